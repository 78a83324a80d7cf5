"""The contextual machine: per-call context, fencing tokens, and the lifecycle end to end."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from reference_engine.clock import ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import (
    ForbiddenTransitionError,
    InvalidItemError,
    LockHeldError,
    LockNotHeldError,
    PayloadTooLargeError,
    StaleLockError,
    UnsupportedStatusError,
)
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.machine import ContextualDataStateMachine
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit
S = IdempotencyStatus
LOCK = dt.timedelta(minutes=30)


def base(execution: str, tenant: str = "t1", scope_id: int = 4) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=scope_id,
        scope_code="Element",
        entity_id="el-1",
        entity_execution_id=execution,
        tenant_id=tenant,
        source_app_id="app",
        handler_config=HandlerConfig(lock_duration=LOCK),
    )


class World:
    def __init__(self) -> None:
        self.clock = ManualClock(dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC))
        self.handler = InMemoryStateHandler(self.clock)

    def worker(self, execution: str, **kw: Any) -> ContextualDataStateMachine:
        return ContextualDataStateMachine(self.handler, base(execution, **kw))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class RecordingHandler(InMemoryStateHandler):
    """Captures the contexts handed to the handler."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.seen: list[StateHandlerContext] = []

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        self.seen.append(ctx)
        return await super().try_acquire_lock(ctx)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.seen.append(ctx)
        await super().set(ctx, status, data)


def test_per_call_context_carries_item_fields_and_token() -> None:
    handler = RecordingHandler(ManualClock())
    machine = ContextualDataStateMachine(handler, base("exec-1"))

    async def flow() -> None:
        assert await machine.try_acquire_lock("INV-1", "invoice")
        await machine.set("INV-1", S.PROCESSED, {"ok": True}, "invoice")

    run(flow())
    acquire_ctx, set_ctx = handler.seen
    assert (acquire_ctx.item_key, acquire_ctx.item_entity_key, acquire_ctx.lock_token) == (
        "INV-1",
        "invoice",
        None,
    )
    assert (set_ctx.item_key, set_ctx.lock_token) == ("INV-1", 1)
    assert set_ctx.entity_execution_id == "exec-1"
    assert machine.base_ctx.item_key == ""  # the base context is never mutated
    assert machine.token_for("INV-1", "invoice") is None  # spent by set


def test_happy_path() -> None:
    w = World()
    a = w.worker("exec-a")

    async def flow() -> None:
        assert not await a.exists("INV-1")
        assert await a.try_acquire_lock("INV-1")
        assert not await a.exists("INV-1")
        await a.set("INV-1", S.PROCESSED, {"charge": "ch_1"})
        assert await a.exists("INV-1")
        record = await a.get("INV-1")
        assert record is not None
        assert (record.status, record.attempt, record.locked_until) == (S.PROCESSED, 1, None)
        assert record.data == {"charge": "ch_1"}

    run(flow())


def test_second_worker_cannot_take_a_live_lock() -> None:
    w = World()
    a, b = w.worker("a"), w.worker("b")

    async def flow() -> None:
        assert await a.try_acquire_lock("INV-1")
        w.clock.advance(LOCK)  # exactly locked_until: still live
        assert not await b.try_acquire_lock("INV-1")
        assert await w.handler.reset_expired_locks() == 0
        with pytest.raises(LockHeldError):
            await b.set("INV-1", S.SKIPPED)

    run(flow())


def test_crash_sweep_retry_and_fencing() -> None:
    w = World()
    crashed, retry = w.worker("crashed"), w.worker("retry")

    async def flow() -> None:
        assert await crashed.try_acquire_lock("INV-1")
        w.clock.advance(LOCK + dt.timedelta(microseconds=1))
        assert await w.handler.reset_expired_locks() == 1
        record = await retry.get("INV-1")
        assert record is not None
        assert (record.status, record.error_detail) == (S.FAILED, SWEEP_ERROR_DETAIL)
        assert not await retry.exists("INV-1")
        assert await retry.try_acquire_lock("INV-1")
        with pytest.raises(StaleLockError) as info:
            await crashed.set("INV-1", S.PROCESSED, {"late": True})
        assert (info.value.token, info.value.current_token) == (1, 2)
        assert crashed.token_for("INV-1") is None
        await retry.set("INV-1", S.PROCESSED, {"ok": 1})
        record = await retry.get("INV-1")
        assert record is not None
        assert (record.status, record.attempt, record.data) == (S.PROCESSED, 2, {"ok": 1})

    run(flow())


def test_expired_unswept_lock_can_be_taken_over() -> None:
    w = World()
    a, b = w.worker("a"), w.worker("b")

    async def flow() -> None:
        assert await a.try_acquire_lock("K")
        w.clock.advance(LOCK + dt.timedelta(seconds=1))
        assert await b.try_acquire_lock("K")
        with pytest.raises(StaleLockError):
            await a.release_lock_as_failed("K", "boom")
        record = await b.get("K")
        assert record is not None and record.status is S.PROCESSING and record.attempt == 2

    run(flow())


def test_late_holder_may_finish_if_nobody_took_over() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        assert await a.try_acquire_lock("K")
        w.clock.advance(LOCK * 2)
        await a.set("K", S.PROCESSED, {"v": 1})
        assert await a.exists("K")

    run(flow())


