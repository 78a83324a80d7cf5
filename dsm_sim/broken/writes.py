"""Broken handlers whose fencing or atomicity fails only under a spent token or a race.

Each completes, releases, upserts or sweeps correctly when nothing happens
in between; the bug shows when the caller's token was already spent by its
own landed write, when the same execution holds two tokens, or when another
call lands between the handler's read and its write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import effective_status
from reference_engine.record import is_lock_live
from reference_engine.status import IdempotencyStatus

__all__ = [
    "CompletionReadsThenWrites",
    "FencingByExecutionId",
    "FencingIgnoresStatus",
    "ReleaseReadsThenWrites",
    "RetentionSweepKeepsVersion",
    "RetentionSweepSelectsThenUpdates",
    "UpsertChecksThenWrites",
]

S = IdempotencyStatus


class _Forcing(InMemoryStateHandler):
    """Helpers to write over a record as a store whose check and write are apart would."""

    def _force_holder(self, ctx: StateHandlerContext) -> None:
        """Make the record look held under ``ctx``'s token again (the stale check passed)."""
        record = self.model.current.get(ctx.record_key)
        if record is not None and ctx.lock_token is not None:
            record.status = S.PROCESSING
            record.attempt = ctx.lock_token
            record.locked_until = record.locked_until or self.clock.now()

    def _holds(self, ctx: StateHandlerContext) -> bool:
        record = self.model.current.get(ctx.record_key)
        return (
            record is not None
            and record.status is S.PROCESSING
            and record.attempt == ctx.lock_token
        )


class FencingIgnoresStatus(_Forcing):
    """Fencing compares the token only, not the status: a spent token can still move the record."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        record = self.model.current.get(ctx.record_key)
        if record is not None and ctx.lock_token is not None and record.attempt == ctx.lock_token:
            self._force_holder(ctx)
        self.model.set(ctx, status, data, self.clock.now())

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        record = self.model.current.get(ctx.record_key)
        if record is not None and ctx.lock_token is not None and record.attempt == ctx.lock_token:
            self._force_holder(ctx)
        self.model.release_lock_as_failed(ctx, error_detail, self.clock.now())


class FencingByExecutionId(_Forcing):
    """Fencing checks the execution id on the record instead of the token."""

    def _by_execution(self, ctx: StateHandlerContext) -> StateHandlerContext:
        record = self.model.current.get(ctx.record_key)
        if (
            record is not None
            and ctx.lock_token is not None
            and record.status is S.PROCESSING
            and record.entity_execution_id == ctx.entity_execution_id
        ):
            return ctx.for_item(ctx.item_key, ctx.item_entity_key, lock_token=record.attempt)
        return ctx

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(self._by_execution(ctx), status, data, self.clock.now())

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(self._by_execution(ctx), error_detail, self.clock.now())


class CompletionReadsThenWrites(_Forcing):
    """``set`` checks the token, then writes in a second round trip that does not check it again."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        if ctx.lock_token is None or not self._holds(ctx):
            self.model.set(ctx, status, data, self.clock.now())
            return
        await asyncio.sleep(0)  # between the SELECT ... and the UPDATE ... WHERE key = :key
        self._force_holder(ctx)
        self.model.set(ctx, status, data, self.clock.now())


class RetentionSweepKeepsVersion(_Forcing):
    """Writes are guarded by a version column that the retention sweep does not bump.

    ``set`` reads the row (status, token, version), then writes ``WHERE
    version = :read``: safe against every writer that bumps the version,
    which all do but the retention sweep's bulk ``UPDATE``.  A holder of an
    expired lock past its retention then completes over the Expired record
    the sweep wrote in between.
    """

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.versions: dict[RecordKey, int] = {}

    async def _bumped(self, ctx: StateHandlerContext) -> None:
        self.versions[ctx.record_key] = self.versions.get(ctx.record_key, 0) + 1

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = await super().try_acquire_lock(ctx)
        await self._bumped(ctx)
        return token

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        if ctx.lock_token is None or not self._holds(ctx):
            await super().set(ctx, status, data)
            await self._bumped(ctx)
            return
        read = self.versions.get(ctx.record_key, 0)
        await asyncio.sleep(0)  # between the SELECT ... and the UPDATE ... WHERE version = :read
        if self.versions.get(ctx.record_key, 0) != read:
            await super().set(ctx, status, data)  # someone else wrote: fenced as usual
            return
        self._force_holder(ctx)
        self.model.set(ctx, status, data, self.clock.now())
        await self._bumped(ctx)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await super().release_lock_as_failed(ctx, error_detail)
        await self._bumped(ctx)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await super().upsert(ctx, data)
        await self._bumped(ctx)

    async def reset_expired_locks(self) -> int:
        swept = [k for k, r in self.model.current.items() if r.status is S.PROCESSING]
        count = await super().reset_expired_locks()
        for key in swept:
            if self.model.current[key].status is S.FAILED:
                self.versions[key] = self.versions.get(key, 0) + 1
        return count


class ReleaseReadsThenWrites(_Forcing):
    """Release checks the token, then marks the row Failed by key alone in a second round trip."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        if ctx.lock_token is None or not self._holds(ctx):
            self.model.release_lock_as_failed(ctx, error_detail, self.clock.now())
            return
        await asyncio.sleep(0)
        self._force_holder(ctx)
        self.model.release_lock_as_failed(ctx, error_detail, self.clock.now())


class RetentionSweepSelectsThenUpdates(InMemoryStateHandler):
    """The retention sweep selects expired rows, then updates them by id without re-checking."""

    async def expire_past_retention(self) -> int:
        now = self.clock.now()
        chosen = [
            record
            for record in self.model.records()
            if record.retain_until is not None
            and record.retain_until < now
            and record.status is not S.EXPIRED
            and not is_lock_live(record.status, record.locked_until, now)
        ]
        await asyncio.sleep(0)  # between the SELECT and the UPDATE ... WHERE id IN (...)
        for record in chosen:
            record.status = S.EXPIRED
            record.locked_until = None
            record.updated_at = self.clock.now()
        return len(chosen)


class UpsertChecksThenWrites(InMemoryStateHandler):
    """Upsert checks for a live lock, then writes in a second round trip over whatever is there."""

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        if ctx.lock_token is not None:
            self.model.upsert(ctx, data, self.clock.now())
            return
        record = self.model.current.get(ctx.record_key)
        if record is not None and is_lock_live(
            record.status, record.locked_until, self.clock.now()
        ):
            self.model.upsert(ctx, data, self.clock.now())  # raises LockHeldError
            return
        await asyncio.sleep(0)
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if record is not None and effective_status(record, now) is S.PROCESSING:
            record.status = S.FAILED  # the write lands over the lock taken meanwhile
            record.locked_until = None
        self.model.upsert(ctx, data, now)
