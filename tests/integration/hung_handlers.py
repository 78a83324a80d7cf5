"""Handlers that hang in one way each, for the tests of ``dsm verify`` against hung calls.

Each is the in-memory handler but for the way it hangs.  The ones meant to
run in another process are served with ``dsm serve hung_handlers:NAME``
(this folder on ``PYTHONPATH``), so they speak the protocol as any handler
process does and simply never answer the request that hangs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

#: Far longer than any test waits: only a stop from outside ends the hang.
FOREVER_S = 600.0
#: ``silent_after``: requests answered before the process goes silent, and the file it
#: writes its pid to when it does.
SILENT_AFTER_ENV = "DSM_TEST_SILENT_AFTER"
SILENT_PIDS_ENV = "DSM_TEST_SILENT_PIDS"

_gets = [0]


class ThirdGetHangs(InMemoryStateHandler):
    """Never answers the third ``get`` of its process."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        _gets[0] += 1
        if _gets[0] == 3:
            await asyncio.Event().wait()
        return await super().get(ctx)


def third_get(clock: Clock) -> ThirdGetHangs:
    return ThirdGetHangs(clock)


async def _forever() -> Any:
    await asyncio.Event().wait()


class EveryCallHangs(InMemoryStateHandler):
    """Opens and closes, and no other call ever returns."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return bool(await _forever())

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        return await _forever()  # type: ignore[no-any-return]

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return await _forever()  # type: ignore[no-any-return]

    async def set(
        self, ctx: StateHandlerContext, status: IdempotencyStatus, data: Any = None
    ) -> None:
        await _forever()

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await _forever()

    async def upsert(self, ctx: StateHandlerContext, data: Any) -> None:
        await _forever()

    async def reset_expired_locks(self) -> int:
        return await _forever()  # type: ignore[no-any-return]

    async def expire_past_retention(self) -> int:
        return await _forever()  # type: ignore[no-any-return]


def every_call(clock: Clock) -> EveryCallHangs:
    return EveryCallHangs(clock)


#: Set by a test when it is done, so the threads ``executor_hang`` blocked end.
RELEASE = threading.Event()


class ExecutorHangs(InMemoryStateHandler):
    """``try_acquire_lock`` waits on an executor thread, as a blocking driver call on a dead socket."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.get_running_loop().run_in_executor(None, RELEASE.wait, FOREVER_S)
        return await super().try_acquire_lock(ctx)


def executor_hang(clock: Clock) -> ExecutorHangs:
    return ExecutorHangs(clock)


_kept: list[threading.Thread] = []


def thread_keeper(clock: Clock) -> InMemoryStateHandler:
    """The in-memory handler; its first build starts a non-daemon thread that sleeps on."""
    if not _kept:
        thread = threading.Thread(target=time.sleep, args=(FOREVER_S,), name="handler-keeper")
        thread.start()
        _kept.append(thread)
    return InMemoryStateHandler(clock)


_requests = [0]


class SilentAfter(InMemoryStateHandler):
    """Answers ``$DSM_TEST_SILENT_AFTER`` calls, then none: a process whose store went away.

    When it goes silent it appends its pid to ``$DSM_TEST_SILENT_PIDS``.
    """

    async def _count(self) -> None:
        _requests[0] += 1
        if _requests[0] == int(os.environ[SILENT_AFTER_ENV]) + 1:
            with open(os.environ[SILENT_PIDS_ENV], "a", encoding="utf-8") as pids:  # noqa: ASYNC230
                pids.write(f"{os.getpid()}\n")
        if _requests[0] > int(os.environ[SILENT_AFTER_ENV]):
            await asyncio.Event().wait()

    async def open(self) -> None:
        await self._count()

    async def close(self) -> None:
        await self._count()

    async def exists(self, ctx: StateHandlerContext) -> bool:
        await self._count()
        return await super().exists(ctx)

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        await self._count()
        return await super().get(ctx)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await self._count()
        return await super().try_acquire_lock(ctx)


def silent_after(clock: Clock) -> SilentAfter:
    return SilentAfter(clock)