def test_release_as_failed_allows_retry() -> None:
    w = World()
    a, b = w.worker("a"), w.worker("b")

    async def flow() -> None:
        assert await a.try_acquire_lock("K")
        await a.release_lock_as_failed("K", "BillingError: down")
        record = await a.get("K")
        assert record is not None
        assert (record.status, record.error_detail, record.locked_until) == (
            S.FAILED,
            "BillingError: down",
            None,
        )
        assert await b.try_acquire_lock("K")

    run(flow())


def test_writes_without_the_lock_are_refused() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        with pytest.raises(LockNotHeldError):
            await a.set("K", S.PROCESSED, {"x": 1})
        with pytest.raises(LockNotHeldError):
            await a.release_lock_as_failed("K", "nope")
        assert await a.get("K") is None

    run(flow())


@pytest.mark.parametrize(
    ("status", "use"),
    [(S.PROCESSING, "try_acquire_lock"), (S.SUPERSEDED, "upsert"), (S.NONE, "try_acquire_lock")],
)
def test_set_refuses_statuses_of_other_operations(status: IdempotencyStatus, use: str) -> None:
    w = World()
    with pytest.raises(UnsupportedStatusError, match=use):
        run(w.worker("a").set("K", status))


def test_skip_and_forbidden_transitions() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        await a.set("K", S.SKIPPED)
        assert await a.exists("K")
        assert not await a.try_acquire_lock("K")
        with pytest.raises(ForbiddenTransitionError) as info:
            await a.upsert("K", {"v": 2})
        assert (info.value.source, info.value.target) == ("Skipped", "Superseded")
        with pytest.raises(ForbiddenTransitionError):
            await a.set("NEW", S.EXPIRED)

    run(flow())


def test_upsert_supersedes_processed() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        await a.upsert("K", {"v": 1})
        first = await a.get("K")
        await a.upsert("K", {"v": 2})
        second = await a.get("K")
        assert first is not None and second is not None
        assert (first.status, first.data, second.status, second.data) == (
            S.PROCESSED,
            {"v": 1},
            S.PROCESSED,
            {"v": 2},
        )
        history = w.handler.model.superseded
        assert [(r.status, r.data) for r in history] == [(S.SUPERSEDED, '{"v":1}')]

    run(flow())


def test_retention_expires_then_allows_reprocessing() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        assert await a.try_acquire_lock("K")
        await a.set("K", S.PROCESSED, {"v": 1})
        w.clock.advance(dt.timedelta(days=31))
        assert await w.handler.expire_past_retention() == 1
        assert not await a.exists("K")
        assert await a.try_acquire_lock("K")

    run(flow())


def test_tenants_and_scopes_do_not_collide() -> None:
    w = World()
    t1, t2 = w.worker("a", tenant="t1"), w.worker("b", tenant="t2")
    other_scope = w.worker("c", scope_id=3)

    async def flow() -> None:
        assert await t1.try_acquire_lock("K")
        await t1.set("K", S.PROCESSED)
        assert not await t2.exists("K")
        assert await t2.try_acquire_lock("K")
        assert not await other_scope.exists("K")
        assert await other_scope.try_acquire_lock("K")

    run(flow())


@pytest.mark.parametrize(
    "key",
    ["", "x" * 257, "a\x00b", "\udcff", 12],
    ids=["empty", "oversized", "nul", "lone-surrogate", "not-a-string"],
)
def test_bad_item_keys_are_refused_before_the_handler(key: Any) -> None:
    w = World()
    with pytest.raises(InvalidItemError):
        run(w.worker("a").try_acquire_lock(key))
    assert not w.handler.model.current


def test_oversized_and_non_json_payloads_write_nothing() -> None:
    w = World()
    a = w.worker("a")

    async def flow() -> None:
        assert await a.try_acquire_lock("K")
        with pytest.raises(PayloadTooLargeError):
            await a.set("K", S.PROCESSED, {"blob": "x" * (300 * 1024)})
        with pytest.raises(InvalidItemError):
            await a.set("K", S.PROCESSED, {"when": dt.datetime(2026, 1, 1)})
        record = await a.get("K")
        assert record is not None and record.status is S.PROCESSING
        assert a.token_for("K") == 1  # the lock is still ours to complete

    run(flow())


def test_quotes_and_sql_fragments_are_just_keys() -> None:
    w = World()
    a = w.worker("a")
    key = "INV-1'; DROP TABLE process_state_logs; --"

    async def flow() -> None:
        assert await a.try_acquire_lock(key)
        await a.set(key, S.PROCESSED)
        assert await a.exists(key)
        assert not await a.exists("INV-1")

    run(flow())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant_id", ""),
        ("tenant_id", "t\x00"),
        ("entity_id", ""),
        ("source_app_id", "\udcff"),
        ("entity_execution_id", "r" * 300),
    ],
)
def test_base_context_refuses_ids_a_store_cannot_hold(field: str, value: str) -> None:
    fields: dict[str, Any] = {
        "scope_id": 4,
        "scope_code": "Element",
        "entity_id": "el-1",
        "entity_execution_id": "run-1",
        "tenant_id": "t1",
        "source_app_id": "app",
    }
    fields[field] = value
    with pytest.raises(InvalidItemError) as info:
        StateHandlerContext(**fields)
    assert info.value.field == field
