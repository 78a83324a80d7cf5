"""The fast path: the hot statements on the pooled driver connection, past SQLAlchemy Core.

On a local server the round trip of a one-row statement costs less than
SQLAlchemy's per-call Python work around it (execution context, the greenlet
bridge into the driver adapter, result processing).  The hot operations
therefore send their statement straight to the driver connection that
SQLAlchemy's pool checked out: on PostgreSQL (exists, acquire, the fenced
writes) to asyncpg, with its prepared-statement cache; on MariaDB (exists,
acquire) to asyncmy.

What stays with SQLAlchemy: the engine and its pool (checkout, return,
invalidation), and the statements themselves.  Each is a Core construct from
:mod:`.prepared` (or :mod:`.mariadb`), compiled once here with the engine's
dialect and schema translation into the driver's SQL text, so both paths send
the same SQL.  Statement counters still see every statement
(:func:`.statements.announce`).  Parameters are converted as SQLAlchemy
converts them: on PostgreSQL instants are checked as aware UTC by hand, as
``UtcDateTime`` does; on MariaDB each parameter goes through its type's bind
processor.  The transaction shape is the SQLAlchemy path's: on PostgreSQL the
connection is in autocommit (each of these operations is one statement, so an
explicit transaction would only add two round trips); on MariaDB the
statement runs in the connection's implicit transaction and ``COMMIT`` follows.
On a SQLite file (aiosqlite) only the reads, ``exists`` and ``get``, take
this path: their cost there is the hops to the driver's thread, not the
round trip (:class:`SqliteFastPath`).

Connections are leased, not checked out per call (:class:`FastPath`): a call
returns its connection to the fast path, and the next call takes it back
without going through the pool, the greenlet bridge or the pool's reset.  A
connection nobody took by the next turn of the event loop goes back to the
pool, and while a statement of the SQLAlchemy path is under way every call
returns its connection to the pool at once, so the pool's other users wait no
longer than they would behind per-call checkouts.
"""

from __future__ import annotations

import asyncio
import operator
from collections import namedtuple
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool, PoolProxiedConnection, QueuePool
from sqlalchemy.util import greenlet_spawn

from reference_engine.clock import ensure_utc
from reference_engine.handlers.sql.prepared import Statement
from reference_engine.handlers.sql.schema import UtcDateTime
from reference_engine.handlers.sql.statements import announce

__all__ = [
    "FastPath",
    "MariaDbFastPath",
    "PgFastPath",
    "RawStatement",
    "SqliteFastPath",
    "WriteOutcome",
    "fast_path_for",
    "render",
]

