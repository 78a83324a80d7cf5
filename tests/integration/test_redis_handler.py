"""The Redis handler against the reference model, call by call, on a real Redis.

Each case drives the Redis handler and the in-memory handler (the reference
model) with the same calls on one ManualClock and, after every step, compares
the outcome (return value, or exception class and message) and every stored
record, superseded history included.  Each test works under its own key
prefix, deleted on close, so runs sharing the server never meet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from tiers import every_other_nightly

from dsm_sim.conformance.suite import ConformanceSuite
from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import (
    ConfigurationError,
    LockHeldError,
    StaleLockError,
    StoreError,
)
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.handlers.redis_factory import (
    REDIS_KEY,
    TEST_REDIS_ENV,
    builtin_redis_factory,
    redis_test_handler,
    redis_test_url,
)
from reference_engine.handlers.redis_handler import RedisKeyspace, RedisStateHandler
from reference_engine.handlers.redis_scripts import AUDIT_SLICE
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

pytestmark = [pytest.mark.integration, pytest.mark.redis]

S = IdempotencyStatus
START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
LOCK = dt.timedelta(minutes=30)
CONFIG = HandlerConfig(lock_duration=LOCK, retention=dt.timedelta(days=2))
TINY = dt.timedelta(microseconds=1)
#: An ``expect`` of a step that is compared with the model only, not with a fixed answer.
UNCHECKED: object = type("Unchecked", (), {"__repr__": lambda self: "UNCHECKED"})()


@dataclass(frozen=True, slots=True)
class Where:
    """Which record a step addresses; every component of the record key can vary."""

    item: str = "inv-1"
    tenant: str = "tenant-1"
    scope_id: int = 4
    entity: str = "element-1"
    item_entity_key: str = ""
    run: str = "run-1"
    config: HandlerConfig = CONFIG

    def ctx(self, token: int | None = None) -> StateHandlerContext:
        base = StateHandlerContext(
            scope_id=self.scope_id,
            scope_code="Element",
            entity_id=self.entity,
            entity_execution_id=self.run,
            tenant_id=self.tenant,
            source_app_id="app-1",
            handler_config=self.config,
        )
        return base.for_item(self.item, self.item_entity_key, lock_token=token)


A = Where()


@dataclass(frozen=True, slots=True)
class Op:
    """One step: a handler call, a clock move or a sweep."""

    name: str
    where: Where = A
    token: int | None = None
    status: IdempotencyStatus | None = None
    data: Mapping[str, Any] | None = None
    detail: str = ""
    delta: dt.timedelta = dt.timedelta(0)
    expect: object = field(default=UNCHECKED, compare=False)

    async def call(self, handler: StateHandler) -> object:
        ctx = self.where.ctx(self.token)
        match self.name:
            case "acquire":
                return await handler.try_acquire_lock(ctx)
            case "set":
                assert self.status is not None
                await handler.set(ctx, self.status, self.data)
                return None
            case "release":
                await handler.release_lock_as_failed(ctx, self.detail)
                return None
            case "upsert":
                await handler.upsert(ctx, self.data)
                return None
            case "exists":
                return await handler.exists(ctx)
            case "get":
                return await handler.get(ctx)
            case "sweep_locks":
                return await handler.reset_expired_locks()
            case "sweep_retention":
                return await handler.expire_past_retention()
        raise AssertionError(f"unknown step {self.name}")


def acquire(where: Where = A, expect: object = UNCHECKED) -> Op:
    return Op("acquire", where, expect=expect)


def set_(
    status: IdempotencyStatus,
    data: Mapping[str, Any] | None = None,
    token: int | None = None,
    where: Where = A,
    expect: object = UNCHECKED,
) -> Op:
    return Op("set", where, token=token, status=status, data=data, expect=expect)


def release(
    token: int | None, detail: str = "boom", where: Where = A, expect: object = UNCHECKED
) -> Op:
    return Op("release", where, token=token, detail=detail, expect=expect)


def upsert(
    data: Mapping[str, Any] | None,
    token: int | None = None,
    where: Where = A,
    expect: object = UNCHECKED,
) -> Op:
    return Op("upsert", where, token=token, data=data, expect=expect)


def exists(where: Where = A, expect: object = UNCHECKED) -> Op:
    return Op("exists", where, expect=expect)


def advance(delta: dt.timedelta) -> Op:
    return Op("advance", delta=delta)


def sweep_locks(expect: object = UNCHECKED) -> Op:
    return Op("sweep_locks", expect=expect)


def sweep_retention(expect: object = UNCHECKED) -> Op:
    return Op("sweep_retention", expect=expect)


Outcome = tuple[str, object]


async def outcome(op: Op, handler: StateHandler) -> Outcome:
    try:
        return ("returned", await op.call(handler))
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def _expected_kind(expect: object) -> str | None:
    """An exception class, or its name, means "this step must raise that"."""
    if isinstance(expect, type) and issubclass(expect, BaseException):
        return expect.__name__
    return expect if isinstance(expect, str) else None


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


@asynccontextmanager
async def redis_under_test(url: str, clock: ManualClock) -> AsyncIterator[RedisStateHandler]:
    """A handler under a fresh prefix; on exit its keys must be gone."""
    handler = RedisStateHandler(
        url, clock, prefix=f"dsm-it-{uuid.uuid4().hex}", delete_on_close=True
    )
    await handler.open()
    try:
        yield handler
    finally:
        await handler.close()
        probe = Redis.from_url(url, decode_responses=True)
        try:
            left = [k async for k in probe.scan_iter(match=handler.keys.pattern, count=1000)]
        finally:
            await probe.aclose()
        assert left == [], f"keys left behind after close: {left[:5]}"


def _snapshot(records: Sequence[object]) -> list[str]:
    return sorted(repr(r) for r in records)


class Pair:
    """The handler under test beside the reference model, on the same clock."""

    def __init__(self, handler: RedisStateHandler, clock: ManualClock) -> None:
        self.handler = handler
        self.clock = clock
        self.model = InMemoryStateHandler(clock)
        self.places: set[Where] = set()

    async def step(self, op: Op, *, full_compare: bool = True) -> Outcome:
        if op.name == "advance":
            self.clock.advance(op.delta)
            return ("returned", self.clock.now())
        self.places.add(dataclasses.replace(op.where, run="", config=CONFIG))
        expected = await outcome(op, self.model)
        actual = await outcome(op, self.handler)
        assert actual == expected, f"{op}: redis gave {actual}, the model {expected}"
        if op.expect is not UNCHECKED:
            kind = _expected_kind(op.expect)
            wanted = (kind, expected[1]) if kind else ("returned", op.expect)
            assert expected == wanted, f"{op}: the model itself answered {expected}"
        for where in self.places:
            ctx = where.ctx()
            assert await self.handler.get(ctx) == await self.model.get(ctx), f"after {op}"
        if full_compare:
            await self.compare_all(f"after {op}")
        return actual

    async def compare_all(self, when: str) -> None:
        stored = await self.handler.records()
        modelled = [r.to_state_record() for r in self.model.model.records()]
        assert _snapshot(stored) == _snapshot(modelled), when

    async def play(self, ops: Sequence[Op]) -> None:
        for op in ops:
            await self.step(op)


B = Where(item="inv-2")
C = Where(item="inv-3")
SHORT_RETENTION = HandlerConfig(lock_duration=dt.timedelta(hours=1), retention=LOCK)
KEEP_FOREVER = HandlerConfig(lock_duration=LOCK, retention=None)

CASES: dict[str, list[Op]] = {
    "happy path, then redelivery is refused": [
        exists(expect=False),
        acquire(expect=1),
        acquire(expect=None),
        set_(S.PROCESSED, {"charge": "ch_1"}, token=1),
        exists(expect=True),
        acquire(expect=None),
    ],
    "failure is released, then retried with the next token": [
        acquire(expect=1),
        release(1, "BillingError: unavailable"),
        exists(expect=False),
        acquire(expect=2),
        set_(S.PROCESSED, {"ok": True}, token=2),
        release(2, expect=StaleLockError),
    ],
    "now == locked_until is live; one microsecond later it is taken over": [
        acquire(expect=1),
        advance(LOCK),
        acquire(expect=None),
        set_(S.SKIPPED, expect=LockHeldError),
        upsert({"late": 1}, expect=LockHeldError),
        advance(TINY),
        exists(expect=False),
        acquire(expect=2),
        set_(S.PROCESSED, {"x": 1}, token=1, expect=StaleLockError),
        set_(S.PROCESSED, {"x": 2}, token=2),
    ],
    "sweeps at the exact boundary leave the record alone": [
        acquire(expect=1),
        advance(LOCK),
        sweep_locks(expect=0),
        advance(TINY),
        sweep_locks(expect=1),
        upsert({"v": 1}),
        advance(dt.timedelta(days=2)),
        sweep_retention(expect=0),
        advance(TINY),
        sweep_retention(expect=1),
    ],
    "an expired, unswept holder may still finish": [
        acquire(expect=1),
        advance(LOCK * 2),
        set_(S.PROCESSED, {"slow": True}, token=1),
        exists(expect=True),
    ],
    "the sweep fails expired locks only, and fences their holders off": [
        acquire(expect=1),
        acquire(B, expect=1),
        advance(LOCK + TINY),
        acquire(C, expect=1),
        sweep_locks(expect=2),
        sweep_locks(expect=0),
        set_(S.PROCESSED, {"x": 1}, token=1, expect=StaleLockError),
        release(1, where=B, expect=StaleLockError),
        set_(S.PROCESSED, {"x": 3}, token=1, where=C),
        acquire(expect=2),
    ],
    "upsert: compressed happy path, then supersede, keeping history": [
        upsert({"v": 1}),
        upsert({"v": 2}),
        upsert(None),
        exists(expect=True),
        set_(S.SKIPPED),
        upsert({"v": 4}, expect="ForbiddenTransitionError"),
    ],
    "upsert with and without the lock": [
        acquire(expect=1),
        upsert({"v": 1}, expect=LockHeldError),
        upsert({"v": 2}, token=1),
        upsert({"v": 3}, token=1, expect=StaleLockError),
        acquire(B, expect=1),
        release(1, where=B),
        upsert({"b": 1}, where=B),
    ],
    "set without a token: skip, expire, retry from expired": [
        set_(S.SKIPPED, {"why": "duplicate"}),
        exists(expect=True),
        set_(S.SKIPPED),
        set_(S.EXPIRED),
        exists(expect=False),
        acquire(expect=1),
        set_(S.PROCESSED, None, token=1),
    ],
    "refusals: lock needed, unsupported statuses, forbidden transitions": [
        set_(S.PROCESSED, {"x": 1}, expect="LockNotHeldError"),
        set_(S.FAILED, expect="LockNotHeldError"),
        set_(S.SUPERSEDED, expect="UnsupportedStatusError"),
        set_(S.PROCESSING, expect="UnsupportedStatusError"),
        set_(S.EXPIRED, expect="ForbiddenTransitionError"),
        release(None, expect="LockNotHeldError"),
        release(7, expect=StaleLockError),
        upsert({"v": 1}),
        release(1, expect=StaleLockError),
        set_(S.PROCESSED, {"v": 2}, expect="LockNotHeldError"),
        set_(S.EXPIRED),
        set_(S.SKIPPED),
        set_(S.EXPIRED),
    ],
    "retention sweep expires current and superseded records, never a live lock": [
        upsert({"v": 1}),
        upsert({"v": 2}),
        acquire(Where(item="short", config=SHORT_RETENTION), expect=1),
        acquire(Where(item="forever", config=KEEP_FOREVER), expect=1),
        advance(dt.timedelta(minutes=45)),
        sweep_retention(expect=0),
        advance(dt.timedelta(days=3)),
        sweep_retention(expect=3),
        sweep_retention(expect=0),
        exists(expect=False),
        acquire(expect=2),
        sweep_locks(expect=1),
    ],
    "a backwards clock jump makes an expired lock live again": [
        acquire(expect=1),
        advance(LOCK + dt.timedelta(minutes=5)),
        advance(dt.timedelta(minutes=-10)),
        acquire(expect=None),
        sweep_locks(expect=0),
        advance(dt.timedelta(minutes=20)),
        sweep_locks(expect=1),
    ],
    "tenant, scope, entity and item entity key each isolate records": [
        acquire(expect=1),
        acquire(Where(tenant="tenant-2"), expect=1),
        acquire(Where(scope_id=3), expect=1),
        acquire(Where(entity="element-2"), expect=1),
        acquire(Where(item_entity_key="customer-9"), expect=1),
        set_(S.PROCESSED, {"t": 1}, token=1, where=Where(tenant="tenant-2")),
        exists(expect=False),
        exists(Where(tenant="tenant-2"), expect=True),
    ],
    "key components cannot be shifted into one another": [
        acquire(Where(item_entity_key="a/1:b", item="c"), expect=1),
        acquire(Where(item_entity_key="a", item="b/1:c"), expect=1),
        acquire(Where(entity="x:rec:", item="y"), expect=1),
        acquire(Where(entity="x", item=":rec:y"), expect=1),
        acquire(Where(item="'; DROP TABLE process_state_logs; --"), expect=1),
        acquire(Where(item="* ? [a-z] \\ {tag}"), expect=1),
        acquire(Where(item="ключ-键-🔑"), expect=1),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=list(CASES))
def test_redis_matches_the_model(redis_url: str, steps: list[Op]) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            await Pair(handler, clock).play(steps)

    run(scenario)


def _random_op(rng: random.Random, places: Sequence[Where]) -> Op:
    where = rng.choice(places)
    token = rng.choice([None, None, 1, 2, 3])
    data = rng.choice([None, {"n": rng.randrange(100)}])
    kind = rng.choices(
        ["acquire", "set", "release", "upsert", "exists", "advance", "locks", "retention"],
        weights=[6, 5, 3, 3, 2, 4, 1, 1],
    )[0]
    match kind:
        case "acquire":
            return acquire(where)
        case "set":
            status = rng.choice([S.PROCESSED, S.FAILED, S.SKIPPED, S.EXPIRED, S.SUPERSEDED])
            return set_(status, data, token=token, where=where)
        case "release":
            return release(token, f"error {rng.randrange(10)}", where=where)
        case "upsert":
            return upsert(data, token=token, where=where)
        case "exists":
            return exists(where)
        case "advance":
            minutes = rng.choice([0, 1, 10, 29, 30, 31, 60 * 24, 60 * 49, -20])
            return advance(dt.timedelta(minutes=minutes) + rng.choice([TINY, dt.timedelta(0)]))
        case "locks":
            return sweep_locks()
    return sweep_retention()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_walks_match_the_model(redis_url: str, seed: int) -> None:
    """Seeded random call sequences; a failure names the seed and the step that diverged."""
    rng = random.Random(seed)
    places = [A, B, Where(tenant="tenant-2"), Where(config=SHORT_RETENTION, item="inv-s")]

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            pair = Pair(handler, clock)
            for number in range(250):
                await pair.step(_random_op(rng, places), full_compare=number % 25 == 0)
            await pair.compare_all(f"end of seed {seed}")

    run(scenario)


def test_fifty_concurrent_acquirers_one_winner(redis_url: str) -> None:
    """Fifty acquisitions in flight at once, over five clients: exactly one token is issued."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as first:
            clients = [first] + [
                RedisStateHandler(redis_url, clock, prefix=first.keys.prefix) for _ in range(4)
            ]
            try:
                for item in ("inv-1", "inv-2", "inv-3"):
                    ctx = Where(item=item).ctx()
                    tokens = await asyncio.gather(
                        *(clients[n % 5].try_acquire_lock(ctx) for n in range(50))
                    )
                    assert sorted(tokens, key=lambda t: t or 0) == [None] * 49 + [1]
                clock.advance(LOCK + TINY)
                ctx = A.ctx()
                retakes = await asyncio.gather(
                    *(clients[n % 5].try_acquire_lock(ctx) for n in range(50))
                )
                assert [t for t in retakes if t is not None] == [2]
            finally:
                for client in clients[1:]:
                    await client.close()

    run(scenario)


