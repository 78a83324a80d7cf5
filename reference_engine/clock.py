"""Injectable time.

Nothing in the engine reads the wall clock except :class:`SystemClock`; the
simulator and the conformance kit swap in their own clocks so clock jumps and
lock expiry are under test control.  All instants are timezone-aware UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

__all__ = ["UTC", "Clock", "ManualClock", "SystemClock", "ensure_utc"]

UTC = dt.UTC


def ensure_utc(instant: dt.datetime) -> dt.datetime:
    """Normalise to aware UTC; a naive datetime is a bug, not a local time to guess."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"naive datetime {instant!r}: every instant must be timezone-aware UTC")
    return instant.astimezone(UTC)


@runtime_checkable
class Clock(Protocol):
    """Source of "now" for handlers, the engine and the catch-up worker."""

    def now(self) -> dt.datetime:
        """Current instant, timezone-aware UTC."""
        ...


class SystemClock:
    """The real clock; the only place that reads the wall time."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to: forwards, backwards or to an instant."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = ensure_utc(start or dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC))

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, delta: dt.timedelta) -> dt.datetime:
        """Move by ``delta`` (negative for a backwards jump) and return the new now."""
        self._now = self._now + delta
        return self._now

    def set(self, instant: dt.datetime) -> None:
        self._now = ensure_utc(instant)

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"
