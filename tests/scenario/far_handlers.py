"""Handlers that stamp the last instant a record can hold where a near one belongs.

Both are wrong, and both stay within what a ``datetime`` holds: the checker
must report them, never crash on them (``test_far_instants.py``).
"""

from __future__ import annotations

import datetime as dt

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = ["END_OF_TIME", "FarLock", "far_lock", "far_zone"]

#: The last instant a record can hold (``docs/semantics.md``).
END_OF_TIME = dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)


class FarLock(InMemoryStateHandler):
    """Every lock it grants lasts until :data:`END_OF_TIME` (or that wall time in ``zone``)."""

    def __init__(self, clock: Clock, zone: dt.tzinfo = dt.UTC) -> None:
        super().__init__(clock)
        self.until = END_OF_TIME.replace(tzinfo=zone)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = await super().try_acquire_lock(ctx)
        record = self.model.current.get(ctx.record_key)
        if token is not None and record is not None:
            record.locked_until = self.until
        return token


def far_lock(clock: Clock) -> FarLock:
    return FarLock(clock)


def far_zone(clock: Clock) -> FarLock:
    """Locks until 9999-12-31 23:59:59.999999 at UTC-1: an hour past the last UTC instant."""
    return FarLock(clock, dt.timezone(dt.timedelta(hours=-1)))
