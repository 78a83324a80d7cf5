"""A queue drained by N concurrent asyncio workers, results kept in input order.

This is the engine's model of a message broker with competing consumers: the
same message may sit in the queue several times (a redelivery), and whichever
worker takes it runs it.  Kept apart from the engine so the simulator and the
stress runner can drive other work through the same worker pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from reference_engine.errors import ConfigurationError

__all__ = ["MAX_WORKERS", "InvalidRunOptionError", "check_count", "run_queue"]

T = TypeVar("T")
R = TypeVar("R")

#: A bound that catches a unit mix-up (a count of messages passed as workers).
MAX_WORKERS = 1024


class InvalidRunOptionError(ConfigurationError):
    """A run option (worker count, delivery limit) is not a whole number in its range."""

    def __init__(self, option: str, value: object, maximum: int) -> None:
        self.option = option
        self.value = value
        self.maximum = maximum
        super().__init__(f"{option} must be an integer from 1 to {maximum}, got {value!r}")


def check_count(option: str, value: object, maximum: int) -> int:
    """Validate a count option before any work starts."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidRunOptionError(option, value, maximum)
    return value


async def run_queue(
    items: Sequence[T], work: Callable[[T], Awaitable[R]], *, workers: int = 1
) -> list[R]:
    """Run ``work`` on every item with ``workers`` concurrent consumers; results in input order.

    Workers take items first come, first served, so under asyncio's
    deterministic scheduling the same inputs interleave the same way every run.
    An exception escaping ``work`` cancels the other workers and propagates
    (the engine turns node failures into results, so only a crash gets here).
    """
    count = check_count("workers", workers, MAX_WORKERS)
    queue: asyncio.Queue[tuple[int, T]] = asyncio.Queue()
    for index, item in enumerate(items):
        queue.put_nowait((index, item))
    results: dict[int, R] = {}

    async def consume() -> None:
        while True:
            try:
                index, item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results[index] = await work(item)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(count, max(len(items), 1))):
            group.create_task(consume())
    return [results[index] for index in range(len(items))]
