"""Interleavings the kit chooses: racing calls resumed one at a time, in a recorded order.

A handler running in this process interleaves with another call only where
it awaits: between the ``SELECT`` and the ``UPDATE``, between reading a
version and writing it back.  Left to the event loop, which of two racing
calls resumes first at each such point is a matter of timing, so a race
found once may never show again.  Here, as Microsoft Coyote does for .NET
tasks, the kit takes that choice: each racing call runs as a task whose
every resumption is held back (:class:`ControlledLoop`), and a scheduler
releases one task at a time, waits until it parks at its next await point
(or finishes), and picks the next.  The choices form a :data:`Schedule`, a
tuple of task indices, one per *choice point* (a moment when more than one
task could resume); with no choice left, the task that ran last goes on,
else the first ready one.  The same schedule replays the same
interleaving, so a race the kit finds replays every time.

Granularity is an await point: for a SQL handler one statement (or one
round trip), for an in-memory one whatever it awaits between its read and
its write.  What a store serialises itself stays the store's: when the task
the scheduler resumed waits on a lock another (held) task has, it cannot
park, and after a bound learnt from the handler's own round trips the
scheduler treats it as blocked and resumes another task.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
from asyncio import tasks as asyncio_tasks
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["ChoicePoint", "ControlledLoop", "Interleaving", "Schedule"]

#: One task index per choice point; an empty schedule runs each task as far as it goes, in order.
Schedule = tuple[int, ...]

#: Bounds of how long a resumed task may stay in flight before it counts as blocked.
_MIN_BLOCK_S = 0.005
_MAX_BLOCK_S = 0.5
#: Until this many round trips were seen, the bound is the maximum's fifth.
_LEARNING = 20
#: In flight this many times longer than the handler's slow round trips (the 95th
#: percentile, so a loaded machine's spikes are learnt too): blocked.
_BLOCK_FACTOR = 10.0


class _RoundTrips:
    """The last round trips seen, in arrival order and in sorted order.

    The bound is asked for at every wait of every race, thousands of times a
    verification; kept sorted as they come, the slow round trip is a lookup
    instead of a sort of the last thousand.
    """

    def __init__(self, maxlen: int) -> None:
        self.arrived: collections.deque[float] = collections.deque(maxlen=maxlen)
        self.ordered: list[float] = []

    def __len__(self) -> int:
        return len(self.arrived)

    def append(self, seconds: float) -> None:
        if len(self.arrived) == self.arrived.maxlen:
            del self.ordered[bisect.bisect_left(self.ordered, self.arrived[0])]
        self.arrived.append(seconds)
        bisect.insort(self.ordered, seconds)

    def slow(self) -> float:
        """The 95th percentile: ``statistics.quantiles(n=20)[-1]``, the same arithmetic."""
        data, n = self.ordered, 20
        size = len(data)
        m = size + 1
        j = min(max((n - 1) * m // n, 1), size - 1)
        delta = (n - 1) * m - j * n
        return (data[j - 1] * (n - delta) + data[j] * delta) / n


#: The round trips seen, across the loops of one process (a replay's loop is new;
#: the handler's timing is not).
_FLIGHTS = _RoundTrips(maxlen=1000)


@dataclass(frozen=True, slots=True)
class ChoicePoint:
    """A moment more than one task could resume: which could, which ran last, which was chosen."""

    ready: tuple[int, ...]
    active: int | None
    chosen: int

    @property
    def preempts(self) -> bool:
        """Choosing another task while the one that ran last could go on."""
        return self.active is not None and self.active in self.ready and self.chosen != self.active


@dataclass(frozen=True, slots=True)
class Interleaving:
    """What a scheduled run did: its choice points, and starts and ends in the order they came."""

    choices: tuple[ChoicePoint, ...]
    #: ("start" | "end", task index), in order.
    log: tuple[tuple[str, int], ...]
    #: Times the resumed task was blocked by the store and another was resumed instead.
    blocked: int = 0


class ControlledLoop(asyncio.SelectorEventLoop):
    """An event loop that holds back every resumption of the tasks it was told to control."""

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[asyncio.Task[Any], list[tuple[Callable[..., Any], tuple[Any, ...], Any]]]
        self._held = {}
        self._changed: asyncio.Event | None = None

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        if self._held:
            # A task's own resumption is a bound method of the task; any other
            # callback (a set's ``discard`` as a done callback) runs as usual.
            owner: Any = getattr(callback, "__self__", None)
            queue = None if not isinstance(owner, Hashable) else self._held.get(cast(Any, owner))
            if queue is not None:
                queue.append((callback, args, context))
                if self._changed is not None:
                    self._changed.set()
                return asyncio.Handle(callback, args, self, context)
        return super().call_soon(callback, *args, context=context)

    # --- running racing calls ------------------------------------------------------------------

    async def interleave(
        self, calls: Sequence[Callable[[], Awaitable[Any]]], schedule: Schedule
    ) -> tuple[list[BaseException | Any], Interleaving]:
        """Run ``calls`` as controlled tasks in the interleaving ``schedule`` chooses.

        Returns each call's result (or the exception it raised) and what happened.
        """
        self._changed = asyncio.Event()
        log: list[tuple[str, int]] = []

        async def logged(index: int, call: Callable[[], Awaitable[Any]]) -> Any:
            # The task's first step was scheduled before it was registered; it
            # only gets this far, so every step of the call itself is held.
            await asyncio.sleep(0)
            log.append(("start", index))
            try:
                return await call()
            finally:
                log.append(("end", index))

        tasks: list[asyncio.Task[Any]] = []
        for index, call in enumerate(calls):
            coro: Coroutine[Any, Any, Any] = logged(index, call)
            # The pure-Python task: its resumptions are bound methods we can recognise.
            task: asyncio.Task[Any] = asyncio_tasks._PyTask(coro, loop=self)  # type: ignore[attr-defined]
            self._held[task] = []
            tasks.append(task)
        for task in tasks:
            task.add_done_callback(lambda _: self._changed.set() if self._changed else None)
        try:
            choices, blocked = await self._schedule(tasks, schedule)
        finally:
            for task in tasks:
                self._release(task)
                self._held.pop(task, None)
            self._changed = None
        results: list[Any] = []
        for task in tasks:
            if task.cancelled():
                results.append(asyncio.CancelledError())
            elif task.exception() is not None:
                results.append(task.exception())
            else:
                results.append(task.result())
        return results, Interleaving(tuple(choices), tuple(log), blocked)

    def _release(self, task: asyncio.Task[Any]) -> None:
        queue = self._held.get(task)
        while queue:
            callback, args, context = queue.pop(0)
            super().call_soon(callback, *args, context=context)

    @staticmethod
    def _block_bound() -> float:
        if len(_FLIGHTS) < _LEARNING:
            return _MAX_BLOCK_S / 5
        slow = _FLIGHTS.slow()
        return min(_MAX_BLOCK_S, max(_MIN_BLOCK_S, slow * _BLOCK_FACTOR))

    async def _wait(self, bound: float | None) -> bool:
        """Until a task parks or finishes; False when ``bound`` seconds passed first."""
        changed = self._changed
        assert changed is not None
        if changed.is_set():
            changed.clear()
            return True
        if bound is not None:
            # A resumed call that waits on nothing outside the loop (an
            # in-process store) parks again, or finishes, in the loop's next
            # turn: one turn tells, without a timer set and cancelled per wait.
            await asyncio.sleep(0)
            if changed.is_set():
                changed.clear()
                return True
        if bound is None:
            await changed.wait()
        else:
            try:
                async with asyncio.timeout(bound):
                    await changed.wait()
            except TimeoutError:
                return False
        changed.clear()
        return True

    async def _schedule(
        self, tasks: list[asyncio.Task[Any]], schedule: Schedule
    ) -> tuple[list[ChoicePoint], int]:
        # Let the tasks' first steps (scheduled by their constructors) run up to
        # their first await, where each is held.
        await asyncio.sleep(0)
        choices: list[ChoicePoint] = []
        active: int | None = None
        blocked = 0
        released_at = 0.0
        while not all(task.done() for task in tasks):
            if active is not None and tasks[active].done():
                active = None
            ready = tuple(i for i, task in enumerate(tasks) if self._held[task])
            if active is not None and active not in ready:
                # In flight: wait until it parks at its next await point, or finishes.
                if await self._wait(self._block_bound()):
                    if self._held[tasks[active]] or tasks[active].done():
                        _FLIGHTS.append(self.time() - released_at)
                    continue
                blocked += 1  # the store holds it for a task we hold: let another go
                active = None
                continue
            if not ready:
                await self._wait(None)
                continue
            if len(ready) > 1:
                wanted = schedule[len(choices)] if len(choices) < len(schedule) else None
                default = active if active in ready else ready[0]
                chosen = wanted if wanted in ready else default
                choices.append(ChoicePoint(ready, active, chosen))
            else:
                chosen = ready[0]
            active = chosen
            released_at = self.time()
            self._release(tasks[chosen])
        return choices, blocked
