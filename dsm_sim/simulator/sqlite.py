"""SQLite in simulation: the real SQL handler, with aiosqlite's calls run on the loop's own thread.

aiosqlite runs every sqlite3 call on a worker thread of its own and hands the
result back through the event loop: a thread switch and a loop wake-up per
statement, which would be most of what a simulated SQLite call costs, and a
thread whose timing the run does not control.  A simulated run has nothing to
overlap with a statement: the simulator runs one handler call at a time, to
completion, before simulated time moves on.  So here the same sqlite3 calls
run inline, where aiosqlite's connection awaits them, behind aiosqlite's own
connection and cursor classes: the interface SQLAlchemy's aiosqlite dialect
drives.  The handler, its statements, the dialect, the pool and sqlite3 are the
production ones; only the hand-off to a thread is gone, and with it every
await a call makes, so the simulator sends to the handler's coroutines
directly (:mod:`dsm_sim.simulator.driver`).

The simulator swaps the production SQLite factories for these
(:func:`for_simulation`); everything outside the simulator keeps aiosqlite's
thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import types
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_dbapi

from reference_engine.clock import Clock
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.sql import factory as production
from reference_engine.handlers.sql.handler import SqlStateHandler

__all__ = [
    "INLINE_DBAPI",
    "InlineConnection",
    "for_simulation",
    "on_loop_thread",
    "sqlite_file_handler",
    "sqlite_memory_handler",
]


class _Inline:
    """Stands in for aiosqlite's queue to its thread: runs each function as it is put.

    SQLAlchemy's dialect puts work on this queue directly (to set a
    connection's isolation level) and awaits the future it put with it.
    """

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as exc:
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        if future is not None and not future.done():
            future.set_result(result)


class InlineConnection(aiosqlite.Connection):
    """An aiosqlite connection whose sqlite3 calls run where they are awaited.

    Its worker thread is created by aiosqlite's constructor and never started.
    """

    def __init__(self, connector: Callable[[], sqlite3.Connection], iter_chunk_size: int) -> None:
        super().__init__(connector, iter_chunk_size)
        self._tx = _Inline()  # type: ignore[assignment]

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    def __await__(self) -> Generator[Any, None, InlineConnection]:
        return self._connect().__await__()

    def stop(self) -> asyncio.Future[Any] | None:
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        return None


def _connect(
    database: str | bytes | Path, *, iter_chunk_size: int = 64, **kwargs: Any
) -> InlineConnection:
    """``aiosqlite.connect``, opening the sqlite3 connection inline when awaited."""

    def connector() -> sqlite3.Connection:
        if isinstance(database, str):
            where = database
        elif isinstance(database, bytes):
            where = database.decode("utf-8")
        else:
            where = str(database)
        connection: sqlite3.Connection = sqlite3.connect(where, **kwargs)
        return connection

    return InlineConnection(connector, iter_chunk_size)


def _inline_aiosqlite() -> types.ModuleType:
    """aiosqlite as SQLAlchemy's dialect sees it, with ``connect`` opening inline connections."""
    module = types.ModuleType("aiosqlite_inline", __doc__)
    for name in aiosqlite.__all__:
        setattr(module, name, getattr(aiosqlite, name))
    module.connect = _connect  # type: ignore[attr-defined]
    module.Connection = InlineConnection  # type: ignore[attr-defined]
    return module


#: The DBAPI the simulator's SQLite engines use in place of the dialect's own.
INLINE_DBAPI = AsyncAdapt_aiosqlite_dbapi(_inline_aiosqlite(), sqlite3)


def sqlite_memory_handler(clock: Clock) -> SqlStateHandler:
    """:func:`~reference_engine.handlers.sql.factory.sqlite_memory_handler` on the inline driver."""
    return production.sqlite_memory_handler(clock, module=INLINE_DBAPI)


def sqlite_file_handler(clock: Clock) -> SqlStateHandler:
    """:func:`~reference_engine.handlers.sql.factory.sqlite_file_handler` on the inline driver."""
    return production.sqlite_file_handler(clock, module=INLINE_DBAPI)


#: Production factory -> the one a simulated run uses instead.
_SIMULATED: tuple[tuple[HandlerFactory, HandlerFactory], ...] = (
    (production.sqlite_memory_handler, sqlite_memory_handler),
    (production.sqlite_file_handler, sqlite_file_handler),
)


def for_simulation(factory: HandlerFactory) -> HandlerFactory:
    """The factory a simulated run builds its handler with: a SQLite one moves onto the loop thread."""
    for made, simulated in _SIMULATED:
        if factory is made:
            return simulated
    return factory


def on_loop_thread(handler: StateHandler) -> bool:
    """Whether ``handler`` is a SQL handler whose engine runs on the inline driver."""
    if not isinstance(handler, SqlStateHandler):
        return False
    return handler.engine.dialect.dbapi is INLINE_DBAPI
