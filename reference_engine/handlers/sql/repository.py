"""The SQL of the lifecycle: one method per operation, each one atomic statement where it can be.

Atomicity comes from the database, not from reading and then writing:
acquisition is an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` whose
``WHERE`` is the rule "missing, Failed, Expired or an expired lock", and a
fenced write is an ``UPDATE ... WHERE attempt = :token``.  When such a
statement changes no row, one follow-up read in the same transaction decides
which error to raise, so the read costs nothing on the success path.

Which status may follow which is read from :data:`reference_engine.status.TRANSITIONS`;
the ``WHERE`` clauses are built from it, never written out by hand.  Every
instant is a bound parameter from the caller's clock, never ``now()``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, false, literal, or_, select, update
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    LockHeldError,
    LockNotHeldError,
    StaleLockError,
    StoreError,
)
from reference_engine.handlers.sql.schema import CURRENT_ROW, KEY_COLUMNS, process_state_logs
from reference_engine.model import NEEDS_LOCK, SWEEP_ERROR_DETAIL, effective_status
from reference_engine.record import StateRecord, is_lock_live
from reference_engine.status import (
    ACQUIRABLE,
    COMPLETED,
    TRANSITIONS,
    IdempotencyStatus,
    check_path,
    check_transition,
    is_allowed,
)

__all__ = ["ProcessStateLogRepository", "effective_status_in", "sources_of"]

S = IdempotencyStatus
T = process_state_logs
_KEY_NAMES = [column.name for column in KEY_COLUMNS]
#: How often an operation is re-run when a concurrent writer changed the row
#: between its statement and the follow-up read (PostgreSQL, READ COMMITTED).
#: Each lost race means another writer finished, so retries always progress;
#: the bound only turns pathological contention into a StoreError.
_RACE_RETRIES = 10


def sources_of(target: IdempotencyStatus) -> frozenset[IdempotencyStatus]:
    """The statuses the transition table lets move to ``target``."""
    return frozenset(source for source, targets in TRANSITIONS.items() if target in targets)


def effective_status_in(
    statuses: Iterable[IdempotencyStatus], now: dt.datetime
) -> ColumnElement[bool]:
    """SQL for "the row's effective status is one of ``statuses``" at ``now``.

    An expired, unswept Processing lock counts as Failed, exactly as
    :func:`reference_engine.model.effective_status` says; ``NONE`` (no row)
    cannot be expressed on a row and is left to the caller's ``INSERT``.
    """
    wanted = frozenset(statuses)
    # Table order, not set order, so the statement text (and its cache key) is stable.
    plain = [s.value for s in S if s in wanted and s not in (S.NONE, S.PROCESSING)]
    clauses: list[ColumnElement[bool]] = []
    if plain:
        clauses.append(T.c.status.in_(plain))
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


def _key(key: RecordKey) -> ColumnElement[bool]:
    return and_(
        T.c.tenant_id == key.tenant_id,
        T.c.scope_id == key.scope_id,
        T.c.entity_id == key.entity_id,
        T.c.item_entity_key == key.item_entity_key,
        T.c.item_key == key.item_key,
        CURRENT_ROW,
    )


def _retain_until(ctx: StateHandlerContext, now: dt.datetime) -> dt.datetime | None:
    retention = ctx.handler_config.retention
    return None if retention is None else now + retention


def _stamp(ctx: StateHandlerContext, now: dt.datetime) -> dict[str, Any]:
    """Fields every write refreshes: who wrote, when, and how long to keep the row."""
    return {
        "entity_execution_id": ctx.entity_execution_id,
        "source_app_id": ctx.source_app_id,
        "updated_at": now,
        "retain_until": _retain_until(ctx, now),
    }


def _new_row(
    ctx: StateHandlerContext,
    now: dt.datetime,
    *,
    status: IdempotencyStatus,
    attempt: int,
    locked_until: dt.datetime | None,
    data: str | None,
) -> dict[str, Any]:
    key = ctx.record_key
    return {
        "tenant_id": key.tenant_id,
        "scope_id": key.scope_id,
        "scope_code": ctx.scope_code,
        "entity_id": key.entity_id,
        "item_entity_key": key.item_entity_key,
        "item_key": key.item_key,
        "status": status.value,
        "attempt": attempt,
        "locked_until": locked_until,
        "data": data,
        "error_detail": None,
        "superseded": False,
        "created_at": now,
        **_stamp(ctx, now),
    }


def _to_record(row: Row[Any]) -> StateRecord:
    return StateRecord(
        key=RecordKey(
            tenant_id=row.tenant_id,
            scope_id=row.scope_id,
            entity_id=row.entity_id,
            item_entity_key=row.item_entity_key,
            item_key=row.item_key,
        ),
        status=S(row.status),
        attempt=row.attempt,
        locked_until=row.locked_until,
        data=None if row.data is None else json.loads(row.data),
        error_detail=row.error_detail,
        entity_execution_id=row.entity_execution_id,
        source_app_id=row.source_app_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        retain_until=row.retain_until,
    )


class ProcessStateLogRepository:
    """Reads and writes ``process_state_logs`` for one engine.

    Methods take ``now`` instead of reading a clock, so the handler decides
    time and the repository only decides SQL.  Errors of the lifecycle
    (stale token, held lock, forbidden transition) are raised here; driver
    errors pass through for the handler to wrap.

    ``serialize`` is for a single shared connection (in-memory SQLite), where
    two transactions must not interleave on it.  On a SQLite file, write
    transactions of this repository queue on an asyncio lock: SQLite admits
    one writer at a time anyway, and queueing in-process is first come, first
    served, where the busy handler would have the losers sleep and poll.
    Writers in other processes still meet the busy timeout.
    """

    def __init__(self, engine: AsyncEngine, *, serialize: bool = False) -> None:
        self.engine = engine
        self.dialect_name = engine.dialect.name
        self._serial = asyncio.Lock() if serialize else None
        single_writer = self.dialect_name == "sqlite" and not serialize
        self._writer = asyncio.Lock() if single_writer else None

    @asynccontextmanager
    async def _transaction(self, *, write: bool = True) -> AsyncIterator[AsyncConnection]:
        gate = self._serial or (self._writer if write else None)
        if gate is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with gate, self.engine.begin() as conn:
            yield conn

    def _insert(self, values: Mapping[str, Any]) -> PgInsert | SqliteInsert:
        if self.dialect_name == "postgresql":
            return pg_insert(T).values(**values)
        return sqlite_insert(T).values(**values)

    @staticmethod
    async def _current(conn: AsyncConnection, key: RecordKey) -> StateRecord | None:
        row = (await conn.execute(select(T).where(_key(key)))).first()
        return None if row is None else _to_record(row)

    # --- reads -------------------------------------------------------------------------------

    async def get(self, key: RecordKey) -> StateRecord | None:
        async with self._transaction(write=False) as conn:
            return await self._current(conn, key)

    async def exists(self, key: RecordKey, now: dt.datetime) -> bool:
        query = select(literal(1)).where(_key(key), effective_status_in(COMPLETED, now)).limit(1)
        async with self._transaction(write=False) as conn:
            return (await conn.execute(query)).first() is not None

    # --- the lock ----------------------------------------------------------------------------

    async def try_acquire_lock(self, ctx: StateHandlerContext, now: dt.datetime) -> int | None:
        """One ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING attempt``."""
        takeover = ACQUIRABLE & sources_of(S.PROCESSING)
        insert = self._insert(
            _new_row(
                ctx,
                now,
                status=S.PROCESSING,
                attempt=1,
                locked_until=now + ctx.handler_config.lock_duration,
                data=None,
            )
        )
        statement = insert.on_conflict_do_update(
            index_elements=_KEY_NAMES,
            index_where=CURRENT_ROW,
            set_={
                "status": S.PROCESSING.value,
                "attempt": T.c.attempt + 1,
                "locked_until": insert.excluded.locked_until,
                "error_detail": None,
                "entity_execution_id": insert.excluded.entity_execution_id,
                "source_app_id": insert.excluded.source_app_id,
                "updated_at": insert.excluded.updated_at,
                "retain_until": insert.excluded.retain_until,
            },
            where=effective_status_in(takeover, now),
        ).returning(T.c.attempt)
        async with self._transaction() as conn:
            token = (await conn.execute(statement)).scalar_one_or_none()
        return None if token is None else int(token)

    async def _fenced_update(
        self,
        ctx: StateHandlerContext,
        now: dt.datetime,
        target: IdempotencyStatus,
        changes: Mapping[str, Any],
    ) -> None:
        """``UPDATE ... WHERE status = 'processing' AND attempt = :token``; else StaleLockError."""
        token = ctx.lock_token
        assert token is not None
        key = ctx.record_key
        statement = (
            update(T)
            .where(_key(key), T.c.status == S.PROCESSING.value, T.c.attempt == token)
            .values(status=target.value, locked_until=None, **changes, **_stamp(ctx, now))
            .returning(T.c.id)
        )
        async with self._transaction() as conn:
            if not is_allowed(S.PROCESSING, target):
                # Fencing is checked before the table, as the reference model does.
                self._require_holder(ctx, await self._current(conn, key))
                check_transition(S.PROCESSING, target, item_key=ctx.item_key)
            if (await conn.execute(statement)).first() is not None:
                return
            self._require_holder(ctx, await self._current(conn, key))
        # The row matched the token on the follow-up read but not on the write:
        # impossible, since tokens only grow; refuse rather than guess.
        raise StoreError(f"fenced write on item {ctx.item_key!r} neither matched nor went stale")

    @staticmethod
    def _require_holder(ctx: StateHandlerContext, record: StateRecord | None) -> None:
        token = ctx.lock_token
        assert token is not None
        if record is None or record.status is not S.PROCESSING or record.attempt != token:
            raise StaleLockError(
                item_key=ctx.item_key,
                token=token,
                current_token=None if record is None else record.attempt,
                status=S.NONE.label if record is None else record.status.label,
            )

    # --- writes ------------------------------------------------------------------------------

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: str | None,
        now: dt.datetime,
    ) -> None:
        """Move to ``status``: fenced with a token, table-checked without one."""
        keep = {} if data is None else {"data": data}
        if ctx.lock_token is not None:
            await self._fenced_update(ctx, now, status, keep)
            return
        if status in NEEDS_LOCK:
            async with self._transaction(write=False) as conn:
                record = await self._current(conn, ctx.record_key)
            self._refuse_live_lock(ctx, record, now)
            raise LockNotHeldError(item_key=ctx.item_key, operation=f"set({status.label})")
        await self._unlocked_set(ctx, status, data, now)

    async def _unlocked_set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: str | None,
        now: dt.datetime,
    ) -> None:
        """One statement whose ``WHERE`` is the table's sources of ``status``, minus live locks."""
        key = ctx.record_key
        sources = sources_of(status) - {S.PROCESSING}
        statement: Any
        if S.NONE in sources:
            insert = self._insert(
                _new_row(ctx, now, status=status, attempt=0, locked_until=None, data=data)
            )
            changes: dict[str, Any] = {
                "status": status.value,
                "locked_until": None,
                "entity_execution_id": insert.excluded.entity_execution_id,
                "source_app_id": insert.excluded.source_app_id,
                "updated_at": insert.excluded.updated_at,
                "retain_until": insert.excluded.retain_until,
            }
            if data is not None:
                changes["data"] = insert.excluded.data
            statement = insert.on_conflict_do_update(
                index_elements=_KEY_NAMES,
                index_where=CURRENT_ROW,
                set_=changes,
                where=effective_status_in(sources, now),
            ).returning(T.c.id)
        else:
            statement = (
                update(T)
                .where(_key(key), effective_status_in(sources, now))
                .values(
                    status=status.value,
                    locked_until=None,
                    **({} if data is None else {"data": data}),
                    **_stamp(ctx, now),
                )
                .returning(T.c.id)
            )
        for _ in range(_RACE_RETRIES):
            async with self._transaction() as conn:
                if (await conn.execute(statement)).first() is not None:
                    return
                record = await self._current(conn, key)
            self._refuse_live_lock(ctx, record, now)
            check_transition(effective_status(record, now), status, item_key=ctx.item_key)
        raise StoreError(f"set({status.label}) on item {ctx.item_key!r} kept losing races")

    async def release_lock_as_failed(
        self, ctx: StateHandlerContext, error_detail: str, now: dt.datetime
    ) -> None:
        if ctx.lock_token is None:
            raise LockNotHeldError(item_key=ctx.item_key, operation="release_lock_as_failed")
        await self._fenced_update(ctx, now, S.FAILED, {"error_detail": error_detail})

    async def upsert(self, ctx: StateHandlerContext, data: str | None, now: dt.datetime) -> None:
        """Supersede a Processed record, or acquire and complete in one step.

        Without a token this is at most three statements in one transaction:
        mark the current Processed row superseded and insert its successor,
        or (no Processed row) the compressed acquire-and-complete upsert.
        """
        if ctx.lock_token is not None:
            await self._fenced_update(ctx, now, S.PROCESSED, {} if data is None else {"data": data})
            return
        for _ in range(_RACE_RETRIES):
            try:
                if await self._upsert_once(ctx, data, now):
                    return
            except IntegrityError:
                # A concurrent writer inserted the key's current row first; re-read and redo.
                continue
        raise StoreError(f"upsert on item {ctx.item_key!r} kept losing races")

    async def _upsert_once(
        self, ctx: StateHandlerContext, data: str | None, now: dt.datetime
    ) -> bool:
        key = ctx.record_key
        supersede = (
            update(T)
            .where(_key(key), effective_status_in(sources_of(S.SUPERSEDED) - {S.PROCESSING}, now))
            .values(status=S.SUPERSEDED.value, superseded=True, updated_at=now)
            .returning(T.c.attempt)
        )
        fresh = ACQUIRABLE & sources_of(S.PROCESSING)
        insert = self._insert(
            _new_row(ctx, now, status=S.PROCESSED, attempt=1, locked_until=None, data=data)
        )
        changes: dict[str, Any] = {
            "status": S.PROCESSED.value,
            "attempt": T.c.attempt + 1,
            "locked_until": None,
            "error_detail": None,
            "entity_execution_id": insert.excluded.entity_execution_id,
            "source_app_id": insert.excluded.source_app_id,
            "updated_at": insert.excluded.updated_at,
            "retain_until": insert.excluded.retain_until,
        }
        if data is not None:
            changes["data"] = insert.excluded.data
        compressed = insert.on_conflict_do_update(
            index_elements=_KEY_NAMES,
            index_where=CURRENT_ROW,
            set_=changes,
            where=effective_status_in(fresh, now),
        ).returning(T.c.attempt)
        async with self._transaction() as conn:
            previous = (await conn.execute(supersede)).scalar_one_or_none()
            if previous is not None:
                successor = _new_row(
                    ctx,
                    now,
                    status=S.PROCESSED,
                    attempt=int(previous),
                    locked_until=None,
                    data=data,
                )
                await conn.execute(T.insert().values(**successor))
                return True
            if (await conn.execute(compressed)).first() is not None:
                return True
            record = await self._current(conn, key)
        self._refuse_live_lock(ctx, record, now)
        source = effective_status(record, now)
        if source in fresh:
            check_path([source, S.PROCESSING, S.PROCESSED], item_key=ctx.item_key)
            return False
        check_transition(source, S.SUPERSEDED, item_key=ctx.item_key)
        return False

    @staticmethod
    def _refuse_live_lock(
        ctx: StateHandlerContext, record: StateRecord | None, now: dt.datetime
    ) -> None:
        if record is not None and is_lock_live(record.status, record.locked_until, now):
            raise LockHeldError(item_key=ctx.item_key, locked_until=str(record.locked_until))

    # --- sweeps ------------------------------------------------------------------------------

    async def reset_expired_locks(self, now: dt.datetime) -> int:
        """One ``UPDATE``, whatever the number of expired locks."""
        statement = (
            update(T)
            .where(T.c.status == S.PROCESSING.value, T.c.locked_until < now)
            .values(
                status=S.FAILED.value,
                locked_until=None,
                error_detail=SWEEP_ERROR_DETAIL,
                updated_at=now,
            )
        )
        async with self._transaction() as conn:
            return int((await conn.execute(statement)).rowcount)

    async def expire_past_retention(self, now: dt.datetime) -> int:
        """One ``UPDATE``; superseded history rows expire too, live locks never do."""
        not_live = or_(
            T.c.status != S.PROCESSING.value,
            T.c.locked_until.is_(None),
            T.c.locked_until < now,
        )
        statement = (
            update(T)
            .where(T.c.retain_until < now, T.c.status != S.EXPIRED.value, not_live)
            .values(status=S.EXPIRED.value, locked_until=None, updated_at=now)
        )
        async with self._transaction() as conn:
            return int((await conn.execute(statement)).rowcount)
