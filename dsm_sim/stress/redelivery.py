"""The broker's redelivery of items whose lock expired, played by the parent during a faulted run.

A partition only tests fencing if someone takes the item over while the
partitioned worker still believes it holds the lock: a broker redelivers a
message whose consumer went silent, and another worker acquires the expired
lock.  The worker processes cannot do it (they are behind the same proxy),
so while network faults are scheduled the parent redelivers, over its direct
connection, every item it reads as Processing with a lock that has expired.
The partitioned worker's late write then arrives at a record another token
holds, and must be rejected.

No catch-up sweep is run meanwhile: an expired lock is already acquirable,
and a sweep racing the workers' writes could not be journalled truthfully.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections import Counter
from pathlib import Path

from dsm_sim.stress.journal import Journal, WallClock
from dsm_sim.stress.ledger import EffectLedger
from dsm_sim.stress.settings import StressSettings
from dsm_sim.stress.worker import REDELIVERY_PROCESS, StressWorker, base_context
from reference_engine.clock import Clock
from reference_engine.errors import DsmError
from reference_engine.handler import StateHandler
from reference_engine.status import IdempotencyStatus

__all__ = ["EXPIRY_MARGIN", "Redelivery"]

#: How long past its ``locked_until`` a lock must be before it is redelivered, so the
#: takeover is provably after the expiry on the wall-clock timeline of the history.
EXPIRY_MARGIN = dt.timedelta(milliseconds=50)


class Redelivery:
    """Redeliver expired items until told to stop; one delivery finishes before it stops."""

    def __init__(
        self,
        settings: StressSettings,
        handler: StateHandler,
        ledger: EffectLedger,
        journal_path: Path,
        clock: Clock,
        wall: WallClock,
    ) -> None:
        """``clock`` is the handler's; ``wall`` the run's time base, which the journal reads."""
        self.settings = settings
        self.handler = handler
        self.clock = clock
        self.journal = Journal(journal_path, REDELIVERY_PROCESS, wall)
        quiet = dataclasses.replace(settings, fail_rate=0.0)
        self.worker = StressWorker(quiet, handler, ledger, self.journal, REDELIVERY_PROCESS, 0)
        self.period = min(0.25, max(0.02, settings.lock_duration.total_seconds() / 4))
        self.outcomes: Counter[str] = Counter()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Let the delivery in progress finish (its journal stays whole), then close."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        self.journal.close()

    async def _run(self) -> None:
        ctx = base_context(self.settings)
        while not self._stopping.is_set():
            for key in self.settings.key_list():
                if self._stopping.is_set():
                    return
                try:
                    record = await self.handler.get(ctx.for_item(key))
                except DsmError:
                    continue
                if (
                    record is not None
                    and record.status is IdempotencyStatus.PROCESSING
                    and record.locked_until is not None
                    and record.locked_until + EXPIRY_MARGIN < self.clock.now()
                ):
                    self.outcomes[(await self.worker.deliver(key)).value] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.period)
