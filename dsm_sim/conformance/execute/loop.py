"""Driving async handlers from Hypothesis' synchronous rules.

Hypothesis has no async state machines, so every rule runs the handler's
coroutines to completion on one event loop owned by the test case.  The loop
is created with the machine and closed in its teardown, after the handler's
``close()``; a task still pending then is a leak the report names.

Every call is bounded in real time (:func:`call_timeout`, ``dsm verify
--call-timeout``): a call still awaiting after that long is cancelled and
raises :class:`CallTimeoutError`, which the judges report like any wrong
answer, with the story of the steps so far, instead of the kit hanging.
The bound is the event loop's own timer (``asyncio.timeout``), so the kit
never reads a clock itself.  It can only stop a call that awaits: a handler
that blocks the thread (a synchronous sleep or socket read) or swallows the
cancellation cannot be stopped from inside the process; verify such a
handler out of process (``--exec``), where the process is killed.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
import threading
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from dsm_sim.conformance.execute.scheduler import ControlledLoop, Interleaving, Schedule
from dsm_sim.hangs import hangs_seen, note_hang
from dsm_sim.inline import send_inline
from dsm_sim.model import Outcome
from dsm_sim.wall import RunStoppedError, remaining, wall_now
from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "MAX_CALL_TIMEOUT_S",
    "CallTimeoutError",
    "LoopDriver",
    "VerificationHalted",
    "call_timeout",
    "default_call_timeout",
    "set_default_call_timeout",
    "threads_left_running",
    "timeouts_seen",
    "validate_call_timeout",
]

T = TypeVar("T")

#: How long one in-process handler call may take before it counts as hung.
DEFAULT_CALL_TIMEOUT_S = 10.0
#: Seconds a closing loop's executor threads get to end before they are left running.
EXECUTOR_GRACE_S = 1.0
#: The longest bound accepted.
MAX_CALL_TIMEOUT_S = 3600.0
#: The :class:`~reference_engine.handler.StateHandler` methods a label may name.
_CALLS = frozenset(
    {
        "open",
        "close",
        "exists",
        "get",
        "try_acquire_lock",
        "begin",
        "set",
        "release_lock_as_failed",
        "upsert",
        "reset_expired_locks",
        "expire_past_retention",
    }
)


class CallTimeoutError(DsmError):
    """A handler call did not return within the kit's per-call timeout; it was cancelled."""

    def __init__(self, *, call: str, timeout: float) -> None:
        self.call = call
        self.timeout = timeout
        super().__init__(
            f"{call} did not return within {timeout:g}s (hung: waiting for a lock or a "
            "connection that never came?) and was cancelled. Set the limit with "
            "--call-timeout (pytest: --dsm-call-timeout)"
        )


class VerificationHalted(BaseException):
    """The verification was stopped (its ``--max-wall`` deadline passed, or a call hung).

    Not an answer of the handler: it passes every judge (they take
    ``Exception``) and Hypothesis (which takes it for a stop, as it does
    ``KeyboardInterrupt``), up to the stage that stops the verification.
    ``deadline``: the deadline stopped it (else a hung call did).
    """

    def __init__(self, message: str, *, deadline: bool = True) -> None:
        super().__init__(message)
        self.deadline = deadline


def validate_call_timeout(seconds: object) -> float:
    """A finite number of seconds above 0 and at most :data:`MAX_CALL_TIMEOUT_S`."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(
            f"call_timeout must be a number of seconds, got {type(seconds).__name__}"
        )
    value = float(seconds) if isinstance(seconds, float) or abs(seconds) < 10**9 else math.inf
    if not math.isfinite(value) or not 0 < value <= MAX_CALL_TIMEOUT_S:
        raise ConfigurationError(
            f"call_timeout must be a finite number of seconds above 0 and at most "
            f"{MAX_CALL_TIMEOUT_S:g}, got {seconds!r}"
        )
    return value


class _Limit:
    """The bound drivers built now get, and the runner's default."""

    seconds: float | None = DEFAULT_CALL_TIMEOUT_S
    default: float = DEFAULT_CALL_TIMEOUT_S


def default_call_timeout() -> float:
    """The bound :func:`~dsm_sim.conformance.runner.verify` uses when given none."""
    return _Limit.default


def set_default_call_timeout(seconds: float) -> None:
    """Change that default for this process (the pytest plugin's ``--dsm-call-timeout``)."""
    _Limit.default = validate_call_timeout(seconds)


