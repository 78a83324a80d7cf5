"""One stress process: M asyncio workers running the invoice-style flow on real deliveries.

The flow is the node contract: ``exists`` guard, ``try_acquire_lock``, the
side effect, then ``set(Processed)`` or, when the effect raised,
``release_lock_as_failed``.  Every handler call is journalled as invoke plus
ok/fail/info.  A store error is what a real node sees when its database
drops: the outcome is unknown, so lock-ending writes are retried with the
same fencing token until they land or the retry budget is spent, and an
acquire whose answer was lost is reclaimed by reading who holds the record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from dsm_sim.history import OpName
from dsm_sim.protocol.groups import stop_on_sigterm
from dsm_sim.stress.journal import EventType, Journal, WallClock
from dsm_sim.stress.ledger import EffectLedger, EffectRow
from dsm_sim.stress.settings import StressSettings
from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import DsmError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

__all__ = [
    "ENTITY_ID",
    "PROBE_KEY",
    "RECOVERY_PROCESS",
    "REDELIVERY_PROCESS",
    "UNSHARED_EXIT",
    "DeliveryOutcome",
    "StressWorker",
    "base_context",
    "probe_context",
    "process_main",
    "write_probe",
]

ENTITY_ID = "stress-invoice-node"
#: The item of the record the parent writes before the workers start; each must read it.
PROBE_KEY = "shared-store-probe"
#: How a worker process exits when its handler does not reach the parent's store.
UNSHARED_EXIT = 3
#: Process number used in journals for the parent's recovery pass.
RECOVERY_PROCESS = -1
#: Process number of the parent's redeliveries while network faults are on.
REDELIVERY_PROCESS = -2


class DeliveryOutcome(enum.Enum):
    """How one delivery ended, from the worker's point of view."""

    PROCESSED = "processed"
    ALREADY_DONE = "already_done"
    LOCKED_ELSEWHERE = "locked_elsewhere"
    FAILED = "failed"
    ERROR = "error"


class InjectedEffectError(Exception):
    """The side effect failed on purpose (``fail_rate``); the item must be retried."""


def base_context(settings: StressSettings) -> StateHandlerContext:
    """The run's context: its own tenant, so runs never share a record key."""
    return StateHandlerContext(
        scope_id=int(Scope.ELEMENT),
        scope_code=Scope.ELEMENT.code,
        entity_id=ENTITY_ID,
        entity_execution_id="",
        tenant_id=f"stress-{settings.run_id}",
        source_app_id="dsm-stress",
        handler_config=HandlerConfig(lock_duration=settings.lock_duration),
    )


def probe_context(settings: StressSettings) -> StateHandlerContext:
    """Where the shared-store probe lives: a tenant of its own, outside the run's records."""
    ctx = dataclasses.replace(
        base_context(settings),
        tenant_id=f"stress-{settings.run_id}-probe",
        entity_execution_id=f"{settings.run_id}-probe",
    )
    return ctx.for_item(PROBE_KEY)


async def write_probe(handler: StateHandler, settings: StressSettings) -> None:
    """The parent's record that every worker's handler must read back (see :func:`_unshared`)."""
    ctx = probe_context(settings)
    token = await handler.try_acquire_lock(ctx)
    if token is None:
        return  # already written (a test that prepares twice): it is still there to read
    held = ctx.for_item(PROBE_KEY, lock_token=token)
    await handler.set(held, IdempotencyStatus.PROCESSED, {"run": settings.run_id})


async def _unshared(handler: StateHandler, settings: StressSettings) -> str | None:
    """Why this process's handler is not on the parent's store (None: it is, or cannot tell).

    A handler whose store is private to its process (in memory, or a file or
    schema of its own) makes every process of the run see an empty store, and
    the run would report each key charged once per process as a handler bug.
    """
    try:
        record = await handler.get(probe_context(settings))
    except Exception:
        return None  # the store is failing: the run itself meets it and reports it
    if record is None:
        return "it found no record where the parent's handler had written one"
    data = record.data if isinstance(record.data, dict) else {}
    if record.status is not IdempotencyStatus.PROCESSED or data.get("run") != settings.run_id:
        return (
            f"it found a record ({record.status.label}) other than the one the parent's "
            "handler had written"
        )
    return None


def _scalar(value: object) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, StateRecord):
        return f"{value.status.value}:{value.attempt}"
    return repr(value)


