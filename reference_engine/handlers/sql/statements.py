"""Counting the SQL statements an operation sends, for tests and benchmarks.

"One atomic statement per operation" is a design claim worth checking: it
is what makes each operation safe under concurrency without application
locks, and what keeps its cost flat.  Transaction bookkeeping (``BEGIN``,
``COMMIT``, ``PRAGMA``, savepoints) is not counted.

Statements reach the database two ways: through SQLAlchemy (seen by its
``before_cursor_execute`` event) and through the PostgreSQL fast path, which
sends prepared statements on the raw asyncpg connection and so bypasses the
event.  The fast path calls :func:`announce` before each statement, and
:func:`count_statements` listens to both, so a count covers everything sent.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["BOOKKEEPING_PREFIXES", "StatementLog", "announce", "count_statements"]

#: Statements that manage the connection or transaction rather than the data.
BOOKKEEPING_PREFIXES = ("PRAGMA", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")

Observer = Callable[[str, Sequence[Any]], None]
#: Observers of statements sent past SQLAlchemy's events, per (sync) engine.
_observers: weakref.WeakKeyDictionary[Engine, list[Observer]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class StatementLog:
    """The statements seen so far; the listener appends to the lists while the block runs.

    ``parameters[i]`` holds the parameters ``statements[i]`` was sent with,
    as the driver received them.
    """

    statements: list[str] = field(default_factory=list)
    parameters: list[Sequence[Any]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.statements)

    def clear(self) -> None:
        self.statements.clear()
        self.parameters.clear()

    def record(self, statement: str, parameters: Sequence[Any]) -> None:
        if not statement.lstrip().upper().startswith(BOOKKEEPING_PREFIXES):
            self.statements.append(statement)
            self.parameters.append(parameters)


def announce(engine: Engine, statement: str, parameters: Sequence[Any]) -> None:
    """Report a statement sent without SQLAlchemy's events to the counters on ``engine``."""
    observers = _observers.get(engine)
    if observers:
        for observer in list(observers):
            observer(statement, parameters)


@contextmanager
def count_statements(engine: AsyncEngine | Engine) -> Iterator[StatementLog]:
    """Record every data statement executed through ``engine`` while the block runs."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    log = StatementLog()

    def before_cursor_execute(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any, **_kwargs: Any
    ) -> None:
        log.record(statement, parameters)

    event.listen(sync_engine, "before_cursor_execute", before_cursor_execute)
    observers = _observers.setdefault(sync_engine, [])
    observers.append(log.record)
    try:
        yield log
    finally:
        observers.remove(log.record)
        event.remove(sync_engine, "before_cursor_execute", before_cursor_execute)
