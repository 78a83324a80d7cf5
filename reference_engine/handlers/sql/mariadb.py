"""MariaDB: the statements and the table parts that the other backends spell differently.

MariaDB has no partial index, no ``ON CONFLICT ... WHERE`` and no
``UPDATE ... RETURNING``.  The same rules are kept, each in one statement:

* **One current row per key.**  A generated column ``current_key`` holds a
  SHA-256 of the record key while the row is current and NULL once it is
  superseded; a UNIQUE index on it admits any number of NULLs, which is the
  partial unique index of the other backends.  Hashing also fits a key of
  four 256-character parts into InnoDB's 3072-byte key limit.
* **Conditional insert-or-update.**  ``INSERT ... ON DUPLICATE KEY UPDATE``
  has no ``WHERE``, so every assignment is guarded by the same condition:
  ``col = CASE WHEN <cond> THEN <new> ELSE col END``.  The session runs with
  ``SIMULTANEOUS_ASSIGNMENT`` (``engine.MARIADB_SESSION_SQL``), so each guard
  reads the row as it was, not the columns assigned before it.
* **What the statement did, without RETURNING.**  The guarded assignment of
  one column calls ``LAST_INSERT_ID(expr)``, whose value the server sends
  back with the row count: 0 means the guard refused (nothing changed), a row
  count of 1 with a non-zero id means a new row was inserted, and 2 means the
  existing row was updated, the id then being the value of ``expr`` (the new
  fencing token).

Every instant is still a bound parameter from the caller's clock.  See
``docs/sql-handler.md`` for where MariaDB needs more than one statement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

from asyncmy import errors as asyncmy_errors
from sqlalchemy import Connection, CursorResult, case, func, text
from sqlalchemy.dialects.mysql import Insert as MariaInsert
from sqlalchemy.dialects.mysql import insert as mariadb_insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from reference_engine.context import RecordKey
from reference_engine.errors import StoreError
from reference_engine.handlers.sql.engine import validate_schema_name
from reference_engine.handlers.sql.prepared import (
    ACQUIRABLE_NOW,
    acquire_changes,
    acquire_row,
)
from reference_engine.handlers.sql.schema import TABLE_NAME, process_state_logs

__all__ = [
    "ACQUIRE",
    "CURRENT_KEY_INDEX",
    "DDL_LOCK_TIMEOUT_S",
    "Outcome",
    "acquired_token",
    "create_database",
    "create_mariadb_schema",
    "current_key_of",
    "drop_database",
    "guarded_upsert",
    "is_deadlock",
    "marked",
    "supersede_marker",
]

T = process_state_logs
CURRENT_KEY_INDEX = "ux_process_state_logs_current_key"
#: How long a start waits for another process that is creating the table.
DDL_LOCK_TIMEOUT_S = 60
#: NUL cannot occur in any key part (``context.validate_key``), so joining the
#: parts with it is unambiguous: two keys hash alike only if they are equal.
_CURRENT_KEY_SQL = (
    "IF(superseded, NULL, UNHEX(SHA2(CONCAT_WS(CHAR(0), "
    "tenant_id, scope_id, entity_id, item_entity_key, item_key), 256)))"
)


def current_key_of(key: RecordKey) -> bytes:
    """The ``current_key`` MariaDB computes for a current row of ``key``, for tests and checks."""
    parts = (key.tenant_id, str(key.scope_id), key.entity_id, key.item_entity_key, key.item_key)
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()


#: ER_LOCK_DEADLOCK: InnoDB chose this transaction as a deadlock's victim.
_DEADLOCK = 1213


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` is InnoDB undoing this transaction to break a deadlock.

    ``exc`` is SQLAlchemy's ``OperationalError``, or asyncmy's own from the
    fast path (``fastpath.py``), which sends the statement past SQLAlchemy.

    Concurrent ``INSERT ... ON DUPLICATE KEY UPDATE`` and range ``UPDATE``
    statements (an acquire racing a sweep) can lock index records in opposite
    orders.  The victim's whole transaction is rolled back, so it changed
    nothing and running it again is the same call made a moment later.
    """
    if isinstance(exc, OperationalError):
        orig: BaseException | None = exc.orig
    elif isinstance(exc, asyncmy_errors.OperationalError):
        orig = exc
    else:
        return False
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] == _DEADLOCK


# --- the table ------------------------------------------------------------------------------


def _qualified_table(conn: Connection) -> str:
    preparer = conn.dialect.identifier_preparer
    schema = conn.schema_for_object(T)
    table = preparer.quote(TABLE_NAME)
    return table if schema is None else f"{preparer.quote_schema(schema)}.{table}"


def _add_current_key(conn: Connection) -> None:
    conn.exec_driver_sql(
        f"ALTER TABLE {_qualified_table(conn)} "
        f"ADD COLUMN IF NOT EXISTS current_key BINARY(32) AS ({_CURRENT_KEY_SQL}) PERSISTENT "
        "COMMENT 'SHA-256 of the record key while the row is current, NULL once superseded', "
        f"ADD UNIQUE INDEX IF NOT EXISTS {CURRENT_KEY_INDEX} (current_key)"
    )