class StressWorker:
    """Delivers messages one at a time; several share a process, handler and journal."""

    def __init__(
        self,
        settings: StressSettings,
        handler: StateHandler,
        ledger: EffectLedger,
        journal: Journal,
        process: int,
        worker: int,
        stall: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.ledger = ledger
        self.journal = journal
        self.process = process
        self.worker = worker
        self.base = base_context(settings)
        self.random = random.Random(f"{settings.seed}/{process}/{worker}")
        self.outcomes: Counter[DeliveryOutcome] = Counter()
        self.unnamed_errors: Counter[str] = Counter()
        self._stall = stall
        self._seq = 0

    # --- the flow ----------------------------------------------------------------------------

    async def drain(self, keys: Iterator[str]) -> None:
        """Deliver keys from ``keys`` (shared with the process's other workers) until none is left.

        The workers of a process share one event loop, so they take turns at
        the iterator: each key is delivered once, and nothing is built ahead.
        """
        for key in keys:
            self.outcomes[await self.deliver(key)] += 1

    async def deliver(self, key: str) -> DeliveryOutcome:
        self._seq += 1
        execution = f"{self.settings.run_id}-p{self.process}-w{self.worker}-{self._seq}"
        ctx = dataclasses.replace(self.base, entity_execution_id=execution).for_item(key)
        outcome, done = await self._call(OpName.EXISTS, ctx, lambda: self.handler.exists(ctx))
        if outcome is not EventType.OK:
            return DeliveryOutcome.ERROR
        if done:
            return DeliveryOutcome.ALREADY_DONE
        acquire_id, outcome, token = await self._journalled(
            OpName.TRY_ACQUIRE_LOCK, ctx, lambda: self.handler.try_acquire_lock(ctx)
        )
        if outcome is EventType.INFO:
            token = await self._reclaim(ctx)
            if token is not None:
                # The reply was lost but the lock is ours: the history must grant this token.
                self.journal.resolve(acquire_id, token)
        elif outcome is EventType.FAIL:
            return DeliveryOutcome.ERROR
        if not isinstance(token, int):
            return (
                DeliveryOutcome.LOCKED_ELSEWHERE
                if outcome is EventType.OK
                else DeliveryOutcome.ERROR
            )
        held = ctx.for_item(key, lock_token=token)
        try:
            await self._effect(held, token)
        except InjectedEffectError as exc:
            detail = str(exc)
            landed = await self._write(
                OpName.RELEASE_LOCK_AS_FAILED,
                held,
                IdempotencyStatus.FAILED,
                lambda: self.handler.release_lock_as_failed(held, detail),
            )
            return DeliveryOutcome.FAILED if landed else DeliveryOutcome.ERROR
        except Exception as exc:
            # The ledger stayed unreachable: the effect's fate is unknown, so the lock
            # is left to expire and the item to the catch-up sweep and a redelivery.
            self.unnamed_errors[f"effect:{type(exc).__name__}"] += 1
            return DeliveryOutcome.ERROR
        landed = await self._write(
            OpName.SET,
            held,
            IdempotencyStatus.PROCESSED,
            lambda: self.handler.set(
                held, IdempotencyStatus.PROCESSED, {"execution": execution, "token": token}
            ),
        )
        return DeliveryOutcome.PROCESSED if landed else DeliveryOutcome.ERROR

    async def sweep(self, expected: Sequence[str] = ()) -> int:
        """Run the catch-up sweep once, journalled like any call.

        The sweep returns only a count; ``expected`` (the keys seen expired just
        before) is journalled as the keys it reset, which holds when nothing
        else writes meanwhile, as in the parent's recovery pass.
        """
        ctx = dataclasses.replace(self.base, entity_execution_id="catch-up").for_item("*")
        op_id = self.journal.invoke(
            self.worker, ctx.entity_execution_id, OpName.RESET_EXPIRED_LOCKS, "*", keys=expected
        )
        try:
            count = await self.handler.reset_expired_locks()
        except StoreError as exc:
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            return 0
        except Exception as exc:
            self.unnamed_errors[type(exc).__name__] += 1
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            return 0
        self.journal.complete(op_id, EventType.OK, value=count)
        return count

    # --- steps -------------------------------------------------------------------------------

    async def _effect(self, held: StateHandlerContext, token: int) -> None:
        if self.random.random() < self.settings.fail_rate:
            raise InjectedEffectError(f"side effect for {held.item_key} failed (injected)")
        row = EffectRow(
            item_key=held.item_key,
            execution=held.entity_execution_id,
            token=token,
            process=self.process,
            worker=self.worker,
            at_ns=self.journal.clock.now_ns(),
        )
        hook = self._stall_hook(held) if self._stall is not None else None
        deadline = time.monotonic() + self.settings.retry_seconds
        delay = 0.05
        while True:
            try:
                await self.ledger.record(row, before_commit=hook)
                return
            except Exception:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _stall_hook(self, held: StateHandlerContext) -> Callable[[], Awaitable[None]]:
        stall = self._stall
        assert stall is not None

        async def hold_open() -> None:
            if stall.is_set():
                return
            stall.set()
            self.journal.mark("stalled", key=held.item_key, execution=held.entity_execution_id)
            await asyncio.sleep(self.settings.stall_after_acquire)

        return hold_open

    async def _reclaim(self, ctx: StateHandlerContext) -> int | None:
        """After an acquire with unknown outcome: is the lock ours after all?"""
        deadline = time.monotonic() + self.settings.retry_seconds
        delay = 0.05
        while True:
            outcome, record = await self._call(OpName.GET, ctx, lambda: self.handler.get(ctx))
            if outcome is EventType.OK:
                if (
                    isinstance(record, StateRecord)
                    and record.status is IdempotencyStatus.PROCESSING
                    and record.entity_execution_id == ctx.entity_execution_id
                ):
                    return record.attempt
                return None
            if outcome is EventType.FAIL or time.monotonic() + delay > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _write(
        self,
        op: OpName,
        held: StateHandlerContext,
        target: IdempotencyStatus,
        call: Callable[[], Awaitable[None]],
    ) -> bool:
        """A lock-ending write, retried with the same token while its outcome is unknown.

        A retry fenced off with a lock error may mean the earlier try landed;
        reading the record settles it.
        """
        deadline = time.monotonic() + self.settings.retry_seconds
        delay = 0.05
        retried = False
        while True:
            outcome, _ = await self._call(op, held, call, status=target.value)
            if outcome is EventType.OK:
                return True
            if outcome is EventType.FAIL:
                return retried and await self._landed(held, target)
            if time.monotonic() + delay > deadline:
                return False
            retried = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _landed(self, held: StateHandlerContext, target: IdempotencyStatus) -> bool:
        ctx = held.for_item(held.item_key)
        outcome, record = await self._call(OpName.GET, ctx, lambda: self.handler.get(ctx))
        return (
            outcome is EventType.OK
            and isinstance(record, StateRecord)
            and record.status is target
            and record.attempt == held.lock_token
            and record.entity_execution_id == held.entity_execution_id
        )

    async def _call(
        self,
        op: OpName,
        ctx: StateHandlerContext,
        call: Callable[[], Awaitable[Any]],
        *,
        status: str | None = None,
    ) -> tuple[EventType, Any]:
        """Journal one handler call: ok, fail (a named refusal) or info (outcome unknown)."""
        _, outcome, value = await self._journalled(op, ctx, call, status=status)
        return outcome, value

    async def _journalled(
        self,
        op: OpName,
        ctx: StateHandlerContext,
        call: Callable[[], Awaitable[Any]],
        *,
        status: str | None = None,
    ) -> tuple[int, EventType, Any]:
        """:meth:`_call`, also giving the call's journal id (to :meth:`Journal.resolve` it later)."""
        op_id = self.journal.invoke(
            self.worker, ctx.entity_execution_id, op, ctx.item_key, ctx.lock_token, status
        )
        try:
            value = await call()
        except StoreError as exc:
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            return op_id, EventType.INFO, None
        except DsmError as exc:
            self.journal.complete(op_id, EventType.FAIL, error=type(exc).__name__)
            return op_id, EventType.FAIL, None
        except Exception as exc:
            # Not a named error: the handler let a driver exception escape.
            self.unnamed_errors[type(exc).__name__] += 1
            self.journal.complete(op_id, EventType.INFO, error=type(exc).__name__)
            return op_id, EventType.INFO, None
        self.journal.complete(op_id, EventType.OK, value=_scalar(value))
        return op_id, EventType.OK, value


async def _run_process(
    settings: StressSettings,
    process: int,
    journal_path: Path,
    barrier: Barrier,
    anchor: tuple[int, int],
) -> None:
    journal = Journal(journal_path, process, WallClock(anchor))
    handler = settings.build_handler(SystemClock())
    ledger = EffectLedger(settings, pool_size=settings.workers)
    try:
        await handler.open()
        unshared = await _unshared(handler, settings)
        if unshared is not None:
            journal.mark("unshared", reason=unshared)
            barrier.abort()  # the others stop waiting too: the run cannot start
            raise SystemExit(UNSHARED_EXIT)
        keys = (key for key, _ in settings.deliveries_for(process))
        stall = asyncio.Event() if process == 0 and settings.stall_after_acquire > 0 else None
        workers = [
            StressWorker(settings, handler, ledger, journal, process, w, stall)
            for w in range(settings.workers)
        ]
        try:
            await asyncio.to_thread(barrier.wait, settings.start_timeout)
        except threading.BrokenBarrierError:
            # Another process could not start (or the start timed out): said by the parent.
            journal.mark("not_started")
            raise SystemExit(1) from None
        journal.mark("start")
        await asyncio.gather(*(w.drain(keys) for w in workers))
        outcomes: Counter[DeliveryOutcome] = Counter()
        unnamed: Counter[str] = Counter()
        for w in workers:
            outcomes.update(w.outcomes)
            unnamed.update(w.unnamed_errors)
        journal.mark(
            "summary",
            outcomes={o.value: n for o, n in outcomes.items()},
            unnamed_errors=dict(unnamed),
        )
    finally:
        await ledger.close()
        await handler.close()
        journal.close()


def process_main(
    settings: StressSettings,
    process: int,
    journal_path: str,
    barrier: Barrier,
    anchor: tuple[int, int],
) -> None:
    """Entry point of a spawned process (must be importable, hence module level).

    ``anchor`` is the run's time base (:attr:`WallClock.anchor` of the parent's
    clock): the journal's times must be comparable with every other process's.

    SIGTERM ends the handler processes it started and exits at once: the
    parent is stopping the run (``dsm stress`` was interrupted, or its time
    ran out) and reads whatever the journal holds.
    """
    stop_on_sigterm()
    asyncio.run(_run_process(settings, process, Path(journal_path), barrier, anchor))
