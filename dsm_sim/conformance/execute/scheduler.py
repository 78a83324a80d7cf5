"""Interleavings the kit chooses: every task of the racing calls resumed one at a time.

A handler running in this process interleaves with another call only where
it awaits: between the ``SELECT`` and the ``UPDATE``, between the ``UPDATE``
and the ``COMMIT``, between reading a version and writing it back.  Left to
the event loop, which task resumes first at each such point is a matter of
timing, so a race found once may never show again.  Here, as Microsoft
Coyote does for .NET tasks, the kit takes that choice.  Each racing call runs
as a task whose every resumption is held back (:class:`ControlledLoop`), and
so does every task such a task creates: ``create_task``, ``ensure_future``,
``gather``, ``shield`` and ``wait_for`` all go through the loop's task
factory, which adopts a child of a controlled task into the same call.  The
scheduler releases one task at a time, waits until every task it released
has parked at its next await point (or finished), and picks the next.

The choices form a :data:`Schedule`, a tuple of task indices, one per
*choice point* (a moment when more than one task could resume); tasks are
numbered in the order they were created, the racing calls first.  With no
choice left, the call that ran last goes on (its task that ran last, else its
oldest ready task), else the first ready task.  The same schedule replays the
same interleaving, so a race the kit finds replays every time.

Granularity is an await point: for a SQL handler one statement (or one round
trip), for an in-memory one whatever it awaits between its read and its
write.  What a store serialises itself stays the store's: when a task the
scheduler resumed waits on a lock another (held) task has, it cannot park,
and after a bound learnt from the handler's own round trips the scheduler
treats it as blocked and resumes another task.  Work handed to a thread
(``run_in_executor``, ``to_thread``) runs outside any scheduler: the
interleaving counts those hand-offs, and the race matrix reports such cells
as uncontrolled instead of covered.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
from asyncio import tasks as asyncio_tasks
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
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
    """A moment more than one task could resume: which could, which ran last, which was chosen.

    ``follows`` is the task that going on without a preemption resumes: the
    task that ran last, else the oldest ready task of its call; None when the
    call that ran last cannot go on (finished, or waiting on the store).
    """

    ready: tuple[int, ...]
    active: int | None
    chosen: int
    follows: int | None = None

    @property
    def preempts(self) -> bool:
        """Choosing another call's task while the call that ran last could go on."""
        return self.follows is not None and self.chosen != self.follows


@dataclass(frozen=True, slots=True)
class Interleaving:
    """What a scheduled run did: its choice points, and starts and ends in the order they came."""

    choices: tuple[ChoicePoint, ...]
    #: ("start" | "end", call index), in order.
    log: tuple[tuple[str, int], ...]
    #: Times the resumed task was blocked by the store and another was resumed instead.
    blocked: int = 0
    #: The call each task belongs to, by task index: the racing calls first, then
    #: the tasks they created, in the order they were created.
    calls: tuple[int, ...] = ()
    #: Hand-offs of controlled tasks to executor threads, which no scheduler reaches.
    threaded: int = 0

    def call_of(self, task: int) -> int:
        """The racing call that ``task`` (a choice's index) belongs to."""
        return self.calls[task] if task < len(self.calls) else task

    @property
    def preemption_points(self) -> int:
        """Choice points where another call could have run instead of the one going on."""
        return sum(1 for point in self.choices if point.follows is not None)


@dataclass(slots=True)
class _Run:
    """The tasks of one interleaving: the racing calls' own, then every task they created."""

    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    index: dict[asyncio.Task[Any], int] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    roots: int = 0
    #: While a controlled task creates a child: the child's call (its first step is held).
    adopting: int | None = None
    threaded: int = 0

    def add(self, task: asyncio.Task[Any], call: int) -> int:
        self.index[task] = len(self.tasks)
        self.tasks.append(task)
        self.calls.append(call)
        return self.index[task]


#: Loop turns a drain waits at most for callbacks that keep scheduling more.
_DRAIN_TURNS = 64


