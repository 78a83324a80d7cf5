"""The engine on the real SQL handler: competing workers, retries and crashes on a shared store."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from reference_engine.catchup import CatchupWorkerService
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.engine.executor import Message, NodeOutcome
from reference_engine.engine.loader import load_workflow
from reference_engine.engine.workflow import DeliveryReport, NodeTypeRegistry, WorkflowEngine
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.sql.factory import postgres_isolated_handler, sqlite_file_handler
from reference_engine.nodes.invoice import NODE_TYPE, FakeBillingApi, invoice_node
from reference_engine.record import StateRecord
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
S = IdempotencyStatus
WORKFLOW = {
    "id": "wf",
    "nodes": [
        {
            "id": "dispatch",
            "type": NODE_TYPE,
            "settings": {"dataStateMachine": {"options": {"lockDuration": "30m"}}},
        }
    ],
}


class Rig:
    """Several engines (one per simulated process) sharing one SQL store and billing API."""

    def __init__(self, factory: HandlerFactory, engines: int = 1) -> None:
        self.clock = ManualClock(START)
        self.handlers = HandlerRegistry(self.clock)
        self.handlers.register("built-in", factory)
        self.billing = FakeBillingApi(self.clock)
        node_types = NodeTypeRegistry()
        node_types.register(NODE_TYPE, invoice_node(self.billing, self.clock))
        definition = load_workflow(WORKFLOW)
        self.engines = [
            WorkflowEngine(definition, node_types, self.handlers, self.clock, id_prefix=f"p{i}")
            for i in range(engines)
        ]

    async def record(self, invoice_id: str) -> StateRecord | None:
        machine = (
            await self.engines[0]
            .executors[0]
            .pre_process(self.engines[0].new_thread(invoice(invoice_id)))
        )
        return await machine.get(invoice_id)

    async def handler(self) -> StateHandler:
        return await self.handlers.resolve("built-in")


def invoice(invoice_id: str, amount: int = 100) -> Message:
    return Message(id=f"msg-{invoice_id}", payload={"invoiceId": invoice_id, "amount": amount})


def run(factory: HandlerFactory, scenario: Callable[[Rig], Awaitable[None]], engines: int) -> None:
    async def main() -> None:
        rig = Rig(factory, engines)
        try:
            await scenario(rig)
        finally:
            await rig.handlers.close()

    asyncio.run(main())


async def duplicates_charge_once(rig: Rig) -> None:
    invoices = [f"INV-{n}" for n in range(5)]
    messages = [invoice(i) for i in invoices for _ in range(6)]
    for engine in rig.engines:
        # Sequentially: HandlerRegistry.resolve is not safe against concurrent first use.
        await engine.open()
    batches = await asyncio.gather(*(e.run(messages, workers=4) for e in rig.engines))
    reports: list[DeliveryReport] = [r for batch in batches for r in batch]
    for invoice_id in invoices:
        assert len(rig.billing.charges_for(invoice_id)) == 1, invoice_id
        record = await rig.record(invoice_id)
        assert record is not None
        assert (record.status, record.attempt) == (S.PROCESSED, 1)
    outcomes = [r.outcomes[0] for r in reports]
    assert outcomes.count(NodeOutcome.SUCCESS) == len(invoices)
    assert outcomes.count(NodeOutcome.FAILURE) == 0
    lock_skips = [r for r in reports if "another worker" in r.results[0].reason]
    assert lock_skips, "with real I/O, some duplicates must meet a live lock"


async def failure_then_redelivery(rig: Rig) -> None:
    (engine,) = rig.engines
    rig.billing.fail_next = 1
    (failed,) = await engine.deliver(invoice("INV-9"))
    assert failed.outcome is NodeOutcome.FAILURE
    record = await rig.record("INV-9")
    assert record is not None
    assert record.status is S.FAILED
    assert "BillingError" in (record.error_detail or "")

    (report,) = await engine.run([invoice("INV-9").redelivered()], max_deliveries=2)
    assert (report.outcomes, report.deliveries) == ((NodeOutcome.SUCCESS,), 1)
    record = await rig.record("INV-9")
    assert record is not None
    assert (record.status, record.attempt, record.error_detail) == (S.PROCESSED, 2, None)
    assert len(rig.billing.charges_for("INV-9")) == 1


async def crash_sweep_retry(rig: Rig) -> None:
    (engine,) = rig.engines
    entered = asyncio.Event()
    hang = True

    class Hanging(FakeBillingApi):
        async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
            if hang:
                entered.set()
                await asyncio.Event().wait()
            return await rig.billing.charge(invoice_id, amount)

    types = NodeTypeRegistry()
    types.register(NODE_TYPE, invoice_node(Hanging(rig.clock), rig.clock))
    crashing = WorkflowEngine(engine.definition, types, rig.handlers, rig.clock, id_prefix="c")
    task = asyncio.create_task(crashing.deliver(invoice("INV-7")))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    hang = False

    (skipped,) = await engine.deliver(invoice("INV-7"))
    assert skipped.outcome is NodeOutcome.SKIP
    rig.clock.advance(dt.timedelta(minutes=31))
    result = await CatchupWorkerService(
        await rig.handler(), interval=dt.timedelta(minutes=1)
    ).run_once()
    assert result.locks_reset == 1
    (retried,) = await engine.deliver(invoice("INV-7").redelivered())
    assert retried.outcome is NodeOutcome.SUCCESS
    record = await rig.record("INV-7")
    assert record is not None
    assert (record.status, record.attempt) == (S.PROCESSED, 2)
    assert len(rig.billing.charges_for("INV-7")) == 1


SCENARIOS = {
    "duplicates-one-engine": (duplicates_charge_once, 1),
    "duplicates-three-engines": (duplicates_charge_once, 3),
    "failure-then-redelivery": (failure_then_redelivery, 1),
    "crash-sweep-retry": (crash_sweep_retry, 1),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_on_a_sqlite_file(name: str) -> None:
    scenario, engines = SCENARIOS[name]
    run(sqlite_file_handler, scenario, engines)


@pytest.mark.postgres
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_on_postgresql(postgres_url: str, name: str) -> None:
    scenario, engines = SCENARIOS[name]

    def factory(clock: Clock) -> StateHandler:
        return postgres_isolated_handler(postgres_url, clock)

    run(factory, scenario, engines)
