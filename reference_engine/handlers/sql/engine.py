"""Async engines for the SQL handler: SQLite (aiosqlite), PostgreSQL (asyncpg), MariaDB (asyncmy).

Settings that decide correctness live here rather than in callers: SQLite
needs WAL and a busy timeout so concurrent writers queue instead of failing,
an in-memory database needs a single shared connection or every session
would see its own empty database, and PostgreSQL runs can be isolated in a
schema of their own without touching a single query.  MariaDB sessions get
the settings its statements rely on (:mod:`.mariadb`).

Every wait on the store is bounded by one setting, the statement timeout:
PostgreSQL's ``statement_timeout`` and ``lock_timeout``, MariaDB's
``max_statement_time`` and ``innodb_lock_wait_timeout``, SQLite's busy
timeout, and the time a connection may take to open.  Without it a row lock
held by another session (a stuck transaction, an operator's ``SELECT ... FOR
UPDATE``) would block a worker forever instead of failing its call.

The server enforces those limits, so a server that does not answer at all
(frozen by ``SIGSTOP``, a VM paused, a network path that drops packets
without resetting) enforces nothing.  The client bounds every round trip
too: asyncpg's ``command_timeout`` and asyncmy's ``read_timeout``, both
:func:`client_timeout` (the statement timeout plus :data:`CLIENT_GRACE_S`,
so the server's own limit, which names its cause, fires first whenever the
server is there to fire it).
"""

from __future__ import annotations

import math
import re
from typing import Any

from sqlalchemy import URL, event, make_url, text
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.schema import CreateSchema, DropSchema

from reference_engine.errors import ConfigurationError

__all__ = [
    "CLIENT_GRACE_S",
    "DDL_LOCK_KEY",
    "DEFAULT_BUSY_TIMEOUT_S",
    "DEFAULT_STATEMENT_TIMEOUT_S",
    "MARIADB_SESSION_SQL",
    "MAX_STATEMENT_TIMEOUT_S",
    "STATEMENT_TIMEOUT_OPTION",
    "SUPPORTED_BACKENDS",
    "SYSTEM_SCHEMAS",
    "ReservedSchemaError",
    "client_timeout",
    "create_engine_for",
    "create_pg_schema",
    "drop_pg_schema",
    "is_memory_url",
    "lock_ddl",
    "mariadb_timeout_sql",
    "normalize_url",
    "statement_timeout_of",
    "validate_schema_name",
    "validate_statement_timeout",
]

#: How long one statement may run or wait for a lock, and a connection take to open.
DEFAULT_STATEMENT_TIMEOUT_S = 30.0
#: The longest statement timeout accepted: beyond an hour a wait is a hang, not a slow call.
MAX_STATEMENT_TIMEOUT_S = 3600.0
#: How long a SQLite writer waits for another connection's write lock (the same setting).
DEFAULT_BUSY_TIMEOUT_S = DEFAULT_STATEMENT_TIMEOUT_S
#: How much longer than the statement timeout the client waits for an answer: the server's
#: own limit fires first when the server is alive, this one when it does not answer.
CLIENT_GRACE_S = 2.0
#: The engine execution option that carries the timeout to the handler's error messages.
STATEMENT_TIMEOUT_OPTION = "dsm_statement_timeout"
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


class ReservedSchemaError(ConfigurationError):
    """A schema (MariaDB: database) name that belongs to the server itself.

    The handler creates its table in the schema it is given and a run may
    drop that schema afterwards; in ``information_schema``, ``pg_catalog``
    or MariaDB's ``mysql`` that is at best refused by the server half-way,
    at worst a write into the server's own catalogue.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"schema {name!r} belongs to the database server (PostgreSQL's "
            "information_schema, pg_catalog, pg_toast and every pg_* name; MariaDB's "
            "information_schema, mysql, performance_schema and sys); give a schema of your "
            "own, e.g. 'dsm'"
        )


#: Schemas (MariaDB: databases) the servers keep for themselves; every ``pg_*`` name too.
SYSTEM_SCHEMAS = frozenset(
    {"information_schema", "pg_catalog", "pg_toast", "mysql", "performance_schema", "sys"}
)


def validate_schema_name(name: str) -> str:
    """Only plain lower-case identifiers, so the name never needs quoting or escaping.

    A server's own schemas are refused with :class:`ReservedSchemaError`.
    """
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise ConfigurationError(
            f"invalid PostgreSQL or MariaDB schema name {name!r}: use 1-63 lower-case "
            "letters, digits and underscores, starting with a letter or underscore"
        )
    if name in SYSTEM_SCHEMAS or name.startswith("pg_"):
        raise ReservedSchemaError(name)
    return name


def validate_statement_timeout(value: object) -> float:
    """Seconds above 0 and at most :data:`MAX_STATEMENT_TIMEOUT_S`, as a float.

    ``None``, 0 and negative values are refused rather than read as "no
    limit": every wait on the store must end.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"statement_timeout must be a number of seconds, got {type(value).__name__}; "
            f"use a number above 0 and at most {MAX_STATEMENT_TIMEOUT_S:g} "
            f"(default {DEFAULT_STATEMENT_TIMEOUT_S:g})"
        )
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_STATEMENT_TIMEOUT_S:
        shown = str(value) if len(str(value)) <= 40 else f"{str(value)[:40]}..."
        raise ConfigurationError(
            f"statement_timeout must be a finite number of seconds above 0 and at most "
            f"{MAX_STATEMENT_TIMEOUT_S:g}, got {shown} (default {DEFAULT_STATEMENT_TIMEOUT_S:g})"
        )
    return seconds


