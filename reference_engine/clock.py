"""Injectable time.

Nothing in the engine reads the wall clock except :class:`SystemClock`; the
simulator and the conformance kit swap in their own clocks so clock jumps and
lock expiry are under test control.  All instants are timezone-aware UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

from reference_engine.errors import InvalidClockError, echo

__all__ = ["UTC", "Clock", "ManualClock", "SystemClock", "ensure_utc", "read_now"]

UTC = dt.UTC


def ensure_utc(instant: dt.datetime) -> dt.datetime:
    """Normalise to aware UTC; a naive datetime is a bug, not a local time to guess."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"naive datetime {instant!r}: every instant must be timezone-aware UTC")
    return instant.astimezone(UTC)


def read_now(clock: Clock) -> dt.datetime:
    """``clock.now()`` as aware UTC, or :class:`~reference_engine.errors.InvalidClockError`.

    Every built-in handler reads its injected clock through this one
    function, so a clock that returns a naive datetime, a string or a number
    is refused the same way on every store, before any write; and a clock in
    another offset is read in UTC, so every store stamps the same instants
    the same way.  A clock already in UTC costs two checks.
    """
    now = clock.now()
    if type(now) is dt.datetime and now.tzinfo is UTC:
        return now
    if not isinstance(now, dt.datetime):
        raise InvalidClockError(clock=echo(clock), returned=f"{type(now).__name__} {echo(now)}")
    try:
        aware = now.tzinfo is not None and now.utcoffset() is not None
    except Exception as exc:  # a tzinfo whose utcoffset raises is no offset at all
        raise InvalidClockError(
            clock=echo(clock), returned=f"a datetime whose tzinfo raised {type(exc).__name__}"
        ) from exc
    if not aware:
        raise InvalidClockError(clock=echo(clock), returned=f"the naive datetime {echo(now)}")
    return now.astimezone(UTC)


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
