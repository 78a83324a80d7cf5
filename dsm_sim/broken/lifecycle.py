"""Broken handlers that get wrong what happens around the calls.

They pass a kit whose callers never touch an object after a call, whose
workers all run in one source app, and whose handler is opened once: they
hand out the object they keep, stamp a record with the app that created it,
or let go of their locks when the worker process restarts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["CloseReleasesLocks", "GetReturnsCachedData", "SourceAppFromInsert"]

S = IdempotencyStatus


class GetReturnsCachedData(InMemoryStateHandler):
    """``get`` hands out the dict of its read cache, so a caller changing it changes what later reads return."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        #: Per record: the stored text and the dict decoded from it, reused while the text stands.
        self._cache: dict[RecordKey, tuple[str, Any]] = {}

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = await super().get(ctx)
        stored = self.model.current.get(ctx.record_key)
        if record is None or stored is None or stored.data is None:
            return record
        text, decoded = self._cache.get(ctx.record_key, ("", None))
        if text != stored.data:
            text, decoded = stored.data, json.loads(stored.data)
            self._cache[ctx.record_key] = (text, decoded)
        return StateRecord(
            key=record.key,
            status=record.status,
            attempt=record.attempt,
            locked_until=record.locked_until,
            data=decoded,
            error_detail=record.error_detail,
            entity_execution_id=record.entity_execution_id,
            source_app_id=record.source_app_id,
            created_at=record.created_at,
            updated_at=record.updated_at,
            retain_until=record.retain_until,
        )


class SourceAppFromInsert(InMemoryStateHandler):
    """``source_app_id`` is written when a record is inserted only, so a later write from another app keeps the first app's id."""

    def _keep_app(self, ctx: StateHandlerContext, before: str | None) -> None:
        after = self.model.current.get(ctx.record_key)
        if before is not None and after is not None:
            after.source_app_id = before

    def _before(self, ctx: StateHandlerContext) -> str | None:
        record = self.model.current.get(ctx.record_key)
        return None if record is None else record.source_app_id

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        before = self._before(ctx)
        try:
            return await super().try_acquire_lock(ctx)
        finally:
            self._keep_app(ctx, before)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        before = self._before(ctx)
        try:
            await super().set(ctx, status, data)
        finally:
            self._keep_app(ctx, before)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        before = self._before(ctx)
        try:
            await super().release_lock_as_failed(ctx, error_detail)
        finally:
            self._keep_app(ctx, before)


class CloseReleasesLocks(InMemoryStateHandler):
    """``close()`` marks the locks still held as Failed, a shutdown hook that breaks every worker's restart."""

    async def close(self) -> None:
        now = self.clock.now()
        for record in list(self.model.current.values()):
            if record.status is S.PROCESSING and record.locked_until is not None:
                record.status = S.FAILED
                record.locked_until = None
                record.error_detail = "released on shutdown"
                record.updated_at = now
