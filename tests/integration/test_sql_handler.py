"""The SQL handler against the reference model: SQLite (file and memory), PostgreSQL, MariaDB.

Every scenario runs the same calls on :class:`ReferenceModel` and on the
handler, and after each step compares what came back (value, or error class
and message) and what is stored (``get`` and ``exists`` of every item).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import (
    ConfigurationError,
    DsmError,
    InvalidItemError,
    LockHeldError,
    StaleLockError,
    StoreError,
    UnsupportedStatusError,
)
from reference_engine.handler import StateHandler
from reference_engine.handlers.sql.engine import create_engine_for, normalize_url
from reference_engine.handlers.sql.factory import (
    DEFAULT_DATABASE_URL,
    builtin_factory,
    database_url,
    mariadb_isolated_handler,
    mariadb_test_handler,
    postgres_isolated_handler,
    postgres_test_handler,
    sql_handler,
    sqlite_file_handler,
    sqlite_memory_handler,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.key_hash import KEY_HASH_INDEX
from reference_engine.handlers.sql.mariadb import CURRENT_KEY_INDEX
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.handlers.sql.statements import count_statements
from reference_engine.model import SWEEP_ERROR_DETAIL, ReferenceModel
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
T = process_state_logs
R = TypeVar("R")
LOCK = dt.timedelta(minutes=30)
RETENTION = dt.timedelta(days=7)
START = dt.datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
Builder = Callable[[Clock], SqlStateHandler]

BACKENDS = [
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("sqlite-file-core", id="sqlite-file-core"),
    pytest.param("sqlite-memory", id="sqlite-memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-core", id="postgres-core", marks=pytest.mark.postgres),
    pytest.param("mariadb", id="mariadb", marks=pytest.mark.mariadb),
    pytest.param("mariadb-core", id="mariadb-core", marks=pytest.mark.mariadb),
]


@pytest.fixture(params=BACKENDS)
def build(request: pytest.FixtureRequest) -> Builder:
    """A builder of fresh, isolated handlers of one backend (cleaned up on close)."""
    if request.param == "sqlite-file":
        return sqlite_file_handler
    if request.param == "sqlite-file-core":
        return lambda clock: without_fast_path(sqlite_file_handler(clock))
    if request.param == "sqlite-memory":
        return sqlite_memory_handler
    if request.param in ("mariadb", "mariadb-core"):
        maria: str = request.getfixturevalue("mariadb_url")
        if request.param == "mariadb-core":
            return lambda clock: without_fast_path(mariadb_isolated_handler(maria, clock))
        return lambda clock: mariadb_isolated_handler(maria, clock)
    url: str = request.getfixturevalue("postgres_url")
    if request.param == "postgres-core":
        return lambda clock: without_fast_path(postgres_isolated_handler(url, clock))
    return lambda clock: postgres_isolated_handler(url, clock)


def without_fast_path(handler: SqlStateHandler) -> SqlStateHandler:
    """The same handler on SQLAlchemy's own execution path (the driver fast path off)."""
    handler.repository.fast_path = None
    return handler


def run_on(build: Builder, clock: Clock, body: Callable[[SqlStateHandler], Awaitable[R]]) -> R:
    async def main() -> R:
        handler = build(clock)
        await handler.open()
        try:
            return await body(handler)
        finally:
            await handler.close()

    return asyncio.run(main())


def base(
    worker: str = "A",
    *,
    tenant: str = "tenant-1",
    scope_id: int = 4,
    entity: str = "element-1",
    retention: dt.timedelta | None = RETENTION,
) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=scope_id,
        scope_code="Element",
        entity_id=entity,
        entity_execution_id=f"run-{worker}",
        tenant_id=tenant,
        source_app_id=f"app-{worker}",
        handler_config=HandlerConfig(lock_duration=LOCK, retention=retention),
    )


# --- the table-driven comparison with the reference model ---------------------------------------


class Op(enum.Enum):
    ACQUIRE = "acquire"
    SET = "set"
    RELEASE = "release"
    UPSERT = "upsert"
    ADVANCE = "advance"
    RESET = "reset"
    EXPIRE = "expire"


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One call; ``with_token`` sends the worker's latest token for the item (if any)."""

    op: Op
    worker: str = "A"
    item: str = "item-1"
    status: IdempotencyStatus = S.PROCESSED
    data: Mapping[str, Any] | None = None
    detail: str = "boom"
    delta: dt.timedelta = dt.timedelta(0)
    with_token: bool = True


def acquire(worker: str = "A", item: str = "item-1") -> Step:
    return Step(Op.ACQUIRE, worker, item)