async def create_mariadb_schema(
    engine: AsyncEngine,
    complete: Callable[[Connection, tuple[str, ...]], bool],
    create_missing: Callable[[Connection], None],
) -> None:
    """Create the table, its indexes and ``current_key`` if missing, queued on a named lock.

    Every DDL statement commits on its own in MariaDB, so a transaction cannot
    hide a half-built table.  Concurrent starts queue on ``GET_LOCK`` instead and
    re-check once they hold it; a start that finds everything in place only reads.
    """
    extra = (CURRENT_KEY_INDEX,)
    async with engine.connect() as conn:
        if await conn.run_sync(complete, extra):
            await conn.rollback()
            return
        schema = await conn.run_sync(lambda sync: sync.schema_for_object(T))
        name = f"dsm_ddl_{schema or 'default'}"
        lock = text("SELECT GET_LOCK(:name, :timeout)")
        got = (await conn.execute(lock, {"name": name, "timeout": DDL_LOCK_TIMEOUT_S})).scalar()
        if got != 1:
            raise StoreError(
                f"creating the table on MariaDB: another start held the lock {name!r} for "
                f"more than {DDL_LOCK_TIMEOUT_S} s; retry the start once it has finished"
            )
        try:
            if not await conn.run_sync(complete, extra):
                await conn.run_sync(create_missing)
                await conn.run_sync(_add_current_key)
        finally:
            await conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
            await conn.commit()


async def create_database(engine: AsyncEngine, name: str) -> None:
    """``CREATE DATABASE IF NOT EXISTS``: MariaDB's schema, for isolating a test or run."""
    quoted = engine.dialect.identifier_preparer.quote_schema(validate_schema_name(name))
    async with engine.connect() as conn:
        # Every process of a stress run opens the run's database; for all but the
        # first it exists, and MariaDB's note about it is printed by the driver as
        # a warning in each.  The note says nothing the IF NOT EXISTS did not.
        await conn.exec_driver_sql("SET SESSION sql_notes = 0")
        try:
            await conn.exec_driver_sql(
                f"CREATE DATABASE IF NOT EXISTS {quoted} "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
            )
        finally:
            await conn.exec_driver_sql("SET SESSION sql_notes = 1")


async def drop_database(engine: AsyncEngine, name: str) -> None:
    """``DROP DATABASE IF EXISTS``: removes the run's table with it."""
    quoted = engine.dialect.identifier_preparer.quote_schema(validate_schema_name(name))
    async with engine.connect() as conn:
        await conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}")


# --- statements -----------------------------------------------------------------------------


def guarded_upsert(
    insert: MariaInsert,
    changes: dict[str, Any],
    where: ColumnElement[bool],
    *,
    marker: str | None = None,
) -> MariaInsert:
    """``INSERT ... ON DUPLICATE KEY UPDATE`` that changes the row only where ``where`` holds.

    ``marker`` names the column of ``changes`` whose new value the statement
    reports through ``LAST_INSERT_ID``; without one the row's ``id`` is reported
    (assigned to itself), so "matched but nothing to change" still counts.
    """
    assignments: list[tuple[str, Any]] = []
    for name, new in changes.items():
        column = T.c[name]
        value = func.last_insert_id(new) if name == marker else new
        assignments.append((name, case((where, value), else_=column)))
    if marker is None:
        assignments.append(("id", case((where, func.last_insert_id(T.c.id)), else_=T.c.id)))
    return insert.on_duplicate_key_update(assignments)


class Outcome(Protocol):
    """What a write reports without ``RETURNING``: a ``CursorResult``, or the fast path's."""

    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int: ...


def marked(result: CursorResult[Any]) -> bool:
    """Whether a :func:`guarded_upsert` inserted or updated the row (the guard let it)."""
    return bool(result.lastrowid)


def acquired_token(result: Outcome) -> int | None:
    """The fencing token :data:`ACQUIRE` took, or None when the lock was not free.

    A new row starts at attempt 1; an updated one reports ``attempt + 1``.
    """
    if not result.lastrowid:
        return None
    return 1 if result.rowcount == 1 else int(result.lastrowid)


def supersede_marker() -> ColumnElement[Any]:
    """``attempt = LAST_INSERT_ID(attempt)``: lets a supersede report the attempt it kept."""
    return func.last_insert_id(T.c.attempt)


def _acquire() -> MariaInsert:
    insert = mariadb_insert(T).values(acquire_row())
    return guarded_upsert(
        insert, acquire_changes(insert.inserted), ACQUIRABLE_NOW, marker="attempt"
    )


#: :func:`.prepared.acquire_statement` for MariaDB: parameters from ``acquire_params``.
ACQUIRE = _acquire()
