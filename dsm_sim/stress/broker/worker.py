"""One broker stress worker process: RabbitMQ -> the real engine -> the real invoice node.

The process builds the workflow engine with the invoice node on the run's
handler, consumes the run's queue with manual acks, and charges through a
billing API whose charge is a row in the durable effect ledger.  Every
handler call is journalled (through :class:`JournalingHandler`) so the
checker can judge the run as it judges the other stress runs, and every
acknowledgement is appended to an ack log the parent reads to know when
every message is settled.  A process with a kill plan SIGKILLs itself the
``nth`` time it reaches its kill point, after marking the journal.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import signal
import time
from collections.abc import Mapping
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import IO, Any

from dsm_sim.history import OpName
from dsm_sim.protocol.groups import stop_on_sigterm
from dsm_sim.stress.broker.settings import BrokerStressSettings, KillPlan, KillPoint
from dsm_sim.stress.journal import EventType, Journal, WallClock
from dsm_sim.stress.ledger import EffectLedger, EffectRow
from dsm_sim.stress.worker import ENTITY_ID, base_context
from reference_engine.broker.amqp import AmqpBroker
from reference_engine.broker.base import Delivery
from reference_engine.broker.consumer import (
    ConsumerHooks,
    EngineConsumer,
    Settlement,
    ack_when_done,
)
from reference_engine.clock import Clock, SystemClock
from reference_engine.context import StateHandlerContext
from reference_engine.engine.executor import Message, NodeOutcome
from reference_engine.engine.workflow import DeliveryReport, NodeTypeRegistry, WorkflowEngine
from reference_engine.errors import DsmError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.nodes.invoice import NODE_TYPE, BillingError, invoice_node
from reference_engine.record import StateRecord
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

__all__ = ["JournalingHandler", "LedgerBilling", "broker_process_main", "workflow_definition"]

#: The lease of the delivery running in this task: set by a successful acquire, read by
#: the charge, so the effect row carries the execution and fencing token it ran under.
_LEASE: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "dsm_broker_lease", default=None
)


def workflow_definition(settings: BrokerStressSettings) -> dict[str, Any]:
    """One invoice node, keyed like every stress run's records (same entity, same tenant)."""
    lock_ms = max(1, round(settings.stress.lock_duration.total_seconds() * 1000))
    return {
        "id": f"stress-{settings.stress.run_id}",
        "nodes": [
            {
                "id": ENTITY_ID,
                "type": NODE_TYPE,
                "settings": {
                    "dataStateMachine": {
                        "handler": "built-in",
                        "scope": "Element",
                        "options": {"lockDuration": f"{lock_ms}ms"},
                    }
                },
            }
        ],
    }


def _scalar(value: object) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, StateRecord):
        return f"{value.status.value}:{value.attempt}"
    return repr(value)


class JournalingHandler:
    """A handler that journals every call (invoke, then ok / fail / info) and passes it on."""

    def __init__(self, inner: StateHandler, journal: Journal) -> None:
        self.inner = inner
        self.journal = journal

    async def _call(
        self, op: OpName, ctx: StateHandlerContext, call: Any, status: str | None = None
    ) -> Any:
        op_id = self.journal.invoke(
            0, ctx.entity_execution_id, op, ctx.item_key, ctx.lock_token, status
        )
        try:
            value = await call
        except StoreError as exc:
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            raise
        except DsmError as exc:
            self.journal.complete(op_id, EventType.FAIL, error=type(exc).__name__)
            raise
        except Exception as exc:
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            raise
        self.journal.complete(op_id, EventType.OK, value=_scalar(value))
        return value

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return bool(await self._call(OpName.EXISTS, ctx, self.inner.exists(ctx)))

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record: StateRecord | None = await self._call(OpName.GET, ctx, self.inner.get(ctx))
        return record

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token: int | None = await self._call(
            OpName.TRY_ACQUIRE_LOCK, ctx, self.inner.try_acquire_lock(ctx)
        )
        if token is not None:
            _LEASE.set((ctx.entity_execution_id, token))
        return token

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await self._call(OpName.SET, ctx, self.inner.set(ctx, status, data), status.value)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await self._call(
            OpName.RELEASE_LOCK_AS_FAILED,
            ctx,
            self.inner.release_lock_as_failed(ctx, error_detail),
            IdempotencyStatus.FAILED.value,
        )

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await self._call(OpName.UPSERT, ctx, self.inner.upsert(ctx, data))

    async def reset_expired_locks(self) -> int:
        return await self.inner.reset_expired_locks()

    async def expire_past_retention(self) -> int:
        return await self.inner.expire_past_retention()


class Killer:
    """Counts arrivals at the plan's kill point and SIGKILLs this process at the ``nth``."""

    def __init__(self, plan: KillPlan | None, journal: Journal) -> None:
        self.plan = plan
        self.journal = journal
        self.arrivals = 0

    def at(self, point: KillPoint, key: str, execution: str) -> None:
        if self.plan is None or point is not self.plan.point:
            return
        self.arrivals += 1
        if self.arrivals >= self.plan.nth:
            self.journal.mark("kill", point=point.value, key=key, execution=execution)
            os.kill(os.getpid(), signal.SIGKILL)


