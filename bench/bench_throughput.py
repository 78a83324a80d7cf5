"""Built-in handler throughput on PostgreSQL against raw asyncpg running the same statement.

The baseline is the handler's own SQL: the statement is captured from the
handler (text and parameters, with ``count_statements``) and replayed through
an asyncpg pool of the same size, so the ratio is the price of SQLAlchemy's
pool, the handler's checks and its Python, not of a different query.

Fair on purpose: the same statement text, parameters and round trips (one
per operation: the asyncpg pool is built without its per-release reset
query, which the handler's pool does not send either); the same number of
connections; asyncpg's prepared-statement cache on both sides; contexts and
keys built before the clock starts; every connection and statement warmed
up first.  The sides run in alternating rounds so a change in machine load
hits all of them alike.

Columns: ``handler`` is the built-in handler as shipped (the PostgreSQL fast
path); ``core path`` is the same handler with the fast path switched off, so
every statement goes through SQLAlchemy Core (prepared constructs, autocommit);
``asyncpg`` is the bare statement; ``asyncpg+tx`` the statement inside
``BEGIN``/``COMMIT``.  Target: handler/asyncpg >= 0.7.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from common import Table, postgres_url, timed
from sqlalchemy import make_url

from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.engine import drop_pg_schema
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.statements import count_statements
from reference_engine.scope import Scope

__all__ = ["TITLE", "run"]

TITLE = "Throughput on PostgreSQL: built-in handler vs raw asyncpg, same statement"
HEADERS = (
    "operation",
    "workers",
    "handler ops/s",
    "core path ops/s",
    "asyncpg ops/s",
    "asyncpg+tx ops/s",
    "handler/asyncpg",
    "core path/asyncpg",
    "handler/asyncpg+tx",
)
SENTINEL = "__bench_item_key__"
#: Alternating rounds per cell; each side's rate is its operations over its summed time.
ROUNDS = 3
SIDES = ("handler", "core", "asyncpg", "asyncpg+tx")

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


async def _capture(
    call: Callable[[], Awaitable[Any]], handler: SqlStateHandler
) -> tuple[str, list[Any], int]:
    """The one data statement ``call`` sends, its parameters, and where the item key sits."""
    with count_statements(handler.engine) as log:
        await call()
    if log.count != 1:
        raise RuntimeError(
            f"expected one statement, the handler sent {log.count}: {log.statements}"
        )
    values = list(log.parameters[0])
    return log.statements[0], values, values.index(SENTINEL)


async def _elapsed(workers: int, per_worker: int, op: Op) -> float:
    async def worker(w: int) -> None:
        for i in range(per_worker):
            await op(w, i)

    started = timed()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return timed() - started


async def _no_reset(_conn: asyncpg.Connection) -> None:
    """Return connections as they are: the handler's pool sends nothing on return either."""


async def _level(url: str, dsn: str, workers: int, total: int) -> list[tuple[object, ...]]:
    schema = f"dsm_bench_{uuid.uuid4().hex[:12]}"
    handler = sql_handler(url, SystemClock(), schema=schema, pool_size=workers, max_overflow=0)
    await handler.open()
    fast_path = handler.repository.fast_path
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers, reset=_no_reset)
    per_round = max(1, total // workers // ROUNDS)
    tag = f"c{workers}"
    try:
        acquire = await _capture(lambda: handler.try_acquire_lock(_ctx(SENTINEL)), handler)
        exists = await _capture(lambda: handler.exists(_ctx(SENTINEL)), handler)

        def keys(side: str, r: int) -> list[list[str]]:
            return [[f"{side}-{tag}-{r}-{w}-{i}" for i in range(per_round)] for w in range(workers)]

        def contexts(side: str, r: int) -> list[list[StateHandlerContext]]:
            return [[_ctx(k) for k in row] for row in keys(side, r)]

        def replay(captured: tuple[str, list[Any], int], tx: bool, ks: list[list[str]]) -> Op:
            sql, args, at = captured
            argv = [[[*args[:at], k, *args[at + 1 :]] for k in row] for row in ks]

            async def go(w: int, i: int) -> Any:
                async with pool.acquire() as conn:
                    if tx:
                        async with conn.transaction():
                            return await conn.fetchval(sql, *argv[w][i])
                    return await conn.fetchval(sql, *argv[w][i])

            return go

        def fast(on: bool) -> None:
            handler.repository.fast_path = fast_path if on else None

        async def on_handler(
            side: str,
            call: Callable[[StateHandlerContext], Awaitable[Any]],
            cs: list[list[StateHandlerContext]],
        ) -> float:
            fast(side == "handler")
            try:
                return await _elapsed(workers, per_round, lambda w, i: call(cs[w][i]))
            finally:
                fast(True)

        # Warm every connection on every side, and every statement, before timing.
        for side in SIDES:
            warm = keys(f"warm-{side}", 0)
            cs = [[_ctx(k) for k in row] for row in warm]
            if side in ("handler", "core"):
                await on_handler(side, handler.try_acquire_lock, cs)
                await on_handler(side, handler.exists, cs)
            else:
                await _elapsed(workers, per_round, replay(acquire, side == "asyncpg+tx", warm))
                await _elapsed(workers, per_round, replay(exists, side == "asyncpg+tx", warm))

        spent = {(name, side): 0.0 for name in ("try_acquire_lock", "exists") for side in SIDES}
        for r in range(ROUNDS):
            for side in SIDES:
                if side in ("handler", "core"):
                    cs = contexts(side, r)
                    spent["try_acquire_lock", side] += await on_handler(
                        side, handler.try_acquire_lock, cs
                    )
                    spent["exists", side] += await on_handler(side, handler.exists, cs)
                else:
                    ks = keys(side, r)
                    tx = side == "asyncpg+tx"
                    spent["try_acquire_lock", side] += await _elapsed(
                        workers, per_round, replay(acquire, tx, ks)
                    )
                    spent["exists", side] += await _elapsed(
                        workers, per_round, replay(exists, tx, ks)
                    )
        done = workers * per_round * ROUNDS
        rows: list[tuple[object, ...]] = []
        for name in ("try_acquire_lock", "exists"):
            mine, core, raw, raw_tx = (done / spent[name, side] for side in SIDES)
            rows.append(
                (name, workers, mine, core, raw, raw_tx, mine / raw, core / raw, mine / raw_tx)
            )
        return rows
    finally:
        await pool.close()
        try:
            await drop_pg_schema(handler.engine, schema)
        finally:
            await handler.close()


async def _run(short: bool) -> Table:
    url = postgres_url()
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    total = 300 if short else 6000
    rows: list[tuple[object, ...]] = []
    for workers in (1, 8, 32):
        rows.extend(await _level(url, dsn, workers, total))
    note = (
        f"{total} operations per cell in {ROUNDS} alternating rounds, on fresh keys; "
        "exists finds a live lock (answer False) on every side"
    )
    return Table(TITLE, HEADERS, rows, note)


def run(short: bool) -> list[Table]:
    return [asyncio.run(_run(short))]
