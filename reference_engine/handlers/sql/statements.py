"""Counting the SQL statements an operation sends, for tests and benchmarks.

"One atomic statement per operation" is a design claim worth checking: it
is what makes each operation safe under concurrency without application
locks, and what keeps its cost flat.  Transaction bookkeeping (``BEGIN``,
``COMMIT``, ``PRAGMA``, savepoints) is not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["BOOKKEEPING_PREFIXES", "StatementLog", "count_statements"]

#: Statements that manage the connection or transaction rather than the data.
BOOKKEEPING_PREFIXES = ("PRAGMA", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@dataclass(frozen=True, slots=True)
class StatementLog:
    """The statements seen so far; the listener appends to the list while the block runs."""

    statements: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.statements)

    def clear(self) -> None:
        self.statements.clear()


@contextmanager
def count_statements(engine: AsyncEngine | Engine) -> Iterator[StatementLog]:
    """Record every data statement executed through ``engine`` while the block runs."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    log = StatementLog()

    def before_cursor_execute(
        _conn: Any, _cursor: Any, statement: str, *_args: Any, **_kwargs: Any
    ) -> None:
        if not statement.lstrip().upper().startswith(BOOKKEEPING_PREFIXES):
            log.statements.append(statement)

    event.listen(sync_engine, "before_cursor_execute", before_cursor_execute)
    try:
        yield log
    finally:
        event.remove(sync_engine, "before_cursor_execute", before_cursor_execute)
