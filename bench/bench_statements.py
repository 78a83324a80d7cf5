"""SQL statements per operation of the built-in handler, counted with SQLAlchemy events.

"One statement per operation" is the design claim that makes every
operation atomic without application locks and keeps its cost flat; a sweep
is one statement whatever the number of expired locks.  The baseline is the
target itself, so the ratio column reads 1.00 when the claim holds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Awaitable, Callable
from typing import Any

from common import BenchSkipped, Table, postgres_url

from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.factory import (
    MARIADB_TEST_URL_ENV,
    mariadb_isolated_handler,
    postgres_isolated_handler,
    sqlite_memory_handler,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.statements import count_statements
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

__all__ = ["TITLE", "run"]

TITLE = "SQL statements per operation (built-in handler)"
S = IdempotencyStatus
HEADERS = ("backend", "operation", "statements", "target", "statements/target")


def _ctx(item: str) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=int(Scope.ELEMENT),
        scope_code=Scope.ELEMENT.code,
        entity_id="bench-node",
        entity_execution_id="bench-run",
        tenant_id="bench",
        source_app_id="bench",
        handler_config=HandlerConfig(
            lock_duration=dt.timedelta(minutes=1), retention=dt.timedelta(days=1)
        ),
    ).for_item(item)


async def _count(handler: SqlStateHandler, call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    with count_statements(handler.engine) as log:
        value = await call()
    return log.count, value


async def _measure(
    backend: str, handler: SqlStateHandler, clock: ManualClock, sweep_sizes: tuple[int, ...]
) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []

    def add(operation: str, count: int, target: int | None) -> None:
        ratio: object = "-" if target is None else count / target
        rows.append((backend, operation, count, "-" if target is None else target, ratio))

    fresh, other = _ctx("item-1"), _ctx("item-2")
    add("exists (missing)", (await _count(handler, lambda: handler.exists(fresh)))[0], 1)
    add("get", (await _count(handler, lambda: handler.get(fresh)))[0], 1)
    count, token = await _count(handler, lambda: handler.try_acquire_lock(fresh))
    add("try_acquire_lock (new)", count, 1)
    add(
        "try_acquire_lock (refused)",
        (await _count(handler, lambda: handler.try_acquire_lock(fresh)))[0],
        1,
    )
    held = fresh.for_item("item-1", lock_token=token)
    add(
        "set(Processed)",
        (await _count(handler, lambda: handler.set(held, S.PROCESSED, {"ok": True})))[0],
        1,
    )
    add("exists (done)", (await _count(handler, lambda: handler.exists(fresh)))[0], 1)
    token2 = await handler.try_acquire_lock(other)
    held2 = other.for_item("item-2", lock_token=token2)
    add(
        "release_lock_as_failed",
        (await _count(handler, lambda: handler.release_lock_as_failed(held2, "bench")))[0],
        1,
    )
    add(
        "try_acquire_lock (retry)",
        (await _count(handler, lambda: handler.try_acquire_lock(other)))[0],
        1,
    )
    add(
        "upsert (supersede)",
        (await _count(handler, lambda: handler.upsert(fresh, {"v": 2})))[0],
        None,
    )
    for size in sweep_sizes:
        for i in range(size):
            await handler.try_acquire_lock(_ctx(f"sweep-{size}-{i}"))
        clock.advance(dt.timedelta(minutes=2))
        count, reset = await _count(handler, handler.reset_expired_locks)
        add(f"reset_expired_locks ({reset} expired)", count, 1)
    clock.advance(dt.timedelta(days=2))
    count, expired = await _count(handler, handler.expire_past_retention)
    add(f"expire_past_retention ({expired} rows)", count, 1)
    return rows


async def _run(short: bool) -> Table:
    sizes = (1, 100) if short else (1, 100, 1000)
    rows: list[tuple[object, ...]] = []
    builders: list[tuple[str, Callable[[ManualClock], SqlStateHandler]]] = [
        ("sqlite", sqlite_memory_handler)
    ]
    note = ""
    try:
        url = postgres_url()
        builders.append(("postgresql", lambda clock: postgres_isolated_handler(url, clock)))
    except BenchSkipped as exc:
        note = f"postgresql skipped: {exc}"
    maria = os.environ.get(MARIADB_TEST_URL_ENV, "").strip()
    if maria:
        builders.append(("mariadb", lambda clock: mariadb_isolated_handler(maria, clock)))
    else:
        note = f"{note}; " if note else ""
        note += f"mariadb skipped: set {MARIADB_TEST_URL_ENV}"
    for backend, build in builders:
        clock = ManualClock(dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC))
        handler = build(clock)
        await handler.open()
        try:
            rows.extend(await _measure(backend, handler, clock, sizes))
        finally:
            await handler.close()
    return Table(TITLE, HEADERS, rows, note)


def run(short: bool) -> list[Table]:
    return [asyncio.run(_run(short))]
