"""A correct in-memory handler whose worker processes die in a few race-matrix cells.

In a worker process of ``dsm verify --jobs`` (a process with a
multiprocessing parent), an ``upsert`` over a Skipped record kills the
process with SIGKILL, as the OOM killer would.  Only the race matrix's
chunks holding such a cell die; in the process that runs the test, the
handler is the reference one, so the rest of the verification passes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.status import IdempotencyStatus

__all__ = ["DiesInWorkers", "make_handler"]


class DiesInWorkers(InMemoryStateHandler):
    begin = InMemoryStateHandler.begin

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        record = self.model.get(ctx)
        skipped = record is not None and record.status is IdempotencyStatus.SKIPPED
        if skipped and multiprocessing.parent_process() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        await super().upsert(ctx, data)


def make_handler(clock: Clock) -> DiesInWorkers:
    return DiesInWorkers(clock)