def test_concurrent_upserts_keep_every_version(redis_url: str) -> None:
    """Twenty racing upserts: one current record, nineteen superseded, none lost."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            await asyncio.gather(*(handler.upsert(A.ctx(), {"v": n}) for n in range(20)))
            stored = await handler.records()
            statuses = sorted(r.status.value for r in stored)
            assert statuses == ["processed"] + ["superseded"] * 19
            assert sorted(r.data["v"] for r in stored if r.data is not None) == list(range(20))

    run(scenario)


def test_sweep_detail_and_stored_fields(redis_url: str) -> None:
    """What the sweep writes, checked directly rather than only against the model."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            assert await handler.try_acquire_lock(A.ctx()) == 1
            clock.advance(LOCK + TINY)
            assert await handler.reset_expired_locks() == 1
            record = await handler.get(A.ctx())
            assert record is not None
            assert (record.status, record.error_detail, record.locked_until) == (
                S.FAILED,
                SWEEP_ERROR_DETAIL,
                None,
            )
            assert record.retain_until == START + dt.timedelta(days=2)
            assert record.updated_at == START + LOCK + TINY

    run(scenario)


async def _full_audit_budget(url: str) -> int:
    """Sweeps that take the audit's cursor once around the whole database, plus one."""
    probe = Redis.from_url(url, decode_responses=True)
    try:
        return int(await probe.dbsize()) // AUDIT_SLICE + 2
    finally:
        await probe.aclose()


