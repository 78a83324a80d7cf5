"""Driving the real handler's coroutines from SimPy processes, on the loop only when they wait on it.

An in-process handler (the in-memory model and its broken variants, SQLite
on the inline driver of :mod:`dsm_sim.simulator.sqlite`) finishes most calls
without ever suspending, and a loop round trip per call (a task, a timeout,
two loop iterations) would cost far more than the call.  For such a handler the coroutine is sent to
directly on this thread, in a copy of the context as a task would be, with
the run's loop installed as the running loop so that ``asyncio.Lock``,
``asyncio.sleep`` and friends find it.  The first time the coroutine yields a
future (it really waits: a timer, another worker's lock, a task it started)
the loop runs until that future is done, within the run's real-time bound,
and the coroutine carries on here; anything else it yields (a bare
yield while it must run to completion) moves the rest of the leg into a task
on the loop.

Every other handler (a server, another process, anything whose code may need
a task of its own before its first await) runs each leg in a task on the
loop from the start.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

from dsm_sim.inline import send_inline
from dsm_sim.simulator.bridge import (
    Done,
    RunStoppedError,
    bounded,
    check_deadline,
    current_deadline,
    hung,
)
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = ["ROUND_TRIP", "HandlerDriver", "in_process"]

T = TypeVar("T")


class _RoundTrip:
    """The type of :data:`ROUND_TRIP`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ROUND_TRIP"


#: Returned for a leg that paused at a bare ``await asyncio.sleep(0)``: a round trip to the store.
ROUND_TRIP: Final = _RoundTrip()


def in_process(handler: StateHandler) -> bool:
    """Whether ``handler`` runs on this thread with no I/O, so its coroutines may be sent to here.

    The in-memory handler (and every subclass) does, and so does a SQL
    handler on the simulator's inline SQLite driver.
    """
    if isinstance(handler, InMemoryStateHandler):
        return True
    if "reference_engine.handlers.sql.handler" not in sys.modules:
        return False  # no SQL handler was ever built: the SQL extra need not be installed
    from dsm_sim.simulator.sqlite import on_loop_thread

    return on_loop_thread(handler)


