"""Broken handlers whose story must blame the right call.

Each has one bug that a later call makes visible: a completion that never
landed shows when the sweep finds the lock still there, a count that leaves
out the history rows looks like history an upsert failed to keep, and an
``open()`` that fails the locks it finds shows when another worker's call
meets the item.  A finding must be filed under the property the first
deviating call breaks, and its story must show that call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.status import IdempotencyStatus

__all__ = ["CompletionLostOnExpiredLock", "OpenFailsLiveLocks", "RetentionCountsCurrentOnly"]

S = IdempotencyStatus


class RetentionCountsCurrentOnly(InMemoryStateHandler):
    """The retention sweep expires history rows too, but returns only the row count of its update of the current records."""

    async def expire_past_retention(self) -> int:
        history = [record.status for record in self.model.superseded]
        count = await super().expire_past_retention()
        expired_history = sum(
            1
            for old, record in zip(history, self.model.superseded, strict=True)
            if old is not record.status
        )
        return count - expired_history


class CompletionLostOnExpiredLock(InMemoryStateHandler):
    """A completion on an expired, unswept lock answers ok and writes nothing: its update requires a live lock and its row count is never read."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        record = self.model.current.get(ctx.record_key)
        if (
            status is S.PROCESSED
            and record is not None
            and record.status is S.PROCESSING
            and record.attempt == ctx.lock_token
            and record.locked_until is not None
            and record.locked_until < self.clock.now()
        ):
            return  # UPDATE ... WHERE locked_until >= now matched no row
        await super().set(ctx, status, data)


class OpenFailsLiveLocks(InMemoryStateHandler):
    """``open()`` marks every Processing record Failed, as if each lock it finds were left by a crashed worker, live or not."""

    async def open(self) -> None:
        await super().open()
        now = self.clock.now()
        for record in self.model.current.values():
            if record.status is S.PROCESSING:
                record.status = S.FAILED
                record.locked_until = None
                record.error_detail = "reset on start-up"
                record.updated_at = now
