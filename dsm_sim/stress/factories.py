"""``(clock)`` handler factories for stress runs: the built-in handler on the run's store.

Every spawned process builds its own handler from a spec string, so these
live in an importable module.  They read the run's database and schema from
:func:`~dsm_sim.stress.target.run_target`, so every process meets in one store.

A handler in another process (``--handler exec:COMMAND`` or
``exec-tcp:HOST:PORT``) is built by :func:`exec_stress_factory`: each stress
process starts its own handler process (or opens its own connection), which
inherits ``DSM_STRESS_DB_URL`` and ``DSM_STRESS_SCHEMA`` from the environment,
and must say on ``open`` that its store is shared.  A process that keeps its
store in memory cannot meet the others anywhere, so it is refused with
:class:`~dsm_sim.protocol.errors.SharedStoreRequiredError` before the run
starts (the parent opens its own handler first).
"""

from __future__ import annotations

from dsm_sim.protocol.client import ExecHandler, Target, parse_address, split_command
from dsm_sim.protocol.errors import SharedStoreRequiredError
from dsm_sim.stress.target import run_target
from reference_engine.clock import Clock
from reference_engine.handler import StateHandler
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler

__all__ = [
    "EXEC_PREFIX",
    "EXEC_TCP_PREFIX",
    "SHORT_BUSY_TIMEOUT_S",
    "ExecStressFactory",
    "SharedStoreExecHandler",
    "exec_stress_factory",
    "is_exec_spec",
    "sqlite_short_busy_timeout_handler",
    "stress_check_then_insert_handler",
    "stress_sql_handler",
    "stress_unfenced_handler",
]

#: ``--handler`` prefixes of an out-of-process handler, as for ``dsm run``.
EXEC_PREFIX = "exec:"
EXEC_TCP_PREFIX = "exec-tcp:"

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


def stress_check_then_insert_handler(clock: Clock) -> StateHandler:
    """The catalogue's check-then-insert SQL handler on the run's store, as a ``(clock)`` factory.

    Its acquire reads and then writes in two transactions.  ``dsm serve
    --shared-store`` can serve only a ``(clock)`` factory, so this is how a
    stress run shows that a race between handler processes is caught.
    """
    from dsm_sim.broken.sql import check_then_insert_handler

    target = run_target()
    return check_then_insert_handler(target.db_url, clock, schema=target.schema)


def stress_unfenced_handler(clock: Clock) -> StateHandler:
    """The catalogue's unfenced SQL handler on the run's store, as a ``(clock)`` factory.

    Its ``set`` ignores the fencing token, so a worker partitioned past its
    lock overwrites the record of the worker that took the item over; a
    ``--netfault`` partition longer than ``--lock-duration`` is what shows it.
    """
    from dsm_sim.broken.sql import unfenced_handler

    target = run_target()
    return unfenced_handler(target.db_url, clock, schema=target.schema)


def is_exec_spec(spec: str) -> bool:
    """Whether a ``--handler`` spec names a handler in another process."""
    return spec.startswith((EXEC_PREFIX, EXEC_TCP_PREFIX))


class SharedStoreExecHandler(ExecHandler):
    """A handler process that must declare a shared store on ``open``, or is refused."""

    async def open(self) -> None:
        await super().open()
        if not self.shared_store:
            await self.close()
            raise SharedStoreRequiredError(command=self.command, name=self.name)


class ExecStressFactory:
    """``(clock) -> handler`` for ``exec:COMMAND`` or ``exec-tcp:HOST:PORT`` under ``dsm stress``."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.target: Target
        if spec.startswith(EXEC_TCP_PREFIX):
            self.target = parse_address(spec[len(EXEC_TCP_PREFIX) :])
        elif spec.startswith(EXEC_PREFIX):
            command = spec[len(EXEC_PREFIX) :]
            split_command(command)  # an empty command is a usage error before the run
            self.target = command
        else:
            raise ValueError(f"not an exec handler spec: {spec!r}")

    def __call__(self, clock: Clock) -> SharedStoreExecHandler:
        return SharedStoreExecHandler(self.target, clock)

    def __repr__(self) -> str:
        return f"exec_stress_factory({self.spec!r})"


def exec_stress_factory(spec: str) -> ExecStressFactory:
    """The factory for an ``exec:``/``exec-tcp:`` spec (a usage error if its command is empty)."""
    return ExecStressFactory(spec)
