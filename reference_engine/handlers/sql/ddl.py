"""Creating the ``process_state_logs`` table on every start, safely on each backend.

Apart from :mod:`.schema` (what the table is) because MariaDB creates it its
own way (:func:`.mariadb.create_mariadb_schema`), and :mod:`.mariadb` builds
its statements on the table: the table cannot know the backend that builds on it.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

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


#: The table, if it exists, and the names of its indexes, in one read per backend.  On
#: PostgreSQL, without a schema, the table is the one the search path finds, as for an
#: unqualified name in the handler's statements.
_PRESENT = {
    "postgresql": (
        "SELECT t.relname, i.relname FROM pg_catalog.pg_class t "
        "JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace "
        "LEFT JOIN pg_catalog.pg_index x ON x.indrelid = t.oid "
        "LEFT JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid "
        "WHERE t.relname = :table AND t.relkind IN ('r', 'p') AND CASE "
        "WHEN CAST(:schema AS text) IS NULL THEN pg_catalog.pg_table_is_visible(t.oid) "
        "ELSE n.nspname = CAST(:schema AS text) END"
    ),
    "mariadb": (
        "SELECT TABLE_NAME FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table "
        "UNION SELECT INDEX_NAME FROM information_schema.STATISTICS "
        "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
    ),
    "sqlite": "SELECT name FROM sqlite_master WHERE tbl_name = :table",
}


def _present(conn: Connection) -> frozenset[str]:
    """The table's name if it exists, and the names of its indexes: one read.

    SQLAlchemy's inspector, which this replaces, made about five catalogue
    queries for the same answer (a dozen on a fresh PostgreSQL schema, where
    each index was also checked after the table was created with it): on
    PostgreSQL 15 ms of a 54 ms start, on a SQLite file about 120 hops to
    aiosqlite's thread.  Every start of a handler reads this, and the
    conformance kit and the simulator start one per test case.
    """
    schema = conn.schema_for_object(process_state_logs)
    params = (
        {"table": TABLE_NAME}
        if conn.dialect.name == "sqlite"
        else {
            "table": TABLE_NAME,
            "schema": schema,
        }
    )
    rows = conn.execute(text(_PRESENT[conn.dialect.name]), params)
    return frozenset(name for row in rows for name in row if name is not None)


def _complete(conn: Connection, extra_indexes: tuple[str, ...] = ()) -> bool:
    """Whether the table and every index exist: the read-only check of every normal start.

    On PostgreSQL that includes the index of the key's hash, and the absence
    of the unique index over the parts that earlier versions created (a table
    that still has it is migrated by :func:`_index_key_hash`).
    """
    present = _present(conn)
    if TABLE_NAME not in present:
        return False
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
    """Create what is missing; runs with concurrent starts queued, so it checks again first.

    A missing table is created with its indexes (and comments).  An existing
    table keeps its rows; an index lost to an interrupted start is created
    on its own.
    """
    present = _present(conn)
    if TABLE_NAME not in present:
        metadata.create_all(conn, checkfirst=False)
    else:
        for index in indexes_for(conn.dialect.name):
            if index.name not in present:
                index.create(conn)
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
