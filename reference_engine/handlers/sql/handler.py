"""The built-in handler: the :class:`~reference_engine.handler.StateHandler` over SQL.

It behaves exactly as the reference model (``reference_engine.model``) does,
error class for error class, and adds only what a real store needs: input is
validated before any statement runs, "now" comes from the injected clock and
is passed as a parameter, and driver failures surface as
:class:`~reference_engine.errors.StoreError` so node code handles one error
root whatever the database.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import StaticPool

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import (
    DsmError,
    InvalidItemError,
    StoreError,
    StoreLostError,
    UnsupportedStatusError,
)
from reference_engine.handlers.sql.engine import is_memory_url
from reference_engine.handlers.sql.repository import ProcessStateLogRepository
from reference_engine.handlers.sql.schema import create_schema
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
    ) -> None:
        self.engine = engine
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

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"SqlStateHandler({url!r})"

    def _store_error(self, operation: str, exc: BaseException) -> StoreError:
        return StoreError(
            f"{operation} failed on the {self.engine.dialect.name} store "
            f"({type(exc).__name__}: {exc}); the outcome is unknown and retrying is safe"
        )

    def _check_file(self) -> None:
        """Refuse to go on when the SQLite file was deleted or replaced since it was opened.

        Connections already open keep reading and writing the deleted file's
        inode, where nobody will ever see the records, and a restart then
        finds an empty database and repeats every item.  One ``stat`` of the
        path (microseconds, no I/O on the database) per operation notices it
        first.  The check runs before the statement: a deletion in the
        instant between the two is not caught until the next operation.
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
                await self.engine.dispose()
            finally:
                if self._on_close is not None:
                    await self._on_close(self.engine)

    # --- the StateHandler protocol -----------------------------------------------------------

    async def exists(self, ctx: StateHandlerContext) -> bool:
        key = _storable(ctx).record_key
        self._check_file()
        try:
            return await self.repository.exists(key, self.clock.now())
        except self._failures as exc:
            raise self._store_error("exists", exc) from exc

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        key = _storable(ctx).record_key
        self._check_file()
        async with self._store("get"):
            return await self.repository.get(key)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        _storable(ctx)
        self._check_file()
        try:
            return await self.repository.try_acquire_lock(ctx, self.clock.now())
        except self._failures as exc:
            raise self._store_error("try_acquire_lock", exc) from exc

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
            await self.repository.set(ctx, status, encoded, self.clock.now())
        except self._failures as exc:
            raise self._store_error(f"set({status.label})", exc) from exc

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        _check_text(error_detail, "error_detail")
        _storable(ctx)
        self._check_file()
        try:
            await self.repository.release_lock_as_failed(ctx, error_detail, self.clock.now())
        except self._failures as exc:
            raise self._store_error("release_lock_as_failed", exc) from exc

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        encoded = encode_data(data)
        _storable(ctx)
        self._check_file()
        async with self._store("upsert"):
            await self.repository.upsert(ctx, encoded, self.clock.now())

    async def reset_expired_locks(self) -> int:
        self._check_file()
        async with self._store("reset_expired_locks"):
            return await self.repository.reset_expired_locks(self.clock.now())

    async def expire_past_retention(self) -> int:
        self._check_file()
        async with self._store("expire_past_retention"):
            return await self.repository.expire_past_retention(self.clock.now())
