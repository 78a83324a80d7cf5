"""Simulated time as the engine's :class:`~reference_engine.clock.Clock`.

The store's clock is SimPy's ``env.now`` mapped onto a datetime epoch plus an
offset that clock-jump faults move; that is the clock the handler is built
with, so lock expiry happens in simulated time.  A worker's clock adds its own
skew on top; with our handler contract the store reads the handler's clock,
so skew only reaches what the worker itself timestamps (the node's
``dispatchedAt``, the billing API's ``charged_at``), never a lock decision.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from reference_engine.clock import UTC, ensure_utc

__all__ = ["DEFAULT_EPOCH", "SimClock", "SkewedClock"]

#: Where simulated second 0 sits on the calendar.
DEFAULT_EPOCH = dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


class SimClock:
    """``now() = epoch + env.now + offset``; ``jump`` moves the offset (either way)."""

    def __init__(self, env: Any, epoch: dt.datetime = DEFAULT_EPOCH) -> None:
        self.env = env
        self.epoch = ensure_utc(epoch)
        self.offset = 0.0

    def seconds(self) -> float:
        """The store's reading as seconds since the epoch (what histories record)."""
        return float(self.env.now) + self.offset

    def now(self) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=self.seconds())

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
