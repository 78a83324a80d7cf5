"""Broken handlers whose safety lives in the instance, not in the store.

Each is correct while every worker calls one instance, and wrong as soon as
two worker processes (two instances) share the store: the kit races workers
through separate instances (:mod:`dsm_sim.conformance.execute.instances`) to see it.
They keep their per-instance state in the instance's ``__dict__``, created
on first use, so they inherit the in-memory handler's constructor and its
:meth:`~reference_engine.handlers.memory.InMemoryStateHandler.peer`.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import effective_status
from reference_engine.status import ACQUIRABLE, IdempotencyStatus

__all__ = ["InstanceLockedAcquire", "RemoteInstanceLockedAcquire"]


class InstanceLockedAcquire(InMemoryStateHandler):
    """Check, then write without re-checking, made "atomic" by an ``asyncio.Lock`` in the instance.

    Within one process no two acquires interleave, so the write never finds
    another worker's lock; a second process's acquire can land between the
    check and the write, and the write takes that live lock over.
    """

    #: Seconds between the check and the write: the store's round trip.
    window = 0.0

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        guard = self.__dict__.setdefault("_acquire_guard", asyncio.Lock())
        async with guard:
            now = self.clock.now()
            if effective_status(self.model.current.get(ctx.record_key), now) not in ACQUIRABLE:
                return None
            await asyncio.sleep(self.window)  # the round trip between the SELECT and the write
            record = self.model.current.get(ctx.record_key)
            if record is not None and record.status is IdempotencyStatus.PROCESSING:
                record.locked_until = now - dt.timedelta(microseconds=1)  # the blind write
            return self.model.try_acquire_lock(ctx, now)


class RemoteInstanceLockedAcquire(InstanceLockedAcquire):
    """The same bug on a store 5 ms away, as two worker processes meet it.

    Requests from two processes reach a server at different instants, so a
    check and its write a loop turn apart almost never meet another
    process's acquire; a real round trip between them does.
    """

    window = 0.005
