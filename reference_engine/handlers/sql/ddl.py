"""Creating the ``process_state_logs`` table on every start, safely on each backend.

Apart from :mod:`.schema` (what the table is) because MariaDB creates it its
own way (:func:`.mariadb.create_mariadb_schema`), and :mod:`.mariadb` builds
its statements on the table: the table cannot know the backend that builds on it.
"""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateIndex, CreateTable

from reference_engine.handlers.sql.engine import lock_ddl
from reference_engine.handlers.sql.key_hash import (
    KEY_HASH_INDEX,
    PARTS_INDEX,
    check_key_hash,
    key_hash_sql,
)
from reference_engine.handlers.sql.mariadb import create_mariadb_schema
from reference_engine.handlers.sql.schema import (
    KEY_COLUMNS,
    TABLE_NAME,
    indexes_for,
    metadata,
    process_state_logs,
)

__all__ = ["create_schema"]


def _complete(conn: Connection, extra_indexes: tuple[str, ...] = ()) -> bool:
    """Whether the table and every index exist: the read-only check of every normal start.

    On PostgreSQL that includes the index of the key's hash, and the absence
    of the unique index over the parts that earlier versions created (a table
    that still has it is migrated by :func:`_index_key_hash`).
    """
    inspector = inspect(conn)
    schema = conn.schema_for_object(process_state_logs)
    if not inspector.has_table(TABLE_NAME, schema=schema):
        return False
    present = {index["name"] for index in inspector.get_indexes(TABLE_NAME, schema=schema)}
    wanted: list[str | None] = [index.name for index in indexes_for(conn.dialect.name)]
    if conn.dialect.name == "postgresql":
        if PARTS_INDEX in present:
            return False
        wanted.append(KEY_HASH_INDEX)
    return all(name in present for name in (*wanted, *extra_indexes))


def _index_key_hash(conn: Connection) -> None:
    """PostgreSQL: the unique index on the key's hash, in place of the one over the parts.

    Runs in the transaction of :func:`create_schema`, under its advisory lock.
    On a table of an earlier version it builds the new index and drops the
    old one, all or nothing: every current row is unique by its parts, hence
    by its hash.  Building the index reads the table once and holds off
    writers meanwhile; nothing is rewritten.
    """
    preparer = conn.dialect.identifier_preparer
    schema = conn.schema_for_object(process_state_logs)
    prefix = "" if schema is None else f"{preparer.quote_schema(schema)}."
    expression = key_hash_sql(*(column.name for column in KEY_COLUMNS))
    conn.exec_driver_sql(
        f"CREATE UNIQUE INDEX IF NOT EXISTS {KEY_HASH_INDEX} "
        f"ON {prefix}{preparer.quote(TABLE_NAME)} (({expression})) WHERE superseded = false"
    )
    conn.exec_driver_sql(f"DROP INDEX IF EXISTS {prefix}{PARTS_INDEX}")


def _create_missing(conn: Connection) -> None:
    # create_all skips a table that exists together with its indexes, so an
    # index lost to an interrupted start would stay missing; check each one.
    metadata.create_all(conn, checkfirst=True)
    for index in indexes_for(conn.dialect.name):
        index.create(conn, checkfirst=True)
    if conn.dialect.name == "postgresql":
        _index_key_hash(conn)


async def create_schema(engine: AsyncEngine) -> None:
    """Create the table and its indexes if missing; safe to run on every start.

    When everything exists (every start but the first) this only reads, so
    it never waits for a writer.  Otherwise the checks and the ``CREATE``
    statements run in one transaction that concurrent starts queue on: an
    advisory lock on PostgreSQL (where DDL is transactional), ``BEGIN
    IMMEDIATE`` on SQLite (whose driver would otherwise commit each DDL
    statement on its own, letting another process see the table before its
    unique index and fail its first upsert).  MariaDB commits every DDL
    statement by itself, so there the starts queue on a named lock instead
    (:func:`.mariadb.create_mariadb_schema`).  On PostgreSQL every start also
    checks, with one read, that the server hashes keys as the handler does
    (:func:`.key_hash.check_key_hash`).
    """
    if engine.dialect.name == "mariadb":
        await create_mariadb_schema(engine, _complete, _create_missing)
        return
    if engine.dialect.name == "sqlite":
        await _create_sqlite_schema(engine)
        return
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            await conn.run_sync(check_key_hash)
        complete = await conn.run_sync(_complete)
        await conn.rollback()
    if complete:
        return
    async with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        await lock_ddl(conn)
        await conn.run_sync(_create_missing)


async def _create_sqlite_schema(engine: AsyncEngine) -> None:
    """SQLite: one read to check, and ``CREATE ... IF NOT EXISTS`` in one ``BEGIN IMMEDIATE``.

    The same objects as :func:`_complete` and :func:`_create_missing` check and
    create, found by name in ``sqlite_master`` instead of through SQLAlchemy's
    inspector: the inspector's ``PRAGMA`` queries, each several hops to
    aiosqlite's thread, made a start on a new file about 120 such hops (16 ms),
    and a start on a complete one 30.  A test case of the conformance kit, a
    worker starting up and a CLI run each open a handler.
    """
    wanted = {TABLE_NAME, *(str(index.name) for index in indexes_for("sqlite"))}
    async with engine.connect() as conn:
        found = await conn.exec_driver_sql(
            f"SELECT name FROM sqlite_master WHERE tbl_name = '{TABLE_NAME}'"
        )
        present = set(found.scalars())
        await conn.rollback()
    if wanted <= present:
        return
    async with engine.begin() as conn:
        # Concurrent starts queue here; each statement is then a no-op for all but the first.
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
        for statement in _sqlite_ddl(conn.dialect):
            await conn.exec_driver_sql(statement)


def _sqlite_ddl(dialect: Dialect) -> list[str]:
    """The table and its SQLite indexes, each ``IF NOT EXISTS``, as ``create_all`` would emit them."""
    return [
        str(CreateTable(process_state_logs, if_not_exists=True).compile(dialect=dialect)),
        *(
            str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect))
            for index in indexes_for("sqlite")
        ),
    ]
