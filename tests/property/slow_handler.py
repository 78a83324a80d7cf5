"""A correct in-memory handler whose every lock takes a tenth of a second: a ci run takes minutes.

Importable by ``dsm verify --jobs`` workers (module level), so a deadline can
pass while they, not the command's process, run the race matrix or the search.
"""

from __future__ import annotations

import asyncio

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = ["SlowLocks", "make_handler"]


class SlowLocks(InMemoryStateHandler):
    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.sleep(0.1)
        return await super().try_acquire_lock(ctx)


def make_handler(clock: Clock) -> SlowLocks:
    return SlowLocks(clock)
