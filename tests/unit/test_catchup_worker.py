"""The catch-up worker's loop, counters and shutdown, with a fake sweeper and a fake sleep."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import pytest

from reference_engine.catchup import CatchupResult, CatchupStats, CatchupWorkerService, Sweeper
from reference_engine.errors import InvalidOptionError, StoreError

pytestmark = pytest.mark.unit

INTERVAL = dt.timedelta(seconds=90)


class FakeSweeper:
    """Returns scripted counts; a run listed in ``fail_on`` raises from the chosen sweep."""

    def __init__(
        self,
        resets: list[int],
        expiries: list[int],
        *,
        fail_on: frozenset[int] = frozenset(),
        fail_in: str = "reset",
    ) -> None:
        self.resets = resets
        self.expiries = expiries
        self.fail_on = fail_on
        self.fail_in = fail_in
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None

    def _run_number(self) -> int:
        return self.calls.count("reset")

    async def reset_expired_locks(self) -> int:
        self.calls.append("reset")
        if self.gate is not None:
            await self.gate.wait()
        run = self._run_number()
        if run in self.fail_on and self.fail_in == "reset":
            raise StoreError(f"database is locked (run {run})")
        return self.resets[run - 1]

    async def expire_past_retention(self) -> int:
        self.calls.append("expire")
        run = self._run_number()
        if run in self.fail_on and self.fail_in == "expire":
            raise StoreError(f"connection lost (run {run})")
        return self.expiries[run - 1]


class FakeSleep:
    """Records each requested sleep; the ``block_after``-th and later never return."""

    def __init__(self, block_after: int) -> None:
        self.block_after = block_after
        self.durations: list[float] = []
        self.reached = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.durations.append(seconds)
        if len(self.durations) >= self.block_after:
            self.reached.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0)


def test_the_fake_sweeper_satisfies_the_protocol() -> None:
    assert isinstance(FakeSweeper([], []), Sweeper)


def test_run_once_sweeps_locks_before_retention_and_counts() -> None:
    sweeper = FakeSweeper([3, 0], [5, 2])
    worker = CatchupWorkerService(sweeper, interval=INTERVAL)

    async def main() -> tuple[CatchupResult, CatchupResult]:
        return await worker.run_once(), await worker.run_once()

    first, second = asyncio.run(main())
    assert (first, second) == (CatchupResult(3, 5), CatchupResult(0, 2))
    assert sweeper.calls == ["reset", "expire", "reset", "expire"]
    assert worker.stats == CatchupStats(runs=2, failures=0, locks_reset=3, records_expired=7)


def test_ticks_once_per_interval_with_the_injected_sleep() -> None:
    sweeper = FakeSweeper([1, 2, 3, 4], [0, 0, 1, 0])
    sleep = FakeSleep(block_after=4)
    worker = CatchupWorkerService(sweeper, interval=INTERVAL, sleep=sleep)

    async def main() -> CatchupStats:
        worker.start()
        assert worker.running
        await asyncio.wait_for(sleep.reached.wait(), timeout=5)
        await worker.stop()
        assert not worker.running
        return worker.stats

    stats = asyncio.run(main())
    assert sleep.durations == [90.0] * 4
    assert stats == CatchupStats(runs=4, failures=0, locks_reset=10, records_expired=1)


@pytest.mark.parametrize("fail_in", ["reset", "expire"])
def test_a_failing_run_is_logged_counted_and_the_loop_goes_on(
    fail_in: str, caplog: pytest.LogCaptureFixture
) -> None:
    sweeper = FakeSweeper([1, 1, 1, 1], [2, 2, 2, 2], fail_on=frozenset({1, 3}), fail_in=fail_in)
    sleep = FakeSleep(block_after=4)
    worker = CatchupWorkerService(sweeper, interval=INTERVAL, sleep=sleep)

    async def main() -> CatchupStats:
        worker.start()
        await asyncio.wait_for(sleep.reached.wait(), timeout=5)
        await worker.stop()
        return worker.stats

    with caplog.at_level(logging.INFO, logger="reference_engine.catchup"):
        stats = asyncio.run(main())
    assert stats.runs == 4
    assert stats.failures == 2
    # A failure in the retention sweep still keeps what the lock sweep did.
    assert stats.locks_reset == (4 if fail_in == "expire" else 2)
    assert stats.records_expired == 4
    assert stats.last_error is not None
    assert stats.last_error.startswith("StoreError")
    assert "(run 3)" in stats.last_error
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [("run 1" in r.getMessage(), "run 3" in r.getMessage()) for r in warnings] == [
        (True, False),
        (False, True),
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 2
    assert all("1 expired lock(s) reset to Failed, 2 record(s) expired" in m for m in infos)


def test_run_once_reraises_the_failure_after_counting_it() -> None:
    worker = CatchupWorkerService(FakeSweeper([1], [1], fail_on=frozenset({1})), interval=INTERVAL)

    async def main() -> None:
        with pytest.raises(StoreError, match="database is locked"):
            await worker.run_once()

    asyncio.run(main())
    assert worker.stats == CatchupStats(
        runs=1, failures=1, last_error="StoreError: database is locked (run 1)"
    )


def test_stop_is_idempotent_and_the_worker_can_start_again() -> None:
    sweeper = FakeSweeper([0] * 4, [0] * 4)
    worker = CatchupWorkerService(sweeper, interval=INTERVAL, sleep=FakeSleep(block_after=1))

    async def main() -> None:
        await worker.stop()  # never started: nothing to do
        worker.start()
        worker.start()  # already running: no second task
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await worker.stop()
        await worker.stop()
        assert worker.stats.runs == 1
        worker.start()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await worker.stop()
        assert worker.stats.runs == 2
        assert not worker.running
        leftovers = [t for t in asyncio.all_tasks() if t.get_name() == "dsm-catchup-worker"]
        assert leftovers == []

    asyncio.run(main())


def test_stop_lets_a_sweep_in_progress_finish() -> None:
    sweeper = FakeSweeper([7], [1])
    sleep = FakeSleep(block_after=1)
    worker = CatchupWorkerService(sweeper, interval=INTERVAL, sleep=sleep)

    async def main() -> None:
        sweeper.gate = asyncio.Event()
        worker.start()
        await asyncio.sleep(0)
        assert sweeper.calls == ["reset"]
        stopping = asyncio.create_task(worker.stop())
        await asyncio.sleep(0)
        assert not stopping.done()
        sweeper.gate.set()
        await asyncio.wait_for(stopping, timeout=5)

    asyncio.run(main())
    assert worker.stats == CatchupStats(runs=1, locks_reset=7, records_expired=1)
    assert sleep.durations == []


@pytest.mark.parametrize("interval", [dt.timedelta(0), dt.timedelta(seconds=-1), 30])
def test_interval_must_be_a_positive_timedelta(interval: Any) -> None:
    with pytest.raises(InvalidOptionError, match="interval"):
        CatchupWorkerService(FakeSweeper([], []), interval=interval)