@contextmanager
def call_timeout(seconds: float | None) -> Iterator[None]:
    """Bound every handler call of the drivers built inside the block; None: no bound.

    No bound is for handlers whose calls are bounded already (the protocol
    client's ``--exec-timeout``), where two timers would race.
    """
    saved = _Limit.seconds
    _Limit.seconds = None if seconds is None else validate_call_timeout(seconds)
    try:
        yield
    finally:
        _Limit.seconds = saved


#: Numbers the drivers, so each one's executor threads carry a name of their own.
_drivers = itertools.count(1)


class _Threads:
    """Executor threads of closed loops that were still running: left behind, never joined."""

    left = 0


def threads_left_running() -> int:
    """Executor threads left running by closed loops in this process so far (compare before/after)."""
    return _Threads.left


def timeouts_seen() -> int:
    """Calls that hung in this process so far, in-process or out (:mod:`dsm_sim.hangs`)."""
    return hangs_seen()


def _label(awaitable: object) -> str:
    name = getattr(awaitable, "__name__", "")
    return f"{name}()" if name in _CALLS else "a handler call"


class _Resumed:
    """Awaits the rest of a coroutine that was sent to directly and then suspended.

    What the coroutine yielded first (a future, or ``None`` for a bare
    yield) is handed to the task running this, and from then on every value
    sent and every exception thrown in (a cancellation by the bound) passes
    through to the coroutine, as if the task had run it from the start.
    """

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self.coro, self.first
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class LoopDriver:
    """One event loop for one test case.

    ``direct``: the handler runs on this thread with no I/O (the in-memory
    model and its variants), so a call is sent to directly, in a copy of the
    context as a task would be, with the loop installed as the running loop.
    Most such calls end without ever suspending, and a task, a timer and two
    turns of the loop per call cost several times the call.  The first time
    a call does suspend (a lock another call holds, a sleep), the rest of it
    runs in a task on the loop under the bound, as any call does.
    """

    def __init__(self, timeout: float | object | None = _Limit, *, direct: bool = False) -> None:
        self.loop = ControlledLoop()
        # The loop's executor is this driver's, its threads named after it: ``close`` knows
        # them, and leaves behind (never joins) one that a hung call keeps blocked.
        self.thread_prefix = f"dsm-call-executor-{next(_drivers)}"
        self.executor = ThreadPoolExecutor(thread_name_prefix=self.thread_prefix)
        self.loop.set_default_executor(self.executor)
        #: Seconds one call may take (None: unbounded); by default the :func:`call_timeout`.
        self.timeout: float | None = (
            _Limit.seconds if timeout is _Limit else validate_call_timeout(timeout)
        )
        self.direct = direct

    async def _bounded(
        self, awaitable: Awaitable[T], label: str | None = None, *, final: bool = False
    ) -> T:
        label = label or _label(awaitable)
        # Never past the command's deadline (``--max-wall``); a ``close`` gets a short grace.
        final = final or label == "close()"
        if self.timeout is None:
            try:
                return await awaitable
            except RunStoppedError as exc:  # the protocol client's timer met the deadline
                raise VerificationHalted(str(exc)) from exc
        seconds, by_deadline = remaining(self.timeout, final=final)
        bound = asyncio.timeout(seconds)
        try:
            async with bound:
                return await awaitable
        except TimeoutError:
            if not bound.expired():
                raise  # the handler's own TimeoutError, not the bound
            if by_deadline:
                raise VerificationHalted(f"{label} was cut at the --max-wall deadline") from None
            error = CallTimeoutError(call=label, timeout=self.timeout)
            note_hang(f"{label} did not return within {self.timeout:g}s (--call-timeout)")
            raise error from None
        except RunStoppedError as exc:  # a call blocked its thread past the deadline
            raise VerificationHalted(str(exc)) from exc

    def run(self, awaitable: Awaitable[T], label: str | None = None) -> T:
        """Run one call to completion; ``label`` names it if it hangs (default: its method)."""
        if not self.direct or type(awaitable) is not types.CoroutineType:
            return self._until_done(self.loop.create_task(self._bounded(awaitable, label)))
        coro = cast("Coroutine[Any, Any, T]", awaitable)
        context = contextvars.copy_context()
        try:
            yielded = send_inline(self.loop, context, coro)
        except StopIteration as stop:
            value: T = stop.value
            return value
        except RunStoppedError as exc:  # a call blocked its thread past the deadline
            raise VerificationHalted(str(exc)) from exc
        rest = self._bounded(_Resumed(coro, yielded), label or _label(coro))
        result: T = self._until_done(self.loop.create_task(rest, context=context))
        return result

    def _until_done(self, task: asyncio.Task[T]) -> T:
        """Run the loop until ``task`` is done; a stop (Ctrl-C, SIGTERM) leaves it cancelled.

        Left pending, the task would finish in the teardown's turns of the loop
        (its handler process ended) with an error nobody reads, which asyncio
        prints as a traceback while the command stops.
        """
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                task.add_done_callback(_unread)
            raise

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
                return Outcome(value=await self._bounded(call()))
            except Exception as exc:
                return Outcome(error=exc)

        async def together() -> list[Outcome]:
            return list(await asyncio.gather(*(one(call) for call in calls)))

        return self._until_done(self.loop.create_task(together()))

    def interleave(
        self,
        calls: Sequence[Callable[[], Awaitable[Any]]],
        schedule: Schedule = (),
        *,
        controlled: bool = True,
    ) -> tuple[list[Outcome], Interleaving]:
        """Run calls concurrently in the interleaving ``schedule`` chooses; every outcome kept.

        Uncontrolled (a handler in another process, whose await points are its
        own), the calls start together and interleave as the store has them.
        """

        def bounded(call: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
            return lambda: self._bounded(call())

        if controlled:
            results, happened = self._until_done(
                self.loop.create_task(
                    self.loop.interleave([bounded(call) for call in calls], schedule)
                )
            )
        else:
            log: list[tuple[str, int]] = []

            async def logged(index: int, call: Callable[[], Awaitable[Any]]) -> Any:
                log.append(("start", index))
                try:
                    return await self._bounded(call())
                finally:
                    log.append(("end", index))

            async def together() -> list[Any]:
                return list(
                    await asyncio.gather(
                        *(logged(i, call) for i, call in enumerate(calls)), return_exceptions=True
                    )
                )

            results = self._until_done(self.loop.create_task(together()))
            happened = Interleaving((), tuple(log))
        outcomes = [
            Outcome(error=result) if isinstance(result, BaseException) else Outcome(value=result)
            for result in results
        ]
        for outcome in outcomes:
            if outcome.error is not None and not isinstance(outcome.error, Exception):
                raise outcome.error  # a KeyboardInterrupt or SystemExit is not an outcome
        return outcomes, happened

    def close(self) -> list[str]:
        """Cancel what is still pending, close the loop; return the leaked tasks' names.

        The loop's executor threads (``run_in_executor``, ``asyncio.to_thread``)
        are asked to stop and given :data:`EXECUTOR_GRACE_S` to end, never
        joined: a thread blocked on a dead socket would otherwise hold the
        verdict for as long as it blocks (``shutdown_default_executor`` joins
        without a timeout).  Those still running are left behind and counted
        (:func:`threads_left_running`).
        """
        if self.loop.is_closed():
            return []
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        leaked = [task.get_name() + ": " + repr(task.get_coro()) for task in pending]
        for task in pending:
            task.cancel()
        try:
            if pending:
                gathered = asyncio.gather(*pending, return_exceptions=True)
                self._finish(gathered, "the cancellation of the tasks close() left running")
            self._finish(self.loop.shutdown_asyncgens(), "the shutdown of async generators")
        finally:
            self._abandon_threads()
            self.loop.close()
        return leaked

    def _finish(self, awaitable: Awaitable[Any], label: str) -> None:
        """Run a step of closing the loop: bounded, with the grace a ``close`` gets at the deadline."""
        self.loop.run_until_complete(self._bounded(awaitable, label, final=True))

    def _abandon_threads(self) -> None:
        """Stop the executor's threads without joining them past a short grace; count the rest."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        grace = EXECUTOR_GRACE_S if self.timeout is None else min(EXECUTOR_GRACE_S, self.timeout)
        until = wall_now() + grace
        left = 0
        for thread in threading.enumerate():
            if thread.name.startswith(self.thread_prefix + "_"):
                thread.join(max(0.0, until - wall_now()))
                left += thread.is_alive()
        _Threads.left += left


def _unread(task: asyncio.Task[Any]) -> None:
    """Read the outcome of a task given up on, so asyncio does not print it."""
    if not task.cancelled():
        task.exception()
