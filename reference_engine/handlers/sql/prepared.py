"""The hot statements, built once from named bound parameters.

Building a Core statement on every call costs more CPU than the round trip
it sends to a local PostgreSQL: the expression tree is rebuilt, its cache
key recomputed and, for a new shape, compiled again.  Built once at import,
each statement has a stable cache key, SQLAlchemy's compiled cache hits on
every call, and the PostgreSQL fast path (:mod:`.fastpath`) renders each one
to SQL text exactly once.  The statements are the single source of truth for
both paths, so both send the same SQL.

Every value that varies per call is a ``bindparam`` named ``p_<column>``
(``p_now`` for the caller's clock); the ``*_params`` functions build the
matching parameter dictionaries.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BindParameter,
    Column,
    ColumnElement,
    Insert,
    LargeBinary,
    Select,
    Update,
    and_,
    bindparam,
    false,
    literal,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import Grouping
from sqlalchemy.sql.operators import OperatorType
from sqlalchemy.sql.visitors import InternalTraversal

from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.sql.key_hash import key_hash_of, key_hash_sql
from reference_engine.handlers.sql.schema import (
    CURRENT_ROW,
    KEY_COLUMNS,
    UtcDateTime,
    process_state_logs,
)
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.status import ACQUIRABLE, COMPLETED, TRANSITIONS, IdempotencyStatus

__all__ = [
    "ACQUIRABLE_NOW",
    "CURRENT",
    "EXISTS",
    "EXPIRE_PAST_RETENTION",
    "KEY_MATCH",
    "NOW",
    "RESET_EXPIRED_LOCKS",
    "Statement",
    "acquire_changes",
    "acquire_params",
    "acquire_row",
    "acquire_statement",
    "begin_statement",
    "conflict_target",
    "effective_status_in",
    "fenced_params",
    "fenced_statement",
    "fenced_update",
    "key_params",
    "sources_of",
]

S = IdempotencyStatus
T = process_state_logs
#: Any of the statements here; what the executors accept.
Statement = Select[Any] | Insert | Update | ReturningInsert[Any] | ReturningUpdate[Any]
#: The caller's "now", bound as a parameter: the database's clock is never read.
NOW: BindParameter[dt.datetime] = bindparam("p_now", type_=UtcDateTime())
_KEY_NAMES = [column.name for column in KEY_COLUMNS]


def sources_of(target: IdempotencyStatus) -> frozenset[IdempotencyStatus]:
    """The statuses the transition table lets move to ``target``."""
    return frozenset(source for source, targets in TRANSITIONS.items() if target in targets)


def effective_status_in(
    statuses: Iterable[IdempotencyStatus], now: dt.datetime | ColumnElement[dt.datetime]
) -> ColumnElement[bool]:
    """SQL for "the row's effective status is one of ``statuses``" at ``now``.

    An expired, unswept Processing lock counts as Failed, exactly as
    :func:`reference_engine.model.effective_status` says; ``NONE`` (no row)
    cannot be expressed on a row and is left to the caller's ``INSERT``.
    ``now`` is an instant or :data:`NOW`.  The status list is a plain
    ``IN ($a, $b)`` rather than an expanding parameter, so a statement built
    once renders to the same SQL text on every call.
    """
    wanted = frozenset(statuses)
    # Table order, not set order, so the statement text (and its cache key) is stable.
    plain = [s.value for s in S if s in wanted and s not in (S.NONE, S.PROCESSING)]
    clauses: list[ColumnElement[bool]] = []
    if plain:
        clauses.append(T.c.status.in_([literal(value) for value in plain]))
    if S.FAILED in wanted:
        clauses.append(
            and_(
                T.c.status == S.PROCESSING.value,
                or_(T.c.locked_until.is_(None), T.c.locked_until < now),
            )
        )
    if S.PROCESSING in wanted:
        clauses.append(and_(T.c.status == S.PROCESSING.value, T.c.locked_until >= now))
    return or_(false(), *clauses)


def _param(column: Column[Any]) -> BindParameter[Any]:
    return bindparam(f"p_{column.name}", type_=column.type)


class KeyMatch(ColumnElement[bool]):
    """The key's current row: every key part equal to its value, and not superseded.

    On PostgreSQL it also compares the key's hash, as the unique index
    computes it from the row, with ``p_key_hash`` (:func:`key_params`), so the
    lookup runs on that index (PostgreSQL indexes no wide key; see
    :mod:`.key_hash`).  Elsewhere it is the plain comparison of the parts.
    ``values`` are the bound parameters of the five parts, in key order.
    """

    __visit_name__ = "dsm_key_match"
    inherit_cache = True
    _traverse_internals = [("plain", InternalTraversal.dp_clauseelement)]

    def __init__(self, values: tuple[BindParameter[Any], ...]) -> None:
        self.plain = and_(
            *(column == value for column, value in zip(KEY_COLUMNS, values, strict=True)),
            CURRENT_ROW,
        )

    @property
    def _from_objects(self) -> list[Any]:
        return self.plain._from_objects

    def self_group(self, against: OperatorType | None = None) -> ColumnElement[Any]:
        # In parentheses exactly where the AND it renders would be.
        return self if self.plain.self_group(against) is self.plain else Grouping(self)


#: The key's hash as the lookup sends it; only PostgreSQL's statements name it.
KEY_HASH: BindParameter[bytes] = bindparam("p_key_hash", type_=LargeBinary())


@compiles(KeyMatch)
def _plain_key_match(element: KeyMatch, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.plain, **kw)


@compiles(KeyMatch, "postgresql")
def _hashed_key_match(element: KeyMatch, compiler: SQLCompiler, **kw: Any) -> str:
    indexed = key_hash_sql(*(compiler.process(column, **kw) for column in KEY_COLUMNS))
    hashed = f"{indexed} = {compiler.process(KEY_HASH, **kw)}"
    return f"{hashed} AND {compiler.process(element.plain, **kw)}"


#: "This is the key's current row", as parameters ``p_tenant_id`` .. ``p_item_key``
#: (and ``p_key_hash`` on PostgreSQL).
KEY_MATCH = KeyMatch(tuple(_param(column) for column in KEY_COLUMNS))


def conflict_target(dialect_name: str) -> list[str | ColumnElement[Any]]:
    """The ``ON CONFLICT`` target: the unique index (``WHERE NOT superseded``) of a backend."""
    if dialect_name == "postgresql":
        return [literal_column(f"({key_hash_sql(*_KEY_NAMES)})")]
    return list(_KEY_NAMES)


def key_params(key: RecordKey, *, hashed: bool = True) -> dict[str, Any]:
    """The parameters of :data:`KEY_MATCH`.

    ``p_key_hash`` is named by PostgreSQL's statements only; ``hashed=False``
    (the other backends) leaves it out rather than hash the key for nothing.
    """
    params = {
        "p_tenant_id": key.tenant_id,
        "p_scope_id": key.scope_id,
        "p_entity_id": key.entity_id,
        "p_item_entity_key": key.item_entity_key,
        "p_item_key": key.item_key,
    }
    if hashed:
        params["p_key_hash"] = key_hash_of(key)
    return params


def _stamp_params(ctx: StateHandlerContext, now: dt.datetime) -> dict[str, Any]:
    """Who wrote, when, and how long to keep the row: refreshed by every write."""
    return {
        "p_entity_execution_id": ctx.entity_execution_id,
        "p_source_app_id": ctx.source_app_id,
        "p_now": now,
        "p_retain_until": ctx.handler_config.retain_until(now),
    }


#: ``SELECT 1 ... WHERE key AND status IN ('processed', 'skipped') LIMIT 1``.
EXISTS = select(literal(1)).where(KEY_MATCH, effective_status_in(COMPLETED, NOW)).limit(1)
#: The key's current row, all columns: the follow-up read of the error paths, and ``get``.
CURRENT = select(T).where(KEY_MATCH)


def _insert(dialect_name: str) -> PgInsert | SqliteInsert:
    return pg_insert(T) if dialect_name == "postgresql" else sqlite_insert(T)


#: "Missing, Failed, Expired or an expired lock" at :data:`NOW`: who may take the lock.
ACQUIRABLE_NOW = effective_status_in(ACQUIRABLE & sources_of(S.PROCESSING), NOW)


def acquire_row() -> dict[str, Any]:
    """The row a first acquisition inserts, as parameters (see :func:`acquire_params`)."""
    return {
        **{column.name: _param(column) for column in KEY_COLUMNS},
        "scope_code": _param(T.c.scope_code),
        "status": S.PROCESSING.value,
        "attempt": 1,
        "locked_until": _param(T.c.locked_until),
        "data": None,
        "error_detail": None,
        "superseded": False,
        "created_at": NOW,
        "entity_execution_id": _param(T.c.entity_execution_id),
        "source_app_id": _param(T.c.source_app_id),
        "updated_at": NOW,
        "retain_until": _param(T.c.retain_until),
    }


def acquire_changes(new: Any) -> dict[str, Any]:
    """What a re-acquisition changes; ``new`` is the proposed row (``excluded``/``inserted``)."""
    return {
        "status": S.PROCESSING.value,
        "attempt": T.c.attempt + 1,
        "locked_until": new.locked_until,
        "error_detail": None,
        "entity_execution_id": new.entity_execution_id,
        "source_app_id": new.source_app_id,
        "updated_at": new.updated_at,
        "retain_until": new.retain_until,
    }


@lru_cache(maxsize=4)
def acquire_statement(dialect_name: str) -> ReturningInsert[Any]:
    """``INSERT ... ON CONFLICT DO UPDATE ... WHERE <acquirable> RETURNING attempt``.

    The ``WHERE`` is the rule "missing, Failed, Expired or an expired lock",
    so deciding and taking the lock are one atomic statement.  MariaDB's
    form is :data:`.mariadb.ACQUIRE`.
    """
    insert = _insert(dialect_name).values(acquire_row())
    return insert.on_conflict_do_update(
        index_elements=conflict_target(dialect_name),
        index_where=CURRENT_ROW,
        set_=acquire_changes(insert.excluded),
        where=ACQUIRABLE_NOW,
    ).returning(T.c.attempt)


@lru_cache(maxsize=1)
def begin_statement() -> Select[Any]:
    """PostgreSQL's ``begin``: the acquire and, when it takes nothing, the current row.

    ``WITH taken AS (<acquire> RETURNING attempt) SELECT taken.attempt AS token,
    row.* FROM (SELECT 1) LEFT JOIN taken ON true LEFT JOIN <current row> ON
    taken.attempt IS NULL``: one statement, so one round trip whatever the
    outcome.  The row is read from the statement's snapshot, which may predate
    the row the acquire's conflict check saw (a concurrent first insert or
    take-over, READ COMMITTED); the caller notices that as "nothing taken, yet
    no row or a takeable one" and runs the statement again.  SQLite has no
    writing CTE and MariaDB no ``ON CONFLICT ... WHERE``; they pair the
    acquire with a read of the row (see the repository).
    """
    taken = acquire_statement("postgresql").cte("taken")
    one = select(literal_column("1").label("one")).subquery("one")
    joined = one.outerjoin(taken, true()).outerjoin(T, and_(KEY_MATCH, taken.c.attempt.is_(None)))
    return select(taken.c.attempt.label("token"), *T.c).select_from(joined)


def acquire_params(
    ctx: StateHandlerContext, now: dt.datetime, *, hashed: bool = True
) -> dict[str, Any]:
    return {
        **key_params(ctx.record_key, hashed=hashed),
        "p_scope_code": ctx.scope_code,
        "p_locked_until": ctx.handler_config.locked_until(now),
        **_stamp_params(ctx, now),
    }


@lru_cache(maxsize=8)
def fenced_update(*, with_data: bool, with_error: bool) -> Update:
    """``UPDATE ... WHERE key AND status = 'processing' AND attempt = :token``.

    One statement per shape: a write without data keeps the stored data, and
    only a release writes an error detail.  Whether it matched is told by
    ``RETURNING`` (:func:`fenced_statement`) or, on MariaDB, by the row count.
    """
    changes: dict[str, Any] = {
        "status": bindparam("p_status", type_=T.c.status.type),
        "locked_until": None,
        "entity_execution_id": _param(T.c.entity_execution_id),
        "source_app_id": _param(T.c.source_app_id),
        "updated_at": NOW,
        "retain_until": _param(T.c.retain_until),
    }
    if with_data:
        changes["data"] = _param(T.c.data)
    if with_error:
        changes["error_detail"] = _param(T.c.error_detail)
    return (
        update(T)
        .where(
            KEY_MATCH,
            T.c.status == S.PROCESSING.value,
            T.c.attempt == bindparam("p_token", type_=T.c.attempt.type),
        )
        .values(changes)
    )


@lru_cache(maxsize=8)
def fenced_statement(*, with_data: bool, with_error: bool) -> ReturningUpdate[Any]:
    """:func:`fenced_update` ``RETURNING id``: a row back means the token still held."""
    return fenced_update(with_data=with_data, with_error=with_error).returning(T.c.id)


def fenced_params(
    ctx: StateHandlerContext,
    now: dt.datetime,
    target: IdempotencyStatus,
    *,
    data: str | None = None,
    error_detail: str | None = None,
    hashed: bool = True,
) -> dict[str, Any]:
    params = {
        **key_params(ctx.record_key, hashed=hashed),
        "p_token": ctx.lock_token,
        "p_status": target.value,
        **_stamp_params(ctx, now),
    }
    if data is not None:
        params["p_data"] = data
    if error_detail is not None:
        params["p_error_detail"] = error_detail
    return params


#: Expired locks become Failed with the sweep's note: one statement, whatever their number.
RESET_EXPIRED_LOCKS = (
    update(T)
    .where(T.c.status == S.PROCESSING.value, T.c.locked_until < NOW)
    .values(
        status=S.FAILED.value,
        locked_until=None,
        error_detail=SWEEP_ERROR_DETAIL,
        updated_at=NOW,
    )
)

#: Rows past retention become Expired (superseded history too); a live lock never does.
EXPIRE_PAST_RETENTION = (
    update(T)
    .where(
        T.c.retain_until < NOW,
        T.c.status != S.EXPIRED.value,
        or_(
            T.c.status != S.PROCESSING.value,
            T.c.locked_until.is_(None),
            T.c.locked_until < NOW,
        ),
    )
    .values(status=S.EXPIRED.value, locked_until=None, updated_at=NOW)
)