def set_(
    status: IdempotencyStatus,
    worker: str = "A",
    data: Mapping[str, Any] | None = None,
    *,
    item: str = "item-1",
    with_token: bool = True,
) -> Step:
    return Step(Op.SET, worker, item, status=status, data=data, with_token=with_token)


def release(worker: str = "A", detail: str = "boom", *, with_token: bool = True) -> Step:
    return Step(Op.RELEASE, worker, detail=detail, with_token=with_token)


def upsert(
    worker: str = "A", data: Mapping[str, Any] | None = None, *, with_token: bool = False
) -> Step:
    return Step(Op.UPSERT, worker, data=data, with_token=with_token)


def advance(**kwargs: float) -> Step:
    return Step(Op.ADVANCE, delta=dt.timedelta(**kwargs))


RESET = Step(Op.RESET)
EXPIRE = Step(Op.EXPIRE)

SCENARIOS: dict[str, list[Step]] = {
    "happy-path": [acquire(), acquire("B"), set_(S.PROCESSED, data={"invoice": 42}), acquire("B")],
    "failure-then-retry": [
        acquire(),
        release(detail="card declined"),
        acquire("B"),
        set_(S.PROCESSED, "B", {"ok": True}),
        release("B"),
    ],
    "expired-lock-takeover-fences-the-old-holder": [
        acquire(),
        advance(minutes=31),
        acquire("B"),
        set_(S.PROCESSED, "A", {"late": True}),
        release("A"),
        upsert("A", {"late": True}, with_token=True),
        set_(S.PROCESSED, "B", {"winner": "B"}),
    ],
    "lock-boundary-now-equals-locked-until-is-live": [
        acquire(),
        advance(minutes=30),
        acquire("B"),
        RESET,
        upsert("B", {"x": 1}),
        set_(S.SKIPPED, "B", with_token=False),
        advance(microseconds=1),
        RESET,
        acquire("B"),
    ],
    "holder-may-finish-after-expiry-if-unswept": [
        acquire(),
        advance(minutes=45),
        set_(S.PROCESSED, data={"slow": True}),
        RESET,
    ],
    "sweep-then-holder-is-stale": [
        acquire(),
        advance(hours=1),
        RESET,
        RESET,
        set_(S.PROCESSED, data={"slow": True}),
        acquire("B"),
    ],
    "expired-unswept-lock-counts-as-failed": [
        acquire(),
        advance(minutes=31),
        set_(S.EXPIRED, "B", with_token=False),
        acquire("B"),
        advance(minutes=31),
        set_(S.SKIPPED, "C", {"why": "operator"}, with_token=False),
        acquire("C"),
        upsert("C", {"v": 1}),
        set_(S.PROCESSED, "B"),
    ],
    "writes-without-the-lock": [
        set_(S.PROCESSED, with_token=False),
        set_(S.FAILED, with_token=False),
        set_(S.EXPIRED, with_token=False),
        release(with_token=False),
        acquire("B"),
        set_(S.PROCESSED, "A", with_token=False),
        set_(S.SKIPPED, "A", with_token=False),
        set_(S.EXPIRED, "A", with_token=False),
        upsert("A"),
        set_(S.PROCESSED, "B", {"v": 1}),
        set_(S.SKIPPED, "A", with_token=False),
        set_(S.SKIPPED, "A", {"why": "dup"}, with_token=False),
        set_(S.EXPIRED, "A", with_token=False),
        acquire("C"),
    ],
    "unsupported-statuses": [
        set_(S.PROCESSING, with_token=False),
        set_(S.SUPERSEDED, with_token=False),
        set_(S.NONE, with_token=False),
        acquire(),
        set_(S.PROCESSING),
    ],
    "upsert-supersedes-and-compresses": [
        upsert("A", {"v": 1}),
        upsert("B", {"v": 2}),
        upsert("C", None),
        acquire("D"),
        set_(S.SKIPPED, "D", with_token=False),
        upsert("D", {"v": 3}),
    ],
    "upsert-over-failed-expired-and-live-locks": [
        acquire(),
        upsert("B", {"v": 1}),
        release(),
        upsert("B", None),
        acquire("C"),
        upsert("C", {"v": 2}, with_token=True),
        upsert("C", {"v": 3}, with_token=True),
    ],
    "set-keeps-data-when-given-none": [
        acquire(),
        set_(S.PROCESSED, data={"keep": "me"}),
        set_(S.SKIPPED, with_token=False),
        set_(S.EXPIRED, with_token=False),
        acquire("B"),
        set_(S.FAILED, "B"),
        set_(S.SKIPPED, "B", {"replaced": 1}, with_token=False),
    ],
    "retention-expires-history-but-not-live-locks": [
        upsert("A", {"v": 1}),
        upsert("B", {"v": 2}),
        Step(Op.ACQUIRE, "C", item="item-2"),
        advance(days=8),
        EXPIRE,
        Step(Op.ACQUIRE, "C", item="item-3"),
        advance(hours=1),
        RESET,
        EXPIRE,
        EXPIRE,
        acquire("D"),
        set_(S.PROCESSED, "D", {"again": True}),
    ],
    "clock-jumps-backwards": [
        acquire(),
        advance(hours=-2),
        acquire("B"),
        advance(hours=3),
        RESET,
        acquire("B"),
        advance(hours=-5),
        set_(S.PROCESSED, "B"),
        EXPIRE,
    ],
    "many-items-one-sweep": [
        *(Step(Op.ACQUIRE, "A", item=f"bulk-{i}") for i in range(6)),
        Step(Op.SET, "A", item="bulk-0", status=S.PROCESSED),
        advance(minutes=31),
        RESET,
        *(Step(Op.ACQUIRE, "B", item=f"bulk-{i}") for i in range(6)),
    ],
}


