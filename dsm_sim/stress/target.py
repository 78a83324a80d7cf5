"""Which store a stress run's handlers must share, told to a ``(clock)`` factory.

A stress handler is built from the same ``(clock) -> handler`` factory as
everywhere else, in every spawned process, and all of them must meet in one
store, or there is no race to find.  The run names that store before it
calls the factory: ``DSM_STRESS_DB_URL`` (the run's database) and
``DSM_STRESS_SCHEMA`` (the PostgreSQL schema of this run, empty for SQLite)
are set in the process's environment, and :func:`run_target` reads them back.
A factory for your own store reads them (or its own configuration) and must
not make a fresh schema or key prefix per call, as a conformance factory does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from reference_engine.errors import ConfigurationError

__all__ = [
    "DB_URL_ENV",
    "SCHEMA_ENV",
    "SavedTarget",
    "StressTarget",
    "export_target",
    "run_target",
]

DB_URL_ENV = "DSM_STRESS_DB_URL"
SCHEMA_ENV = "DSM_STRESS_SCHEMA"


@dataclass(frozen=True, slots=True)
class StressTarget:
    """The database a stress run uses and, on PostgreSQL, the schema its tables live in."""

    db_url: str
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class SavedTarget:
    """This process's target variables as they were before a run exported its own.

    The process that drives a run (a test, an application calling
    ``run_stress``) outlives it: a handler process it starts later would
    otherwise inherit the finished run's database, and a handler that
    prefers a stress run's store (``handlers/node/postgres.js``) would go
    there instead of where it was told.
    """

    values: tuple[tuple[str, str | None], ...]

    @classmethod
    def now(cls) -> SavedTarget:
        return cls(tuple((name, os.environ.get(name)) for name in (DB_URL_ENV, SCHEMA_ENV)))

    def restore(self) -> None:
        for name, value in self.values:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def export_target(target: StressTarget) -> None:
    """Tell factories built in this process where the run's store is."""
    os.environ[DB_URL_ENV] = target.db_url
    os.environ[SCHEMA_ENV] = target.schema or ""


def run_target() -> StressTarget:
    """The store of the stress run this process belongs to."""
    url = os.environ.get(DB_URL_ENV, "").strip()
    if not url:
        raise ConfigurationError(
            f"no stress run in progress: {DB_URL_ENV} is not set; a stress factory is "
            "called by dsm stress, which sets it to the run's database"
        )
    return StressTarget(url, os.environ.get(SCHEMA_ENV, "").strip() or None)