async def _lose(url: str, index: str, member: str | None) -> None:
    """What an operator's ZREM or DEL, an eviction or a partial restore does to an index."""
    probe = Redis.from_url(url, decode_responses=True)
    try:
        if member is None:
            assert await probe.delete(index) == 1
        else:
            assert await probe.zrem(index, member) == 1
    finally:
        await probe.aclose()


@pytest.mark.parametrize("loss", ["one-entry", "whole-index"])
def test_a_lock_whose_index_entry_was_lost_is_still_swept(redis_url: str, loss: str) -> None:
    """The sweep reads the lock index; a record missing from it must not stay Processing."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            assert await handler.try_acquire_lock(A.ctx()) == 1
            assert await handler.try_acquire_lock(B.ctx()) == 1
            lost = handler.keys.record(A.ctx().record_key)
            await _lose(redis_url, handler.keys.locks, lost if loss == "one-entry" else None)
            budget = await _full_audit_budget(redis_url)
            clock.advance(LOCK + TINY)
            swept = 0
            for _ in range(budget):
                swept += await handler.reset_expired_locks()
                if swept == 2:
                    break
            assert swept == 2, f"{2 - swept} expired lock(s) left after {budget} sweeps"
            for where in (A, B):
                record = await handler.get(where.ctx())
                assert record is not None
                assert (record.status, record.error_detail) == (S.FAILED, SWEEP_ERROR_DETAIL)
            assert await handler.reset_expired_locks() == 0

    run(scenario)


def test_the_audit_restores_a_lost_entry_with_its_deadline_and_adds_nothing(
    redis_url: str,
) -> None:
    """Before the lock expires the sweep sweeps nothing, but the index is whole again."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            assert await handler.try_acquire_lock(A.ctx()) == 1
            await handler.upsert(B.ctx(), {"v": 1})
            lost = handler.keys.record(A.ctx().record_key)
            await _lose(redis_url, handler.keys.locks, lost)
            for _ in range(await _full_audit_budget(redis_url)):
                assert await handler.reset_expired_locks() == 0
            probe = Redis.from_url(redis_url, decode_responses=True)
            try:
                index = await probe.zrange(handler.keys.locks, 0, -1, withscores=True)
            finally:
                await probe.aclose()
            until = START + LOCK
            micros = (until - dt.datetime(1970, 1, 1, tzinfo=UTC)) // TINY
            assert index == [(lost, float(micros))]
            record = await handler.get(A.ctx())
            assert record is not None and record.status is S.PROCESSING

    run(scenario)