class Comparison:
    """Drives the model and the handler in lock-step and records any divergence."""

    def __init__(self, handler: StateHandler, clock: ManualClock) -> None:
        self.handler = handler
        self.clock = clock
        self.model = ReferenceModel()
        self.tokens: dict[tuple[str, str], int] = {}
        self.items: set[str] = set()

    def ctx(self, step: Step) -> StateHandlerContext:
        token = self.tokens.get((step.worker, step.item)) if step.with_token else None
        return base(step.worker).for_item(step.item, lock_token=token)

    async def apply(self, step: Step) -> None:
        now = self.clock.now()
        ctx = self.ctx(step)
        self.items.add(step.item)
        model_outcome = self._outcome(lambda: self._model_call(step, ctx, now))
        try:
            value: Any = await self._handler_call(step, ctx)
            handler_outcome: tuple[str, Any] = ("ok", value)
        except DsmError as exc:
            handler_outcome = (type(exc).__name__, str(exc))
        assert handler_outcome == model_outcome, f"{step}: handler {handler_outcome}"
        if step.op is Op.ACQUIRE and handler_outcome[1] is not None:
            self.tokens[(step.worker, step.item)] = handler_outcome[1]
        for item in sorted(self.items):
            probe = base().for_item(item)
            assert await self.handler.get(probe) == self.model.get(probe, now), (step, item)
            assert await self.handler.exists(probe) == self.model.exists(probe, now), (step, item)

    @staticmethod
    def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
        try:
            return ("ok", call())
        except DsmError as exc:
            return (type(exc).__name__, str(exc))

    def _model_call(self, step: Step, ctx: StateHandlerContext, now: dt.datetime) -> Any:
        match step.op:
            case Op.ACQUIRE:
                return self.model.try_acquire_lock(ctx, now)
            case Op.SET:
                return self.model.set(ctx, step.status, step.data, now)
            case Op.RELEASE:
                return self.model.release_lock_as_failed(ctx, step.detail, now)
            case Op.UPSERT:
                return self.model.upsert(ctx, step.data, now)
            case Op.ADVANCE:
                return None
            case Op.RESET:
                return self.model.reset_expired_locks(now)
            case Op.EXPIRE:
                return self.model.expire_past_retention(now)

    async def _handler_call(self, step: Step, ctx: StateHandlerContext) -> Any:
        match step.op:
            case Op.ACQUIRE:
                return await self.handler.try_acquire_lock(ctx)
            case Op.SET:
                return await self.handler.set(ctx, step.status, step.data)
            case Op.RELEASE:
                return await self.handler.release_lock_as_failed(ctx, step.detail)
            case Op.UPSERT:
                return await self.handler.upsert(ctx, step.data)
            case Op.ADVANCE:
                self.clock.advance(step.delta)
                return None
            case Op.RESET:
                return await self.handler.reset_expired_locks()
            case Op.EXPIRE:
                return await self.handler.expire_past_retention()


