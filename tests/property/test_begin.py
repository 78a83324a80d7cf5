"""``begin``: one round trip for "done?" and "take the lock", judged by the kit like every operation.

The kit's begin rule must be able to fail: a handler whose ``begin`` takes the
lock over a Processed record is caught (seed 0).  The built-in handlers'
native ``begin`` passes it, and handlers without one keep the rule set (and
so the seeded searches) they had.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any, ClassVar

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.conformance.execute.begin import begins_natively
from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.runner import VerificationReport, verify
from reference_engine.begin import (
    Acquired,
    BeginCapable,
    BeginResult,
    Completed,
    Locked,
    begin,
    begin_in_model,
    native_begin,
)
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.context import StateHandlerContext
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler
from reference_engine.handlers.redis_factory import redis_test_handler, redis_test_url
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.factory import (
    mariadb_test_handler,
    postgres_test_handler,
    sqlite_file_handler,
    sqlite_memory_handler,
)
from reference_engine.handlers.sql.statements import count_statements
from reference_engine.machine import NULL_MACHINE, ContextualDataStateMachine
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.property

S = IdempotencyStatus
SEED = 0
START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BASE = StateHandlerContext(
    scope_id=4,
    scope_code="Element",
    entity_id="dispatch",
    entity_execution_id="run-1",
    tenant_id="tenant-1",
    source_app_id="app-1",
)


class BeginOverProcessed(InMemoryStateHandler):
    """Its begin takes the lock over a Processed record: the finished work would run again."""

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if record is not None and record.status is S.PROCESSED:
            record.status = S.PROCESSING
            record.attempt += 1
            record.locked_until = now + ctx.handler_config.lock_duration
            record.updated_at = now
            return Acquired(record.attempt)
        return begin_in_model(self.model, ctx, now)


class CountingBegin(InMemoryStateHandler):
    """The in-memory handler's own begin, counted, to show the kit calls it."""

    calls: ClassVar[int] = 0

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        type(self).calls += 1
        return await super().begin(ctx)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the kit's rule ---------------------------------------------------------------------------


def test_a_begin_that_acquires_over_processed_work_is_caught() -> None:
    report = verify(BeginOverProcessed, "ci", seed=SEED, stop_on_first=True)
    assert report.error is None, report.error
    assert len(report.violations) == 1, "the begin rule let a second charge through"
    caught = report.violations[0]
    assert caught.found_as == "allowed_transitions_only", caught.render()
    assert "begin(" in caught.story and "Processed" in caught.message
    assert "state.begin(" in caught.reproduction


def unannotated_begin_over_processed(clock):  # type: ignore[no-untyped-def]
    """A factory that does not say what it builds, as most users write one."""
    return BeginOverProcessed(clock)


def test_a_native_begin_behind_an_unannotated_factory_is_still_judged() -> None:
    assert begins_natively(unannotated_begin_over_processed)
    # A subclass of its own, without a begin, falls back to the composed one.
    plain = type("PlainSubclass", (InMemoryStateHandler,), {})
    assert not begins_natively(lambda clock: plain(clock))
    report = verify(unannotated_begin_over_processed, "ci", seed=SEED, stop_on_first=True)
    assert len(report.violations) == 1, "a native begin went unverified"
    assert "state.begin(" in report.violations[0].reproduction


def _assert_passed(report: VerificationReport) -> None:
    assert report.error is None, report.error
    assert report.passed, [v.render() for v in report.violations]


def test_the_kit_calls_a_native_begin_and_the_memory_handler_passes() -> None:
    CountingBegin.calls = 0
    report = verify(CountingBegin, "ci", seed=SEED, max_examples=20)
    _assert_passed(report)
    assert CountingBegin.calls > 0


def test_only_native_begins_get_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert begins_natively(in_memory_handler) and begins_natively(sqlite_memory_handler)
    # A handler is built (never opened) to ask it: the services need only be named.
    monkeypatch.setenv("DSM_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:1/test")
    assert begins_natively(redis_test_handler) and begins_natively(postgres_test_handler)
    assert hasattr(build_machine(in_memory_handler), "begin")
    # The catalogue's handlers change exists or acquire: their begin is the composed
    # one, so their machines (and seeded searches) are exactly what they were.
    for spec in CATALOGUE.values():
        assert not begins_natively(spec.factory), spec.name
        assert not hasattr(build_machine(spec.factory), "begin"), spec.name


# Nightly: TestSqliteMemoryHandler (test_conformance_sql.py) runs the kit on the same
# handler, its native begin included, on every pull request.
@pytest.mark.thorough
def test_sqlite_begin_passes_the_kit() -> None:
    report = verify(sqlite_memory_handler, "ci", seed=SEED, max_examples=6, matrix="dev")
    _assert_passed(report)


