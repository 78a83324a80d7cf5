"""The PostgreSQL fast path: prepared statements on the pooled asyncpg connection.

On a local PostgreSQL the round trip of a one-row statement costs less than
SQLAlchemy's per-call Python work around it (execution context, the greenlet
bridge into the driver adapter, result processing).  The hot operations
(exists, acquire, and the fenced writes) therefore send their statement
straight to the asyncpg connection that SQLAlchemy's pool checked out, using
asyncpg's own prepared-statement cache.

What stays with SQLAlchemy: the engine and its pool (checkout, return,
invalidation), and the statements themselves.  Each is a Core construct from
:mod:`.prepared`, compiled once here with the engine's dialect and schema
translation into ``$n`` SQL text, so both paths send the same SQL.  Statement
counters still see every statement (:func:`.statements.announce`), and
timestamps are checked as aware UTC by hand, as ``UtcDateTime`` does.  The
connection is in autocommit: each of these operations is one statement, so an
explicit transaction would only add two round trips.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only as await_
from sqlalchemy.util import greenlet_spawn

from reference_engine.clock import ensure_utc
from reference_engine.handlers.sql.prepared import Statement
from reference_engine.handlers.sql.schema import UtcDateTime
from reference_engine.handlers.sql.statements import announce

__all__ = ["PgFastPath", "RawStatement", "render"]


@dataclass(frozen=True, slots=True)
class RawStatement:
    """A statement rendered for asyncpg: its SQL text and how to order the arguments.

    ``slots`` has one entry per ``$n``: the parameter name, whether the caller
    must supply it (otherwise ``value`` is the constant the statement carries,
    such as a status literal), and whether it is an instant to check as UTC.
    """

    sql: str
    slots: tuple[tuple[str, bool, Any, bool], ...]

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments; a missing parameter is a programming error (KeyError)."""
        out: list[Any] = []
        for name, supplied, value, instant in self.slots:
            arg = params[name] if supplied else value
            if instant and arg is not None:
                arg = ensure_utc(arg)
            out.append(arg)
        return tuple(out)


def render(statement: Statement, engine: AsyncEngine) -> RawStatement:
    """Compile ``statement`` once for ``engine``: dialect, ``$n`` style and schema included."""
    translate = engine.sync_engine.get_execution_options().get("schema_translate_map")
    compiled = statement.compile(
        dialect=engine.dialect,
        schema_translate_map=translate,
        render_schema_translate=translate is not None,
    )
    if compiled.positiontup is None:
        raise TypeError(f"dialect {engine.dialect.name!r} does not use positional parameters")
    binds = [(name, compiled.binds[name]) for name in compiled.positiontup]
    slots = tuple(
        (
            name,
            bind.required,
            None if bind.required else bind.effective_value,
            isinstance(bind.type, UtcDateTime),
        )
        for name, bind in binds
    )
    return RawStatement(sql=compiled.string, slots=slots)


class PgFastPath:
    """Runs :mod:`.prepared` statements on the raw asyncpg connection of ``engine``'s pool.

    Driver errors propagate unchanged (the handler wraps them as
    ``StoreError``); the connection they happened on is invalidated first,
    so the pool replaces it instead of handing out a broken one.  A cancelled
    call invalidates its connection too, as SQLAlchemy does, since the driver
    may be mid-protocol.  Unlike SQLAlchemy's own path, a lost connection
    does not invalidate the rest of the pool: after a server restart each
    pooled connection fails one call with ``StoreError`` and is replaced.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sync_engine = engine.sync_engine
        self._rendered: dict[int, tuple[Statement, RawStatement]] = {}

    def rendered(self, statement: Statement) -> RawStatement:
        # Keyed by identity: the statements are module-level constants or lru-cached,
        # and the entry keeps the statement alive so its id is never reused.
        entry = self._rendered.get(id(statement))
        if entry is None:
            entry = (statement, render(statement, self.engine))
            self._rendered[id(statement)] = entry
        return entry[1]

    async def fetchval(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None when no row came back."""
        raw = self.rendered(statement)
        args = raw.arguments(params)
        announce(self._sync_engine, raw.sql, args)
        # Straight from the engine's pool: an engine-level Connection would only add
        # Python work here (events, options, transaction state) for a raw statement.
        # Checkout and return may have to await the driver, so the whole call runs
        # in one greenlet, as SQLAlchemy runs its own statements.
        return await greenlet_spawn(self._run, raw.sql, args)

    def _run(self, sql: str, args: tuple[Any, ...]) -> Any:
        # Looked up per call: engine.dispose() replaces the pool.
        fairy = self._sync_engine.pool.connect()
        try:
            return await_(fairy.driver_connection.fetchval(sql, *args))  # type: ignore[union-attr]
        except BaseException as exc:
            fairy.invalidate(exc if isinstance(exc, Exception) else None)
            raise
        finally:
            fairy.close()
