"""Concurrent callers on separate connections: one lock winner, never two live locks.

The handlers here share one database but not one connection pool, so the
database (not the event loop) decides who wins: PostgreSQL through row locks
on the conflicting index entry, SQLite through its single writer (WAL and a
busy timeout make the losers wait instead of failing).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import func, select

from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.factory import postgres_isolated_handler, sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
T = process_state_logs
R = TypeVar("R")
CONTENDERS = 50
ITEMS = ("order-1", "order-2", "order-3")
LOCK = dt.timedelta(minutes=30)
START = dt.datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
Pool = list[SqlStateHandler]


def worker(index: int) -> StateHandlerContext:
    """An execution context of its own per contender, as separate workers would have."""
    return StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="charge-card",
        entity_execution_id=f"run-{index}",
        tenant_id="tenant-1",
        source_app_id=f"worker-{index % 7}",
        handler_config=HandlerConfig(lock_duration=LOCK),
    )


def postgres_pool(url: str, clock: ManualClock) -> Pool:
    """Five handlers (five pools, 25 connections) on one fresh schema."""
    owner = postgres_isolated_handler(url, clock, pool_size=5, max_overflow=0)
    assert owner.schema_name is not None
    others = [
        sql_handler(url, clock, schema=owner.schema_name, pool_size=5, max_overflow=0)
        for _ in range(4)
    ]
    return [*others, owner]


def sqlite_pool(path: Path, clock: ManualClock) -> Pool:
    """Ten handlers (ten pools, 50 connections) on one SQLite file."""
    return [sql_handler(f"sqlite:///{path}", clock, pool_size=5, max_overflow=0) for _ in range(10)]


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "sqlite-file"])
def make_pool(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[ManualClock], Pool]:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return lambda clock: postgres_pool(url, clock)
    return lambda clock: sqlite_pool(tmp_path / "race.db", clock)


def run_with(pool: Pool, body: Callable[[Pool], Awaitable[R]]) -> R:
    async def main() -> R:
        for handler in reversed(pool):  # the owner (last) creates the schema first
            await handler.open()
        try:
            # Warm every pool so the race is between open connections, not connects.
            await asyncio.gather(
                *(pool[i % len(pool)].exists(worker(i).for_item("warm-up")) for i in range(50))
            )
            return await body(pool)
        finally:
            for handler in pool:
                await handler.close()

    return asyncio.run(main())


async def race(pool: Pool, item: str) -> list[int | None]:
    return list(
        await asyncio.gather(
            *(
                pool[i % len(pool)].try_acquire_lock(worker(i).for_item(item))
                for i in range(CONTENDERS)
            )
        )
    )


async def current_rows(pool: Pool, item: str) -> list[tuple[str, int]]:
    query = select(T.c.status, T.c.attempt).where(T.c.item_key == item, T.c.superseded.is_(False))
    async with pool[0].engine.connect() as conn:
        return [(row.status, row.attempt) for row in await conn.execute(query)]


def test_fifty_concurrent_acquirers_exactly_one_wins(
    make_pool: Callable[[ManualClock], Pool],
) -> None:
    clock = ManualClock(START)

    async def body(pool: Pool) -> None:
        item = "order-1"
        tokens = await race(pool, item)
        assert [t for t in tokens if t is not None] == [1]
        assert tokens.count(None) == CONTENDERS - 1
        assert await current_rows(pool, item) == [("processing", 1)]
        clock.advance(LOCK + dt.timedelta(seconds=1))
        tokens = await race(pool, item)
        assert [t for t in tokens if t is not None] == [2]
        assert await current_rows(pool, item) == [("processing", 2)]

    run_with(make_pool(clock), body)


def test_sweeps_racing_acquirers_never_leave_two_live_locks(
    make_pool: Callable[[ManualClock], Pool],
) -> None:
    clock = ManualClock(START)

    async def body(pool: Pool) -> None:
        for item in ITEMS:
            assert await pool[0].try_acquire_lock(worker(999).for_item(item)) == 1
        clock.advance(LOCK + dt.timedelta(seconds=1))
        calls: list[Awaitable[int | None]] = []
        for i in range(CONTENDERS):
            handler = pool[i % len(pool)]
            if i % 5 == 0:
                calls.append(handler.reset_expired_locks())
            else:
                calls.append(handler.try_acquire_lock(worker(i).for_item(ITEMS[i % len(ITEMS)])))
        outcomes = await asyncio.gather(*calls)
        swept = sum(o or 0 for i, o in enumerate(outcomes) if i % 5 == 0)
        tokens = [o for i, o in enumerate(outcomes) if i % 5 != 0 and o is not None]
        assert sorted(tokens) == [2] * len(ITEMS)
        assert swept <= len(ITEMS)
        for item in ITEMS:
            assert await current_rows(pool, item) == [("processing", 2)]
            record = await pool[0].get(worker(0).for_item(item))
            assert record is not None
            assert record.locked_until == clock.now() + LOCK
            assert record.lock_live(clock.now())

    run_with(make_pool(clock), body)


def test_concurrent_upserts_each_supersede_exactly_once(
    make_pool: Callable[[ManualClock], Pool],
) -> None:
    clock = ManualClock(START)
    writers = 12

    async def body(pool: Pool) -> None:
        item = worker(0).for_item("invoice-9")
        await pool[0].upsert(item, {"version": "first"})
        await asyncio.gather(
            *(
                pool[i % len(pool)].upsert(worker(i).for_item("invoice-9"), {"version": i})
                for i in range(writers)
            )
        )
        assert await current_rows(pool, "invoice-9") == [("processed", 1)]
        query = select(func.count()).where(T.c.item_key == "invoice-9", T.c.superseded.is_(True))
        async with pool[0].engine.connect() as conn:
            assert (await conn.execute(query)).scalar() == writers
        record = await pool[0].get(item)
        assert record is not None
        assert record.data is not None
        assert record.data["version"] in range(writers)

    run_with(make_pool(clock), body)


def test_concurrent_opens_of_a_fresh_store_all_succeed(
    make_pool: Callable[[ManualClock], Pool],
) -> None:
    clock = ManualClock(START)
    pool = make_pool(clock)

    async def main() -> None:
        try:
            outcomes = await asyncio.gather(
                *(handler.open() for handler in pool), return_exceptions=True
            )
            assert [o for o in outcomes if o is not None] == []
            tokens = await asyncio.gather(
                *(h.try_acquire_lock(worker(i).for_item("first")) for i, h in enumerate(pool))
            )
            assert [t for t in tokens if t is not None] == [1]
        finally:
            for handler in pool:
                await handler.close()

    asyncio.run(main())