@pytest.mark.redis
# Nightly: TestRedisConformance (test_redis_handler.py) runs the kit on the same
# handler, its native begin included, on every pull request.
@pytest.mark.thorough
def test_redis_begin_passes_the_kit(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_REDIS_URL", redis_url)
    report = verify(redis_test_handler, "ci", seed=SEED, max_examples=4, matrix="dev")
    _assert_passed(report)


def pooled_redis_handler(clock: Clock) -> RedisStateHandler:
    """The Redis handler as deployed: a pool for reads, its scripts on one pipelined connection."""
    return RedisStateHandler(
        redis_test_url(), clock, prefix=f"dsm-test-{uuid.uuid4().hex}", delete_on_close=True
    )


@pytest.mark.redis
def test_pipelined_redis_passes_the_kit(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_REDIS_URL", redis_url)
    report = verify(pooled_redis_handler, "ci", seed=SEED, max_examples=10, matrix="dev")
    _assert_passed(report)


@pytest.mark.postgres
# Nightly: TestPostgresHandler / TestMariadbHandler (test_conformance_sql.py) run the
# kit on the same handler, its native begin included, on every pull request.
@pytest.mark.thorough
def test_postgres_begin_passes_the_kit(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)
    report = verify(postgres_test_handler, "ci", seed=SEED, max_examples=6, matrix="dev")
    _assert_passed(report)


@pytest.mark.mariadb
# Nightly: TestPostgresHandler / TestMariadbHandler (test_conformance_sql.py) run the
# kit on the same handler, its native begin included, on every pull request.
@pytest.mark.thorough
def test_mariadb_begin_passes_the_kit(mariadb_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_MARIADB_URL", mariadb_url)
    report = verify(mariadb_test_handler, "ci", seed=SEED, max_examples=3, matrix="dev")
    _assert_passed(report)


# --- the answers --------------------------------------------------------------------------------


async def _walk(handler: StateHandler, clock: ManualClock) -> list[str]:
    """Every outcome once: new, locked, completed, expired-lock take-over, Failed retry."""
    await handler.open()
    try:
        seen: list[str] = []
        first = await begin(handler, BASE.for_item("a"))
        seen.append(repr(first))
        seen.append(type(await begin(handler, BASE.for_item("a"))).__name__)
        assert isinstance(first, Acquired)
        await handler.set(BASE.for_item("a", lock_token=first.token), S.PROCESSED, {"n": 1})
        done = await begin(handler, BASE.for_item("a"))
        assert isinstance(done, Completed)
        seen.append(f"Completed {None if done.record is None else done.record.data}")
        took = await begin(handler, BASE.for_item("b"))
        clock.advance(dt.timedelta(hours=1))  # past the 30 min lock: taken over
        seen.append(repr(await begin(handler, BASE.for_item("b"))))
        assert isinstance(took, Acquired)
        retry = await begin(handler, BASE.for_item("c"))
        assert isinstance(retry, Acquired)
        await handler.release_lock_as_failed(BASE.for_item("c", lock_token=retry.token), "no")
        seen.append(repr(await begin(handler, BASE.for_item("c"))))
        return seen
    finally:
        await handler.close()


EXPECTED = [
    "Acquired(token=1)",
    "Locked",
    "Completed {'n': 1}",
    "Acquired(token=2)",
    "Acquired(token=2)",
]


class Composed(InMemoryStateHandler):
    """Redefines exists: the inherited begin is withdrawn, the composed one is used."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return await super().exists(ctx)


@pytest.mark.parametrize(
    "factory",
    [in_memory_handler, sqlite_memory_handler, sqlite_file_handler],
    ids=["memory", "sqlite-memory", "sqlite-file"],
)
def test_native_begin_answers_every_outcome(factory: HandlerFactory) -> None:
    clock = ManualClock(START)
    handler = factory(clock)
    assert native_begin(handler) is not None
    assert run(_walk(handler, clock)) == EXPECTED


def test_the_composed_begin_gives_the_same_answers_without_the_record() -> None:
    clock = ManualClock(START)
    handler = Composed(clock)
    assert native_begin(handler) is None and not isinstance(handler, BeginCapable)
    expected = [*EXPECTED]
    expected[2] = "Completed None"  # exists alone: no record read
    assert run(_walk(handler, clock)) == expected


def test_a_tapped_instance_uses_its_tapped_calls() -> None:
    handler = InMemoryStateHandler(ManualClock(START))
    calls: list[str] = []
    plain_exists = handler.exists

    async def exists(ctx: StateHandlerContext) -> bool:
        calls.append("exists")
        return await plain_exists(ctx)

    handler.exists = exists  # type: ignore[method-assign]
    assert native_begin(handler) is None
    assert run(begin(handler, BASE.for_item("x"))) == Acquired(1)
    assert calls == ["exists"]


def test_the_contextual_machine_keeps_the_token_of_a_begin() -> None:
    handler = InMemoryStateHandler(ManualClock(START))
    dsm = ContextualDataStateMachine(handler, BASE)

    async def flow() -> tuple[BeginResult, BeginResult, BeginResult]:
        first = await dsm.begin("inv-1")
        again = await dsm.begin("inv-1")
        await dsm.set("inv-1", S.PROCESSED, {"ok": True})  # fenced with begin's token
        return first, again, await dsm.begin("inv-1")

    first, again, done = run(flow())
    assert first == Acquired(1) and isinstance(again, Locked) and isinstance(done, Completed)
    assert dsm.token_for("inv-1") is None, "set spent the token begin took"
    assert run(NULL_MACHINE.begin("inv-1")) == Acquired(0)


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_begin_is_one_statement_whatever_the_outcome(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)
    clock = ManualClock(START)
    handler = postgres_test_handler(clock)

    async def flow() -> list[tuple[str, int]]:
        await handler.open()
        try:
            out: list[tuple[str, int]] = []
            for _ in range(2):  # Acquired, then Locked
                with count_statements(handler.engine) as log:
                    result = await handler.begin(BASE.for_item("k"))
                out.append((type(result).__name__, log.count))
            await handler.set(BASE.for_item("k", lock_token=1), S.PROCESSED, None)
            with count_statements(handler.engine) as log:
                result = await handler.begin(BASE.for_item("k"))
            out.append((type(result).__name__, log.count))
            return out
        finally:
            await handler.close()

    assert run(flow()) == [("Acquired", 1), ("Locked", 1), ("Completed", 1)]


def test_sqlite_begin_takes_a_new_item_in_one_statement() -> None:
    handler = sqlite_memory_handler(ManualClock(START))

    async def flow() -> list[tuple[str, int]]:
        await handler.open()
        try:
            out = []
            for _ in range(2):
                with count_statements(handler.engine) as log:
                    result = await handler.begin(BASE.for_item("k"))
                out.append((type(result).__name__, log.count))
            return out
        finally:
            await handler.close()

    # A refused take reads the row in the same write transaction: two statements, in-process.
    assert run(flow()) == [("Acquired", 1), ("Locked", 2)]


# --- the instance decides, not the annotation --------------------------------------------------


class WithoutBegin:
    """A correct handler that has no ``begin`` of its own: every call goes to the one it wraps.

    As a deployment wraps a store's handler (to log, to meter): the wrapper
    answers the ten operations, and the engine composes ``begin`` from its
    ``exists`` and ``try_acquire_lock``.  Each call yields to the loop after
    the store has answered, as a reply travelling back over a network does, so
    another call can land between the two of a composed ``begin``; each
    operation itself stays atomic.
    """

    def __init__(self, inner: InMemoryStateHandler) -> None:
        self.inner = inner

    async def open(self) -> None:
        await self.inner.open()
        await asyncio.sleep(0)  # the reply on its way back

    async def close(self) -> None:
        await self.inner.close()
        await asyncio.sleep(0)  # the reply on its way back

    async def exists(self, ctx: StateHandlerContext) -> bool:
        answer = await self.inner.exists(ctx)
        await asyncio.sleep(0)  # the reply on its way back
        return answer

    async def get(self, ctx: StateHandlerContext) -> Any:
        answer = await self.inner.get(ctx)
        await asyncio.sleep(0)  # the reply on its way back
        return answer

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        answer = await self.inner.try_acquire_lock(ctx)
        await asyncio.sleep(0)  # the reply on its way back
        return answer

    async def set(self, ctx: StateHandlerContext, status: S, data: Any = None) -> None:
        await self.inner.set(ctx, status, data)
        await asyncio.sleep(0)  # the reply on its way back

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await self.inner.release_lock_as_failed(ctx, error_detail)
        await asyncio.sleep(0)  # the reply on its way back

    async def upsert(self, ctx: StateHandlerContext, data: Any = None) -> None:
        await self.inner.upsert(ctx, data)
        await asyncio.sleep(0)  # the reply on its way back

    async def reset_expired_locks(self) -> int:
        answer = await self.inner.reset_expired_locks()
        await asyncio.sleep(0)  # the reply on its way back
        return answer

    async def expire_past_retention(self) -> int:
        answer = await self.inner.expire_past_retention()
        await asyncio.sleep(0)  # the reply on its way back
        return answer


def annotated_with_a_begin(clock: Clock) -> InMemoryStateHandler:
    """Annotated with a class that has ``begin``; returns a wrapper that has none."""
    return WithoutBegin(InMemoryStateHandler(clock))  # type: ignore[return-value]


def test_whether_a_handler_begins_is_read_from_the_handler_not_the_annotation() -> None:
    assert native_begin(annotated_with_a_begin(ManualClock(START))) is None
    assert not begins_natively(annotated_with_a_begin)
    assert not hasattr(build_machine(annotated_with_a_begin), "begin")

    # And the other way round: annotated with a class without begin, it answers one.
    def annotated_without(clock: Clock) -> WithoutBegin:
        return BeginOverProcessed(clock)  # type: ignore[return-value]

    assert begins_natively(annotated_without)


def test_a_correct_handler_annotated_with_a_begin_it_lacks_passes() -> None:
    # The composed begin is two calls, so a race can land between them; judged as a
    # native (atomic) begin it was a false alarm: exists_agrees_with_model, found by the
    # race matrix (ci's budget, whose preempted interleavings stop a call between the two).
    report = verify(annotated_with_a_begin, "dev", seed=SEED, probes=False, matrix="ci")
    assert report.error is None, report.error
    assert not report.violations, [v.render() for v in report.violations]
    assert report.coverage.exercised == report.coverage.applicable > 0
