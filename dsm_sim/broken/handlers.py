"""Deliberately broken handlers: each one realistic bug on top of the in-memory handler.

Each class overrides as little as possible of
:class:`~reference_engine.handlers.memory.InMemoryStateHandler`, so the one
thing that differs from the reference is the bug its docstring names.  The
bugs are the ones real stores ship: a check-then-insert race, a missing
``WHERE`` term, an off-by-one at the boundary, a unit or time-zone slip.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import StaleLockError
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import ModelRecord, effective_status
from reference_engine.record import StateRecord
from reference_engine.status import ACQUIRABLE, IdempotencyStatus

__all__ = [
    "AcquireOverProcessed",
    "CheckThenInsertAcquire",
    "EntityMissingFromKey",
    "ExistsTrueForFailed",
    "ExistsTrueForProcessing",
    "ExpiredNotRetryable",
    "ExpiresWithoutRetention",
    "InclusiveLockBoundary",
    "InclusiveRetentionBoundary",
    "KeyRoutingHandler",
    "LocalTimeNotUtc",
    "LockDurationInMilliseconds",
    "NoFencing",
    "ReleaseKeepsLock",
    "ScopeMissingFromKey",
    "SetKeepsLock",
    "SetWithoutDataClearsData",
    "SweepIgnoresLockedUntil",
    "TenantMissingFromKey",
    "TokenNotIncremented",
    "UpsertOverwritesInPlace",
]

S = IdempotencyStatus
_TICK = dt.timedelta(microseconds=1)


class CheckThenInsertAcquire(InMemoryStateHandler):
    """Acquire reads the record, then writes in a second round trip without re-checking."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        key = ctx.record_key
        seen = self.model.current.get(key)
        if effective_status(seen, now) not in ACQUIRABLE:
            return None
        snapshot = None if seen is None else dataclasses.replace(seen)
        await asyncio.sleep(0)  # the round trip between the SELECT and the write
        if snapshot is None:
            self.model.current.pop(key, None)
        else:
            self.model.current[key] = snapshot
        return self.model.try_acquire_lock(ctx, now)


class AcquireOverProcessed(InMemoryStateHandler):
    """Acquire's update only excludes live locks, so it takes over Processed records too."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        record = self.model.current.get(ctx.record_key)
        if record is not None and record.status is S.PROCESSED:
            record.status = S.FAILED
        return self.model.try_acquire_lock(ctx, self.clock.now())


class SweepIgnoresLockedUntil(InMemoryStateHandler):
    """The catch-up sweep filters on ``status = 'processing'`` only, killing live locks."""

    async def reset_expired_locks(self) -> int:
        now = self.clock.now()
        for record in self.model.current.values():
            if record.status is S.PROCESSING:
                record.locked_until = now - _TICK
        return self.model.reset_expired_locks(now)


class InclusiveLockBoundary(InMemoryStateHandler):
    """Acquire treats a lock as expired at ``locked_until <= now``: ``<=`` where ``<`` belongs."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if record is not None and record.status is S.PROCESSING and record.locked_until == now:
            record.locked_until = now - _TICK
        return self.model.try_acquire_lock(ctx, now)


class InclusiveRetentionBoundary(InMemoryStateHandler):
    """The retention sweep expires at ``retain_until <= now``: ``<=`` where ``<`` belongs."""

    async def expire_past_retention(self) -> int:
        now = self.clock.now()
        return self.model.expire_where(
            now, lambda record: record.retain_until is not None and record.retain_until <= now
        )


class ExpiresWithoutRetention(InMemoryStateHandler):
    """The retention sweep reads a NULL ``retain_until`` as past, expiring records kept forever."""

    async def expire_past_retention(self) -> int:
        now = self.clock.now()
        return self.model.expire_where(
            now, lambda record: record.retain_until is None or record.retain_until < now
        )


class SetKeepsLock(InMemoryStateHandler):
    """The completing update writes status and data but forgets ``locked_until = NULL``."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        record = self.model.current.get(ctx.record_key)
        kept = None if record is None else record.locked_until
        self.model.set(ctx, status, data, self.clock.now())
        after = self.model.current.get(ctx.record_key)
        if after is not None and kept is not None and ctx.lock_token is not None:
            after.locked_until = kept


class ReleaseKeepsLock(InMemoryStateHandler):
    """Release records the error but leaves the record Processing until the sweep."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        record = self.model.current.get(ctx.record_key)
        self.model.release_lock_as_failed(ctx, error_detail, self.clock.now())
        if record is not None and record.status is S.FAILED:
            record.status = S.PROCESSING
            record.locked_until = record.updated_at + ctx.handler_config.lock_duration


class ExistsTrueForFailed(InMemoryStateHandler):
    """Exists asks "is there a finished row?", so Failed and Expired count as done."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        record = self.model.current.get(ctx.record_key)
        return record is not None and record.status is not S.PROCESSING


class ExistsTrueForProcessing(InMemoryStateHandler):
    """Exists asks "is there a row?", so an item being processed counts as done."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        record = self.model.current.get(ctx.record_key)
        return record is not None and record.status in (S.PROCESSING, S.PROCESSED, S.SKIPPED)