def client_timeout(statement_timeout: float) -> float:
    """How long the driver waits for any answer of the server: past the server's own limit."""
    return statement_timeout + CLIENT_GRACE_S


def statement_timeout_of(engine: AsyncEngine) -> float | None:
    """The statement timeout :func:`create_engine_for` gave ``engine``; None for other engines."""
    value = engine.get_execution_options().get(STATEMENT_TIMEOUT_OPTION)
    return float(value) if isinstance(value, int | float) else None


def _milliseconds(seconds: float) -> int:
    """Whole milliseconds, at least 1: 0 means "no limit" to every server."""
    return max(1, math.ceil(seconds * 1000))


def _sqlite_pragmas(busy_timeout_s: float, *, memory: bool) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={_milliseconds(busy_timeout_s)}")
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


def mariadb_timeout_sql(seconds: float) -> tuple[str, ...]:
    """The session settings that bound a MariaDB statement and its row-lock waits.

    ``max_statement_time`` (fractions of a second) interrupts a statement,
    including one waiting for a row lock; ``innodb_lock_wait_timeout`` takes
    whole seconds only, so it is the same limit rounded up, a backstop.
    """
    return (
        f"SET SESSION max_statement_time = {seconds:.6f}",
        f"SET SESSION innodb_lock_wait_timeout = {max(1, math.ceil(seconds))}",
    )


def _mariadb_session(timeout_s: float) -> Any:
    statements = (*MARIADB_SESSION_SQL, *mariadb_timeout_sql(timeout_s))

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()

    return on_connect


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
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT_S,
    busy_timeout_s: float | None = None,
    module: Any | None = None,
) -> AsyncEngine:
    """An :class:`AsyncEngine` configured for the handler.

    ``schema`` (PostgreSQL; on MariaDB a database) maps the table into that
    schema through ``schema_translate_map``; the schema must exist (see
    :func:`create_pg_schema`, :func:`.mariadb.create_database`).  MariaDB runs
    at READ COMMITTED, like PostgreSQL, so a statement that waited for a row
    lock re-reads the committed row instead of a snapshot.
    ``pool_size``/``max_overflow`` override the pool of file and server
    databases; an in-memory SQLite database always has exactly one connection.
    ``statement_timeout`` (seconds) bounds every statement, every lock wait and
    every connect (see the module docstring); ``busy_timeout_s`` is its older
    name, for SQLite, and wins when given.  ``module`` replaces the DBAPI module the
    dialect would import (SQLAlchemy's ``module``): the simulator runs SQLite's
    calls on the loop thread through one.
    """
    timeout = validate_statement_timeout(
        statement_timeout if busy_timeout_s is None else busy_timeout_s
    )
    busy_timeout_s = timeout
    target = normalize_url(url)
    backend = target.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "postgresql":
        # lock_timeout equal to statement_timeout: a lock wait is named as such
        # when it fires first; the server's own setting, so the fast path's raw
        # asyncpg statements are bounded too.  ``timeout`` bounds the connect.
        # ``command_timeout`` bounds every round trip on the client: a frozen server
        # enforces no statement_timeout.
        milliseconds = str(_milliseconds(timeout))
        kwargs["connect_args"] = {
            "server_settings": {"statement_timeout": milliseconds, "lock_timeout": milliseconds},
            "timeout": timeout,
            "command_timeout": client_timeout(timeout),
        }
    if backend == "mariadb":
        # ``read_timeout`` is asyncmy's bound on every read of an answer (see above).
        kwargs["connect_args"] = {
            "connect_timeout": max(1, math.ceil(timeout)),
            "read_timeout": client_timeout(timeout),
        }
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
    if module is not None:
        kwargs["module"] = module
    engine = create_async_engine(target, **kwargs)
    if backend == "sqlite":
        pragmas = _sqlite_pragmas(busy_timeout_s, memory=is_memory_url(target))
        event.listen(engine.sync_engine, "connect", pragmas)
    if backend == "mariadb":
        event.listen(engine.sync_engine, "connect", _mariadb_session(timeout))
    options: dict[str, Any] = {STATEMENT_TIMEOUT_OPTION: timeout}
    if schema is not None:
        options["schema_translate_map"] = {None: validate_schema_name(schema)}
    return engine.execution_options(**options)


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
