"""The catch-up worker against a real SQLite store: a crashed worker's lock ends up Failed."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from reference_engine.catchup import CatchupResult, CatchupStats, CatchupWorkerService
from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.factory import sqlite_file_handler
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
LOCK = dt.timedelta(minutes=10)
RETENTION = dt.timedelta(hours=2)
INTERVAL = dt.timedelta(minutes=4)
START = dt.datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


def context(execution: str) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="ship-parcel",
        entity_execution_id=execution,
        tenant_id="tenant-1",
        source_app_id="app",
        handler_config=HandlerConfig(lock_duration=LOCK, retention=RETENTION),
    )


def test_run_once_sweeps_a_crashed_workers_lock_to_failed() -> None:
    clock = ManualClock(START)
    handler = sqlite_file_handler(clock)
    crashed = context("run-crashed").for_item("parcel-1")
    finished = context("run-ok").for_item("parcel-2")

    async def main() -> None:
        await handler.open()
        try:
            worker = CatchupWorkerService(handler, interval=INTERVAL)
            assert await handler.try_acquire_lock(crashed) == 1
            token = await handler.try_acquire_lock(finished)
            await handler.set(finished.for_item("parcel-2", lock_token=token), S.PROCESSED)
            assert await worker.run_once() == CatchupResult(locks_reset=0, records_expired=0)
            clock.advance(LOCK + dt.timedelta(seconds=1))
            assert await worker.run_once() == CatchupResult(locks_reset=1, records_expired=0)
            record = await handler.get(crashed)
            assert record is not None
            assert (record.status, record.locked_until, record.error_detail) == (
                S.FAILED,
                None,
                SWEEP_ERROR_DETAIL,
            )
            done = await handler.get(finished)
            assert done is not None
            assert done.status is S.PROCESSED
            assert await handler.try_acquire_lock(context("run-retry").for_item("parcel-1")) == 2
        finally:
            await handler.close()

    asyncio.run(main())


def test_background_ticks_sweep_as_simulated_time_passes() -> None:
    clock = ManualClock(START)
    handler = sqlite_file_handler(clock)
    ticks: list[dt.datetime] = []
    enough = asyncio.Event()

    async def sleep(seconds: float) -> None:
        """Simulated time: each sleep moves the clock instead of waiting."""
        ticks.append(clock.now())
        clock.advance(dt.timedelta(seconds=seconds))
        if len(ticks) >= 40:
            enough.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0)

    async def main() -> CatchupStats:
        await handler.open()
        try:
            assert await handler.try_acquire_lock(context("run-1").for_item("parcel-1")) == 1
            worker = CatchupWorkerService(handler, interval=INTERVAL, sleep=sleep)
            worker.start()
            await asyncio.wait_for(enough.wait(), timeout=30)
            await worker.stop()
            record = await handler.get(context("probe").for_item("parcel-1"))
            assert record is not None
            assert record.status is S.EXPIRED
            return worker.stats
        finally:
            await handler.close()

    stats = asyncio.run(main())
    assert ticks[:2] == [START, START + INTERVAL]
    # Lock ends at +10 min: the run at +12 min resets it.  Retention ends at
    # +2 h: the first run after it (+2 h 4 min) expires the record.
    assert stats == CatchupStats(runs=40, failures=0, locks_reset=1, records_expired=1)
