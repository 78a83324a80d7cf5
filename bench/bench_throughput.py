"""Built-in handler throughput against the raw driver running the same statement.

PostgreSQL against asyncpg, MariaDB against asyncmy.  The baseline is the
handler's own SQL: each statement is captured from the handler (text and
parameters, with ``count_statements``) and replayed through the driver, so
the ratio is the price of the handler's pool, checks and Python, not of a
different query.

Fair on purpose:

* the same statement text and parameters: every key-dependent parameter
  (the item key, and PostgreSQL's key hash) is replaced for each fresh key;
* the same round trips and transaction shape: PostgreSQL runs each statement
  alone in autocommit on both sides (the asyncpg pool is built without its
  per-release reset query, which the handler's pool does not send either);
  MariaDB runs the statement and ``COMMIT`` on both sides, as the handler does;
* the same number of connections, with the same session settings;
* contexts, keys and arguments built before the clock starts;
* every connection and statement warmed up first;
* the sides run in alternating rounds, so a change in machine load (other
  work shares the machine) hits all of them alike.

Columns: ``handler`` is the built-in handler as shipped (its fast path on the
raw driver connection); ``core path`` the same handler with the fast path
switched off, so every statement goes through SQLAlchemy Core; ``<driver>``
the bare statement through the driver's own pool, acquired and released per
operation, which is what an application on the raw driver would write;
``<driver> conn`` the floor: one connection per worker, no pool at all.
Target: handler/<driver> >= 0.9 at every concurrency.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncmy
import asyncpg
from asyncmy.constants import CLIENT
from common import BenchSkipped, SkippedTable, Table, postgres_url, timed
from sqlalchemy import URL, make_url

from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.engine import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    MARIADB_SESSION_SQL,
    client_timeout,
    drop_pg_schema,
    mariadb_timeout_sql,
    normalize_url,
)
from reference_engine.handlers.sql.factory import MARIADB_TEST_URL_ENV, sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.key_hash import key_hash_of
from reference_engine.handlers.sql.mariadb import drop_database
from reference_engine.handlers.sql.statements import count_statements
from reference_engine.scope import Scope

__all__ = ["MARIADB_TITLE", "POSTGRES_TITLE", "TITLE", "run"]

POSTGRES_TITLE = "Throughput on PostgreSQL: built-in handler vs raw asyncpg, same statement"
MARIADB_TITLE = "Throughput on MariaDB: built-in handler vs raw asyncmy, same statement"
TITLE = POSTGRES_TITLE
SENTINEL = "__bench_item_key__"
#: Alternating rounds per cell; each side's rate is its operations over its summed time.
ROUNDS = 6
SIDES = ("handler", "core", "pool", "conn")
OPERATIONS = ("try_acquire_lock", "exists")

#: One operation of one worker: (worker, index) -> awaitable.
Op = Callable[[int, int], Awaitable[Any]]


def _ctx(item: str) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=int(Scope.ELEMENT),
        scope_code=Scope.ELEMENT.code,
        entity_id="bench-node",
        entity_execution_id="bench-run",
        tenant_id="bench",
        source_app_id="bench",
        handler_config=HandlerConfig(lock_duration=dt.timedelta(minutes=30)),
    ).for_item(item)


@dataclass(frozen=True, slots=True)
class Captured:
    """A statement the handler sent, with its parameters and where the key sits in them."""

    sql: str
    args: tuple[Any, ...]
    #: Positions of the item key, and of its hash (PostgreSQL only).
    key_at: tuple[int, ...]
    hash_at: tuple[int, ...]

    def for_key(self, key: str) -> tuple[Any, ...]:
        """The same arguments for another item key (its hash included)."""
        args = list(self.args)
        for i in self.key_at:
            args[i] = key
        if self.hash_at:
            digest = key_hash_of(_ctx(key).record_key)
            for i in self.hash_at:
                args[i] = digest
        return tuple(args)


async def _capture(call: Callable[[], Awaitable[Any]], handler: SqlStateHandler) -> Captured:
    """The one data statement ``call`` sends; refuses a call that sends more."""
    with count_statements(handler.engine) as log:
        await call()
    if log.count != 1:
        raise RuntimeError(
            f"expected one statement, the handler sent {log.count}: {log.statements}"
        )
    args = tuple(log.parameters[0])
    sentinel_hash = key_hash_of(_ctx(SENTINEL).record_key)
    return Captured(
        sql=log.statements[0],
        args=args,
        key_at=tuple(i for i, a in enumerate(args) if a == SENTINEL),
        hash_at=tuple(i for i, a in enumerate(args) if a == sentinel_hash),
    )


class Driver:
    """The raw side of one backend: a pool of the handler's size and one connection per worker."""

    name = ""

    async def open(self, workers: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def pooled(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        raise NotImplementedError

    def pinned(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        raise NotImplementedError


async def _no_reset(_conn: asyncpg.Connection) -> None:
    """Return connections as they are: the handler's pool sends nothing on return either."""


class Asyncpg(Driver):
    """asyncpg, each statement alone (autocommit), with its prepared-statement cache."""

    name = "asyncpg"

    def __init__(self, url: URL) -> None:
        self.dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.pool: asyncpg.Pool | None = None
        self.conns: list[asyncpg.Connection] = []

    async def open(self, workers: int) -> None:
        # The handler's session and client-side bounds (engine.create_engine_for).
        limit = str(math.ceil(DEFAULT_STATEMENT_TIMEOUT_S * 1000))
        kwargs: dict[str, Any] = {
            "server_settings": {"statement_timeout": limit, "lock_timeout": limit},
            "timeout": DEFAULT_STATEMENT_TIMEOUT_S,
            "command_timeout": client_timeout(DEFAULT_STATEMENT_TIMEOUT_S),
        }
        self.pool = await asyncpg.create_pool(
            self.dsn, min_size=workers, max_size=workers, reset=_no_reset, **kwargs
        )
        self.conns = [await asyncpg.connect(self.dsn, **kwargs) for _ in range(workers)]

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()
        if self.pool is not None:
            await self.pool.close()

    def pooled(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        pool, sql = self.pool, captured.sql
        assert pool is not None

        async def go(w: int, i: int) -> Any:
            async with pool.acquire() as conn:
                return await conn.fetchval(sql, *argv[w][i])

        return go

    def pinned(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        conns, sql = self.conns, captured.sql

        async def go(w: int, i: int) -> Any:
            return await conns[w].fetchval(sql, *argv[w][i])

        return go


class Asyncmy(Driver):
    """asyncmy with the handler's client flags and session settings; statement, then COMMIT."""

    name = "asyncmy"

    def __init__(self, url: URL) -> None:
        self.kwargs: dict[str, Any] = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "root",
            "password": url.password or "",
            "db": url.database,
            "charset": url.query.get("charset", "utf8mb4"),
            # SQLAlchemy's dialect connects with FOUND_ROWS: rowcount means "matched".
            "client_flag": CLIENT.FOUND_ROWS,
            # The handler's client-side bounds (engine.create_engine_for).
            "connect_timeout": math.ceil(DEFAULT_STATEMENT_TIMEOUT_S),
            "read_timeout": client_timeout(DEFAULT_STATEMENT_TIMEOUT_S),
        }
        self.pool: Any = None
        self.conns: list[Any] = []

    async def _session(self, conn: Any) -> None:
        async with conn.cursor() as cur:
            for statement in (
                *MARIADB_SESSION_SQL,
                *mariadb_timeout_sql(DEFAULT_STATEMENT_TIMEOUT_S),
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ):
                await cur.execute(statement)
        await conn.commit()

    async def open(self, workers: int) -> None:
        self.pool = await asyncmy.create_pool(minsize=workers, maxsize=workers, **self.kwargs)
        held = [await self.pool.acquire() for _ in range(workers)]
        for conn in held:
            await self._session(conn)
            self.pool.release(conn)
        self.conns = [await asyncmy.connect(**self.kwargs) for _ in range(workers)]
        for conn in self.conns:
            await self._session(conn)

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()
        if self.pool is not None:
            self.pool.close()
            await self.pool.wait_closed()

    @staticmethod
    async def _one(conn: Any, op: str, sql: str, args: tuple[Any, ...]) -> Any:
        async with conn.cursor() as cur:
            await cur.execute(sql, args)
            if op == "exists":
                row = await cur.fetchone()
                value: Any = None if row is None else row[0]
            else:
                value = (cur.lastrowid, cur.rowcount)
        await conn.commit()
        return value

    def pooled(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        pool, sql, one = self.pool, captured.sql, self._one

        async def go(w: int, i: int) -> Any:
            async with pool.acquire() as conn:
                return await one(conn, op, sql, argv[w][i])

        return go

    def pinned(self, op: str, captured: Captured, argv: list[list[tuple[Any, ...]]]) -> Op:
        conns, sql, one = self.conns, captured.sql, self._one

        async def go(w: int, i: int) -> Any:
            return await one(conns[w], op, sql, argv[w][i])

        return go


async def _elapsed(workers: int, per_worker: int, op: Op) -> float:
    async def worker(w: int) -> None:
        for i in range(per_worker):
            await op(w, i)

    started = timed()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return timed() - started


async def _level(url: str, driver: Driver, workers: int, total: int) -> list[tuple[object, ...]]:
    schema = f"dsm_bench_{uuid.uuid4().hex[:12]}"
    handler = sql_handler(url, SystemClock(), schema=schema, pool_size=workers, max_overflow=0)
    await handler.open()
    fast_path = handler.repository.fast_path
    await driver.open(workers)
    per_round = max(1, total // workers // ROUNDS)
    tag = f"c{workers}"
    try:
        captured = {
            "try_acquire_lock": await _capture(
                lambda: handler.try_acquire_lock(_ctx(SENTINEL)), handler
            ),
            "exists": await _capture(lambda: handler.exists(_ctx(SENTINEL)), handler),
        }

        def keys(side: str, r: int) -> list[list[str]]:
            return [[f"{side}-{tag}-{r}-{w}-{i}" for i in range(per_round)] for w in range(workers)]

        def handler_op(side: str, name: str, ks: list[list[str]]) -> Op:
            call = getattr(handler, name)
            cs = [[_ctx(k) for k in row] for row in ks]

            async def go(w: int, i: int) -> Any:
                return await call(cs[w][i])

            return go

        def raw_op(side: str, name: str, ks: list[list[str]]) -> Op:
            c = captured[name]
            argv = [[c.for_key(k) for k in row] for row in ks]
            build = driver.pooled if side == "pool" else driver.pinned
            return build(name, c, argv)

        async def one_side(side: str, r: int) -> dict[str, float]:
            """Both operations on fresh keys: acquire them, then ask whether they exist."""
            ks = keys(side, r)
            ops = {
                name: (handler_op if side in ("handler", "core") else raw_op)(side, name, ks)
                for name in OPERATIONS
            }
            if side == "core":
                handler.repository.fast_path = None
            try:
                return {name: await _elapsed(workers, per_round, ops[name]) for name in OPERATIONS}
            finally:
                handler.repository.fast_path = fast_path

        # Warm every connection on every side, and every statement, before timing.
        for side in SIDES:
            await one_side(side, -1)
        spent = {(name, side): 0.0 for name in OPERATIONS for side in SIDES}
        for r in range(ROUNDS):
            # Rotate the order too, so no side always runs first (or right after another).
            for side in SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]:
                for name, seconds in (await one_side(side, r)).items():
                    spent[name, side] += seconds
        done = workers * per_round * ROUNDS
        rows: list[tuple[object, ...]] = []
        for name in OPERATIONS:
            mine, core, pooled, pinned = (done / spent[name, side] for side in SIDES)
            rows.append(
                (
                    name,
                    workers,
                    mine,
                    core,
                    pooled,
                    pinned,
                    mine / pooled,
                    core / pooled,
                    mine / pinned,
                )
            )
        return rows
    finally:
        await driver.close()
        try:
            if handler.engine.dialect.name == "mariadb":
                await drop_database(handler.engine, schema)
            else:
                await drop_pg_schema(handler.engine, schema)
        finally:
            await handler.close()


def _headers(driver: str) -> tuple[str, ...]:
    return (
        "operation",
        "workers",
        "handler ops/s",
        "core path ops/s",
        f"{driver} ops/s",
        f"{driver} conn ops/s",
        f"handler/{driver}",
        f"core path/{driver}",
        f"handler/{driver} conn",
    )


#: Concurrent workers per row.  At 32, the four sides hold about a hundred connections
#: between them (a pool and a connection per worker each, raw and handler), which is
#: PostgreSQL's default ``max_connections``: ``--short``, which only proves the table
#: prints, stops at 8 so that it can share a server with other tests.
LEVELS = (1, 8, 32)
SHORT_LEVELS = (1, 8)


async def _table(title: str, url: str, driver: Driver, short: bool, shape: str) -> Table:
    total = 300 if short else 6000
    rows: list[tuple[object, ...]] = []
    for workers in SHORT_LEVELS if short else LEVELS:
        rows.extend(await _level(url, driver, workers, total))
    note = (
        f"{total} operations per cell in {ROUNDS} alternating rounds, on fresh keys; {shape}; "
        f"pool size = workers; '{driver.name} conn' is one connection per worker, no pool; "
        "exists finds a live lock (answer False) on every side"
    )
    return Table(title, _headers(driver.name), rows, note)


def _postgres(short: bool) -> Table:
    url = postgres_url()
    driver = Asyncpg(make_url(url))
    return asyncio.run(_table(POSTGRES_TITLE, url, driver, short, "each statement in autocommit"))


def _mariadb(short: bool) -> Table | SkippedTable:
    url = os.environ.get(MARIADB_TEST_URL_ENV, "").strip()
    if not url:
        return SkippedTable(MARIADB_TITLE, f"MariaDB not configured: set {MARIADB_TEST_URL_ENV}")
    driver = Asyncmy(normalize_url(url))
    shape = "each statement then COMMIT"
    return asyncio.run(_table(MARIADB_TITLE, url, driver, short, shape))


def run(short: bool) -> Sequence[Table | SkippedTable]:
    try:
        postgres: Table | SkippedTable = _postgres(short)
    except BenchSkipped as exc:
        postgres = SkippedTable(POSTGRES_TITLE, str(exc))
    return [postgres, _mariadb(short)]
