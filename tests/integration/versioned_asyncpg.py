"""A handler written from docs/writing-a-handler.md on plain asyncpg, with optimistic writes.

Each item is one row with a ``version`` column.  A write reads the row, takes
its decision with the reference model's rules on that one record, and writes
back ``WHERE version = <the version it read>``, bumping the version; a write
that finds the version moved reads again and decides again.  Superseded
records go to a ``history`` table.  Each handler works in a schema of its
own, created on ``open`` and dropped on ``close``; a peer shares it.

:class:`VersionedHandler` is correct.  :class:`RetentionKeepsVersion` has
the defect found outside the repository: its retention sweep's bulk
``UPDATE`` does not bump the version, so a holder whose lock expired past
its retention reads the row, the sweep expires it, and the holder's
``set(Processed)`` still matches the version it read and lands on the
Expired record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import asyncpg

from reference_engine.clock import Clock, read_now
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.model import ModelRecord, ReferenceModel
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

S = IdempotencyStatus
T = TypeVar("T")
URL_ENV = "DSM_TEST_POSTGRES_URL"
_FIELDS = (
    "status",
    "attempt",
    "locked_until",
    "data",
    "error_detail",
    "entity_execution_id",
    "source_app_id",
    "created_at",
    "updated_at",
    "retain_until",
)


def _dsn() -> str:
    url = os.environ.get(URL_ENV, "postgresql://postgres@127.0.0.1:5432/test")
    return url.replace("postgresql+asyncpg://", "postgresql://")


def _hash(key: RecordKey) -> bytes:
    parts = (key.tenant_id, str(key.scope_id), key.entity_id, key.item_entity_key, key.item_key)
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()


class VersionedHandler:
    """Correct: every write, the sweeps included, bumps the row's version."""

    #: Whether the retention sweep bumps the version (the defect is False).
    retention_bumps_version = True

    def __init__(self, clock: Clock, schema: str | None = None, owner: bool = True) -> None:
        self.clock = clock
        self.schema = schema or f"dsm_versioned_{uuid.uuid4().hex[:12]}"
        self.owner = owner
        self.pool: asyncpg.Pool | None = None

    def peer(self) -> VersionedHandler:
        return type(self)(self.clock, self.schema, owner=False)

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(_dsn(), min_size=1, max_size=4)
        s = self.schema
        async with self.pool.acquire() as c:
            await c.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            for table, extra in (("items", "PRIMARY KEY"), ("history", "")):
                await c.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.{table} (key_hash bytea {extra}, "
                    "tenant_id text, scope_id int, entity_id text, item_entity_key text, "
                    "item_key text, status text, attempt bigint, locked_until timestamptz, "
                    "data text, error_detail text, entity_execution_id text, "
                    "source_app_id text, created_at timestamptz, updated_at timestamptz, "
                    "retain_until timestamptz, version bigint NOT NULL DEFAULT 0)"
                )

    async def close(self) -> None:
        if self.pool is None:
            return
        if self.owner:
            async with self.pool.acquire() as c:
                await c.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        await self.pool.close()
        self.pool = None

    # --- reads ---------------------------------------------------------------------------

    async def _row(self, key: RecordKey) -> asyncpg.Record | None:
        assert self.pool is not None
        try:
            return await self.pool.fetchrow(
                f"SELECT * FROM {self.schema}.items WHERE key_hash = $1", _hash(key)
            )
        except (asyncpg.PostgresError, OSError) as exc:
            raise StoreError(f"reading the item failed: {exc}") from exc

    @staticmethod
    def _record(key: RecordKey, row: asyncpg.Record) -> ModelRecord:
        fields = {name: row[name] for name in _FIELDS}
        fields["status"] = S(fields["status"])
        return ModelRecord(key=key, **fields)

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        row = await self._row(ctx.record_key)
        return None if row is None else self._record(ctx.record_key, row).to_state_record()

    async def exists(self, ctx: StateHandlerContext) -> bool:
        row = await self._row(ctx.record_key)
        model = ReferenceModel()
        if row is not None:
            model.current[ctx.record_key] = self._record(ctx.record_key, row)
        return model.exists(ctx, read_now(self.clock))

    # --- writes: read, decide with the model's rules, write back if the version held ------

    async def _decide(self, ctx: StateHandlerContext, act: Callable[[ReferenceModel], T]) -> T:
        assert self.pool is not None
        key = ctx.record_key
        for _ in range(50):
            row = await self._row(key)
            model = ReferenceModel()
            if row is not None:
                model.current[key] = self._record(key, row)
            before = dataclasses.replace(model.current[key]) if row is not None else None
            answer = act(model)  # raises the model's errors, writing nothing
            after = model.current.get(key)
            if after is None or after == before:
                return answer
            values = _values(after)
            try:
                async with self.pool.acquire() as c, c.transaction():
                    if row is None:
                        written = await c.execute(
                            f"INSERT INTO {self.schema}.items VALUES ($1, $2, $3, $4, $5, $6, "
                            "$7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 0) "
                            "ON CONFLICT (key_hash) DO NOTHING",
                            _hash(key),
                            key.tenant_id,
                            key.scope_id,
                            key.entity_id,
                            key.item_entity_key,
                            key.item_key,
                            *values,
                        )
                    else:
                        sets = ", ".join(f"{name} = ${i + 3}" for i, name in enumerate(_FIELDS))
                        written = await c.execute(
                            f"UPDATE {self.schema}.items SET {sets}, version = version + 1 "
                            "WHERE key_hash = $1 AND version = $2",
                            _hash(key),
                            row["version"],
                            *values,
                        )
                    if written.endswith(" 0"):
                        raise _Moved
                    for old in model.superseded:
                        await c.execute(
                            f"INSERT INTO {self.schema}.history VALUES ($1, $2, $3, $4, $5, $6, "
                            "$7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 0)",
                            _hash(key),
                            key.tenant_id,
                            key.scope_id,
                            key.entity_id,
                            key.item_entity_key,
                            key.item_key,
                            *_values(old),
                        )
            except _Moved:
                continue  # another writer moved the row: read it again, decide again
            except (asyncpg.PostgresError, OSError) as exc:
                raise StoreError(f"writing the item failed: {exc}") from exc
            return answer
        raise StoreError("the row kept moving under 50 attempts to write it")

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = read_now(self.clock)
        return await self._decide(ctx, lambda m: m.try_acquire_lock(ctx, now))

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        now = read_now(self.clock)
        await self._decide(ctx, lambda m: m.set(ctx, status, data, now))

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        now = read_now(self.clock)
        await self._decide(ctx, lambda m: m.release_lock_as_failed(ctx, error_detail, now))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        now = read_now(self.clock)
        await self._decide(ctx, lambda m: m.upsert(ctx, data, now))

    # --- sweeps --------------------------------------------------------------------------

    async def reset_expired_locks(self) -> int:
        assert self.pool is not None
        now = read_now(self.clock)
        done = await self.pool.execute(
            f"UPDATE {self.schema}.items SET status = 'failed', locked_until = NULL, "
            "error_detail = 'lock expired; reset by the catch-up sweep', updated_at = $1, "
            "version = version + 1 WHERE status = 'processing' AND locked_until < $1",
            now,
        )
        return int(done.split()[-1])

    async def expire_past_retention(self) -> int:
        assert self.pool is not None
        now = read_now(self.clock)
        bump = ", version = version + 1" if self.retention_bumps_version else ""
        total = 0
        for table in ("items", "history"):
            done = await self.pool.execute(
                f"UPDATE {self.schema}.{table} SET status = 'expired', locked_until = NULL, "
                f"updated_at = $1{bump} WHERE retain_until < $1 AND status <> 'expired' "
                "AND NOT (status = 'processing' AND locked_until >= $1)",
                now,
            )
            total += int(done.split()[-1])
        return total


def _values(record: ModelRecord) -> list[Any]:
    """A record's fields as the table stores them (the status as its text)."""
    return [record.status.value if name == "status" else getattr(record, name) for name in _FIELDS]


class _Moved(Exception):
    """The row's version moved between the read and the write."""


class RetentionKeepsVersion(VersionedHandler):
    """Broken: the retention sweep does not bump the version a holder's write checks."""

    retention_bumps_version = False


def make_correct(clock: Clock) -> VersionedHandler:
    return VersionedHandler(clock)


def make_broken(clock: Clock) -> RetentionKeepsVersion:
    return RetentionKeepsVersion(clock)
