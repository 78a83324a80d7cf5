"""Async engines for the SQL handler: SQLite (aiosqlite), PostgreSQL (asyncpg), MariaDB (asyncmy).

Settings that decide correctness live here rather than in callers: SQLite
needs WAL and a busy timeout so concurrent writers queue instead of failing,
an in-memory database needs a single shared connection or every session
would see its own empty database, and PostgreSQL runs can be isolated in a
schema of their own without touching a single query.  MariaDB sessions get
the settings its statements rely on (:mod:`.mariadb`).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import URL, event, make_url, text
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.schema import CreateSchema, DropSchema

from reference_engine.errors import ConfigurationError

__all__ = [
    "DDL_LOCK_KEY",
    "DEFAULT_BUSY_TIMEOUT_S",
    "MARIADB_SESSION_SQL",
    "SUPPORTED_BACKENDS",
    "create_engine_for",
    "create_pg_schema",
    "drop_pg_schema",
    "is_memory_url",
    "lock_ddl",
    "normalize_url",
    "validate_schema_name",
]

#: How long a SQLite writer waits for another connection's write lock.
DEFAULT_BUSY_TIMEOUT_S = 30.0
SUPPORTED_BACKENDS = ("sqlite", "postgresql", "mariadb")
#: PostgreSQL advisory lock taken while creating schemas and the table ("dsm" in ASCII).
DDL_LOCK_KEY = 0x64736D
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "mariadb": "mariadb+asyncmy",
}
#: ``mysql://`` URLs name MariaDB: the statements use MariaDB-only SQL (see :mod:`.mariadb`).
_BACKEND_ALIASES = {"postgres": "postgresql", "mysql": "mariadb"}
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def normalize_url(url: str | URL) -> URL:
    """Parse ``url`` and point it at the async driver (``sqlite:///`` -> aiosqlite, ...)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(
            f"invalid database URL {str(url)!r}: {exc}; expected e.g. "
            "'sqlite+aiosqlite:///dsm.db', 'postgresql+asyncpg://user@host/db' or "
            "'mariadb+asyncmy://user@host/db'"
        ) from exc
    backend = _BACKEND_ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _ASYNC_DRIVERS:
        raise ConfigurationError(
            f"database URL {parsed.render_as_string(hide_password=True)!r} uses backend "
            f"{backend!r}; the SQL handler supports: {', '.join(SUPPORTED_BACKENDS)}"
        )
    target = parsed.set(drivername=_ASYNC_DRIVERS[backend])
    if backend == "mariadb" and "charset" not in target.query:
        # Four-byte UTF-8 on the wire too, or keys outside the BMP would be mangled.
        target = target.update_query_dict({"charset": "utf8mb4"})
    return target


def is_memory_url(url: URL) -> bool:
    """Whether a SQLite URL names a private in-memory database."""
    if url.get_backend_name() != "sqlite":
        return False
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def validate_schema_name(name: str) -> str:
    """Only plain lower-case identifiers, so the name never needs quoting or escaping."""
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise ConfigurationError(
            f"invalid PostgreSQL or MariaDB schema name {name!r}: use 1-63 lower-case "
            "letters, digits and underscores, starting with a letter or underscore"
        )
    return name


def _sqlite_pragmas(busy_timeout_s: float, *, memory: bool) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            if not memory:
                _switch_to_wal(cursor)
        finally:
            cursor.close()

    return on_connect


#: Session settings the MariaDB statements rely on; see ``docs/sql-handler.md``.
MARIADB_SESSION_SQL = (
    # Every assignment of an UPDATE / ON DUPLICATE KEY UPDATE sees the row as it
    # was, as in standard SQL: each guarded assignment re-tests the same condition,
    # which must not see the columns assigned before it.
    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT,STRICT_ALL_TABLES')",
    "SET SESSION time_zone = '+00:00'",
)


def _mariadb_session(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for statement in MARIADB_SESSION_SQL:
            cursor.execute(statement)
    finally:
        cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    """Put the file in WAL mode once; the mode is stored in the file and outlives connections.

    Switching needs the file to itself and fails at once (no busy wait) when
    another connection is using it, which happens when many processes open a
    fresh file together.  Such a connection carries on: whichever connection
    does switch makes WAL the file's mode for all of them, and until then the
    rollback journal is just as correct, only less concurrent.
    """
    cursor.execute("PRAGMA journal_mode")
    row = cursor.fetchone()
    if row is not None and str(row[0]).lower() == "wal":
        return
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except Exception as exc:
        if "locked" not in str(exc).lower() and "busy" not in str(exc).lower():
            raise


def create_engine_for(
    url: str | URL,
    *,
    schema: str | None = None,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
) -> AsyncEngine:
    """An :class:`AsyncEngine` configured for the handler.

    ``schema`` (PostgreSQL; on MariaDB a database) maps the table into that
    schema through ``schema_translate_map``; the schema must exist (see
    :func:`create_pg_schema`, :func:`.mariadb.create_database`).  MariaDB runs
    at READ COMMITTED, like PostgreSQL, so a statement that waited for a row
    lock re-reads the committed row instead of a snapshot.
    ``pool_size``/``max_overflow`` override the pool of file and server
    databases; an in-memory SQLite database always has exactly one connection.
    """
    target = normalize_url(url)
    backend = target.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        if schema is not None:
            raise ConfigurationError(
                f"schema {schema!r} given for a SQLite URL; schemas are for PostgreSQL and "
                "MariaDB, use a separate database file to isolate SQLite runs"
            )
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
        if is_memory_url(target):
            kwargs["poolclass"] = StaticPool
    if backend == "mariadb":
        kwargs["isolation_level"] = "READ COMMITTED"
    # No pool_pre_ping on PostgreSQL: it costs a round trip on every checkout,
    # while a connection that died in the pool fails its next call with a
    # StoreError (retrying is safe) and is replaced by the pool.
    if "poolclass" not in kwargs:
        if pool_size is not None:
            kwargs["pool_size"] = pool_size
        if max_overflow is not None:
            kwargs["max_overflow"] = max_overflow
    engine = create_async_engine(target, **kwargs)
    if backend == "sqlite":
        pragmas = _sqlite_pragmas(busy_timeout_s, memory=is_memory_url(target))
        event.listen(engine.sync_engine, "connect", pragmas)
    if backend == "mariadb":
        event.listen(engine.sync_engine, "connect", _mariadb_session)
    if schema is not None:
        engine = engine.execution_options(schema_translate_map={None: validate_schema_name(schema)})
    return engine


async def lock_ddl(conn: AsyncConnection) -> None:
    """Serialise schema changes across processes for the rest of the transaction (PostgreSQL).

    ``CREATE ... IF NOT EXISTS`` is not safe against itself: two sessions can
    both see "missing" and one then fails on a unique index of the catalogue.
    A transaction-scoped advisory lock makes the second wait and then find
    the object in place.  SQLite needs nothing: it has one writer at a time.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": DDL_LOCK_KEY})


async def create_pg_schema(engine: AsyncEngine, name: str) -> None:
    """``CREATE SCHEMA IF NOT EXISTS``; for isolating a test or simulation run."""
    async with engine.begin() as conn:
        await lock_ddl(conn)
        await conn.execute(CreateSchema(validate_schema_name(name), if_not_exists=True))


async def drop_pg_schema(engine: AsyncEngine, name: str) -> None:
    """``DROP SCHEMA IF EXISTS ... CASCADE``: removes the run's table with it."""
    async with engine.begin() as conn:
        await conn.execute(DropSchema(validate_schema_name(name), cascade=True, if_exists=True))
