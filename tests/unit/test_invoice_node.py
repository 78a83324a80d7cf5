"""The invoice dispatcher: each branch of its guard, and what it leaves in the record."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from reference_engine.clock import UTC, ManualClock
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import Message, NodeExecutionResult, NodeOutcome
from reference_engine.errors import StoreError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.nodes.invoice import (
    COMPLETE_ATTEMPTS,
    NODE_TYPE,
    BillingError,
    FakeBillingApi,
    InvoiceDispatchExecutor,
    invoice_node,
)
from reference_engine.record import StateRecord
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
LOCK = dt.timedelta(minutes=30)
S = IdempotencyStatus


class Rig:
    def __init__(
        self, make_handler: Callable[[ManualClock], InMemoryStateHandler] = InMemoryStateHandler
    ) -> None:
        self.clock = ManualClock(START)
        self.handler = make_handler(self.clock)
        registry = HandlerRegistry(self.clock)
        registry.register("built-in", lambda _clock: self.handler)
        self.factory = DataStateMachineFactory(registry)
        self.billing = FakeBillingApi(self.clock)
        self.element = Element(
            id="dispatch",
            workflow_id="wf",
            node_type=NODE_TYPE,
            settings={"dataStateMachine": {"options": {"lockDuration": "30m"}}},
        )
        self.node = invoice_node(self.billing, self.clock)(self.element, self.factory)
        self.runs = 0

    def thread(self) -> ExecutionThread:
        self.runs += 1
        return ExecutionThread(f"wf/exec-{self.runs:04d}", "tenant-1", "app-1", "m")

    async def run(self, invoice_id: str = "INV-1", amount: int = 500) -> NodeExecutionResult:
        message = Message(id="m", payload={"invoiceId": invoice_id, "amount": amount})
        return await self.node.run(self.thread(), message)

    async def record(self, invoice_id: str = "INV-1") -> StateRecord | None:
        machine = await self.node.pre_process(self.thread())
        return await machine.get(invoice_id)


def test_invoice_node_constructor_wires_billing_and_clock() -> None:
    rig = Rig()
    assert isinstance(rig.node, InvoiceDispatchExecutor)
    assert (rig.node.billing, rig.node.clock) == (rig.billing, rig.clock)
    assert rig.node.node_type == NODE_TYPE == "invoice-dispatch"


def test_success_charges_and_records_processed_with_the_response() -> None:
    rig = Rig()

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        return await rig.run(amount=1250), await rig.record()

    result, record = asyncio.run(scenario())
    response = {"chargeId": "ch_0001", "amount": 1250, "status": "succeeded"}
    assert result == NodeExecutionResult.success({"invoiceId": "INV-1", "response": response})
    assert record is not None
    assert (record.status, record.attempt, record.locked_until) == (S.PROCESSED, 1, None)
    assert record.data == {"dispatchedAt": START.isoformat(), "response": response}
    assert record.entity_execution_id == "wf/exec-0001"
    assert [(c.invoice_id, c.amount) for c in rig.billing.charges] == [("INV-1", 1250)]


def test_already_dispatched_is_skipped_without_a_charge() -> None:
    rig = Rig()

    async def scenario() -> NodeExecutionResult:
        await rig.run()
        rig.clock.advance(dt.timedelta(hours=2))
        return await rig.run()

    result = asyncio.run(scenario())
    assert result == NodeExecutionResult.skip("invoice INV-1 already dispatched")
    assert len(rig.billing.charges) == 1


def test_a_live_lock_of_another_worker_is_skipped_without_a_charge() -> None:
    rig = Rig()

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        other = await rig.node.pre_process(rig.thread())
        assert await other.try_acquire_lock("INV-1")
        rig.clock.advance(LOCK)  # now == locked_until: still live
        return await rig.run(), await rig.record()

    result, record = asyncio.run(scenario())
    assert result == NodeExecutionResult.skip("invoice INV-1 is being dispatched by another worker")
    assert not rig.billing.charges
    assert record is not None
    assert (record.status, record.attempt) == (S.PROCESSING, 1)


def test_an_expired_unswept_lock_is_taken_over_and_dispatched() -> None:
    rig = Rig()

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        crashed = await rig.node.pre_process(rig.thread())
        assert await crashed.try_acquire_lock("INV-1")
        rig.clock.advance(LOCK + dt.timedelta(seconds=1))
        return await rig.run(), await rig.record()

    result, record = asyncio.run(scenario())
    assert result.outcome is NodeOutcome.SUCCESS
    assert record is not None
    assert (record.status, record.attempt) == (S.PROCESSED, 2)
    assert len(rig.billing.charges) == 1


def test_a_billing_error_releases_the_lock_as_failed_and_reports_failure() -> None:
    rig = Rig()
    rig.billing.fail_next = 1

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        return await rig.run(), await rig.record()

    result, record = asyncio.run(scenario())
    detail = "BillingError: billing API unavailable while charging INV-1"
    assert (result.outcome, result.error) == (NodeOutcome.FAILURE, detail)
    assert record is not None
    assert (record.status, record.attempt, record.locked_until) == (S.FAILED, 1, None)
    assert record.error_detail == detail
    assert not rig.billing.charges
    assert rig.billing.fail_next == 0


def test_a_fenced_write_is_not_released_and_the_new_holder_keeps_the_record() -> None:
    """The lock expires mid-charge and another worker takes over: the late write is refused."""
    rig = Rig()

    class SlowBilling(FakeBillingApi):
        async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
            response = await super().charge(invoice_id, amount)
            rig.clock.advance(LOCK + dt.timedelta(minutes=1))
            assert await rig.handler.reset_expired_locks() == 1
            taker = await rig.node.pre_process(rig.thread())
            assert await taker.try_acquire_lock(invoice_id)
            return response

    rig.node = invoice_node(SlowBilling(rig.clock), rig.clock)(rig.element, rig.factory)

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        return await rig.run(), await rig.record()

    result, record = asyncio.run(scenario())
    assert result.outcome is NodeOutcome.FAILURE
    assert (result.error or "").startswith("StaleLockError: stale lock on item 'INV-1'")
    assert record is not None
    assert (record.status, record.attempt, record.error_detail) == (S.PROCESSING, 2, None)
    assert record.entity_execution_id == "wf/exec-0002"


def test_a_swept_lock_records_the_sweep_note() -> None:
    rig = Rig()

    async def scenario() -> StateRecord | None:
        crashed = await rig.node.pre_process(rig.thread())
        assert await crashed.try_acquire_lock("INV-1")
        rig.clock.advance(LOCK + dt.timedelta(seconds=1))
        assert await rig.handler.reset_expired_locks() == 1
        return await rig.record()

    record = asyncio.run(scenario())
    assert record is not None
    assert (record.status, record.error_detail) == (S.FAILED, SWEEP_ERROR_DETAIL)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "invoiceId"),
        ({"invoiceId": 42}, "invoiceId"),
        ({"invoiceId": ""}, "invoiceId"),
        ({"invoiceId": "INV-1", "amount": "12"}, "amount"),
        ({"invoiceId": "INV-1", "amount": -1}, "amount"),
        ({"invoiceId": "INV-1", "amount": True}, "amount"),
    ],
)
def test_a_malformed_message_fails_before_any_record_or_charge(
    payload: dict[str, Any], field: str
) -> None:
    rig = Rig()
    result = asyncio.run(rig.node.run(rig.thread(), Message(id="m", payload=payload)))
    assert result.outcome is NodeOutcome.FAILURE
    assert (result.error or "").startswith("InvalidItemError: invoice message needs")
    assert repr(field) in (result.error or "")
    assert not rig.handler.model.current
    assert not rig.billing.charges


def test_fake_billing_counts_charges_per_invoice_and_fails_on_request() -> None:
    billing = FakeBillingApi(ManualClock(START), fail_next=1)

    async def scenario() -> None:
        with pytest.raises(BillingError, match="INV-1"):
            await billing.charge("INV-1", 1)
        await billing.charge("INV-1", 1)
        await billing.charge("INV-2", 2)

    asyncio.run(scenario())
    assert [c.charge_id for c in billing.charges_for("INV-1")] == ["ch_0001"]
    assert [c.charge_id for c in billing.charges_for("INV-2")] == ["ch_0002"]


class FlakySetHandler(InMemoryStateHandler):
    """set(Processed) raises StoreError for the first ``failures`` calls.

    With ``landed`` the write is applied before the error, as when a
    connection drops after the database committed.
    """

    def __init__(self, clock: ManualClock, failures: int, *, landed: bool) -> None:
        super().__init__(clock)
        self.failures = failures
        self.landed = landed
        self.releases = 0

    async def set(
        self,
        ctx: Any,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        if self.failures > 0:
            self.failures -= 1
            if self.landed:
                await super().set(ctx, status, data)
            raise StoreError("connection lost after the request was sent")
        await super().set(ctx, status, data)

    async def release_lock_as_failed(self, ctx: Any, error_detail: str) -> None:
        self.releases += 1
        await super().release_lock_as_failed(ctx, error_detail)


@pytest.mark.parametrize("landed", [False, True], ids=["write-lost", "write-landed"])
def test_a_store_error_after_the_charge_never_releases_the_lock(landed: bool) -> None:
    flaky: list[FlakySetHandler] = []

    def make(clock: ManualClock) -> FlakySetHandler:
        flaky.append(FlakySetHandler(clock, failures=1, landed=landed))
        return flaky[-1]

    rig = Rig(make)

    async def scenario() -> tuple[NodeExecutionResult, NodeExecutionResult, StateRecord | None]:
        first = await rig.run()
        second = await rig.run()  # a redelivery
        return first, second, await rig.record()

    first, second, record = asyncio.run(scenario())
    assert first.outcome is NodeOutcome.SUCCESS
    assert second.outcome is NodeOutcome.SKIP
    assert record is not None
    assert record.status is S.PROCESSED
    assert len(rig.billing.charges) == 1
    assert flaky[0].releases == 0


def test_a_store_that_stays_down_leaves_the_lock_to_expire() -> None:
    flaky: list[FlakySetHandler] = []

    def make(clock: ManualClock) -> FlakySetHandler:
        flaky.append(FlakySetHandler(clock, failures=COMPLETE_ATTEMPTS, landed=False))
        return flaky[-1]

    rig = Rig(make)

    async def scenario() -> tuple[NodeExecutionResult, StateRecord | None]:
        return await rig.run(), await rig.record()

    result, record = asyncio.run(scenario())
    assert result.outcome is NodeOutcome.FAILURE
    assert "StoreError" in (result.error or "")
    assert record is not None
    assert record.status is S.PROCESSING  # not released: the charge happened
    assert flaky[0].releases == 0