@pytest.mark.parametrize("steps", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_matches_the_reference_model(build: Builder, steps: list[Step]) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        comparison = Comparison(handler, clock)
        for step in steps:
            await comparison.apply(step)
        history = [
            (record.key.item_key, record.status.value) for record in comparison.model.superseded
        ]
        assert sorted(await stored_history(handler)) == sorted(history)

    run_on(build, clock, body)


async def stored_history(handler: SqlStateHandler) -> list[tuple[str, str]]:
    """The superseded rows as stored, read around the handler's own methods."""
    query = select(T.c.item_key, T.c.status).where(T.c.superseded.is_(True))
    async with handler.engine.connect() as conn:
        return [(row.item_key, row.status) for row in await conn.execute(query)]


def test_superseded_history_is_kept_and_expired_with_the_record(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        ctx = base().for_item("inv-1")
        for version in range(3):
            await handler.upsert(ctx, {"version": version})
        assert sorted(await stored_history(handler)) == [("inv-1", "superseded")] * 2
        current = await handler.get(ctx)
        assert current is not None
        assert current.data == {"version": 2}
        assert current.attempt == 1
        clock.advance(RETENTION + dt.timedelta(seconds=1))
        assert await handler.expire_past_retention() == 3
        assert sorted(await stored_history(handler)) == [("inv-1", "expired")] * 2

    run_on(build, clock, body)


# --- isolation, fencing, boundaries ---------------------------------------------------------------


def test_same_item_key_in_other_tenants_scopes_and_entities_never_collides(build: Builder) -> None:
    clock = ManualClock(START)
    owners = [
        base(tenant="tenant-1"),
        base(tenant="tenant-2"),
        base(tenant="tenant-1", scope_id=3),
        base(tenant="tenant-1", entity="element-2"),
    ]

    async def body(handler: SqlStateHandler) -> None:
        contexts = [owner.for_item("order-7") for owner in owners]
        tokens = [await handler.try_acquire_lock(ctx) for ctx in contexts]
        assert tokens == [1, 1, 1, 1]
        first = dataclasses.replace(contexts[0], lock_token=1)
        await handler.set(first, S.PROCESSED, {"who": "tenant-1"})
        assert [await handler.exists(ctx) for ctx in contexts] == [True, False, False, False]
        others = [await handler.get(ctx) for ctx in contexts[1:]]
        assert [record.status if record else None for record in others] == [S.PROCESSING] * 3
        assert {record.key.tenant_id for record in others if record} == {"tenant-1", "tenant-2"}
        sub_a = owners[0].for_item("order-7", "line-1")
        assert await handler.try_acquire_lock(sub_a) == 1

    run_on(build, clock, body)


def test_stale_token_write_is_rejected_and_changes_nothing(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        a = base("A").for_item("pay-1")
        b = base("B").for_item("pay-1")
        assert await handler.try_acquire_lock(a) == 1
        clock.advance(LOCK + dt.timedelta(seconds=1))
        assert await handler.try_acquire_lock(b) == 2
        before = await handler.get(b)
        for write in (
            handler.set(dataclasses.replace(a, lock_token=1), S.PROCESSED, {"double": True}),
            handler.release_lock_as_failed(dataclasses.replace(a, lock_token=1), "late"),
            handler.upsert(dataclasses.replace(a, lock_token=1), {"double": True}),
            handler.set(dataclasses.replace(a, lock_token=7), S.PROCESSED),
        ):
            with pytest.raises(StaleLockError) as caught:
                await write
            assert caught.value.current_token == 2
            assert caught.value.status == "Processing"
        assert await handler.get(b) == before

    run_on(build, clock, body)


def test_lock_is_live_at_exactly_locked_until_and_the_sweep_leaves_it(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        a = base("A").for_item("edge")
        assert await handler.try_acquire_lock(a) == 1
        record = await handler.get(a)
        assert record is not None
        assert record.locked_until == START + LOCK
        clock.set(START + LOCK)
        assert await handler.try_acquire_lock(base("B").for_item("edge")) is None
        assert await handler.reset_expired_locks() == 0
        with pytest.raises(LockHeldError):
            await handler.upsert(base("B").for_item("edge"), {"x": 1})
        clock.advance(dt.timedelta(microseconds=1))
        assert await handler.reset_expired_locks() == 1
        swept = await handler.get(a)
        assert swept is not None
        assert (swept.status, swept.locked_until, swept.error_detail) == (
            S.FAILED,
            None,
            SWEEP_ERROR_DETAIL,
        )

    run_on(build, clock, body)


def test_timestamps_round_trip_as_aware_utc(build: Builder) -> None:
    instant = dt.datetime(2026, 10, 25, 0, 59, 59, 999999, tzinfo=UTC)
    clock = ManualClock(instant)

    async def body(handler: SqlStateHandler) -> None:
        ctx = base().for_item("tz")
        await handler.try_acquire_lock(ctx)
        record = await handler.get(ctx)
        assert record is not None
        for value, expected in (
            (record.created_at, instant),
            (record.updated_at, instant),
            (record.locked_until, instant + LOCK),
            (record.retain_until, instant + RETENTION),
        ):
            assert value == expected
            assert value is not None
            assert value.utcoffset() == dt.timedelta(0)
            assert value.tzinfo is UTC
        if handler.engine.dialect.name == "sqlite":
            async with handler.engine.connect() as conn:
                raw = (
                    await conn.execute(text("SELECT created_at FROM process_state_logs"))
                ).scalar()
            assert raw == "2026-10-25T00:59:59.999999Z"

    run_on(build, clock, body)


KEYS = [
    "it's",
    'say "hi"',
    "'; DROP TABLE process_state_logs; --",
    "100% _match_ \\ escaped",
    "ключ-🔑-鍵",
    "a",
    "A",
    "a ",
    " a",
]


def test_keys_with_quotes_sql_and_unicode_are_stored_verbatim(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        owner = base(tenant="o'brien; --", entity="élément")
        for index, key in enumerate(KEYS):
            ctx = owner.for_item(key, item_entity_key=key[::-1])
            assert await handler.try_acquire_lock(ctx) == 1, key
            held = dataclasses.replace(ctx, lock_token=1)
            await handler.set(held, S.PROCESSED, {"key": key, "n": index})
        for index, key in enumerate(KEYS):
            record = await handler.get(owner.for_item(key, item_entity_key=key[::-1]))
            assert record is not None
            assert (record.key.item_key, record.key.item_entity_key) == (key, key[::-1])
            assert record.key.tenant_id == "o'brien; --"
            assert record.data == {"key": key, "n": index}
        async with handler.engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(T))).scalar()
        assert rows == len(KEYS)

    run_on(build, clock, body)


def test_open_is_idempotent_and_keeps_rows(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        ctx = base().for_item("persist")
        await handler.upsert(ctx, {"v": 1})
        await handler.open()
        await handler.open()
        record = await handler.get(ctx)
        assert record is not None
        assert record.data == {"v": 1}

    run_on(build, clock, body)


def test_a_sqlite_start_reads_once_and_creates_in_one_transaction(tmp_path: Path) -> None:
    # A start reads sqlite_master once; only a store that lacks something reads it again
    # inside BEGIN IMMEDIATE (concurrent starts queue there) and creates what is missing.
    url = f"sqlite+aiosqlite:///{tmp_path / 'dsm.db'}"
    clock = ManualClock(START)

    async def body() -> list[list[str]]:
        starts: list[list[str]] = []
        for _ in range(2):
            handler = SqlStateHandler(create_engine_for(url), clock)
            sent: list[str] = []
            event.listen(
                handler.engine.sync_engine,
                "before_cursor_execute",
                lambda _c, _cur, sql, *_rest, _sent=sent: _sent.append(sql.split("(")[0].strip()),
            )
            await handler.open()
            starts.append(sent)
            await handler.close()
        return starts

    fresh, again = asyncio.run(body())
    present = "SELECT name FROM sqlite_master WHERE tbl_name = ?"
    assert fresh[:4] == [present, "BEGIN IMMEDIATE", present, "CREATE TABLE process_state_logs"]
    assert sorted(fresh[4:]) == [  # in the order of a set
        "CREATE INDEX ix_process_state_logs_lock_sweep ON process_state_logs",
        "CREATE INDEX ix_process_state_logs_retention ON process_state_logs",
        "CREATE UNIQUE INDEX ux_process_state_logs_current_key ON process_state_logs",
    ]
    assert again == [present]


def test_open_recreates_a_missing_index_of_an_existing_table(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        await handler.upsert(base().for_item("kept"), {"v": 1})
        if handler.engine.dialect.name == "mariadb":
            # Without its unique index MariaDB would insert a second current row
            # instead of failing; drop it and check that open() puts it back.
            async with handler.engine.begin() as conn:
                await conn.exec_driver_sql(
                    f"DROP INDEX {CURRENT_KEY_INDEX} ON `{handler.schema_name}`.{T.name}"
                )
                assert CURRENT_KEY_INDEX not in await index_names(conn)
            await handler.open()
            async with handler.engine.connect() as conn:
                assert CURRENT_KEY_INDEX in await index_names(conn)
            assert await handler.try_acquire_lock(base().for_item("kept")) is None
            return
        unique = next(i for i in T.indexes if i.unique)
        async with handler.engine.begin() as conn:
            if handler.engine.dialect.name == "postgresql":
                # PostgreSQL's unique index is on the key's hash (key_hash.py).
                await conn.exec_driver_sql(f"DROP INDEX {handler.schema_name}.{KEY_HASH_INDEX}")
            else:
                await conn.run_sync(unique.drop)
        with pytest.raises(StoreError):
            await handler.try_acquire_lock(base().for_item("needs-the-index"))
        await handler.open()
        assert await handler.try_acquire_lock(base().for_item("needs-the-index")) == 1
        assert await handler.exists(base().for_item("kept"))

    run_on(build, clock, body)


async def index_names(conn: AsyncConnection) -> set[str]:
    def read(sync: Any) -> set[str]:
        schema = sync.schema_for_object(T)
        return {str(index["name"]) for index in inspect(sync).get_indexes(T.name, schema=schema)}

    return await conn.run_sync(read)


def test_bad_input_raises_before_anything_is_written(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        ctx = base().for_item("bad")
        token = await handler.try_acquire_lock(ctx)
        held = dataclasses.replace(ctx, lock_token=token)
        before = await handler.get(ctx)
        with pytest.raises(InvalidItemError):
            await handler.set(held, S.PROCESSED, {"when": dt.datetime(2026, 1, 1)})
        with pytest.raises(InvalidItemError):
            await handler.upsert(held, {"nan": float("nan")})
        with pytest.raises(UnsupportedStatusError):
            await handler.set(held, S.SUPERSEDED)
        with pytest.raises(InvalidItemError):
            await handler.try_acquire_lock(base())
        with pytest.raises(InvalidItemError, match="error_detail"):
            await handler.release_lock_as_failed(held, "bad \x00 detail")
        assert await handler.get(ctx) == before
        odd_fields: list[tuple[str, Any]] = [
            ("tenant_id", "t-\udc80"),
            ("entity_execution_id", "run\x00"),
            ("source_app_id", 7),
        ]
        for field, value in odd_fields:
            odd = dataclasses.replace(held, **{field: value})
            for call in (
                handler.try_acquire_lock(odd),
                handler.set(odd, S.PROCESSED),
                handler.upsert(odd, {"v": 1}),
                handler.exists(odd),
            ):
                with pytest.raises(InvalidItemError, match=field):
                    await call
        assert await handler.get(ctx) == before

    run_on(build, clock, body)


def test_retention_never_expires_a_live_lock(build: Builder) -> None:
    clock = ManualClock(START)
    short = dataclasses.replace(
        base(),
        handler_config=HandlerConfig(
            lock_duration=dt.timedelta(hours=2), retention=dt.timedelta(hours=1)
        ),
    )

    async def body(handler: SqlStateHandler) -> None:
        model = ReferenceModel()
        ctx = short.for_item("long-job")
        assert await handler.try_acquire_lock(ctx) == model.try_acquire_lock(ctx, START) == 1
        clock.advance(dt.timedelta(minutes=90))
        assert await handler.expire_past_retention() == model.expire_past_retention(clock.now())
        record = await handler.get(ctx)
        assert record is not None
        assert record.status is S.PROCESSING
        clock.advance(dt.timedelta(minutes=31))
        assert (
            await handler.expire_past_retention() == model.expire_past_retention(clock.now()) == 1
        )
        assert await handler.get(ctx) == model.get(ctx, clock.now())

    run_on(build, clock, body)


# --- statement counts -----------------------------------------------------------------------------


def test_each_operation_is_one_statement_and_a_sweep_of_any_size_is_one(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> dict[str, int]:
        counts: dict[str, int] = {}

        async def measure(name: str, call: Awaitable[Any]) -> Any:
            with count_statements(handler.engine) as log:
                result = await call
            counts[name] = log.count
            return result

        ctx = base().for_item("count")
        await measure("exists", handler.exists(ctx))
        await measure("get", handler.get(ctx))
        token = await measure("acquire", handler.try_acquire_lock(ctx))
        await measure("acquire-refused", handler.try_acquire_lock(base("B").for_item("count")))
        await measure("set", handler.set(dataclasses.replace(ctx, lock_token=token), S.PROCESSED))
        other = base().for_item("count-2")
        token = await handler.try_acquire_lock(other)
        await measure(
            "release",
            handler.release_lock_as_failed(dataclasses.replace(other, lock_token=token), "x"),
        )
        await measure("skip", handler.set(base().for_item("count-3"), S.SKIPPED))
        await measure("upsert-fresh", handler.upsert(base().for_item("count-4"), {"v": 1}))
        await measure("upsert-supersede", handler.upsert(base().for_item("count-4"), {"v": 2}))
        for i in range(25):
            await handler.try_acquire_lock(base().for_item(f"sweep-{i}"))
        clock.advance(LOCK + dt.timedelta(seconds=1))
        swept = await measure("reset-25", handler.reset_expired_locks())
        assert swept == 25
        await measure("reset-0", handler.reset_expired_locks())
        clock.advance(RETENTION)
        expired = await measure("expire-30", handler.expire_past_retention())
        assert expired == 30
        return counts

    counts = run_on(build, clock, body)
    assert counts == {
        "exists": 1,
        "get": 1,
        "acquire": 1,
        "acquire-refused": 1,
        "set": 1,
        "release": 1,
        "skip": 1,
        "upsert-fresh": 2,
        "upsert-supersede": 2,
        "reset-25": 1,
        "reset-0": 1,
        "expire-30": 1,
    }


# --- store failures -------------------------------------------------------------------------------


def test_driver_failures_surface_as_store_error(build: Builder) -> None:
    clock = ManualClock(START)

    async def body(handler: SqlStateHandler) -> None:
        async with handler.engine.begin() as conn:
            await conn.run_sync(T.drop)
        for call in (
            handler.exists(base().for_item("x")),
            handler.try_acquire_lock(base().for_item("x")),
            handler.reset_expired_locks(),
        ):
            with pytest.raises(StoreError) as caught:
                await call
            assert caught.value.__cause__ is not None
            assert not isinstance(caught.value.__cause__, DsmError)
        await handler.open()
        assert await handler.try_acquire_lock(base().for_item("x")) == 1

    run_on(build, clock, body)


def test_unreachable_postgres_is_a_store_error() -> None:
    handler = sql_handler("postgresql://nobody@127.0.0.1:1/none", ManualClock(START))

    async def main() -> None:
        try:
            with pytest.raises(StoreError) as caught:
                await handler.try_acquire_lock(base().for_item("x"))
            assert caught.value.__cause__ is not None
            assert not isinstance(caught.value.__cause__, DsmError)
        finally:
            await handler.close()

    asyncio.run(main())


def test_unreachable_mariadb_is_a_store_error_naming_the_store() -> None:
    handler = mariadb_isolated_handler("mariadb://nobody@127.0.0.1:1/none", ManualClock(START))

    async def main() -> None:
        try:
            for call in (handler.open(), handler.try_acquire_lock(base().for_item("x"))):
                with pytest.raises(StoreError, match="mariadb store") as caught:
                    await call
                assert caught.value.__cause__ is not None
                assert not isinstance(caught.value.__cause__, DsmError)
        finally:
            await handler.close()

    asyncio.run(main())


@pytest.mark.postgres
def test_a_server_refusing_the_connection_is_a_store_error_on_every_operation(
    postgres_url: str,
) -> None:
    """A server that answers but refuses (restarting, or no such database) is a StoreError.

    The refusal comes back as the dialect's DBAPI error from the pool's connect,
    which is what the fast path meets while PostgreSQL restarts
    (``CannotConnectNowError``): it must not escape as a bare driver error.
    """
    url = make_url_database(postgres_url, "dsm_no_such_database")
    handler = sql_handler(url, ManualClock(START))
    ctx = base().for_item("x")
    held = ctx.for_item("x", lock_token=1)

    async def main() -> None:
        try:
            for call in (
                lambda: handler.exists(ctx),
                lambda: handler.try_acquire_lock(ctx),
                lambda: handler.set(held, S.PROCESSED, {"a": 1}),
                lambda: handler.release_lock_as_failed(held, "boom"),
                lambda: handler.get(ctx),
                lambda: handler.upsert(ctx, {"a": 2}),
                handler.reset_expired_locks,
            ):
                with pytest.raises(StoreError, match="dsm_no_such_database") as caught:
                    await call()
                assert caught.value.__cause__ is not None
                assert not isinstance(caught.value.__cause__, DsmError)
        finally:
            await handler.close()

    asyncio.run(main())


def make_url_database(url: str, database: str) -> str:
    return normalize_url(url).set(database=database).render_as_string(hide_password=False)


# --- URLs and factories ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("sqlite:///dsm.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite"),
        ("postgresql://app@db:5432/dsm", "postgresql+asyncpg"),
        ("postgres://app@db/dsm", "postgresql+asyncpg"),
        ("postgresql+psycopg2://app@db/dsm", "postgresql+asyncpg"),
        ("mariadb://app@db/dsm", "mariadb+asyncmy"),
        ("mysql+asyncmy://app@db/dsm", "mariadb+asyncmy"),
        ("mysql+aiomysql://app@db/dsm", "mariadb+asyncmy"),
    ],
)
def test_urls_are_mapped_to_the_async_drivers(url: str, driver: str) -> None:
    assert normalize_url(url).drivername == driver


@pytest.mark.parametrize("url", ["oracle://app@db/dsm", "not a url", ""])
def test_unsupported_urls_are_refused_with_the_supported_list(url: str) -> None:
    with pytest.raises(ConfigurationError, match="sqlite"):
        normalize_url(url)


@pytest.mark.parametrize("name", ["Bad", "1abc", "a-b", "x; drop", "a" * 64, ""])
def test_schema_names_must_be_plain_identifiers(name: str) -> None:
    with pytest.raises(ConfigurationError, match="schema name"):
        create_engine_for("postgresql://app@db/dsm", schema=name)


def test_a_schema_is_refused_for_sqlite() -> None:
    with pytest.raises(ConfigurationError, match="for PostgreSQL and MariaDB"):
        create_engine_for("sqlite:///dsm.db", schema="dsm_x")


def test_mariadb_test_handler_needs_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSM_TEST_MARIADB_URL", raising=False)
    with pytest.raises(ConfigurationError, match="DSM_TEST_MARIADB_URL"):
        mariadb_test_handler(ManualClock(START))


def test_mariadb_isolation_refuses_other_backends() -> None:
    with pytest.raises(ConfigurationError, match="MariaDB URL"):
        mariadb_isolated_handler("postgresql://app@db/dsm", ManualClock(START))


def test_postgres_test_handler_needs_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSM_TEST_POSTGRES_URL", raising=False)
    with pytest.raises(ConfigurationError, match="DSM_TEST_POSTGRES_URL"):
        postgres_test_handler(ManualClock(START))


def test_builtin_factory_honours_the_environment_and_serves_the_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "from-env.db"
    monkeypatch.setenv("DSM_DATABASE_URL", f"sqlite:///{path}")
    assert database_url() == f"sqlite:///{path}"
    registry = HandlerRegistry(ManualClock(START))
    registry.register("built-in", builtin_factory())

    async def main() -> None:
        handler = await registry.resolve("built-in")
        assert handler is await registry.resolve("built-in")
        assert isinstance(handler, SqlStateHandler)
        await handler.upsert(base().for_item("via-registry"), {"v": 1})
        await registry.close()

    asyncio.run(main())
    assert path.exists()
    monkeypatch.delenv("DSM_DATABASE_URL")
    assert database_url() == DEFAULT_DATABASE_URL == "sqlite+aiosqlite:///dsm.db"
    with pytest.raises(ConfigurationError):
        builtin_factory("oracle://app@db/dsm")


def test_sqlite_files_run_in_wal_mode_with_a_busy_timeout() -> None:
    handler = sqlite_file_handler(ManualClock(START))

    async def main() -> list[Any]:
        await handler.open()
        try:
            async with handler.engine.connect() as conn:
                return [
                    (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()
                    for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")
                ]
        finally:
            await handler.close()

    assert asyncio.run(main()) == ["wal", 30000, 1, 1]


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_fast_path_sends_the_statements_of_the_core_path(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """One source of truth: both paths send the same SQL with the same parameters."""
    isolated: Callable[[str, Clock], SqlStateHandler]
    if backend == "sqlite":
        url = ""
        isolated = lambda _url, clock: sqlite_file_handler(clock)  # noqa: E731
    else:
        isolated = postgres_isolated_handler if backend == "postgres" else mariadb_isolated_handler
        url = request.getfixturevalue(f"{backend}_url")

    def capture(handler: SqlStateHandler) -> list[tuple[str, object]]:
        clock = ManualClock(START)
        handler.clock = clock

        async def body(h: SqlStateHandler) -> list[tuple[str, object]]:
            ctx = base().for_item("same-sql")
            with count_statements(h.engine) as log:
                await h.exists(ctx)
                token = await h.try_acquire_lock(ctx)
                await h.set(dataclasses.replace(ctx, lock_token=token), S.PROCESSED, {"v": 1})
                other = base().for_item("same-sql-2")
                token = await h.try_acquire_lock(other)
                await h.release_lock_as_failed(dataclasses.replace(other, lock_token=token), "x")
                await h.get(ctx)
                await h.exists(other)
            schema = h.schema_name or ""
            return [
                (" ".join(sql.replace(schema, "<schema>").split()), params)
                for sql, params in zip(log.statements, log.parameters, strict=True)
            ]

        return run_on(lambda _clock: handler, clock, body)

    fast = capture(isolated(url, ManualClock(START)))
    core = capture(without_fast_path(isolated(url, ManualClock(START))))
    assert len(fast) == 7
    assert [sql for sql, _ in fast] == [sql for sql, _ in core]
    assert [list(params) for _, params in fast] == [list(params) for _, params in core]
