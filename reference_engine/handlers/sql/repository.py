"""The SQL of the lifecycle: one method per operation, each one atomic statement where it can be.

Atomicity comes from the database, not from reading and then writing:
acquisition is an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` whose
``WHERE`` is the rule "missing, Failed, Expired or an expired lock", and a
fenced write is an ``UPDATE ... WHERE attempt = :token``.  When such a
statement changes no row, one follow-up read decides which error to raise,
so the read costs nothing on the success path.

The hot statements (exists, acquire, the fenced writes, the sweeps) are built
once in :mod:`.prepared`.  On PostgreSQL each runs alone in autocommit, the
per-item ones on the raw asyncpg connection (:mod:`.fastpath`); a statement
is atomic by itself, so ``BEGIN``/``COMMIT`` would only add round trips.  The
operations of two statements (upsert, a table-checked set) keep a transaction.
On MariaDB the same rules are built by :mod:`.mariadb` (no ``ON CONFLICT ...
WHERE``, no ``UPDATE ... RETURNING``), still one statement per operation, and
every statement runs in a transaction of its own.

Which status may follow which is read from :data:`reference_engine.status.TRANSITIONS`;
the ``WHERE`` clauses are built from it, never written out by hand.  Every
instant is a bound parameter from the caller's clock, never ``now()``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, nullcontext
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Row, update
from sqlalchemy.dialects.mysql import Insert as MariaInsert
from sqlalchemy.dialects.mysql import insert as mariadb_insert
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from reference_engine.begin import Acquired, BeginResult, Completed, Locked
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    LockHeldError,
    LockNotHeldError,
    StoreError,
)
from reference_engine.handlers.sql import mariadb as M
from reference_engine.handlers.sql import prepared as P
from reference_engine.handlers.sql.fastpath import (
    MariaDbFastPath,
    PgFastPath,
    SqliteFastPath,
    fast_path_for,
)
from reference_engine.handlers.sql.prepared import effective_status_in, sources_of
from reference_engine.handlers.sql.schema import CURRENT_ROW, process_state_logs
from reference_engine.model import NEEDS_LOCK, effective_status, require_holder, write_landed
from reference_engine.record import StateRecord, is_lock_live
from reference_engine.status import (
    ACQUIRABLE,
    COMPLETED,
    IdempotencyStatus,
    check_path,
    check_transition,
    is_allowed,
)

__all__ = ["ProcessStateLogRepository", "effective_status_in", "sources_of"]

S = IdempotencyStatus
T = process_state_logs
#: How often an operation is re-run when a concurrent writer changed the row
#: between its statement and the follow-up read (PostgreSQL, READ COMMITTED).
#: Each lost race means another writer finished, so retries always progress;
#: the bound only turns pathological contention into a StoreError.  A writer
#: among N racing on one key can lose N - 1 times before it lands (each time to
#: a writer that then finished), so the bound is well above the concurrency a
#: key meets: at 10, the last of 12 concurrent upserts of one key could fail.
_RACE_RETRIES = 32
R = TypeVar("R")


def _retain_until(ctx: StateHandlerContext, now: dt.datetime) -> dt.datetime | None:
    return ctx.handler_config.retain_until(now)


def _stamp(ctx: StateHandlerContext, now: dt.datetime) -> dict[str, Any]:
    """Fields every write refreshes: who wrote, when, and how long to keep the row."""
    return {
        "entity_execution_id": ctx.entity_execution_id,
        "source_app_id": ctx.source_app_id,
        "updated_at": now,
        "retain_until": _retain_until(ctx, now),
    }


def _completion_changes(new: Any, status: IdempotencyStatus, data: str | None) -> dict[str, Any]:
    """What an insert-or-update that ends in ``status`` takes from the new row ``new``.

    ``new`` is the proposed row: ``excluded`` (``ON CONFLICT``) or ``inserted``
    (MariaDB's ``ON DUPLICATE KEY``).  ``data=None`` keeps the stored data.
    """
    changes: dict[str, Any] = {
        "status": status.value,
        "locked_until": None,
        "entity_execution_id": new.entity_execution_id,
        "source_app_id": new.source_app_id,
        "updated_at": new.updated_at,
        "retain_until": new.retain_until,
    }
    if data is not None:
        changes["data"] = new.data
    return changes


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


def _not_taken(record: StateRecord | None, now: dt.datetime) -> BeginResult | None:
    """What ``begin`` answers when its acquire took nothing: Completed, Locked, or None.

    None means the row read is one the acquire would have taken: the read
    saw a later (or earlier) state than the acquire did, and the caller retries.
    """
    if record is None:
        return None
    if effective_status(record, now) in COMPLETED:
        return Completed(record)
    if is_lock_live(record.status, record.locked_until, now):
        return Locked(record.locked_until)
    return None


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
        postgres = self.dialect_name == "postgresql"
        #: Whether the statements look the key up by its hash (PostgreSQL's unique index).
        self.hashed = postgres
        self.mariadb = self.dialect_name == "mariadb"
        #: The hot operations on the raw driver connection (PostgreSQL, MariaDB; SQLite's reads).
        self.fast_path: PgFastPath | MariaDbFastPath | SqliteFastPath | None = (
            None if serialize else fast_path_for(engine)
        )
        # One statement is atomic on its own; BEGIN and COMMIT would be two more round trips.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if postgres else None
        )

    @asynccontextmanager
    async def _transaction(self, *, write: bool = True) -> AsyncIterator[AsyncConnection]:
        gate = self._serial or (self._writer if write else None)
        # The fast path's leased connections go back to the pool while this runs.
        lending = nullcontext() if self.fast_path is None else self.fast_path.lending()
        if gate is None:
            async with lending, self.engine.begin() as conn:
                yield conn
            return
        async with gate, lending, self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def _single(self, *, write: bool = True) -> AsyncIterator[AsyncConnection]:
        """For an operation of one statement: autocommit on PostgreSQL, else a transaction."""
        if self._autocommit is None:
            async with self._transaction(write=write) as conn:
                yield conn
            return
        if self.fast_path is None:
            async with self._autocommit.connect() as conn:
                yield conn
            return
        async with self.fast_path.lending(), self._autocommit.connect() as conn:
            yield conn

    def _insert(self, values: Mapping[str, Any]) -> PgInsert | SqliteInsert | MariaInsert:
        if self.mariadb:
            return mariadb_insert(T).values(**values)
        if self.dialect_name == "postgresql":
            return pg_insert(T).values(**values)
        return sqlite_insert(T).values(**values)

    def _proposed(self, insert: PgInsert | SqliteInsert | MariaInsert) -> Any:
        """The row an insert proposes, as its conflict clause names it."""
        return insert.inserted if isinstance(insert, MariaInsert) else insert.excluded

    def _upsert_where(
        self,
        insert: PgInsert | SqliteInsert | MariaInsert,
        changes: dict[str, Any],
        where: ColumnElement[bool],
        *,
        returning: Any,
    ) -> Any:
        """Insert, or update the key's current row where ``where`` holds: one statement."""
        if isinstance(insert, MariaInsert):
            return M.guarded_upsert(insert, changes, where)
        return insert.on_conflict_do_update(
            index_elements=P.conflict_target(self.dialect_name),
            index_where=CURRENT_ROW,
            set_=changes,
            where=where,
        ).returning(returning)

    def _applied(self, result: Any, *, upsert: bool) -> bool:
        """Whether a conditional write from this repository changed a row."""
        if not self.mariadb:
            return result.first() is not None
        return M.marked(result) if upsert else bool(result.rowcount)

    async def current(self, conn: AsyncConnection, key: RecordKey) -> StateRecord | None:
        """The item's current record, read inside the caller's transaction."""
        row = (await conn.execute(P.CURRENT, P.key_params(key, hashed=self.hashed))).first()
        return None if row is None else _to_record(row)

    # --- reads -------------------------------------------------------------------------------

    async def get(self, key: RecordKey) -> StateRecord | None:
        fast = self.fast_path
        if isinstance(fast, SqliteFastPath):
            row = await fast.fetch_row(P.CURRENT, P.key_params(key, hashed=self.hashed))
            return None if row is None else _to_record(row)
        async with self._single(write=False) as conn:
            return await self.current(conn, key)

    async def _fetchval(
        self, statement: P.Statement, params: dict[str, Any], *, write: bool
    ) -> Any:
        """Run one statement alone; the first column of its first row, or None."""
        fast = self.fast_path
        if fast is not None and (not write or not isinstance(fast, SqliteFastPath)):
            return await fast.fetchval(statement, params)
        async with self._single(write=write) as conn:
            return (await conn.execute(statement, params)).scalar()

    async def exists(self, key: RecordKey, now: dt.datetime) -> bool:
        params = P.key_params(key, hashed=self.hashed)
        params["p_now"] = now
        return await self._fetchval(P.EXISTS, params, write=False) is not None

    # --- the lock ----------------------------------------------------------------------------

    async def _past_deadlocks(self, attempt: Callable[[], Awaitable[R]]) -> R:
        """Run ``attempt`` (whole transactions), again when MariaDB undid it to break a deadlock.

        Only MariaDB reports deadlocks among these statements; a victim changed
        nothing, so each retry is the same call made later.  Like a lost race,
        each deadlock means another writer went ahead, so retries progress.
        """
        if not self.mariadb:
            return await attempt()
        for _ in range(_RACE_RETRIES - 1):
            try:
                return await attempt()
            except Exception as exc:  # SQLAlchemy's OperationalError, or asyncmy's (fast path)
                if not M.is_deadlock(exc):
                    raise
        return await attempt()

    async def _run(self, statement: Any, params: dict[str, Any]) -> Any:
        """Run one write statement alone and return its result (MariaDB: no RETURNING)."""

        async def attempt() -> Any:
            async with self._single(write=True) as conn:
                return await conn.execute(statement, params)

        return await self._past_deadlocks(attempt)

    async def _mariadb_acquire(self, params: dict[str, Any]) -> M.Outcome:
        """MariaDB's acquire statement, on the fast path when there is one, past deadlocks."""
        fast = self.fast_path
        if isinstance(fast, MariaDbFastPath):
            return await self._past_deadlocks(lambda: fast.write(M.ACQUIRE, params))
        return await self._run(M.ACQUIRE, params)  # type: ignore[no-any-return]

    async def try_acquire_lock(self, ctx: StateHandlerContext, now: dt.datetime) -> int | None:
        """One ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING attempt``."""
        if self.mariadb:
            return M.acquired_token(
                await self._mariadb_acquire(P.acquire_params(ctx, now, hashed=self.hashed))
            )
        statement = P.acquire_statement(self.dialect_name)
        token = await self._fetchval(
            statement, P.acquire_params(ctx, now, hashed=self.hashed), write=True
        )
        return None if token is None else int(token)

    async def begin(self, ctx: StateHandlerContext, now: dt.datetime) -> BeginResult:
        """``exists`` then ``try_acquire_lock`` as one atomic step.

        PostgreSQL: one statement (:func:`.prepared.begin_statement`).  SQLite:
        the acquire statement and, only when it took nothing, a read of the
        row, in one write transaction (SQLite admits one writer, so nothing
        lands between them; both run in-process, no round trip is added).
        MariaDB: its acquire statement and, when it took nothing, one read; a
        row that changed in between is noticed and the pair run again.
        """
        key = ctx.record_key
        for _ in range(_RACE_RETRIES):
            if self.dialect_name == "postgresql":
                params = P.acquire_params(ctx, now, hashed=self.hashed)
                async with self._single(write=True) as conn:
                    row = (await conn.execute(P.begin_statement(), params)).first()
                assert row is not None  # the statement always yields its one row
                if row.token is not None:
                    return Acquired(int(row.token))
                record = None if row.id is None else _to_record(row)
            elif self.mariadb:
                token = M.acquired_token(
                    await self._mariadb_acquire(P.acquire_params(ctx, now, hashed=self.hashed))
                )
                if token is not None:
                    return Acquired(token)
                record = await self.get(key)
            else:
                statement = P.acquire_statement(self.dialect_name)
                async with self._transaction() as conn:
                    taken = (
                        await conn.execute(
                            statement, P.acquire_params(ctx, now, hashed=self.hashed)
                        )
                    ).scalar()
                    if taken is not None:
                        return Acquired(int(taken))
                    record = await self.current(conn, key)
            decided = _not_taken(record, now)
            if decided is not None:
                return decided
            # Nothing was taken, yet the row read is takeable (or absent): another
            # writer changed it between the decision and the read.  Ask again.
        raise StoreError(f"begin on item {ctx.item_key!r} kept losing races")

    async def _fenced_update(
        self,
        ctx: StateHandlerContext,
        now: dt.datetime,
        target: IdempotencyStatus,
        *,
        data: str | None = None,
        error_detail: str | None = None,
    ) -> None:
        """``UPDATE ... WHERE status = 'processing' AND attempt = :token``; else StaleLockError.

        A write that matched no row may be a retry of one that landed: the
        follow-up read tells (:func:`~reference_engine.model.write_landed`),
        and then the retry succeeds without writing.

        The follow-up read runs only when no row matched.  Outside the write's
        transaction (PostgreSQL autocommit) it may see a later state, which
        decides the same way: a row that did not match the token at the write
        never matches it again, since tokens only grow.
        """
        assert ctx.lock_token is not None
        key = ctx.record_key
        shape = {"with_data": data is not None, "with_error": error_detail is not None}
        params = P.fenced_params(
            ctx, now, target, data=data, error_detail=error_detail, hashed=self.hashed
        )
        if not is_allowed(S.PROCESSING, target):
            # Fencing is checked before the table, as the reference model does.
            record = await self.get(key)
            if write_landed(record, ctx.lock_token, target, data=data, error_detail=error_detail):
                return
            require_holder(ctx, record)
            check_transition(S.PROCESSING, target, item_key=ctx.item_key)
        if self.mariadb:
            # The status always changes, so "matched" and "changed" are the same count.
            if (await self._run(P.fenced_update(**shape), params)).rowcount:
                return
        elif await self._fetchval(P.fenced_statement(**shape), params, write=True) is not None:
            return
        record = await self.get(key)
        if write_landed(record, ctx.lock_token, target, data=data, error_detail=error_detail):
            return
        require_holder(ctx, record)
        # The row matched the token on the follow-up read but not on the write:
        # impossible, since tokens only grow; refuse rather than guess.
        raise StoreError(f"fenced write on item {ctx.item_key!r} neither matched nor went stale")

    # --- writes ------------------------------------------------------------------------------

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: str | None,
        now: dt.datetime,
    ) -> None:
        """Move to ``status``: fenced with a token, table-checked without one."""
        # The instant the record would be kept until is checked first, as the model does, so
        # a set past year 9999 is InstantOutOfRangeError on every store, with a token or not.
        ctx.handler_config.retain_until(now)
        if ctx.lock_token is not None:
            await self._fenced_update(ctx, now, status, data=data)
            return
        if status in NEEDS_LOCK:
            record = await self.get(ctx.record_key)
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
        inserts = S.NONE in sources
        if inserts:
            insert = self._insert(
                _new_row(ctx, now, status=status, attempt=0, locked_until=None, data=data)
            )
            statement = self._upsert_where(
                insert,
                _completion_changes(self._proposed(insert), status, data),
                effective_status_in(sources, now),
                returning=T.c.id,
            )
        else:
            statement = (
                update(T)
                .where(P.KEY_MATCH, effective_status_in(sources, now))
                .values(
                    status=status.value,
                    locked_until=None,
                    **({} if data is None else {"data": data}),
                    **_stamp(ctx, now),
                )
            )
            if not self.mariadb:
                statement = statement.returning(T.c.id)

        # The insert names its key in its values; the update finds it by KEY_MATCH's parameters.
        params = None if inserts else P.key_params(key, hashed=self.hashed)

        async def attempt() -> tuple[bool, StateRecord | None]:
            async with self._transaction() as conn:
                if self._applied(await conn.execute(statement, params), upsert=inserts):
                    return True, None
                return False, await self.current(conn, key)

        for _ in range(_RACE_RETRIES):
            done, record = await self._past_deadlocks(attempt)
            if done:
                return
            self._refuse_live_lock(ctx, record, now)
            check_transition(effective_status(record, now), status, item_key=ctx.item_key)
        raise StoreError(f"set({status.label}) on item {ctx.item_key!r} kept losing races")

    async def release_lock_as_failed(
        self, ctx: StateHandlerContext, error_detail: str, now: dt.datetime
    ) -> None:
        if ctx.lock_token is None:
            raise LockNotHeldError(item_key=ctx.item_key, operation="release_lock_as_failed")
        await self._fenced_update(ctx, now, S.FAILED, error_detail=error_detail)

    async def upsert(self, ctx: StateHandlerContext, data: str | None, now: dt.datetime) -> None:
        """Supersede a Processed record, or acquire and complete in one step.

        Without a token this is at most three statements in one transaction:
        mark the current Processed row superseded and insert its successor,
        or (no Processed row) the compressed acquire-and-complete upsert.
        """
        if ctx.lock_token is not None:
            await self._fenced_update(ctx, now, S.PROCESSED, data=data)
            return
        for _ in range(_RACE_RETRIES):
            try:
                if await self._past_deadlocks(lambda: self._upsert_once(ctx, data, now)):
                    return
            except IntegrityError:
                # A concurrent writer inserted the key's current row first; re-read and redo.
                continue
        raise StoreError(f"upsert on item {ctx.item_key!r} kept losing races")

    async def _upsert_once(
        self, ctx: StateHandlerContext, data: str | None, now: dt.datetime
    ) -> bool:
        key = ctx.record_key
        supersede: Any = (
            update(T)
            .where(P.KEY_MATCH, effective_status_in(sources_of(S.SUPERSEDED) - {S.PROCESSING}, now))
            .values(status=S.SUPERSEDED.value, superseded=True, updated_at=now)
        )
        if self.mariadb:
            supersede = supersede.values(attempt=M.supersede_marker())
        else:
            supersede = supersede.returning(T.c.attempt)
        fresh = ACQUIRABLE & sources_of(S.PROCESSING)
        insert = self._insert(
            _new_row(ctx, now, status=S.PROCESSED, attempt=1, locked_until=None, data=data)
        )
        changes = {
            **_completion_changes(self._proposed(insert), S.PROCESSED, data),
            "attempt": T.c.attempt + 1,
            "error_detail": None,
        }
        compressed = self._upsert_where(
            insert, changes, effective_status_in(fresh, now), returning=T.c.attempt
        )
        async with self._transaction() as conn:
            superseded = await conn.execute(supersede, P.key_params(key, hashed=self.hashed))
            if self.mariadb:
                previous = superseded.lastrowid if superseded.rowcount else None
            else:
                previous = superseded.scalar_one_or_none()
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
            if self._applied(await conn.execute(compressed), upsert=True):
                return True
            record = await self.current(conn, key)
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
        return int((await self._run(P.RESET_EXPIRED_LOCKS, {"p_now": now})).rowcount)

    async def expire_past_retention(self, now: dt.datetime) -> int:
        """One ``UPDATE``; superseded history rows expire too, live locks never do."""
        return int((await self._run(P.EXPIRE_PAST_RETENTION, {"p_now": now})).rowcount)
