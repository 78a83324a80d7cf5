"""``(clock)`` handler factories for stress runs: the built-in handler on the run's store.

Every spawned process builds its own handler from a spec string, so these
live in an importable module.  They read the run's database and schema from
:func:`~dsm_sim.stress.target.run_target`, so every process meets in one store.
"""

from __future__ import annotations

from dsm_sim.stress.target import run_target
from reference_engine.clock import Clock
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler

__all__ = ["SHORT_BUSY_TIMEOUT_S", "sqlite_short_busy_timeout_handler", "stress_sql_handler"]

#: Short enough that writers on one SQLite file give up instead of queueing.
SHORT_BUSY_TIMEOUT_S = 0.005


def stress_sql_handler(clock: Clock) -> SqlStateHandler:
    """The built-in SQL handler on the run's database (and schema, on PostgreSQL)."""
    target = run_target()
    return sql_handler(target.db_url, clock, schema=target.schema)


def sqlite_short_busy_timeout_handler(clock: Clock) -> SqlStateHandler:
    """The built-in handler on the run's SQLite file, whose writers wait only 5 ms for the lock.

    Under contention this provokes ``database is locked``, which the handler
    must turn into a :class:`~reference_engine.errors.StoreError`.
    """
    target = run_target()
    engine = create_engine_for(target.db_url, busy_timeout_s=SHORT_BUSY_TIMEOUT_S)
    return SqlStateHandler(engine, clock)
