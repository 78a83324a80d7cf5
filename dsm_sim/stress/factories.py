"""Handler factories with the stress runner's ``(url, clock, *, schema=)`` signature.

They exist for runs that need the built-in handler configured differently
from its defaults, and must live in an importable module because every
spawned process builds its own handler from the spec string.
"""

from __future__ import annotations

from reference_engine.clock import Clock
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.handler import SqlStateHandler

__all__ = ["SHORT_BUSY_TIMEOUT_S", "sqlite_short_busy_timeout_handler"]

#: Short enough that writers on one SQLite file give up instead of queueing.
SHORT_BUSY_TIMEOUT_S = 0.005


def sqlite_short_busy_timeout_handler(
    url: str, clock: Clock, *, schema: str | None = None
) -> SqlStateHandler:
    """The built-in handler on a SQLite file whose writers wait only 5 ms for the lock.

    Under contention this provokes ``database is locked``, which the handler
    must turn into a :class:`~reference_engine.errors.StoreError`.
    """
    engine = create_engine_for(url, schema=schema, busy_timeout_s=SHORT_BUSY_TIMEOUT_S)
    return SqlStateHandler(engine, clock)
