"""Built-in handler throughput on PostgreSQL against raw asyncpg running the same statement.

The baseline is the handler's own SQL: the statement is captured from the
handler (text and parameters, via a SQLAlchemy event) and replayed through
an asyncpg pool of the same size, so the ratio is the price of SQLAlchemy,
the pool and the handler's checks, not of a different query.  Two baselines:
the bare statement (autocommit, one round trip) and the statement inside an
explicit transaction, which is what the handler's engine does.  Target:
handler/asyncpg >= 0.7.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from common import Table, postgres_url, timed
from sqlalchemy import event, make_url

from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.engine import drop_pg_schema
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.scope import Scope

__all__ = ["TITLE", "run"]

TITLE = "Throughput on PostgreSQL: built-in handler vs raw asyncpg, same statement"
HEADERS = (
    "operation",
    "workers",
    "handler ops/s",
    "asyncpg ops/s",
    "asyncpg+tx ops/s",
    "handler/asyncpg",
    "handler/asyncpg+tx",
)
SENTINEL = "__bench_item_key__"


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
    handler: SqlStateHandler, call: Callable[[], Awaitable[Any]]
) -> tuple[str, list[Any], int]:
    """The one data statement ``call`` sends, its parameters, and where the item key sits."""
    seen: list[tuple[str, Sequence[Any]]] = []

    def listener(_c: Any, _cur: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(handler.engine.sync_engine, "before_cursor_execute", listener)
    try:
        await call()
    finally:
        event.remove(handler.engine.sync_engine, "before_cursor_execute", listener)
    data = [(s, p) for s, p in seen if not s.lstrip().upper().startswith(("SELECT 1", "BEGIN"))]
    statement, parameters = data[-1]
    values = list(parameters)
    return statement, values, values.index(SENTINEL)


async def _rate(workers: int, per_worker: int, op: Callable[[int, int], Awaitable[Any]]) -> float:
    async def worker(w: int) -> None:
        for i in range(per_worker):
            await op(w, i)

    started = timed()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return workers * per_worker / (timed() - started)


async def _level(url: str, dsn: str, workers: int, total: int) -> list[tuple[object, ...]]:
    schema = f"dsm_bench_{uuid.uuid4().hex[:12]}"
    handler = sql_handler(url, SystemClock(), schema=schema, pool_size=workers, max_overflow=0)
    await handler.open()
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
    per_worker = max(1, total // workers)
    tag = f"c{workers}"
    try:
        acquire_sql, acquire_args, acquire_at = await _capture(
            handler, lambda: handler.try_acquire_lock(_ctx(SENTINEL))
        )
        exists_sql, exists_args, exists_at = await _capture(
            handler, lambda: handler.exists(_ctx(SENTINEL))
        )

        def replay(sql: str, args: list[Any], at: int, key: str, tx: bool) -> Awaitable[Any]:
            values = list(args)
            values[at] = key

            async def go() -> Any:
                async with pool.acquire() as conn:
                    if tx:
                        async with conn.transaction():
                            return await conn.fetchval(sql, *values)
                    return await conn.fetchval(sql, *values)

            return go()

        # Warm both sides (connections, prepared statements) before timing.
        for w in range(workers):
            await handler.exists(_ctx(f"warm-{w}"))
            await replay(exists_sql, exists_args, exists_at, f"warm-{w}", False)

        rows: list[tuple[object, ...]] = []
        acquire = (
            await _rate(
                workers, per_worker, lambda w, i: handler.try_acquire_lock(_ctx(f"h-{tag}-{w}-{i}"))
            ),
            await _rate(
                workers,
                per_worker,
                lambda w, i: replay(
                    acquire_sql, acquire_args, acquire_at, f"r-{tag}-{w}-{i}", False
                ),
            ),
            await _rate(
                workers,
                per_worker,
                lambda w, i: replay(
                    acquire_sql, acquire_args, acquire_at, f"t-{tag}-{w}-{i}", True
                ),
            ),
        )
        exists = (
            await _rate(workers, per_worker, lambda w, i: handler.exists(_ctx(f"h-{tag}-{w}-{i}"))),
            await _rate(
                workers,
                per_worker,
                lambda w, i: replay(exists_sql, exists_args, exists_at, f"h-{tag}-{w}-{i}", False),
            ),
            await _rate(
                workers,
                per_worker,
                lambda w, i: replay(exists_sql, exists_args, exists_at, f"h-{tag}-{w}-{i}", True),
            ),
        )
        for name, (mine, raw, raw_tx) in (("try_acquire_lock", acquire), ("exists", exists)):
            rows.append((name, workers, mine, raw, raw_tx, mine / raw, mine / raw_tx))
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
    total = 400 if short else 4000
    rows: list[tuple[object, ...]] = []
    for workers in (1, 8, 32):
        rows.extend(await _level(url, dsn, workers, total))
    note = f"{total} operations per cell; each cell measured in this run, on fresh keys"
    return Table(TITLE, HEADERS, rows, note)


def run(short: bool) -> list[Table]:
    return [asyncio.run(_run(short))]