class HandlerDriver:
    """Runs handler coroutines for one simulated run; ``direct`` sends to them on this thread.

    ``seconds`` bounds, in real time, the part of a call that waits on the
    loop (None: unbounded, for the protocol client, which bounds itself).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float | None, *, direct: bool
    ) -> None:
        self.loop = loop
        self.seconds = seconds
        self.direct = direct

    def complete(self, coro: Coroutine[Any, Any, T], what: str, *, final: bool = False) -> T:
        """Run ``coro`` to its end and return its value (or raise its exception).

        The command's wall-clock deadline (``dsm run --max-wall``) stops the
        run before the call, except a ``final`` one (the ``close()`` that
        releases the store after the run, stopped or not).
        """
        self._check(coro, final)
        if not self.direct or not isinstance(coro, types.CoroutineType):
            deadline = current_deadline(final)
            return self._until_done(bounded(coro, what, self.seconds, deadline))
        context = contextvars.copy_context()
        try:
            yielded = self._send(context, coro)
        except StopIteration as stop:
            value: T = stop.value
            return value
        leg = self._carry_on(context, coro, yielded, split=False, what=what)
        assert isinstance(leg, Done)
        result: T = leg.value
        return result

    def leg(self, coro: Coroutine[Any, Any, Any], *, split: bool) -> Done | _RoundTrip:
        """One leg of a handler call: :class:`Done` with the result, or :data:`ROUND_TRIP`.

        With ``split`` false the call always runs to completion in one leg,
        which is what handlers doing real I/O need: their connections must
        not be held across simulated time.
        """
        self._check(coro, False)
        if not self.direct:
            what = f"{getattr(coro, '__name__', 'call')}()"
            leg = bounded(_leg(coro, split), what, self.seconds, current_deadline())
            try:
                return self._until_done(leg)
            except RunStoppedError:
                coro.close()  # driven by hand, so cancelling the leg left it suspended
                raise
        context = contextvars.copy_context()
        try:
            yielded = self._send(context, coro)
        except StopIteration as stop:
            return Done(stop.value)
        return self._carry_on(context, coro, yielded, split=split, what="")

    def _until_done(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` in a task until it is done; a stop (Ctrl-C, SIGTERM) leaves it cancelled.

        Left pending, the task would finish in the clean-up's turns of the loop
        (its handler process ended) with an error nobody reads, which asyncio
        prints as a traceback while the command stops.
        """
        task = self.loop.create_task(coro)
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                task.add_done_callback(_unread)
            raise

    @staticmethod
    def _check(coro: Coroutine[Any, Any, Any], final: bool) -> None:
        try:
            check_deadline(final)
        except RunStoppedError:
            coro.close()
            raise

    def _carry_on(
        self,
        context: contextvars.Context,
        coro: Coroutine[Any, Any, Any],
        yielded: Any,
        *,
        split: bool,
        what: str,
    ) -> Done | _RoundTrip:
        """From what ``coro`` yielded, on here until its leg ends; the loop runs only while it waits.

        A future it waits on (a task it started, a timer) is completed by
        running the loop until it is done; the coroutine then carries on here.
        """
        while True:
            if yielded is None and split:
                return ROUND_TRIP
            what = what or f"{getattr(coro, '__name__', 'call')}()"
            if yielded is None or not asyncio.isfuture(yielded):
                return self._on_loop(context, coro, yielded, split=split, what=what)
            self._wait(coro, yielded, what)
            try:
                yielded = self._send(context, coro)
            except StopIteration as stop:
                return Done(stop.value)

    def _wait(self, coro: Coroutine[Any, Any, Any], future: asyncio.Future[Any], what: str) -> None:
        """Run the loop until ``future`` is done, at most the bound; a call still waiting is hung."""
        if future.done():
            return
        woken: asyncio.Future[bool] = self.loop.create_future()

        def wake(_: object) -> None:
            if not woken.done():
                woken.set_result(True)

        def expire() -> None:
            if not woken.done():
                woken.set_result(False)

        future.add_done_callback(wake)
        timer = None if self.seconds is None else self.loop.call_later(self.seconds, expire)
        try:
            finished = self.loop.run_until_complete(woken)
        finally:
            if timer is not None:
                timer.cancel()
            future.remove_done_callback(wake)
        if not finished:
            assert self.seconds is not None
            coro.close()
            raise hung(what, self.seconds)

    def _send(self, context: contextvars.Context, coro: Coroutine[Any, Any, Any]) -> Any:
        return send_inline(self.loop, context, coro)

    def _on_loop(
        self,
        context: contextvars.Context,
        coro: Coroutine[Any, Any, Any],
        yielded: Any,
        *,
        split: bool,
        what: str,
    ) -> Done | _RoundTrip:
        """The rest of the leg in a task on the loop, starting from what the coroutine yielded."""
        rest = bounded(_resume(coro, yielded, split), what, self.seconds, current_deadline())
        task = self.loop.create_task(rest, context=context)
        try:
            return self.loop.run_until_complete(task)
        except RunStoppedError:
            coro.close()
            raise


async def _leg(coro: Coroutine[Any, Any, Any], split: bool) -> Done | _RoundTrip:
    """Run ``coro`` inside the loop until it returns, or (``split``) until a bare yield.

    A bare yield (``await asyncio.sleep(0)``) is how an in-process handler marks a
    round trip to its store; anything else yielded is a real future (I/O), which
    is awaited here so the loop can complete it.
    """
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return Done(stop.value)
    if yielded is None and split:
        return ROUND_TRIP
    return await _resume(coro, yielded, split)


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any, split: bool) -> Done | _RoundTrip:
    """Carry on from ``yielded`` (a bare yield or a future) until the leg ends."""
    while True:
        if yielded is None:
            await asyncio.sleep(0)
        else:
            await asyncio.wait([yielded])
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return Done(stop.value)
        if yielded is None and split:
            return ROUND_TRIP


def _unread(task: asyncio.Task[Any]) -> None:
    """Read the outcome of a task given up on, so asyncio does not print it."""
    if not task.cancelled():
        task.exception()
