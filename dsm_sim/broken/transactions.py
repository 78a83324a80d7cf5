"""Broken handlers whose race window lies deep inside a call, not at its first await.

A SQL handler's acquire is several round trips: ``BEGIN``, a ``SELECT``, an
``UPDATE``, ``COMMIT``.  Another call run at the first of them (after
``BEGIN``) lands before anything was read, and the handler then sees it and
behaves; the window is between the read and the conditional write, two
awaits in.  A race search that preempts a call only at its first await
passes such a handler; one that preempts at every await does not.
"""

from __future__ import annotations

import asyncio
import dataclasses

from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import effective_status
from reference_engine.status import ACQUIRABLE

__all__ = ["StatusCompareAndSetAcquire"]


class StatusCompareAndSetAcquire(InMemoryStateHandler):
    """Acquire takes over by an UPDATE on condition of the status read, so a lock taken meanwhile passes.

    The transaction reads the row, decides (free, or an expired lock to take
    over), then updates it on condition that the status is still the one it
    read.  A take-over leaves the status ``Processing``, as it found it: the
    condition holds over the lock another worker took in between (the row's
    token is what the condition had to compare).
    """

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.sleep(0)  # BEGIN
        now = self.clock.now()
        key = ctx.record_key
        seen = self.model.current.get(key)
        if effective_status(seen, now) not in ACQUIRABLE:
            await asyncio.sleep(0)  # ROLLBACK
            return None
        read = None if seen is None else seen.status
        await asyncio.sleep(0)  # the SELECT's round trip, then the UPDATE ... WHERE status = :read
        current = self.model.current.get(key)
        if current is not None and current.status is read:
            # The condition holds: the write lands as if the row were as read.
            self.model.current[key] = dataclasses.replace(seen) if seen is not None else current
        elif (current is None) != (read is None):
            await asyncio.sleep(0)  # ROLLBACK: the row changed under the condition
            return None
        token = self.model.try_acquire_lock(ctx, now)
        await asyncio.sleep(0)  # COMMIT
        return token
