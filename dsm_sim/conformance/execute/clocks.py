"""Clock control for the state machine: the injected clock, optionally mirrored by freezegun.

A handler built from the factory's ``clock`` argument sees every jump at once.
A handler that reads the system clock (``datetime.now``) is run in
:attr:`ClockMode.SYSTEM`, where freezegun pins the wall clock to the same
instant and moves it with every jump.  freezegun is started with
``real_asyncio=True``: without it, it also freezes ``time.monotonic`` and the
event loop's timers never fire, so any ``await asyncio.sleep`` hangs.  It
cannot move a database server's own ``now()``; a handler that asks the
database for the time cannot be verified here, and should not exist.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError

__all__ = ["ClockMode", "ConformanceClock", "parse_clock_mode"]


class ClockMode(enum.Enum):
    """How the handler under test learns the time."""

    INJECTED = "injected"
    SYSTEM = "system"

    def __repr__(self) -> str:
        return f"ClockMode.{self.name}"


def parse_clock_mode(value: str | ClockMode) -> ClockMode:
    """Accept a mode or its name; an unknown name is a configuration error."""
    if isinstance(value, ClockMode):
        return value
    for mode in ClockMode:
        if mode.value == str(value).strip().lower():
            return mode
    raise ConfigurationError(
        f"unknown clock mode {value!r}; choose one of {', '.join(m.value for m in ClockMode)}"
    )


class ConformanceClock:
    """The clock handed to the factory; in SYSTEM mode freezegun follows it."""

    def __init__(self, start: dt.datetime, mode: ClockMode = ClockMode.INJECTED) -> None:
        self._manual = ManualClock(start)
        self.mode = mode
        self._freezer: Any = None
        self._frozen: Any = None

    def now(self) -> dt.datetime:
        return self._manual.now()

    def start(self) -> None:
        """Pin the system clock (SYSTEM mode only); idempotent."""
        if self.mode is ClockMode.SYSTEM and self._freezer is None:
            from freezegun import freeze_time

            self._freezer = freeze_time(self._manual.now(), real_asyncio=True)
            self._frozen = self._freezer.start()

    def stop(self) -> None:
        """Release the system clock; safe to call twice."""
        if self._freezer is not None:
            freezer, self._freezer, self._frozen = self._freezer, None, None
            freezer.stop()

    def advance(self, delta: dt.timedelta) -> dt.datetime:
        """Move by ``delta`` (negative for a backwards jump) and return the new now."""
        now = self._manual.advance(delta)
        self._follow()
        return now

    def set(self, instant: dt.datetime) -> None:
        self._manual.set(instant)
        self._follow()

    def _follow(self) -> None:
        if self._frozen is not None:
            self._frozen.move_to(self._manual.now())

    def __repr__(self) -> str:
        return f"ConformanceClock({self._manual.now()!r}, {self.mode!r})"
