"""The built-in handler: the :class:`~reference_engine.handler.StateHandler` over SQL.

It behaves exactly as the reference model (``reference_engine.model``) does,
error class for error class, and adds only what a real store needs: input is
validated before any statement runs, "now" comes from the injected clock and
is passed as a parameter, and driver failures surface as
:class:`~reference_engine.errors.StoreError` so node code handles one error
root whatever the database.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import StaticPool

from reference_engine.begin import BeginResult
from reference_engine.clock import Clock, read_now
from reference_engine.context import StateHandlerContext
from reference_engine.errors import (
    DsmError,
    InvalidItemError,
    StoreError,
    StoreLostError,
    UnsupportedStatusError,
)
from reference_engine.handlers.sql.ddl import create_schema
from reference_engine.handlers.sql.engine import (
    CLIENT_GRACE_S,
    client_timeout,
    create_engine_for,
    is_memory_url,
    statement_timeout_of,
)
from reference_engine.handlers.sql.repository import ProcessStateLogRepository
from reference_engine.model import SETTABLE
from reference_engine.record import StateRecord, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = ["SqlStateHandler"]

S = IdempotencyStatus
#: Run on open (before the table is created) and on close (after disposal).
Hook = Callable[[AsyncEngine], Awaitable[None]]
#: Errors from the driver and the network that mean "outcome unknown".  The asyncpg
#: classes reach here unwrapped from the PostgreSQL fast path (``fastpath.py``); the
#: dialect's PEP 249 ``Error`` base joins them per engine (see ``store_failures``).
_STORE_FAILURES: tuple[type[BaseException], ...] = (
    SQLAlchemyError,
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)
#: Context fields stored as text besides the item keys (which the context validates).
_TEXT_FIELDS = ("tenant_id", "entity_id", "entity_execution_id", "source_app_id", "scope_code")


def store_failures(engine: AsyncEngine) -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the store failed, outcome unknown" for ``engine``.

    Besides the driver's own classes this includes the DBAPI module's ``Error``:
    the fast path checks connections out of the pool directly, and a connect that
    fails there (the server restarting, ``CannotConnectNowError``) raises the
    dialect's adapted DBAPI error, which SQLAlchemy wraps only on its own path.
    """
    dbapi_error = getattr(engine.dialect.loaded_dbapi, "Error", None)
    if isinstance(dbapi_error, type) and issubclass(dbapi_error, BaseException):
        return (*_STORE_FAILURES, dbapi_error)
    return _STORE_FAILURES