class ControlledLoop(asyncio.SelectorEventLoop):
    """An event loop that holds back every resumption of the tasks it controls.

    Outside :meth:`interleave` it is an ordinary loop: its task factory builds
    the usual tasks, and nothing is held.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[asyncio.Task[Any], list[tuple[Callable[..., Any], tuple[Any, ...], Any]]]
        self._held = {}
        self._changed: asyncio.Event | None = None
        self._run: _Run | None = None
        self.set_task_factory(self._new_task)

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        """A child of a controlled task is controlled too, in its parent's call."""
        run = self._run
        parent = asyncio_tasks.current_task(self) if run is not None else None
        if run is None or parent is None or parent not in run.index:
            return asyncio.Task(coro, loop=self, **kwargs)
        run.adopting = run.calls[run.index[parent]]
        try:
            task: asyncio.Task[Any] = asyncio_tasks._PyTask(coro, loop=self, **kwargs)  # type: ignore[attr-defined]
        finally:
            run.adopting = None
        self._held.setdefault(task, [])
        if task not in run.index:
            run.add(task, run.calls[run.index[parent]])
        task.add_done_callback(self._note_change)
        return task

    def _note_change(self, _: object = None) -> None:
        if self._changed is not None:
            self._changed.set()

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        if self._held:
            # A task's own resumption is a bound method of the task; any other
            # callback (a set's ``discard`` as a done callback) runs as usual.
            owner: Any = getattr(callback, "__self__", None)
            queue = None if not isinstance(owner, Hashable) else self._held.get(cast(Any, owner))
            run = self._run
            if (
                queue is None
                and run is not None
                and run.adopting is not None
                and _is_py_task(owner)
            ):
                # The first step of a child being created: held from the start.
                queue = self._held[owner] = []
                run.add(owner, run.adopting)
            if queue is not None:
                queue.append((callback, args, context))
                self._note_change()
                return asyncio.Handle(callback, args, self, context)
        return super().call_soon(callback, *args, context=context)

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> Any:
        """Count a controlled task's hand-off to a thread: what runs there is not scheduled."""
        run = self._run
        if run is not None and asyncio_tasks.current_task(self) in run.index:
            run.threaded += 1
        return super().run_in_executor(executor, func, *args)

    # --- running racing calls ------------------------------------------------------------------

    async def interleave(
        self, calls: Sequence[Callable[[], Awaitable[Any]]], schedule: Schedule
    ) -> tuple[list[BaseException | Any], Interleaving]:
        """Run ``calls`` as controlled tasks in the interleaving ``schedule`` chooses.

        Returns each call's result (or the exception it raised) and what happened.
        A task a call created that is still pending when every call has ended
        (a fire-and-forget write) is let go, to run as the loop has it.
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

        run = _Run()
        for index, call in enumerate(calls):
            coro: Coroutine[Any, Any, Any] = logged(index, call)
            # The pure-Python task: its resumptions are bound methods we can recognise.
            task: asyncio.Task[Any] = asyncio_tasks._PyTask(coro, loop=self)  # type: ignore[attr-defined]
            self._held[task] = []
            run.add(task, index)
            task.add_done_callback(self._note_change)
        run.roots = len(calls)
        self._run = run
        try:
            choices, blocked = await self._schedule(run, schedule)
        finally:
            self._run = None
            for task in run.tasks:
                self._release(task)
                self._held.pop(task, None)
            self._changed = None
        results: list[Any] = []
        for task in run.tasks[: run.roots]:
            if task.cancelled():
                results.append(asyncio.CancelledError())
            elif task.exception() is not None:
                results.append(task.exception())
            else:
                results.append(task.result())
        happened = Interleaving(
            tuple(choices), tuple(log), blocked, tuple(run.calls), threaded=run.threaded
        )
        return results, happened

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

    async def _drain(self) -> None:
        """Let the callbacks already scheduled run: a released step, and what it set off.

        Held resumptions never enter the loop's ready queue, so once it holds
        nothing but this coroutine's own wake-up, every released task has
        either parked (held again, or waiting on a future) or finished.
        """
        ready: collections.deque[Any] = self._ready  # type: ignore[attr-defined]
        for _ in range(_DRAIN_TURNS):
            await asyncio.sleep(0)
            if not ready:
                return

    async def _wait(self, bound: float | None) -> bool:
        """Until a controlled task parks or finishes; False when ``bound`` seconds passed first."""
        changed = self._changed
        assert changed is not None
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

    def _ours(self, run: _Run) -> set[int]:
        """Ids of the futures a controlled task's end settles: the task, and what it resolves.

        ``gather``, ``shield`` and ``wait_for`` have their caller wait on a
        future of their own, which a done callback of the child settles; a
        task waiting on such a future is parked on a controlled task, not in
        flight on the store.
        """
        ours: set[int] = set()
        for task in run.tasks:
            if task.done():
                continue
            ours.add(id(task))
            for callback, _ in getattr(task, "_callbacks", None) or ():
                ours.update(id(value) for value in _referenced(callback))
        return ours

    def _flying(self, run: _Run, skip: set[int]) -> list[int]:
        """Controlled tasks resumed and not parked yet: neither held, done, nor waiting on ours."""
        flying: list[int] = []
        ours: set[int] | None = None
        for index, task in enumerate(run.tasks):
            if index in skip or task.done() or self._held.get(task):
                continue
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is not None:
                if ours is None:
                    ours = self._ours(run)
                children = getattr(waiter, "_children", None) or ()
                if id(waiter) in ours or any(id(child) in ours for child in children):
                    continue
            flying.append(index)
        return flying

    def _follows(self, run: _Run, active: int | None, ready: tuple[int, ...]) -> int | None:
        """The task that goes on without a preemption: the active one, else its call's oldest."""
        if active is None:
            return None
        if active in ready:
            return active
        call = run.calls[active]
        return next((index for index in ready if run.calls[index] == call), None)

    async def _schedule(self, run: _Run, schedule: Schedule) -> tuple[list[ChoicePoint], int]:
        # Let the tasks' first steps (scheduled by their constructors) run up to
        # their first await, where each is held.
        await self._drain()
        choices: list[ChoicePoint] = []
        active: int | None = None
        blocked = 0
        #: Tasks given up on as blocked by the store: not waited for again until they park.
        stuck: set[int] = set()
        released_at = 0.0
        roots = run.tasks[: run.roots]
        while not all(task.done() for task in roots):
            flying = self._flying(run, stuck)
            if flying:
                # In flight: wait until each parks at its next await point, or finishes.
                if await self._wait(self._block_bound()):
                    await self._drain()
                    if active in flying and active not in self._flying(run, stuck):
                        _FLIGHTS.append(self.time() - released_at)
                    continue
                blocked += 1  # the store holds it for a task we hold: let another go
                stuck.update(flying)
                if active in stuck:
                    active = None
                continue
            ready = tuple(i for i, task in enumerate(run.tasks) if self._held.get(task))
            stuck.difference_update(ready)
            if not ready:
                await self._wait(None)
                await self._drain()
                continue
            follows = self._follows(run, active, ready)
            if len(ready) > 1:
                wanted = schedule[len(choices)] if len(choices) < len(schedule) else None
                default = follows if follows is not None else ready[0]
                chosen = wanted if wanted in ready else default
                choices.append(ChoicePoint(ready, active, chosen, follows))
            else:
                chosen = ready[0]
            active = chosen
            released_at = self.time()
            self._release(run.tasks[chosen])
            await self._drain()
        return choices, blocked


def _is_py_task(value: object) -> bool:
    return isinstance(value, asyncio_tasks._PyTask)  # type: ignore[attr-defined]


def _referenced(callback: Any) -> Iterator[Any]:
    """The objects a done callback carries: a partial's arguments, a closure's cells."""
    if isinstance(callback, functools.partial):
        yield from callback.args
        callback = callback.func
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    owner = getattr(callback, "__self__", None)
    if owner is not None:
        yield owner