class UpsertOverwritesInPlace(InMemoryStateHandler):
    """Upsert updates the Processed row in place instead of superseding it: history is lost."""

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if ctx.lock_token is None and record is not None and record.status is S.PROCESSED:
            created = record.created_at
            self.model.upsert(ctx, data, now)
            self.model.superseded.pop()
            self.model.current[ctx.record_key].created_at = created
            return
        self.model.upsert(ctx, data, now)


class KeyRoutingHandler(InMemoryStateHandler):
    """Every per-item call is made on the context :meth:`_route` gives: how a key-mangling store looks."""

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        raise NotImplementedError

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return await super().exists(self._route(ctx))

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        return await super().get(self._route(ctx))

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return await super().try_acquire_lock(self._route(ctx))

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await super().set(self._route(ctx), status, data)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await super().release_lock_as_failed(self._route(ctx), error_detail)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await super().upsert(self._route(ctx), data)


class _KeyCollapsingHandler(KeyRoutingHandler):
    """Records are found by a key missing one column: the first writer's row answers all."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._first: dict[RecordKey, StateHandlerContext] = {}

    def _collapse(self, key: RecordKey) -> RecordKey:
        raise NotImplementedError

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        first = self._first.setdefault(self._collapse(ctx.record_key), ctx)
        return dataclasses.replace(
            ctx,
            tenant_id=first.tenant_id,
            scope_id=first.scope_id,
            scope_code=first.scope_code,
            entity_id=first.entity_id,
            item_entity_key=first.item_entity_key,
            item_key=first.item_key,
        )


class TenantMissingFromKey(_KeyCollapsingHandler):
    """The lookup's ``WHERE`` omits ``tenant_id``: one tenant's record answers for all."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, tenant_id="")


class ScopeMissingFromKey(_KeyCollapsingHandler):
    """The lookup's ``WHERE`` omits ``scope_id``: Workflow and Element records collide."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, scope_id=0)


class EntityMissingFromKey(_KeyCollapsingHandler):
    """The key has tenant, scope and item but not the entity: every node shares one record."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, entity_id="", item_entity_key="")


class LockDurationInMilliseconds(InMemoryStateHandler):
    """The lock duration in seconds is passed where milliseconds are expected: 30 min -> 1.8 s."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        config = ctx.handler_config
        wrong = dt.timedelta(milliseconds=config.lock_duration.total_seconds())
        ctx = dataclasses.replace(
            ctx, handler_config=dataclasses.replace(config, lock_duration=wrong)
        )
        return self.model.try_acquire_lock(ctx, self.clock.now())


class _LocalWallClock:
    """Reads the injected clock, then labels Central European wall time as UTC."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> dt.datetime:
        local = self._clock.now().astimezone(dt.timezone(dt.timedelta(hours=1), "CET"))
        return local.replace(tzinfo=dt.UTC)


class LocalTimeNotUtc(InMemoryStateHandler):
    """Timestamps are the server's local wall time stored as if it were UTC."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.clock = _LocalWallClock(self.clock)


class NoFencing(InMemoryStateHandler):
    """Completing writes match on the key only, not on the token: a swept holder still wins."""

    def _unfenced(self, ctx: StateHandlerContext) -> StateHandlerContext:
        record: ModelRecord | None = self.model.current.get(ctx.record_key)
        if record is None:
            return ctx
        record.status = S.PROCESSING
        return dataclasses.replace(ctx, lock_token=record.attempt)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            self.model.set(ctx, status, data, self.clock.now())
        except StaleLockError:
            self.model.set(self._unfenced(ctx), status, data, self.clock.now())

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        try:
            self.model.release_lock_as_failed(ctx, error_detail, self.clock.now())
        except StaleLockError:
            self.model.release_lock_as_failed(self._unfenced(ctx), error_detail, self.clock.now())

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        try:
            self.model.upsert(ctx, data, self.clock.now())
        except StaleLockError:
            self.model.upsert(self._unfenced(ctx), data, self.clock.now())


class ExpiredNotRetryable(InMemoryStateHandler):
    """Acquire retries only ``status = 'failed'``; an Expired item can never be processed again."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        record = self.model.current.get(ctx.record_key)
        if record is not None and record.status is S.EXPIRED:
            return None
        return self.model.try_acquire_lock(ctx, self.clock.now())


class SetWithoutDataClearsData(InMemoryStateHandler):
    """``set(status)`` without data writes ``data = NULL`` instead of keeping what is stored."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(ctx, status, data, self.clock.now())
        record = self.model.current.get(ctx.record_key)
        if data is None and record is not None:
            record.data = None


class TokenNotIncremented(InMemoryStateHandler):
    """A retry re-acquires under the old attempt number, so old and new holder share a token."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = self.model.try_acquire_lock(ctx, self.clock.now())
        if token is None or token == 1:
            return token
        self.model.current[ctx.record_key].attempt = token - 1
        return token - 1
