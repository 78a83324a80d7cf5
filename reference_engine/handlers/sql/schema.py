"""The ``process_state_logs`` table: one row per item record, current or superseded.

The table is SQLAlchemy Core so the same definition creates and queries the
store on SQLite, PostgreSQL and MariaDB.  The partial unique index over the
record key (``WHERE NOT superseded``) is what makes the atomic operations
possible: it is the ``ON CONFLICT`` target of every insert-or-update, and it
lets the superseded history of a key live beside its one current row.
SQLite indexes the key parts themselves.  PostgreSQL's index rows are too
small for a key at its limits, so there the unique index is on a hash of the
key (:mod:`.key_hash`).  MariaDB has no partial index;
:mod:`.mariadb` builds the same rule from a generated column, and the
indexes here that it cannot use are created on the other backends only.  :mod:`.ddl` creates the table.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Dialect,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)
from sqlalchemy.dialects.mysql import DATETIME as MARIADB_DATETIME
from sqlalchemy.dialects.mysql import MEDIUMTEXT
from sqlalchemy.types import DateTime, TypeDecorator, TypeEngine

from reference_engine.clock import UTC, ensure_utc
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.handlers.sql.key_hash import PARTS_INDEX
from reference_engine.status import IdempotencyStatus

__all__ = [
    "CURRENT_ROW",
    "KEY_COLUMNS",
    "SQLITE_TIMESTAMP_FORMAT",
    "TABLE_NAME",
    "UtcDateTime",
    "indexes_for",
    "metadata",
    "process_state_logs",
]

TABLE_NAME = "process_state_logs"

#: Fixed width, so on SQLite comparing the stored text compares the instants.
SQLITE_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _format_sqlite(instant: dt.datetime) -> str:
    # strftime does not zero-pad years below 1000 on every platform; spell it out.
    utc = ensure_utc(instant)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T"
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond:06d}Z"
    )


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC instants on every backend.

    PostgreSQL stores ``TIMESTAMPTZ``.  SQLite has no time type and
    SQLAlchemy's ``DateTime(timezone=True)`` drops the offset there, so the
    instant is stored as fixed-width ISO-8601 UTC text, which keeps ``<`` in
    SQL meaning "earlier".  MariaDB's ``DATETIME`` has no zone and drops
    microseconds unless told otherwise, so it gets ``DATETIME(6)`` holding
    naive UTC (not ``TIMESTAMP``, which the session time zone would shift and
    which ends in 2038).  Naive datetimes are refused instead of guessed.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(27))
        if dialect.name == "mariadb":
            return dialect.type_descriptor(MARIADB_DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return _format_sqlite(value)
        if dialect.name == "mariadb":
            return ensure_utc(value).replace(tzinfo=None)
        return ensure_utc(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            parsed = dt.datetime.strptime(value, SQLITE_TIMESTAMP_FORMAT)
            return parsed.replace(tzinfo=UTC)
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                return value.replace(tzinfo=UTC)
            return value.astimezone(UTC)
        raise TypeError(f"unexpected timestamp value {value!r} from {dialect.name}")


metadata = MetaData()

#: Key and stamp text on MariaDB: an index cannot cover TEXT, and every text field
#: of a context is at most MAX_KEY_LENGTH characters (``context.validate_key``).
_SHORT_TEXT = Text().with_variant(String(MAX_KEY_LENGTH), "mariadb")
#: Payloads and error details: MariaDB's TEXT holds only 64 KiB.
_LONG_TEXT = Text().with_variant(MEDIUMTEXT(), "mariadb")

_STORED_STATUSES = tuple(s.value for s in IdempotencyStatus if s is not IdempotencyStatus.NONE)

process_state_logs = Table(
    TABLE_NAME,
    metadata,
    Column(
        "id",
        BigInteger().with_variant(Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
        comment="Surrogate key; orders the history of a record key by insertion.",
    ),
    Column("tenant_id", _SHORT_TEXT, nullable=False, comment="Tenant; part of every record key."),
    Column(
        "source_app_id",
        _SHORT_TEXT,
        nullable=False,
        comment="Application that sent the message of the latest write.",
    ),
    Column(
        "scope_id",
        Integer,
        nullable=False,
        comment="Scope table id (1 Tenant .. 5 Thread); part of every record key.",
    ),
    Column("scope_code", String(32), nullable=False, comment="Scope name, for humans."),
    Column(
        "entity_id",
        _SHORT_TEXT,
        nullable=False,
        comment="Entity the scope points at (tenant, application, workflow, element or run).",
    ),
    Column(
        "entity_execution_id",
        _SHORT_TEXT,
        nullable=False,
        comment="Run (execution thread) of the latest write; shows who holds a lock.",
    ),
    Column(
        "item_entity_key",
        String(256),
        nullable=False,
        comment="Optional sub-entity of the item ('' when unused); part of the record key.",
    ),
    Column("item_key", String(256), nullable=False, comment="The work item's key."),
    Column(
        "status",
        String(16),
        nullable=False,
        comment="IdempotencyStatus value: processing, processed, failed, superseded, "
        "skipped or expired.",
    ),
    Column(
        "attempt",
        Integer,
        nullable=False,
        default=0,
        comment="Fencing token of the latest acquisition (0 if never acquired).",
    ),
    Column(
        "locked_until",
        UtcDateTime(),
        nullable=True,
        comment="End of the processing lock (UTC); NULL unless status is processing.",
    ),
    Column("data", _LONG_TEXT, nullable=True, comment="Result payload as canonical JSON text."),
    Column(
        "error_detail",
        _LONG_TEXT,
        nullable=True,
        comment="Why the item failed (node error or the sweep's note).",
    ),
    Column(
        "superseded",
        Boolean,
        nullable=False,
        default=False,
        server_default=false(),
        comment="True for history rows replaced by an upsert; at most one current row per key.",
    ),
    Column("created_at", UtcDateTime(), nullable=False, comment="First write of this row (UTC)."),
    Column("updated_at", UtcDateTime(), nullable=False, comment="Latest write of this row (UTC)."),
    Column(
        "retain_until",
        UtcDateTime(),
        nullable=True,
        comment="After this instant (UTC) the retention sweep marks the row expired; "
        "NULL keeps it forever.",
    ),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{v}'" for v in _STORED_STATUSES) + ")",
        name="ck_process_state_logs_status",
    ),
    CheckConstraint("attempt >= 0", name="ck_process_state_logs_attempt"),
    comment="DataStateMachine records: idempotency guard and processing lock per work item.",
    # MariaDB: exact text comparison.  The default collations fold case and accents,
    # and every PAD SPACE collation (utf8mb4_bin too) ignores trailing spaces, which
    # would make 'a', 'A' and 'a ' one key.  NO PAD binary keeps them three.
    mariadb_engine="InnoDB",
    mariadb_charset="utf8mb4",
    mariadb_collate="utf8mb4_nopad_bin",
)

#: The record key, in index order; every per-item query filters on all of it.
KEY_COLUMNS = (
    process_state_logs.c.tenant_id,
    process_state_logs.c.scope_id,
    process_state_logs.c.entity_id,
    process_state_logs.c.item_entity_key,
    process_state_logs.c.item_key,
)

_CURRENT = process_state_logs.c.superseded == false()
_PROCESSING = process_state_logs.c.status == IdempotencyStatus.PROCESSING.value
#: Backends with partial indexes; MariaDB gets its own (see :mod:`.mariadb`).
_PARTIAL = ("sqlite", "postgresql")


def _has_partial_indexes(
    ddl: Any,
    target: Any,
    bind: Any,
    tables: Any = None,
    state: Any = None,
    *,
    dialect: Dialect,
    compiler: Any = None,
    checkfirst: bool = False,
) -> bool:
    return dialect.name in _PARTIAL


#: SQLite's unique index over the key parts (its index rows have no size limit);
#: PostgreSQL's is on the key's hash (:func:`_index_key_hash`).
_PARTS_INDEX = Index(
    PARTS_INDEX,
    *KEY_COLUMNS,
    unique=True,
    sqlite_where=_CURRENT,
).ddl_if(dialect="sqlite")
_LOCK_SWEEP_INDEX = Index(
    "ix_process_state_logs_lock_sweep",
    process_state_logs.c.locked_until,
    sqlite_where=_PROCESSING,
    postgresql_where=_PROCESSING,
).ddl_if(callable_=_has_partial_indexes)
_RETENTION_INDEX = Index("ix_process_state_logs_retention", process_state_logs.c.retain_until)
_MARIADB_INDEXES = (
    # The lookup of a key.  InnoDB keys hold at most 3072 bytes (768 characters of
    # utf8mb4), so the index keeps prefixes of the longer parts; uniqueness comes
    # from the generated column of .mariadb, not from this index.
    Index(
        "ix_process_state_logs_key",
        *KEY_COLUMNS,
        mariadb_length={"tenant_id": 128, "entity_id": 128, "item_entity_key": 64},
    ).ddl_if(dialect="mariadb"),
    Index(
        "ix_process_state_logs_lock_sweep",
        process_state_logs.c.status,
        process_state_logs.c.locked_until,
    ).ddl_if(dialect="mariadb"),
)

#: The predicate of the partial unique index; ``ON CONFLICT`` must repeat it verbatim.
CURRENT_ROW = _CURRENT


def indexes_for(dialect_name: str) -> tuple[Index, ...]:
    """The indexes of the table that ``dialect_name`` creates and checks."""
    if dialect_name == "mariadb":
        return (*_MARIADB_INDEXES, _RETENTION_INDEX)
    if dialect_name == "postgresql":
        return (_LOCK_SWEEP_INDEX, _RETENTION_INDEX)
    return (_PARTS_INDEX, _LOCK_SWEEP_INDEX, _RETENTION_INDEX)
