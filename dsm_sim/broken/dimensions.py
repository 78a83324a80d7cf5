"""Broken handlers that pass any world that stands still, small and plain.

Each is right for the world most tests draw: one deployment, a few upserts
per item, a read nobody races, short keys, a morning that ends before
midnight, tenants that all go through ``try_acquire_lock``.  Each fails when
one of those dimensions moves: a node redeployed between two deliveries, an
item's history longer than a page, a write landing between a read's two
halves, every key part at its limit in bytes, a lock that ends after
midnight, a tenant whose records were only ever upserted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.config import HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import ModelRecord
from reference_engine.record import StateRecord, is_lock_live
from reference_engine.status import IdempotencyStatus

__all__ = [
    "GetReadsPayloadApart",
    "HistorySweepPagesNewest",
    "KeepsFirstLockDuration",
    "KeysLimitedInBytes",
    "LockWrapsAtMidnight",
    "SweepSkipsTenantsNeverAcquired",
]

S = IdempotencyStatus


class KeepsFirstLockDuration(InMemoryStateHandler):
    """An item keeps the node options (lock duration, retention) of its first acquisition, even after its node is redeployed."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.options: dict[RecordKey, HandlerConfig] = {}

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        first = self.options.setdefault(ctx.record_key, ctx.handler_config)
        return await super().try_acquire_lock(dataclasses.replace(ctx, handler_config=first))


class HistorySweepPagesNewest(InMemoryStateHandler):
    """The retention sweep reads each item's history a page of the newest six rows at a time, and never turns the page."""

    PAGE = 6

    async def expire_past_retention(self) -> int:
        now = self.clock.now()
        newest: dict[RecordKey, list[ModelRecord]] = {}
        for record in self.model.superseded:
            newest.setdefault(record.key, []).append(record)
        seen = {id(r) for rows in newest.values() for r in rows[-self.PAGE :]}
        return self.model.expire_where(
            now,
            lambda record: (
                record.retain_until is not None
                and record.retain_until < now
                and (record.status is not S.SUPERSEDED or id(record) in seen)
            ),
        )


class GetReadsPayloadApart(InMemoryStateHandler):
    """``get`` reads the row, then its payload in a second round trip: a write between them gives a record no write made."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        row = self.model.current.get(ctx.record_key)
        status = None if row is None else (row.status, row.attempt, row.locked_until)
        await asyncio.sleep(0)  # the payload comes from its own table
        record = await super().get(ctx)
        if record is None or status is None:
            return record
        return dataclasses.replace(
            record, status=status[0], attempt=status[1], locked_until=status[2]
        )


class KeysLimitedInBytes(InMemoryStateHandler):
    """The unique index refuses a key whose parts together take more than 2,704 bytes (a PostgreSQL btree row)."""

    LIMIT = 2704

    def _check(self, ctx: StateHandlerContext) -> None:
        key = ctx.record_key
        size = sum(
            len(part.encode("utf-8"))
            for part in (key.tenant_id, key.entity_id, key.item_entity_key, key.item_key)
        )
        if size > self.LIMIT:
            raise StoreError(f"index row size {size} exceeds btree version 4 maximum {self.LIMIT}")

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        self._check(ctx)
        return await super().try_acquire_lock(ctx)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self._check(ctx)
        await super().set(ctx, status, data)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        self._check(ctx)
        await super().upsert(ctx, data)


class LockWrapsAtMidnight(InMemoryStateHandler):
    """``locked_until`` is kept as the acquire's date and the expiry's time of day: a lock ending after midnight ends the morning it began."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = await super().try_acquire_lock(ctx)
        record = self.model.current.get(ctx.record_key)
        if token is not None and record is not None and record.locked_until is not None:
            start = self.clock.now().astimezone(dt.UTC)
            end = record.locked_until.astimezone(dt.UTC)
            record.locked_until = dt.datetime.combine(start.date(), end.timetz())
        return token


class SweepSkipsTenantsNeverAcquired(InMemoryStateHandler):
    """The retention sweep goes tenant by tenant over a registry that only ``try_acquire_lock`` fills."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.tenants: set[str] = set()

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        self.tenants.add(ctx.tenant_id)
        return await super().try_acquire_lock(ctx)

    async def expire_past_retention(self) -> int:
        now = self.clock.now()
        return self.model.expire_where(
            now,
            lambda record: (
                record.retain_until is not None
                and record.retain_until < now
                and record.key.tenant_id in self.tenants
                and not is_lock_live(record.status, record.locked_until, now)
            ),
        )
