"""Driving async handlers from Hypothesis' synchronous rules.

Hypothesis has no async state machines, so every rule runs the handler's
coroutines to completion on one event loop owned by the test case.  The loop
is created with the machine and closed in its teardown, after the handler's
``close()``; a task still pending then is a leak the report names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from dsm_sim.model import Outcome

__all__ = ["LoopDriver"]

T = TypeVar("T")


class LoopDriver:
    """One event loop for one test case."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def outcome(self, call: Callable[[], Awaitable[Any]]) -> Outcome:
        """Run one handler call; its value, or any exception it raised, becomes the outcome."""
        try:
            return Outcome(value=self.run(call()))
        except Exception as exc:
            return Outcome(error=exc)

    def gather(self, calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Outcome]:
        """Run calls concurrently, interleaving at each ``await``, and keep every outcome."""

        async def one(call: Callable[[], Awaitable[Any]]) -> Outcome:
            try:
                return Outcome(value=await call())
            except Exception as exc:
                return Outcome(error=exc)

        async def together() -> list[Outcome]:
            return list(await asyncio.gather(*(one(call) for call in calls)))

        return self.run(together())

    def close(self) -> list[str]:
        """Cancel what is still pending, close the loop; return the leaked tasks' names."""
        if self.loop.is_closed():
            return []
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        leaked = [task.get_name() + ": " + repr(task.get_coro()) for task in pending]
        for task in pending:
            task.cancel()
        try:
            if pending:
                self.run(asyncio.gather(*pending, return_exceptions=True))
            self.run(self.loop.shutdown_asyncgens())
            self.run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
        return leaked