def test_a_record_whose_retention_entry_was_lost_still_expires(redis_url: str) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with redis_under_test(redis_url, clock) as handler:
            await handler.upsert(A.ctx(), {"v": 1})
            lost = handler.keys.record(A.ctx().record_key)
            await _lose(redis_url, handler.keys.retention, lost)
            budget = await _full_audit_budget(redis_url)
            clock.advance(dt.timedelta(days=2) + TINY)
            expired = 0
            for _ in range(budget):
                expired += await handler.expire_past_retention()
                if expired:
                    break
            assert expired == 1
            record = await handler.get(A.ctx())
            assert record is not None and record.status is S.EXPIRED

    run(scenario)


def test_test_factory_isolates_and_cleans_up(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEST_REDIS_ENV, redis_url)

    async def scenario() -> None:
        clock = ManualClock(START)
        one, two = redis_test_handler(clock), redis_test_handler(clock)
        assert one.keys.prefix != two.keys.prefix
        try:
            assert await one.try_acquire_lock(A.ctx()) == 1
            assert await two.try_acquire_lock(A.ctx()) == 1
        finally:
            await one.close()
        assert await two.get(A.ctx()) is not None
        assert await one.records() == []
        await one.close()
        await two.close()

    run(scenario)


def test_registry_builds_the_redis_handler_by_key(redis_url: str) -> None:
    async def scenario() -> None:
        registry = HandlerRegistry(ManualClock(START))
        prefix = f"dsm-it-{uuid.uuid4().hex}"
        registry.register(REDIS_KEY, builtin_redis_factory(redis_url, prefix=prefix))
        handler = await registry.resolve(REDIS_KEY)
        assert isinstance(handler, RedisStateHandler)
        handler.delete_on_close = True
        assert await registry.resolve(REDIS_KEY) is handler
        assert await handler.try_acquire_lock(A.ctx()) == 1
        await registry.close()

    run(scenario)