#: How one parameter is converted before the driver sees it (None: passed as is).
Convert = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class RawStatement:
    """A statement rendered for the driver: its SQL text and how to order the arguments.

    ``slots`` has one entry per positional parameter: the parameter name,
    whether the caller must supply it (otherwise ``value`` is the constant the
    statement carries, such as a status literal, already converted), and how
    to convert a supplied value that is not None.  A parameter named more than
    once (``p_now`` appears up to nine times) is converted once per call.
    """

    sql: str
    slots: tuple[tuple[str, bool, Any, Convert], ...]
    #: The constants, then one converter per distinct supplied name; ``_pick`` orders them.
    _constants: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    _supplied: tuple[tuple[str, Convert], ...] = field(init=False, repr=False, compare=False)
    _pick: Callable[[list[Any]], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        constants: list[Any] = []
        supplied: dict[str, tuple[int, Convert]] = {}
        at: list[int] = []
        for name, required, value, convert in self.slots:
            if not required:
                at.append(len(constants))
                constants.append(value)
            else:
                at.append(-1 - supplied.setdefault(name, (len(supplied), convert))[0])
        # Supplied values follow the constants in the list the picker reads.
        positions = [i if i >= 0 else len(constants) - 1 - i for i in at]
        names = sorted(supplied.items(), key=lambda item: item[1][0])
        object.__setattr__(self, "_constants", tuple(constants))
        object.__setattr__(self, "_supplied", tuple((n, c) for n, (_, c) in names))
        object.__setattr__(self, "_pick", _picker(positions))

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments; a missing parameter is a programming error (KeyError)."""
        values = list(self._constants)
        for name, convert in self._supplied:
            value = params[name]
            if convert is not None and value is not None:
                value = convert(value)
            values.append(value)
        return self._pick(values)


def _picker(positions: list[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """``values -> tuple(values[i] for i in positions)``, at C speed for two or more."""
    if len(positions) >= 2:
        return operator.itemgetter(*positions)
    return lambda values: tuple(values[i] for i in positions)


def _convert(bind: Any, engine: AsyncEngine) -> Convert:
    """What SQLAlchemy does to a value of ``bind`` before the driver sees it, for ``engine``."""
    if engine.dialect.name == "postgresql":
        # asyncpg takes Python values as they are; UtcDateTime only checks instants.
        return ensure_utc if isinstance(bind.type, UtcDateTime) else None
    processor: Convert = bind.type._cached_bind_processor(engine.dialect)
    return processor


def render(statement: Statement, engine: AsyncEngine) -> RawStatement:
    """Compile ``statement`` once for ``engine``: dialect, parameter style and schema included."""
    translate = engine.sync_engine.get_execution_options().get("schema_translate_map")
    compiled = statement.compile(
        dialect=engine.dialect,
        schema_translate_map=translate,
        render_schema_translate=translate is not None,
    )
    if compiled.positiontup is None:
        raise TypeError(f"dialect {engine.dialect.name!r} does not use positional parameters")
    slots = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        convert = _convert(bind, engine)
        value = None
        if not bind.required:
            value = bind.effective_value
            if convert is not None and value is not None:
                value = convert(value)
        slots.append((name, bool(bind.required), value, convert))
    return RawStatement(sql=compiled.string, slots=tuple(slots))


@dataclass(frozen=True, slots=True)
class _Lease:
    """A connection the fast path checked out: the pool's proxy, its pool and the driver's."""

    pool: Pool
    fairy: PoolProxiedConnection
    driver: Any


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What a write without ``RETURNING`` reports (MariaDB): its row count and last insert id."""

    rowcount: int
    lastrowid: int


class FastPath:
    """Leases ``engine``'s pooled connections to run :mod:`.prepared` statements on the driver.

    Driver errors propagate unchanged (the handler wraps them as
    ``StoreError``); the connection they happened on is invalidated first,
    so the pool replaces it instead of handing out a broken one.  A cancelled
    call invalidates its connection too, as SQLAlchemy does, since the driver
    may be mid-protocol.  Unlike SQLAlchemy's own path, a lost connection
    does not invalidate the rest of the pool: after a server restart each
    pooled connection fails one call with ``StoreError`` and is replaced.

    Leases (see the module docstring): ``_idle`` holds the connections
    between calls.  Checking one out of SQLAlchemy's pool costs a greenlet,
    the pool's queue, its checkout and return bookkeeping and its reset;
    under concurrency that was more CPU than the statement itself.  A lease
    goes back to the pool when the pool was replaced (``engine.dispose()``),
    when it sat unused for a turn of the loop, while the SQLAlchemy path
    needs connections (:meth:`lending`), and on :meth:`close`.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sync_engine = engine.sync_engine
        self._rendered: dict[int, tuple[Statement, RawStatement]] = {}
        self._idle: list[_Lease] = []
        #: Statements of the SQLAlchemy path under way: while any is, leases are not kept.
        self._lending = 0
        self._sweep_due = False
        self._returns: set[asyncio.Task[None]] = set()

    def rendered(self, statement: Statement) -> RawStatement:
        # Keyed by identity: the statements are module-level constants or lru-cached,
        # and the entry keeps the statement alive so its id is never reused.
        entry = self._rendered.get(id(statement))
        if entry is None:
            entry = (statement, render(statement, self.engine))
            self._rendered[id(statement)] = entry
        return entry[1]

    def _prepare(
        self, statement: Statement, params: Mapping[str, Any]
    ) -> tuple[str, tuple[Any, ...]]:
        raw = self.rendered(statement)
        args = raw.arguments(params)
        announce(self._sync_engine, raw.sql, args)
        return raw.sql, args

    async def _take(self) -> _Lease:
        """An idle lease, or a connection checked out of the pool (which may wait, or open one)."""
        if self._idle:
            return self._idle.pop()
        # Looked up per checkout: engine.dispose() replaces the pool.
        pool = self._sync_engine.pool
        fairy = await greenlet_spawn(pool.connect)
        return _Lease(pool, fairy, fairy.driver_connection)

    async def _give(self, lease: _Lease) -> None:
        """Keep ``lease`` for the next call, or return it to its pool."""
        if self._lending or lease.pool is not self._sync_engine.pool:
            await greenlet_spawn(lease.fairy.close)
            return
        self._idle.append(lease)
        if not self._sweep_due:
            self._sweep_due = True
            asyncio.get_running_loop().call_soon(self._sweep)

    @staticmethod
    async def _fail(lease: _Lease, exc: BaseException) -> None:
        """Invalidate a connection a call failed (or was cancelled) on, and return it."""
        await greenlet_spawn(_discard, lease.fairy, exc)

    def _sweep(self) -> None:
        """One turn after a lease went idle: return what is still idle a turn later."""
        self._sweep_due = False
        if self._idle:
            task = asyncio.get_running_loop().create_task(self._return_idle())
            self._returns.add(task)
            task.add_done_callback(self._returns.discard)

    async def _return_idle(self) -> None:
        idle, self._idle = self._idle, []
        if idle:
            await greenlet_spawn(_close_all, [lease.fairy for lease in idle])

    @asynccontextmanager
    async def lending(self) -> AsyncIterator[None]:
        """While the block runs, every lease goes back to the pool: the SQLAlchemy path needs it."""
        self._lending += 1
        try:
            await self._return_idle()
            yield
        finally:
            self._lending -= 1

    async def close(self) -> None:
        """Return every idle lease to the pool: before the engine is disposed."""
        await asyncio.gather(*list(self._returns), return_exceptions=True)
        await self._return_idle()


def _discard(fairy: PoolProxiedConnection, exc: BaseException) -> None:
    try:
        fairy.invalidate(exc if isinstance(exc, Exception) else None)
    finally:
        fairy.close()


def _close_all(fairies: list[PoolProxiedConnection]) -> None:
    """Return connections to their pool; one that fails to reset is invalidated by the pool."""
    for fairy in fairies:
        fairy.close()


class PgFastPath(FastPath):
    """asyncpg: ``fetchval`` of a prepared statement, in autocommit."""

    async def fetchval(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None when no row came back."""
        sql, args = self._prepare(statement, params)
        lease = self._idle.pop() if self._idle else await self._take()
        try:
            value = await lease.driver.fetchval(sql, *args)
        except BaseException as exc:
            await self._fail(lease, exc)
            raise
        await self._give(lease)
        return value


class MariaDbFastPath(FastPath):
    """asyncmy: the statement in the connection's implicit transaction, then ``COMMIT``."""

    async def fetchval(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None when no row came back."""
        sql, args = self._prepare(statement, params)
        lease = self._idle.pop() if self._idle else await self._take()
        conn = lease.driver
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(sql, args)
                row = await cursor.fetchone()
            await conn.commit()
        except BaseException as exc:
            await self._fail(lease, exc)
            raise
        await self._give(lease)
        return None if row is None else row[0]

    async def write(self, statement: Statement, params: Mapping[str, Any]) -> WriteOutcome:
        """Run a write; its row count and ``LAST_INSERT_ID`` as the server reported them."""
        sql, args = self._prepare(statement, params)
        lease = self._idle.pop() if self._idle else await self._take()
        conn = lease.driver
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(sql, args)
                outcome = WriteOutcome(cursor.rowcount, cursor.lastrowid)
            await conn.commit()
        except BaseException as exc:
            await self._fail(lease, exc)
            raise
        await self._give(lease)
        return outcome


class SqliteFastPath(FastPath):
    """aiosqlite, for the reads only: one hop to the connection's thread per statement.

    SQLAlchemy's path for a one-row read on aiosqlite makes several hops to
    the driver's thread (the checkout's reset, the statement, the cursor's
    rows, the transaction's end), each a thread wake-up, and on a file that
    costs far more than the read.  Here the statement, its rows and the
    cursor's close are one ``execute_fetchall``.  A SELECT outside a
    transaction reads the last committed state (WAL), as the one-statement
    transaction of SQLAlchemy's path does.  Writes stay on SQLAlchemy's
    path, behind the repository's single-writer lock, and every lease goes
    back to the pool while one runs (:meth:`FastPath.lending`).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._rows: dict[int, Callable[[tuple[Any, ...]], Any]] = {}

    async def fetchval(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None when no row came back."""
        rows = await self._fetch(statement, params)
        return rows[0][0] if rows else None

    async def fetch_row(self, statement: Select[Any], params: Mapping[str, Any]) -> Any:
        """The first row, its columns by name and converted as SQLAlchemy's result would."""
        rows = await self._fetch(statement, params)
        if not rows:
            return None
        # By identity, as ``rendered``, whose entry (made by ``_fetch``) keeps the statement alive.
        make = self._rows.get(id(statement))
        if make is None:
            make = self._rows[id(statement)] = _row_maker(statement, self.engine)
        return make(rows[0])

    async def _fetch(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        sql, args = self._prepare(statement, params)
        lease = self._idle.pop() if self._idle else await self._take()
        try:
            rows = await lease.driver.execute_fetchall(sql, args)
        except BaseException as exc:
            await self._fail(lease, exc)
            raise
        await self._give(lease)
        return rows


def _row_maker(statement: Select[Any], engine: AsyncEngine) -> Callable[[tuple[Any, ...]], Any]:
    """Raw row -> a named tuple of the statement's columns, each through its result processor."""
    columns = list(statement.selected_columns)
    names = [str(column.key) for column in columns]
    processors = [column.type._cached_result_processor(engine.dialect, None) for column in columns]
    shape = namedtuple("Row", names)  # type: ignore[misc]

    def make(raw: tuple[Any, ...]) -> Any:
        return shape._make(
            value if convert is None or value is None else convert(value)
            for convert, value in zip(processors, raw, strict=True)
        )

    return make


def fast_path_for(engine: AsyncEngine) -> PgFastPath | MariaDbFastPath | SqliteFastPath | None:
    """The fast path of ``engine``'s backend, or None.

    On SQLite only for a file opened through aiosqlite, with a pool of its own
    connections: an in-memory database shares one connection among all
    callers, where a read on the side could see another caller's open
    transaction; another DBAPI module (the simulator's inline driver) has
    its own ways.
    """
    name = engine.dialect.name
    if name == "postgresql":
        return PgFastPath(engine)
    if name == "mariadb":
        return MariaDbFastPath(engine)
    if name == "sqlite" and _own_aiosqlite_file(engine):
        return SqliteFastPath(engine)
    return None


def _own_aiosqlite_file(engine: AsyncEngine) -> bool:
    database = engine.url.database or ""
    module = getattr(engine.dialect.loaded_dbapi, "aiosqlite", None)
    return (
        engine.dialect.driver == "aiosqlite"
        and getattr(module, "__name__", "") == "aiosqlite"
        and database not in ("", ":memory:")
        and "mode=memory" not in str(engine.url)
        and isinstance(engine.sync_engine.pool, QueuePool)
    )
