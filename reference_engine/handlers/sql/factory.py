"""Factories for the built-in SQL handler: ``(clock) -> handler``, as the registry expects.

The isolating factories (a fresh in-memory database, a temporary file, a
throw-away PostgreSQL schema or MariaDB database) are what the conformance kit, the simulator and
the tests build handlers from, so runs that share a server never see each
other's rows and leave nothing behind once closed.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import StaticPool

from reference_engine.clock import Clock
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.sql.engine import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    create_engine_for,
    create_pg_schema,
    drop_pg_schema,
    normalize_url,
    validate_statement_timeout,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.mariadb import create_database, drop_database

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "MARIADB_TEST_URL_ENV",
    "MEMORY_URL",
    "POSTGRES_TEST_URL_ENV",
    "builtin_factory",
    "database_url",
    "mariadb_isolated_handler",
    "mariadb_test_handler",
    "postgres_isolated_handler",
    "postgres_test_handler",
    "sql_handler",
    "sqlite_file_handler",
    "sqlite_memory_handler",
]

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///dsm.db"
DATABASE_URL_ENV = "DSM_DATABASE_URL"
POSTGRES_TEST_URL_ENV = "DSM_TEST_POSTGRES_URL"
MARIADB_TEST_URL_ENV = "DSM_TEST_MARIADB_URL"
MEMORY_URL = "sqlite+aiosqlite:///:memory:"


def database_url() -> str:
    """``DSM_DATABASE_URL`` if set, else :data:`DEFAULT_DATABASE_URL` (a file in the cwd)."""
    return os.environ.get(DATABASE_URL_ENV, "").strip() or DEFAULT_DATABASE_URL


def sql_handler(
    url: str,
    clock: Clock,
    *,
    schema: str | None = None,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT_S,
    module: Any | None = None,
) -> SqlStateHandler:
    """A handler on ``url``; with ``schema`` the table lives in that schema (MariaDB: database).

    The schema is created on open if missing and kept on close.
    ``statement_timeout`` (seconds, default 30) bounds every statement, lock
    wait and connect; when it fires the call raises ``StoreError``.
    ``module``: the DBAPI module in place of the driver's (see :func:`create_engine_for`).
    """
    make_engine = functools.partial(
        create_engine_for,
        url,
        schema=schema,
        pool_size=pool_size,
        max_overflow=max_overflow,
        statement_timeout=statement_timeout,
        module=module,
    )
    engine = make_engine()
    # A private in-memory database lives in its one connection: no second engine reaches it.
    shared = None if isinstance(engine.sync_engine.pool, StaticPool) else make_engine
    on_open = None
    if schema is not None:
        name = schema

        async def on_open(engine: AsyncEngine) -> None:
            if engine.dialect.name == "mariadb":
                await create_database(engine, name)
            else:
                await create_pg_schema(engine, name)

    handler = SqlStateHandler(engine, clock, on_open=on_open, engine_factory=shared)
    handler.schema_name = schema
    return handler


def sqlite_memory_handler(clock: Clock, *, module: Any | None = None) -> SqlStateHandler:
    """A fresh private in-memory SQLite database per call; gone when closed.

    ``module``: the DBAPI module in place of aiosqlite (see :func:`create_engine_for`).
    """
    return sql_handler(MEMORY_URL, clock, module=module)


def sqlite_file_handler(clock: Clock, *, module: Any | None = None) -> SqlStateHandler:
    """A fresh SQLite file (WAL) in a temporary directory per call, removed on close.

    ``module``: the DBAPI module in place of aiosqlite (see :func:`create_engine_for`).
    """
    directory = Path(tempfile.mkdtemp(prefix="dsm-sqlite-"))

    async def remove(_engine: AsyncEngine) -> None:
        shutil.rmtree(directory, ignore_errors=True)

    make_engine = functools.partial(
        create_engine_for, f"sqlite+aiosqlite:///{directory / 'dsm.db'}", module=module
    )
    return SqlStateHandler(make_engine(), clock, on_close=remove, engine_factory=make_engine)


def postgres_isolated_handler(
    url: str,
    clock: Clock,
    *,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT_S,
    cls: type[SqlStateHandler] = SqlStateHandler,
) -> SqlStateHandler:
    """A handler in a fresh, uniquely named schema of the PostgreSQL database at ``url``.

    The schema is created on open and dropped (with its rows) on close, so
    concurrent runs on one server are isolated.  ``handler.schema_name``
    tells which schema a run used.  ``cls`` is the handler's class: a
    subclass of the built-in handler (a variant under test) runs the same way.
    """
    if normalize_url(url).get_backend_name() != "postgresql":
        raise ConfigurationError(f"an isolated schema needs a PostgreSQL URL, got {url!r}")
    name = f"dsm_run_{uuid.uuid4().hex[:16]}"

    async def create(engine: AsyncEngine) -> None:
        await create_pg_schema(engine, name)

    async def drop(engine: AsyncEngine) -> None:
        try:
            await drop_pg_schema(engine, name)
        finally:
            await engine.dispose()

    return _in_schema(
        url,
        clock,
        name,
        create,
        drop,
        pool_size=pool_size,
        max_overflow=max_overflow,
        statement_timeout=statement_timeout,
        cls=cls,
    )


def _in_schema(
    url: str,
    clock: Clock,
    name: str,
    create: Callable[[AsyncEngine], Awaitable[None]],
    drop: Callable[[AsyncEngine], Awaitable[None]],
    *,
    pool_size: int | None,
    max_overflow: int | None,
    statement_timeout: float,
    cls: type[SqlStateHandler] = SqlStateHandler,
) -> SqlStateHandler:
    """A handler whose table lives in schema ``name``, created on open and dropped on close.

    Its peers (:meth:`SqlStateHandler.peer`) build their engines the same way.
    """
    make_engine = functools.partial(
        create_engine_for,
        url,
        schema=name,
        pool_size=pool_size,
        max_overflow=max_overflow,
        statement_timeout=statement_timeout,
    )
    handler = cls(make_engine(), clock, on_open=create, on_close=drop, engine_factory=make_engine)
    handler.schema_name = name
    return handler


def postgres_test_handler(clock: Clock) -> SqlStateHandler:
    """:func:`postgres_isolated_handler` on ``DSM_TEST_POSTGRES_URL``.

    For the conformance kit and the simulator: every call is a fresh schema.
    """
    url = _test_url(
        "postgres_test_handler",
        POSTGRES_TEST_URL_ENV,
        "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    )
    return postgres_isolated_handler(url, clock)


def mariadb_isolated_handler(
    url: str,
    clock: Clock,
    *,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT_S,
) -> SqlStateHandler:
    """A handler in a fresh, uniquely named database of the MariaDB server at ``url``.

    The database is created on open and dropped (with its rows) on close, so
    concurrent runs on one server are isolated; the connections stay on the
    URL's database and reach the table through schema translation, as on
    PostgreSQL.  ``handler.schema_name`` tells which database a run used.
    """
    if normalize_url(url).get_backend_name() != "mariadb":
        raise ConfigurationError(f"an isolated database needs a MariaDB URL, got {url!r}")
    name = f"dsm_run_{uuid.uuid4().hex[:16]}"
    created = False

    async def create(engine: AsyncEngine) -> None:
        nonlocal created
        await create_database(engine, name)
        created = True

    async def drop(engine: AsyncEngine) -> None:
        # A server that never took the database (refused, unreachable) has
        # nothing to drop, and closing such a handler must not fail; its
        # connection pool is released either way.
        try:
            if created:
                await drop_database(engine, name)
        finally:
            await engine.dispose()

    return _in_schema(
        url,
        clock,
        name,
        create,
        drop,
        pool_size=pool_size,
        max_overflow=max_overflow,
        statement_timeout=statement_timeout,
    )


def mariadb_test_handler(clock: Clock) -> SqlStateHandler:
    """:func:`mariadb_isolated_handler` on ``DSM_TEST_MARIADB_URL``.

    For the conformance kit and the simulator: every call is a fresh database.
    """
    url = _test_url(
        "mariadb_test_handler", MARIADB_TEST_URL_ENV, "mariadb+asyncmy://root@127.0.0.1:3306/test"
    )
    return mariadb_isolated_handler(url, clock)


def _test_url(factory: str, env_var: str, example: str) -> str:
    """The test server's URL from ``env_var``, or an error naming the variable to set."""
    url = os.environ.get(env_var, "").strip()
    if not url:
        raise ConfigurationError(f"{factory} needs {env_var}, e.g. {example}")
    return url


def builtin_factory(
    url: str | None = None, *, statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT_S
) -> HandlerFactory:
    """The factory to register under the key ``"built-in"``.

    ``url`` defaults to :func:`database_url` (``DSM_DATABASE_URL`` or a
    ``dsm.db`` file); it and ``statement_timeout`` are validated now, so a bad
    value fails at registration.
    """
    target = url if url is not None else database_url()
    normalize_url(target)
    timeout = validate_statement_timeout(statement_timeout)

    def build(clock: Clock) -> SqlStateHandler:
        return sql_handler(target, clock, statement_timeout=timeout)

    build.__qualname__ = build.__name__ = "builtin_sql_handler"
    return build