#: MariaDB error numbers of the two limits the session sets (``engine.mariadb_timeout_sql``).
_MARIADB_TIMEOUTS = {
    1969: "max_statement_time",  # ER_STATEMENT_TIMEOUT
    3024: "max_statement_time",  # ER_QUERY_TIMEOUT, MySQL's spelling of the same
    1205: "innodb_lock_wait_timeout",  # ER_LOCK_WAIT_TIMEOUT
}


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, the driver error SQLAlchemy wraps, and their causes (a short, finite chain)."""
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending and len(seen) < 8:
        current = pending.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        orig = getattr(current, "orig", None)
        pending += [orig if isinstance(orig, BaseException) else None, current.__cause__]
    return seen


def timeout_fired(exc: BaseException) -> str | None:
    """Which of the handler's time limits ``exc`` reports, by the store's own name; else None.

    Walks the chain because the same server error arrives unwrapped from the
    PostgreSQL fast path and wrapped (twice) from SQLAlchemy's path.
    """
    for cause in _causes(exc):
        canceled = isinstance(cause, asyncpg.exceptions.QueryCanceledError)
        if canceled and "statement timeout" in str(cause):
            return "PostgreSQL's statement_timeout"
        if isinstance(cause, asyncpg.exceptions.LockNotAvailableError):
            return "PostgreSQL's lock_timeout"
        args: tuple[Any, ...] = tuple(getattr(cause, "args", ()))
        from_mariadb = type(cause).__module__.startswith(("asyncmy", "pymysql", "MySQLdb"))
        if from_mariadb and args and isinstance(args[0], int) and args[0] in _MARIADB_TIMEOUTS:
            return f"MariaDB's {_MARIADB_TIMEOUTS[args[0]]}"
        if from_mariadb and args and args[0] == 2013 and "read timeout" in str(cause):
            return CLIENT_LIMIT  # asyncmy's read_timeout
        if isinstance(cause, sqlite3.OperationalError) and "locked" in str(cause):
            return "SQLite's busy timeout"
        if isinstance(cause, TimeoutError):
            return CLIENT_LIMIT  # asyncpg's command_timeout, or a connect that got no answer
    return None


#: What :func:`timeout_fired` says when the client gave up waiting (the server said nothing).
CLIENT_LIMIT = "the client-side limit"


def _check_text(value: object, field: str) -> None:
    """Refuse text a database would reject, before any statement runs.

    PostgreSQL rejects NUL in text and both drivers reject lone surrogates;
    checking here makes that a named input error instead of a driver error.
    """
    if not isinstance(value, str):
        raise InvalidItemError(f"{field} must be a string, got {type(value).__name__}", field=field)
    if "\x00" in value:
        raise InvalidItemError(f"{field} must not contain NUL characters", field=field)
    if value.isascii():  # O(1) on CPython, and ASCII is always valid UTF-8
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidItemError(
            f"{field} is not valid Unicode text (cannot be encoded as UTF-8): {exc.reason}",
            field=field,
        ) from exc


def sqlite_file_path(engine: AsyncEngine) -> str | None:
    """The absolute path of the file a SQLite engine opens; None for memory, URI names, servers.

    Resolved once, at construction, so a later ``chdir`` cannot point the
    identity check at another file.
    """
    url = engine.url
    if url.get_backend_name() != "sqlite" or is_memory_url(url):
        return None
    database = url.database or ""
    if database.startswith("file:") or url.query.get("uri"):
        return None  # a URI filename: SQLite resolves it, and it may name no file on disk
    return os.path.abspath(database)


def _storable(ctx: StateHandlerContext) -> StateHandlerContext:
    if not ctx.item_key:
        ctx.record_key  # noqa: B018 -- raises InvalidItemError when the item key is missing
    for field in _TEXT_FIELDS:
        _check_text(getattr(ctx, field), field)
    return ctx


class SqlStateHandler:
    """SQL persistence of item records on SQLite (aiosqlite), PostgreSQL (asyncpg) or MariaDB.

    Build it with :func:`reference_engine.handlers.sql.factory.sql_handler`
    or give it an engine from :func:`~reference_engine.handlers.sql.engine.create_engine_for`.
    ``on_open`` runs before the table is created (e.g. create an isolation
    schema); ``on_close`` runs after the engine is disposed (e.g. remove a
    temporary file).  Use one handler from one event loop.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Clock,
        *,
        on_open: Hook | None = None,
        on_close: Hook | None = None,
        engine_factory: Callable[[], AsyncEngine] | None = None,
    ) -> None:
        self.engine = engine
        #: Builds another engine on the same database, for :meth:`peer`.
        self._engine_factory = engine_factory
        self.clock = clock
        single_connection = isinstance(engine.sync_engine.pool, StaticPool)
        self.repository = ProcessStateLogRepository(engine, serialize=single_connection)
        self._failures = store_failures(engine)
        self._on_open = on_open
        self._on_close = on_close
        self._closed = False
        #: The PostgreSQL schema (MariaDB database) the table lives in, when built for one.
        self.schema_name: str | None = None
        #: The SQLite file this handler works on, and its (device, inode) once seen.
        self._path = sqlite_file_path(engine)
        self._file_id: tuple[int, int] | None = None

    def peer(self) -> SqlStateHandler | None:
        """Another handler on this one's table, with its own engine and connections.

        It opens without the owner's ``on_open`` (the schema exists by then)
        and closes without its ``on_close``, so closing it disposes only its
        own pool and never drops what the owner created.  Without an engine
        factory the second engine is built from this one's URL and schema
        with the default settings.  ``None`` for a private in-memory SQLite
        database, which no second engine can reach.
        """
        make_engine = self._engine_factory or self._same_database()
        if make_engine is None:
            return None
        engine = make_engine()
        try:
            twin = type(self)(engine, self.clock, engine_factory=make_engine)
        except TypeError:
            return None  # a subclass built otherwise: it has no peer
        twin.schema_name = self.schema_name
        return twin

    def _same_database(self) -> Callable[[], AsyncEngine] | None:
        if isinstance(self.engine.sync_engine.pool, StaticPool):
            return None
        url = self.engine.url
        translated = self.engine.get_execution_options().get("schema_translate_map") or {}
        schema = translated.get(None)
        return functools.partial(create_engine_for, url, schema=schema)

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"SqlStateHandler({url!r})"

    def _store_error(self, operation: str, exc: BaseException) -> StoreError:
        fired = timeout_fired(exc)
        if fired is not None:
            return self._timeout_error(operation, exc, fired)
        return StoreError(
            f"{operation} failed on the {self.engine.dialect.name} store "
            f"({type(exc).__name__}: {exc}); the outcome is unknown and retrying is safe"
        )

    def _timeout_error(self, operation: str, exc: BaseException, fired: str) -> StoreError:
        """A wait that hit the statement timeout: which limit, the usual cause, how to change it."""
        seconds = statement_timeout_of(self.engine)
        limit = "" if seconds is None else f" of {seconds:g} s"
        if fired == CLIENT_LIMIT:
            waited = "" if seconds is None else f" within {client_timeout(seconds):g} s"
            return StoreError(
                f"{operation} failed on the {self.engine.dialect.name} store: the server did "
                f"not answer{waited} ({fired}: the statement_timeout{limit} plus "
                f"{CLIENT_GRACE_S:g} s for a statement, the statement_timeout to connect), so "
                "it is frozen, overloaded or unreachable, and its own limits cannot fire "
                f"({type(exc).__name__}: {exc}); the outcome is unknown and retrying is safe"
            )
        return StoreError(
            f"{operation} failed on the {self.engine.dialect.name} store: {fired} fired "
            f"({type(exc).__name__}: {exc}); the outcome is unknown and retrying is safe. The "
            f"handler bounds every statement, lock wait and connect by its statement_timeout"
            f"{limit}; the usual cause is a row lock another session holds (a transaction left "
            "open). If the store is slow rather than blocked, raise the limit: "
            "sql_handler(url, clock, statement_timeout=SECONDS) or "
            "builtin_factory(url, statement_timeout=SECONDS)"
        )

    def _check_file(self) -> None:
        """Refuse to go on when the SQLite file was deleted or replaced since it was opened.

        Connections already open keep reading and writing the deleted file's
        inode, where nobody will ever see the records, and a restart then
        finds an empty database and repeats every item.  One ``stat`` of the
        path (microseconds, no I/O on the database) per operation notices it
        first.  The check runs before the statement and, for the calls a
        node bases its side effect on, again after it; a deletion after that
        second check is seen by the next call (the write that records the
        outcome), after the side effect.
        """
        if self._path is None:
            return
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            raise StoreLostError(
                store=f"SQLite file {self._path!r}",
                reason="the file was deleted while the handler had it open",
            ) from None
        except OSError as exc:
            raise self._store_error("checking the database file", exc) from exc
        seen = (info.st_dev, info.st_ino)
        if self._file_id is None:
            self._file_id = seen
        elif seen != self._file_id:
            raise StoreLostError(
                store=f"SQLite file {self._path!r}",
                reason="the path now names another file (the one opened was deleted or "
                "replaced, e.g. restored from a copy)",
            )

    @asynccontextmanager
    async def _store(self, operation: str) -> AsyncIterator[None]:
        """Turn a driver failure into StoreError; the lifecycle's own errors pass through.

        The four per-item operations of the hot path catch inline instead: a
        ``try`` costs nothing when no exception is raised, this generator does.
        """
        try:
            yield
        except DsmError:
            raise
        except self._failures as exc:
            raise self._store_error(operation, exc) from exc

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        self._closed = False  # a restart: close() then open() on the same instance
        async with self._store("open"):
            if self._on_open is not None:
                await self._on_open(self.engine)
            await create_schema(self.engine)
        self._check_file()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._store("close"):
            try:
                fast_path = self.repository.fast_path
                if fast_path is not None:
                    await fast_path.close()  # its leases go back before the pool is disposed
                await self.engine.dispose()
            finally:
                if self._on_close is not None:
                    await self._on_close(self.engine)

    # --- the StateHandler protocol -----------------------------------------------------------

    # The four calls a node decides its side effect on check the file again after the
    # statement: a file deleted while the statement ran answered from a store nobody
    # will read again ("not done", or a token in it), and the side effect must not follow.

    async def exists(self, ctx: StateHandlerContext) -> bool:
        key = _storable(ctx).record_key
        self._check_file()
        try:
            found = await self.repository.exists(key, read_now(self.clock))
        except self._failures as exc:
            raise self._store_error("exists", exc) from exc
        self._check_file()
        return found

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        key = _storable(ctx).record_key
        self._check_file()
        async with self._store("get"):
            record = await self.repository.get(key)
        self._check_file()
        return record

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        _storable(ctx)
        self._check_file()
        try:
            token = await self.repository.try_acquire_lock(ctx, read_now(self.clock))
        except self._failures as exc:
            raise self._store_error("try_acquire_lock", exc) from exc
        self._check_file()
        return token

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        """``exists`` then ``try_acquire_lock`` atomically (see :mod:`reference_engine.begin`)."""
        _storable(ctx)
        self._check_file()
        try:
            result = await self.repository.begin(ctx, read_now(self.clock))
        except self._failures as exc:
            raise self._store_error("begin", exc) from exc
        self._check_file()
        return result

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(status, IdempotencyStatus) or status not in SETTABLE:
            use = "upsert()" if status is S.SUPERSEDED else "try_acquire_lock()"
            label = status.label if isinstance(status, IdempotencyStatus) else repr(status)
            raise UnsupportedStatusError(status=label, use=use)
        encoded = encode_data(data)
        _storable(ctx)
        self._check_file()
        try:
            await self.repository.set(ctx, status, encoded, read_now(self.clock))
        except self._failures as exc:
            raise self._store_error(f"set({status.label})", exc) from exc

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        _check_text(error_detail, "error_detail")
        _storable(ctx)
        self._check_file()
        try:
            await self.repository.release_lock_as_failed(ctx, error_detail, read_now(self.clock))
        except self._failures as exc:
            raise self._store_error("release_lock_as_failed", exc) from exc

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        encoded = encode_data(data)
        _storable(ctx)
        self._check_file()
        async with self._store("upsert"):
            await self.repository.upsert(ctx, encoded, read_now(self.clock))

    async def reset_expired_locks(self) -> int:
        self._check_file()
        async with self._store("reset_expired_locks"):
            return await self.repository.reset_expired_locks(read_now(self.clock))

    async def expire_past_retention(self) -> int:
        self._check_file()
        async with self._store("expire_past_retention"):
            return await self.repository.expire_past_retention(read_now(self.clock))