def test_configuration_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_REDIS_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=TEST_REDIS_ENV):
        redis_test_url()
    with pytest.raises(ConfigurationError, match=r"redis://, rediss:// or unix://") as info:
        builtin_redis_factory("postgresql://admin:s3cret@localhost/db")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigurationError, match="non-empty"):
        RedisKeyspace("")


def test_unreachable_redis_is_a_store_error() -> None:
    async def scenario() -> None:
        handler = RedisStateHandler("redis://127.0.0.1:1/0", ManualClock(START))
        with pytest.raises(StoreError, match="Redis command failed"):
            await handler.open()
        await handler.close()

    run(scenario)


class TestRedisConformance(ConformanceSuite):
    """The kit as a third party runs it: one test per property, on the Redis test factory."""

    @pytest.fixture
    def dsm_handler_factory(
        self, redis_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> HandlerFactory:
        monkeypatch.setenv(TEST_REDIS_ENV, redis_url)
        return redis_test_handler

    @pytest.fixture
    def dsm_seed(self) -> int:
        # Whether every property is reached must not be up to a drawn seed.
        return 0

    @pytest.fixture
    def dsm_profile(self) -> str:
        # dev keeps CI's budget; `nox -s conformance` runs the ci profile on Redis.
        return "dev"


@pytest.mark.parametrize(
    "path",
    every_other_nightly(sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.toml"))),
)
def test_the_chaos_scenarios_pass(
    path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipped scenario, first seed, with the invoice node on the Redis handler."""
    from dsm_sim.scenario import load_scenario
    from dsm_sim.simulator.run import run_scenario

    monkeypatch.setenv(TEST_REDIS_ENV, redis_url)
    result = run_scenario(load_scenario(path), 1, redis_test_handler)
    assert result.passed, f"{result.scenario.name}: {result.violated}; replay: {result.replay}"
