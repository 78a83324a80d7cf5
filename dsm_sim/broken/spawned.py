"""Broken handlers whose race runs inside a task the handler starts itself.

Each is a race of :mod:`dsm_sim.broken.writes` or :mod:`dsm_sim.broken.handlers`
with its body moved into a child task, as handlers do to put a call under a
timeout, to shield a write from the caller's cancellation, or to run two
statements side by side.  The defect is the same; what changes is where the
race runs: a scheduler that controls only the racing calls' own tasks lets the
child run as the event loop has it, and never interleaves it.  On a plain
event loop the race is real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dsm_sim.broken.handlers import CheckThenInsertAcquire
from dsm_sim.broken.writes import (
    CompletionReadsThenWrites,
    ReleaseReadsThenWrites,
    UpsertChecksThenWrites,
)
from reference_engine.context import StateHandlerContext
from reference_engine.status import IdempotencyStatus

__all__ = [
    "AcquireInChildTask",
    "CompletionUnderWaitFor",
    "ReleaseInGather",
    "UpsertShielded",
]

#: The timeout a handler puts its store call under (never reached by the kit's calls).
_STORE_TIMEOUT_S = 30.0


class AcquireInChildTask(CheckThenInsertAcquire):
    """Acquire reads, then writes without re-checking, in a task it creates for the store call."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return await asyncio.create_task(super().try_acquire_lock(ctx))


class UpsertShielded(UpsertChecksThenWrites):
    """Upsert checks for a live lock, then writes over whatever is there, under ``asyncio.shield``."""

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await asyncio.shield(super().upsert(ctx, data))


class CompletionUnderWaitFor(CompletionReadsThenWrites):
    """``set`` checks the token, then writes by key alone, inside ``asyncio.wait_for``."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await asyncio.wait_for(super().set(ctx, status, data), _STORE_TIMEOUT_S)


class ReleaseInGather(ReleaseReadsThenWrites):
    """Release checks the token, then marks the row Failed by key alone, inside ``gather``."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await asyncio.gather(super().release_lock_as_failed(ctx, error_detail))