class LedgerBilling:
    """The invoice node's billing API: a charge is an effect row committed to the ledger."""

    def __init__(
        self,
        settings: BrokerStressSettings,
        ledger: EffectLedger,
        journal: Journal,
        killer: Killer,
        process: int,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.journal = journal
        self.killer = killer
        self.process = process
        self.random = random.Random(f"{settings.stress.seed}/billing/{process}")

    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
        execution, token = _LEASE.get() or ("", None)
        self.killer.at(KillPoint.BEFORE_CHARGE, invoice_id, execution)
        if self.random.random() < self.settings.stress.fail_rate:
            raise BillingError(f"charge of {invoice_id} declined (injected)")
        row = EffectRow(
            item_key=invoice_id,
            execution=execution,
            token=token,
            process=self.process,
            worker=0,
            at_ns=self.journal.clock.now_ns(),
        )
        deadline = time.monotonic() + self.settings.stress.retry_seconds
        delay = 0.05
        while True:
            try:
                await self.ledger.record(row)
                break
            except Exception:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.killer.at(KillPoint.AFTER_CHARGE, invoice_id, execution)
        return {"chargeId": f"ch-{execution}", "amount": amount, "status": "succeeded"}


class LoggedDelivery:
    """A delivery whose ack is appended to the ack log as it is sent."""

    def __init__(self, inner: Delivery, log: IO[str]) -> None:
        self.inner = inner
        self.log = log

    @property
    def message(self) -> Message:
        return self.inner.message

    @property
    def redelivered(self) -> bool:
        return self.inner.redelivered

    async def ack(self) -> None:
        # Logged first: an ack that reaches the broker while another delivery's kill
        # point stops the process must not go unrecorded, or the parent would wait
        # for it forever.  An ack logged but lost leaves the message in the queue,
        # which the parent sees once the workers have stopped, and drains.
        self.log.write(self.inner.message.id + "\n")
        self.log.flush()
        await self.inner.ack()

    async def requeue(self) -> None:
        await self.inner.requeue()

    async def reject(self) -> None:
        await self.inner.reject()


async def _until(event: Event) -> None:
    # Polled, not waited for in a thread: a thread blocked in wait() would hold up
    # the loop's shutdown when consuming ends early (the queue was deleted).
    while not event.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.1)


async def _run(
    settings: BrokerStressSettings,
    process: int,
    journal_path: Path,
    ack_path: Path,
    stop: Event,
    plan: KillPlan | None,
    anchor: tuple[int, int],
) -> None:
    stress = settings.stress
    journal = Journal(journal_path, process, WallClock(anchor))
    clock: Clock = SystemClock()
    killer = Killer(plan, journal)
    inner = stress.build_handler(clock)
    handler = JournalingHandler(inner, journal)
    ledger = EffectLedger(stress, pool_size=stress.workers)
    registry = HandlerRegistry(clock)
    registry.register("built-in", lambda _clock: handler)
    nodes = NodeTypeRegistry()
    billing = LedgerBilling(settings, ledger, journal, killer, process)
    nodes.register(NODE_TYPE, invoice_node(billing, clock))
    engine = WorkflowEngine.from_json(
        workflow_definition(settings),
        nodes,
        registry,
        clock,
        id_prefix=f"{stress.run_id}-i{process}",
    )
    base = base_context(stress)

    async def is_done(message: Message) -> bool:
        return await inner.exists(base.for_item(str(message.payload["invoiceId"])))

    async def before_settle(
        delivery: Delivery, report: DeliveryReport, settlement: Settlement
    ) -> None:
        if settlement is Settlement.ACK and report.outcomes == (NodeOutcome.SUCCESS,):
            killer.at(
                KillPoint.AFTER_SET, str(delivery.message.payload["invoiceId"]), report.execution_id
            )

    consumer = EngineConsumer(
        engine,
        AmqpBroker(settings.broker_url, settings.topology),
        prefetch=stress.workers,
        settle=ack_when_done(is_done),
        hooks=ConsumerHooks(before_settle=before_settle),
        requeue_delay=settings.requeue_delay,
        ack_first=settings.ack_first,
    )
    broker = consumer.broker
    log = ack_path.open("a", encoding="utf-8")
    try:
        await broker.connect()
        journal.mark("start", plan=None if killer.plan is None else killer.plan.point.value)

        async def handle(delivery: Delivery) -> None:
            await consumer.handle(LoggedDelivery(delivery, log))

        await engine.open()
        await broker.consume(handle, prefetch=stress.workers, stop=_until(stop))
        journal.mark("summary", outcomes=dict(consumer.counts), unnamed_errors={})
    finally:
        await broker.close()
        await ledger.close()
        await registry.close()
        log.close()
        journal.close()


def broker_process_main(
    settings: BrokerStressSettings,
    process: int,
    journal_path: str,
    ack_path: str,
    stop: Event,
    plan: KillPlan | None,
    anchor: tuple[int, int],
) -> None:
    """Entry point of a spawned worker process (module level, so ``spawn`` can import it).

    ``anchor`` is the run's time base (:attr:`~dsm_sim.stress.journal.WallClock.anchor`
    of the parent's clock), on which every process's journal is timed.

    SIGTERM ends the handler processes it started and exits at once: its
    unacknowledged deliveries go back to the queue, and the parent is
    stopping the run.
    """
    stop_on_sigterm()
    asyncio.run(_run(settings, process, Path(journal_path), Path(ack_path), stop, plan, anchor))
