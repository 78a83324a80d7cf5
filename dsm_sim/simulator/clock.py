"""Simulated time as the engine's :class:`~reference_engine.clock.Clock`.

The store's clock is SimPy's ``env.now`` mapped onto a datetime epoch plus an
offset that clock-jump faults move; that is the clock the handler is built
with, so lock expiry happens in simulated time.  A worker's clock adds its own
skew on top; with our handler contract the store reads the handler's clock,
so skew only reaches what the worker itself timestamps (the node's
``dispatchedAt``, the billing API's ``charged_at``), never a lock decision.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import time
from collections.abc import Iterator
from typing import Any

from dsm_sim.micros import Micros, micros_in
from reference_engine.clock import UTC, ensure_utc

__all__ = ["DEFAULT_EPOCH", "ClockMirror", "SimClock", "SkewedClock", "host_timezone"]

#: Where simulated second 0 sits on the calendar.
DEFAULT_EPOCH = dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


class SimClock:
    """``now() = epoch + env.now + offset``; ``jump`` moves the offset (either way)."""

    def __init__(self, env: Any, epoch: dt.datetime = DEFAULT_EPOCH) -> None:
        self.env = env
        self.epoch = ensure_utc(epoch)
        self.offset = 0.0
        # The last reading: every call and read at one instant asks for the same datetime.
        self._at = math.nan
        self._now = self.epoch
        # The microseconds of the reading _micros_for (see micros).
        self._micros_for = self.epoch
        self._micros = 0

    def micros(self) -> Micros:
        """The store's reading as microseconds since the epoch (what histories record).

        Exactly the instant :meth:`now` gives the handler, to the microsecond.
        """
        now = self.now()
        if now is not self._micros_for:
            self._micros = micros_in(now - self.epoch)
            self._micros_for = now
        return self._micros

    def now(self) -> dt.datetime:
        seconds = float(self.env.now) + self.offset
        if seconds != self._at:
            self._now = self.epoch + dt.timedelta(seconds=seconds)
            self._at = seconds
        return self._now

    def jump(self, by: float) -> None:
        self.offset += by

    def __repr__(self) -> str:
        return f"SimClock(t={self.env.now!r}, offset={self.offset!r})"


class SkewedClock:
    """A worker's view: the store clock plus a fixed skew."""

    def __init__(self, base: SimClock, skew: float) -> None:
        self.base = base
        self.skew = skew

    def now(self) -> dt.datetime:
        return self.base.now() + dt.timedelta(seconds=self.skew)

    def __repr__(self) -> str:
        return f"SkewedClock(skew={self.skew!r})"


class ClockMirror:
    """Keeps the system clock on the store clock, for handlers that ignore the clock they get.

    With ``system`` true, freezegun pins ``datetime.now`` and friends to the
    store clock and :meth:`follow` moves them before every handler call.  It is
    started with ``real_asyncio=True``, as the conformance kit does, so the
    event loop's own timers keep working.  A database server's ``now()`` cannot
    be moved this way.
    """

    def __init__(self, clock: SimClock, *, system: bool = False) -> None:
        self.clock = clock
        self.system = system
        self._freezer: Any = None
        self._frozen: Any = None

    def start(self) -> None:
        if self.system and self._freezer is None:
            from freezegun import freeze_time

            self._freezer = freeze_time(self.clock.now(), real_asyncio=True)
            self._frozen = self._freezer.start()

    def follow(self) -> None:
        if self._frozen is not None:
            self._frozen.move_to(self.clock.now())

    def stop(self) -> None:
        if self._freezer is not None:
            freezer, self._freezer, self._frozen = self._freezer, None, None
            freezer.stop()


@contextlib.contextmanager
def host_timezone(name: str) -> Iterator[None]:
    """Run with the process' local time zone set to ``name`` ("" changes nothing).

    Correct handlers never notice: they take aware UTC instants from the clock
    they are given.  A handler that mixes in local time does, on a host that is
    not on UTC.  The previous zone is restored afterwards.
    """
    if not name or not hasattr(time, "tzset"):
        yield
        return
    previous = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = previous
        time.tzset()
