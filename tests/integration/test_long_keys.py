"""Every store holds every key the docs allow: all parts at 256 characters of 4-byte UTF-8 at once.

``context.validate_key`` admits 256 characters per key part, of any Unicode
but NUL and lone surrogates.  In bytes the worst case is every part at its
limit in characters outside the Basic Multilingual Plane (4 bytes each in
UTF-8), drawn at random so that nothing compresses it: 1,024 bytes per part,
over 4 KiB for the record key alone.  A store that indexes the key parts as
they are (PostgreSQL's B-tree keeps at most 2,704 bytes per index row, InnoDB
3,072) refuses such a row, and the item can then never be acquired.

The same life of two items runs on each store (memory, SQLite file and memory,
PostgreSQL, MariaDB, Redis, and the Node.js PostgreSQL handler through the
protocol): begin, read, complete, supersede, release, take over, both
sweeps.  The second pair of items share the concatenation of their parts and
differ only in where one part ends, which a key hash over the plain
concatenation would merge.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, make_url

from dsm_sim.protocol.client import exec_factory
from reference_engine.begin import Acquired, begin
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import MAX_KEY_LENGTH, StateHandlerContext
from reference_engine.errors import ConfigurationError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql import prepared as P
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.factory import (
    mariadb_isolated_handler,
    postgres_isolated_handler,
    sql_handler,
    sqlite_file_handler,
    sqlite_memory_handler,
)
from reference_engine.handlers.sql.fastpath import render
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.key_hash import (
    KEY_HASH_INDEX,
    PARTS_INDEX,
    key_hash_of,
    key_hash_sql,
)
from reference_engine.handlers.sql.mariadb import current_key_of
from reference_engine.handlers.sql.prepared import Statement
from reference_engine.handlers.sql.schema import KEY_COLUMNS, process_state_logs
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
START = dt.datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
LOCK = dt.timedelta(minutes=30)
RETENTION = dt.timedelta(days=7)
Builder = Callable[[Clock], StateHandler]
NODE_DIR = Path(__file__).resolve().parents[2] / "handlers" / "node"


def astral_text(rng: random.Random, length: int = MAX_KEY_LENGTH) -> str:
    """``length`` random code points above U+FFFF: 4 bytes each in UTF-8, and incompressible."""
    return "".join(chr(rng.randrange(0x10000, 0x110000)) for _ in range(length))


def worst_case_base(seed: int) -> tuple[StateHandlerContext, str, str]:
    """A base context whose every text field is at its limit, and an entity key and item key."""
    rng = random.Random(seed)
    base = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id=astral_text(rng),
        entity_execution_id=astral_text(rng),
        tenant_id=astral_text(rng),
        source_app_id=astral_text(rng),
        handler_config=HandlerConfig(lock_duration=LOCK, retention=RETENTION),
    )
    return base, astral_text(rng), astral_text(rng)


BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("sqlite-memory", id="sqlite-memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", id="mariadb", marks=pytest.mark.mariadb),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("node-postgres", id="node-postgres", marks=pytest.mark.postgres),
]


def node_postgres(postgres_url: str) -> Builder:
    """``handlers/node/postgres.js`` through the protocol, on a schema of its own."""
    node = shutil.which("node")
    missing = "node is not installed" if node is None else None
    if node is not None and not (NODE_DIR / "node_modules" / "pg").is_dir():
        missing = f"the pg package is not installed: run npm ci in {NODE_DIR}"
    if missing is not None or node is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing} (CI=true: a missing tool is a failure, not a skip)")
        pytest.skip(str(missing))
    command = [node, str(NODE_DIR / "postgres.js")]
    return exec_factory(command, env={"DSM_NODE_PG_URL": postgres_url}, named_stores=False)


@pytest.fixture(params=BACKENDS)
def build(request: pytest.FixtureRequest) -> Builder:
    """A builder of fresh handlers of one store, each in a namespace of its own."""
    if request.param == "memory":
        return InMemoryStateHandler
    if request.param == "sqlite-file":
        return sqlite_file_handler
    if request.param == "sqlite-memory":
        return sqlite_memory_handler
    if request.param == "postgres":
        postgres: str = request.getfixturevalue("postgres_url")
        return lambda clock: postgres_isolated_handler(postgres, clock)
    if request.param == "mariadb":
        maria: str = request.getfixturevalue("mariadb_url")
        return lambda clock: mariadb_isolated_handler(maria, clock)
    if request.param == "node-postgres":
        return node_postgres(request.getfixturevalue("postgres_url"))
    redis: str = request.getfixturevalue("redis_url")
    return lambda clock: RedisStateHandler(
        redis, clock, prefix=f"dsm-long-keys-{uuid.uuid4().hex}", delete_on_close=True
    )


def test_every_operation_holds_a_key_at_every_limit_at_once(build: Builder) -> None:
    clock = ManualClock(START)
    base, entity_key, item_key = worst_case_base(seed=22)
    first = base.for_item(item_key, entity_key)
    # Same concatenation of parts, split one character apart.
    left = base.for_item(item_key[:-1], entity_key)
    right = base.for_item(entity_key[-1] + item_key[:-1], entity_key[:-1])

    async def main() -> None:
        handler = build(clock)
        await handler.open()
        try:
            begun = await begin(handler, first)
            assert begun == Acquired(1)
            assert not await handler.exists(first)
            held = first.with_lock_token(1)
            await handler.set(held, S.PROCESSED, {"v": 1})
            assert await handler.exists(first)
            await handler.upsert(first, {"v": 2})  # supersedes: a history row now exists
            record = await handler.get(first)
            assert record is not None
            assert (record.status, record.data, record.attempt) == (S.PROCESSED, {"v": 2}, 1)
            assert record.key == first.record_key
            assert record.entity_execution_id == base.entity_execution_id
            assert record.source_app_id == base.source_app_id

            assert await handler.try_acquire_lock(left) == 1
            assert await handler.try_acquire_lock(right) == 1
            await handler.release_lock_as_failed(left.with_lock_token(1), "boom")
            assert await handler.try_acquire_lock(left) == 2
            clock.advance(LOCK + dt.timedelta(seconds=1))
            assert await handler.reset_expired_locks() == 2
            for ctx in (left, right):
                swept = await handler.get(ctx)
                assert swept is not None and swept.key == ctx.record_key
                assert (swept.status, swept.error_detail) == (S.FAILED, SWEEP_ERROR_DETAIL)

            clock.advance(RETENTION)
            # The current record and its history row, and the two failed items.
            assert await handler.expire_past_retention() == 4
            expired = await handler.get(first)
            assert expired is not None and expired.status is S.EXPIRED
            assert await begin(handler, first) == Acquired(2)
        finally:
            await handler.close()

    asyncio.run(main())


# --- PostgreSQL: the key's hash ---------------------------------------------------------------


async def stored_rows(handler: SqlStateHandler) -> list[tuple[bytes, str, bool]]:
    """``(the key's hash as the index computes it, status, superseded)`` of every row."""
    table = f"{handler.schema_name}.{process_state_logs.name}"
    indexed = key_hash_sql(*(column.name for column in KEY_COLUMNS))
    async with handler.engine.connect() as conn:
        result = await conn.exec_driver_sql(
            f"SELECT {indexed}, status, superseded FROM {table} ORDER BY id"
        )
        return [
            (bytes(digest), status, superseded) for digest, status, superseded in map(tuple, result)
        ]


async def plan_of(handler: SqlStateHandler, statement: Statement, params: dict[str, Any]) -> str:
    """PostgreSQL's plan of ``statement`` as the handler sends it, sequential scans priced out."""
    raw = render(statement, handler.engine)
    async with handler.engine.connect() as conn:
        await conn.exec_driver_sql("SET enable_seqscan = off")
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        rows = await driver.fetch(f"EXPLAIN {raw.sql}", *raw.arguments(params))
        await conn.exec_driver_sql("RESET enable_seqscan")
    return "\n".join(row[0] for row in rows)


async def add_live_locks(handler: SqlStateHandler, count: int) -> None:
    """``count`` other items under live locks, and fresh statistics: a table the planner weighs.

    On an empty table every index costs the same; with many locks the index
    of the lock sweep is the one a lookup of the fenced writes must not take.
    """
    table = f"{handler.schema_name}.{process_state_logs.name}"
    async with handler.engine.begin() as conn:
        await conn.exec_driver_sql(
            f"INSERT INTO {table} (tenant_id, source_app_id, scope_id, scope_code, entity_id, "
            "entity_execution_id, item_entity_key, item_key, status, attempt, locked_until, "
            "superseded, created_at, updated_at) SELECT 'tenant-1', 'app', 4, 'Element', 'e', "
            "'run', '', 'item-' || i, 'processing', 1, $1, false, $1, $1 "
            f"FROM generate_series(1, {count}) AS i",
            (START + LOCK,),
        )
        await conn.exec_driver_sql(f"ANALYZE {table}")


@pytest.mark.postgres
def test_postgres_finds_every_key_through_the_index_of_its_hash(postgres_url: str) -> None:
    clock = ManualClock(START)
    base, entity_key, item_key = worst_case_base(seed=7)
    ctx = base.for_item(item_key, entity_key)

    async def main() -> None:
        handler = postgres_isolated_handler(postgres_url, clock)
        await handler.open()
        try:
            await handler.upsert(ctx, {"v": 1})
            await handler.upsert(ctx, {"v": 2})
            # The server's hash is the documented one: the parts in UTF-8, joined by NUL.
            digest = key_hash_of(ctx.record_key)
            assert digest == current_key_of(ctx.record_key)  # MariaDB's, for the same key
            assert await stored_rows(handler) == [
                (digest, "superseded", True),
                (digest, "processed", False),
            ]
            await add_live_locks(handler, 1000)
            key = P.key_params(ctx.record_key)
            stamped = P.fenced_params(ctx.with_lock_token(1), clock.now(), S.PROCESSED)
            lookups: dict[str, tuple[Statement, dict[str, Any]]] = {
                "exists": (P.EXISTS, {**key, "p_now": clock.now()}),
                "get": (P.CURRENT, key),
                "begin": (P.begin_statement(), P.acquire_params(ctx, clock.now())),
                "fenced set": (P.fenced_statement(with_data=False, with_error=False), stamped),
            }
            for name, (statement, params) in lookups.items():
                plan = await plan_of(handler, statement, params)
                # A lookup of the hash in its index, not a walk over the whole index.
                assert f"{KEY_HASH_INDEX} on" in plan, f"{name}:\n{plan}"
                assert "Index Cond: (sha256(" in plan, f"{name}:\n{plan}"
        finally:
            await handler.close()

    asyncio.run(main())


async def make_it_an_earlier_version(handler: SqlStateHandler) -> None:
    """The table as earlier versions created it: a unique index over the parts, not the hash."""
    table = f"{handler.schema_name}.{process_state_logs.name}"
    parts = ", ".join(column.name for column in KEY_COLUMNS)
    async with handler.engine.begin() as conn:
        await conn.exec_driver_sql(f"DROP INDEX {handler.schema_name}.{KEY_HASH_INDEX}")
        await conn.exec_driver_sql(
            f"CREATE UNIQUE INDEX {PARTS_INDEX} ON {table} ({parts}) WHERE superseded = false"
        )


@pytest.mark.postgres
def test_postgres_table_of_an_earlier_version_is_migrated_on_open(postgres_url: str) -> None:
    clock = ManualClock(START)
    plain = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="element-1",
        entity_execution_id="run-A",
        tenant_id="tenant-1",
        source_app_id="app-A",
        handler_config=HandlerConfig(lock_duration=LOCK, retention=RETENTION),
    ).for_item("inv-1")
    base, entity_key, item_key = worst_case_base(seed=3)
    wide = base.for_item(item_key, entity_key)

    async def main() -> None:
        handler = postgres_isolated_handler(postgres_url, clock)
        await handler.open()
        try:
            await handler.upsert(plain, {"v": 1})
            await handler.upsert(plain, {"v": 2})
            await make_it_an_earlier_version(handler)
            with pytest.raises(StoreError, match="ON CONFLICT"):  # not yet migrated
                await handler.try_acquire_lock(wide)

            await handler.open()  # what a restart on the new version does
            async with handler.engine.connect() as conn:
                indexes = await conn.run_sync(
                    lambda sync: {
                        index["name"]
                        for index in inspect(sync).get_indexes(
                            process_state_logs.name, schema=handler.schema_name
                        )
                    }
                )
            assert KEY_HASH_INDEX in indexes and PARTS_INDEX not in indexes
            digest = key_hash_of(plain.record_key)
            assert await stored_rows(handler) == [
                (digest, "superseded", True),
                (digest, "processed", False),
            ]
            assert await handler.exists(plain)
            await handler.upsert(plain, {"v": 3})  # the old rows are found through the new index
            current = await handler.get(plain)
            assert current is not None and current.data == {"v": 3}
            assert await handler.try_acquire_lock(wide) == 1
        finally:
            await handler.close()

    asyncio.run(main())


@pytest.mark.postgres
def test_postgres_database_that_is_not_utf8_is_refused_on_open(postgres_url: str) -> None:
    name = f"dsm_latin1_{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        admin = create_engine_for(postgres_url).execution_options(isolation_level="AUTOCOMMIT")
        async with admin.connect() as conn:
            await conn.exec_driver_sql(
                f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            )
        try:
            url = make_url(postgres_url).set(database=name)
            handler = sql_handler(url.render_as_string(hide_password=False), ManualClock(START))
            with pytest.raises(ConfigurationError, match=r"LATIN1.*UTF8"):
                await handler.open()
            await handler.close()
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
            await admin.dispose()

    asyncio.run(main())
