"""The catch-up worker: the background sweeps that keep crashed work from staying stuck.

A worker that dies while holding a lock leaves a Processing record behind.
Acquisition already treats an expired lock as Failed, but until something
writes that down, ``get`` still shows Processing and operators see a phantom
in-flight item.  The worker periodically runs the handler's two sweeps
(expired locks -> Failed, past retention -> Expired).  A failing sweep is
logged and counted, never fatal: the next tick tries again, and every sweep
is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reference_engine.errors import InvalidOptionError

__all__ = ["CatchupResult", "CatchupStats", "CatchupWorkerService", "Sleep", "Sweeper"]

logger = logging.getLogger(__name__)

#: ``asyncio.sleep`` or a stand-in; tests inject one so no test waits for real.
Sleep = Callable[[float], Awaitable[None]]


@runtime_checkable
class Sweeper(Protocol):
    """The part of :class:`~reference_engine.handler.StateHandler` the worker needs."""

    async def reset_expired_locks(self) -> int: ...

    async def expire_past_retention(self) -> int: ...


@dataclass(frozen=True, slots=True)
class CatchupResult:
    """What one run changed."""

    locks_reset: int
    records_expired: int


@dataclass(frozen=True, slots=True)
class CatchupStats:
    """Counters since the worker was built; a snapshot, safe to keep and compare."""

    runs: int = 0
    failures: int = 0
    locks_reset: int = 0
    records_expired: int = 0
    last_error: str | None = None


class CatchupWorkerService:
    """Runs the sweeps every ``interval`` on an asyncio task until stopped.

    ``start`` runs a first sweep at once, then one per interval; ``stop``
    lets a sweep in progress finish (only the sleep between sweeps is
    cancelled), waits for the task, and may be called any number of times.
    """

    def __init__(
        self,
        handler: Sweeper,
        *,
        interval: dt.timedelta,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not isinstance(interval, dt.timedelta) or interval <= dt.timedelta(0):
            raise InvalidOptionError(
                "interval", f"must be a positive datetime.timedelta, got {interval!r}"
            )
        self.handler = handler
        self.interval = interval
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._sleeping = False
        self._runs = 0
        self._failures = 0
        self._locks_reset = 0
        self._records_expired = 0
        self._last_error: str | None = None

    def __repr__(self) -> str:
        return f"CatchupWorkerService({self.handler!r}, interval={self.interval!r})"

    @property
    def stats(self) -> CatchupStats:
        return CatchupStats(
            runs=self._runs,
            failures=self._failures,
            locks_reset=self._locks_reset,
            records_expired=self._records_expired,
            last_error=self._last_error,
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run_once(self) -> CatchupResult:
        """One run of both sweeps; a failure is counted, logged and re-raised to the caller.

        The expired-lock sweep runs first so a record whose lock and retention
        both ran out is recorded as Failed before it is expired.
        """
        self._runs += 1
        reset = 0
        try:
            reset = await self.handler.reset_expired_locks()
            self._locks_reset += reset
            expired = await self.handler.expire_past_retention()
            self._records_expired += expired
        except Exception as exc:
            self._failures += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "catch-up run %d failed after resetting %d lock(s): %s",
                self._runs,
                reset,
                self._last_error,
            )
            raise
        logger.info(
            "catch-up run %d: %d expired lock(s) reset to Failed, %d record(s) expired",
            self._runs,
            reset,
            expired,
        )
        return CatchupResult(locks_reset=reset, records_expired=expired)

    def start(self) -> None:
        """Start the background task on the running loop; a no-op if it is running."""
        if self.running:
            return
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="dsm-catchup-worker")

    async def stop(self) -> None:
        """Stop after the current sweep (if any) and wait for the task; idempotent."""
        task = self._task
        if task is None:
            return
        self._stopping = True
        if self._sleeping:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._task = None

    async def _loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(Exception):
                # run_once has already counted and logged the failure.
                await self.run_once()
            if self._stopping:
                return
            self._sleeping = True
            try:
                await self._sleep(self.interval.total_seconds())
            finally:
                self._sleeping = False
