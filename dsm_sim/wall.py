"""The deadline of a whole command in real time (``dsm run --max-wall``), and how it is enforced.

A deadline is a :func:`wall_now` instant.  :func:`wall_deadline` sets the
one in force for the calls made inside it; every real handler call reads it
(:func:`current_deadline`) and waits no longer than it, and the protocol
client clips each request's timer to it, so a handler process that stops
answering cannot hold a command past its limit.

A call that blocks its thread (a ``time.sleep`` or a blocking socket read in
an ``async`` method) never yields to a timer.  :func:`interrupt_at` covers
that case for the command's own thread: a watchdog thread sends a signal to
the main thread at the deadline plus :data:`STOP_GRACE_S`, and the signal's
handler raises :class:`WallClockLimitError` inside the blocked call (a
system call is interrupted by the signal, a Python loop at its next
bytecode).  Worker processes are not interrupted this way: the process that
waits for them kills them.

Nothing here is the handler's clock: these are real seconds, read with
``CLOCK_MONOTONIC``, which is one clock for every process on the host, so a
deadline computed in the parent holds in worker processes too.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from reference_engine.errors import DsmError

__all__ = [
    "CLOSE_GRACE_S",
    "STOP_GRACE_S",
    "RunStoppedError",
    "WallClockLimitError",
    "current_deadline",
    "interrupt_at",
    "past_deadline",
    "patience",
    "remaining",
    "wall_deadline",
    "wall_now",
]

#: Real seconds past the deadline a run is given to stop by itself at its next call (and
#: release its store) before it is interrupted in this process or its worker process killed.
STOP_GRACE_S = 3.0
#: Real seconds past the deadline a closing call (the ``close`` that releases a store) may
#: still take; shorter than :data:`STOP_GRACE_S`, so it ends before anything is killed.
CLOSE_GRACE_S = 1.0
#: The signal the watchdog of :func:`interrupt_at` sends to the main thread.  Not SIGALRM:
#: pytest-timeout and other tools own that one.
_INTERRUPT = signal.SIGUSR2
#: How often the watchdog signals again while the interrupted code is still unwinding.
_AGAIN_S = 1.0


class RunStoppedError(DsmError):
    """A bound (real time, memory) stopped the run; nothing after that instant was simulated.

    Takes its message only: SimPy re-raises a process's error as
    ``type(exc)(*exc.args)``, which must rebuild it.  Every layer between a
    handler call and the run lets it through, where a handler's own named
    error would be recorded as the call's outcome.
    """


class WallClockLimitError(RunStoppedError):
    """The deadline of the whole command (``dsm run --max-wall``) passed during this run."""


#: The deadline in force, in :func:`wall_now` seconds (None: unbounded).
_deadline: float | None = None


def wall_now() -> float:
    """Real monotonic seconds, read past freezegun (``--clock system`` freezes ``time``).

    ``CLOCK_MONOTONIC`` is one clock for every process on the host, so a
    deadline computed in the parent holds in the ``--jobs`` workers too.
    """
    clock_gettime = getattr(time, "clock_gettime", None)
    if clock_gettime is None:  # pragma: no cover - not on Linux or macOS
        return time.monotonic()
    return float(clock_gettime(time.CLOCK_MONOTONIC))


@contextmanager
def wall_deadline(deadline: float | None) -> Iterator[None]:
    """Bound every real call made inside the block by ``deadline`` (a :func:`wall_now` instant)."""
    global _deadline
    previous, _deadline = _deadline, deadline
    try:
        yield
    finally:
        _deadline = previous


def current_deadline(final: bool = False) -> float | None:
    """The deadline a call made now must meet; none for a ``final`` one (a closing release)."""
    return None if final else _deadline


def remaining(seconds: float, *, final: bool = False) -> tuple[float, bool]:
    """How long a wait bounded by ``seconds`` may last now, and whether the deadline binds it.

    A ``final`` wait (the request that closes a store) may run
    :data:`CLOSE_GRACE_S` past the deadline, so a stopped run still releases
    what it holds, but no longer.
    """
    if _deadline is None:
        return seconds, False
    left = max(0.0, _deadline + (CLOSE_GRACE_S if final else 0.0) - wall_now())
    return (left, True) if left < seconds else (seconds, False)


def past_deadline(what: str = "") -> WallClockLimitError:
    """The error that stops a run at the command's wall-clock limit; ``what`` was cut short."""
    cut = f" while {what}" if what else " at its next handler call"
    return WallClockLimitError(
        f"the command's wall-clock limit (dsm run --max-wall) passed{cut}, so the run "
        "stopped; nothing after it was simulated or checked"
    )


def patience(deadline: float | None) -> float | None:
    """How long to wait now for a run in another process: to the deadline and its grace."""
    return None if deadline is None else max(0.0, deadline + STOP_GRACE_S - wall_now())


@contextmanager
def interrupt_at(deadline: float | None) -> Iterator[None]:
    """Raise :class:`WallClockLimitError` in this thread if the block outlives ``deadline``.

    Armed only in the main thread (only it receives signals); elsewhere, and
    without a deadline, the block runs unguarded and only the cooperative
    checks bound it.  Fires :data:`STOP_GRACE_S` after the deadline, so a
    run that stops by itself at its next call is never interrupted, and
    again every second while the interrupted code is still unwinding (a
    handler that swallows the first one, a ``close`` that blocks too).
    """
    if deadline is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = threading.Event()
    armed.set()
    done = threading.Event()
    target = threading.main_thread().ident
    assert target is not None

    def handle(signum: int, frame: FrameType | None) -> None:
        if armed.is_set():
            raise past_deadline("a handler call blocked its thread")

    def watch() -> None:
        wait = deadline + STOP_GRACE_S - wall_now()
        while not done.wait(max(0.0, wait)):
            if armed.is_set():
                signal.pthread_kill(target, _INTERRUPT)
            wait = _AGAIN_S

    previous = signal.signal(_INTERRUPT, handle)
    watchdog = threading.Thread(target=watch, name="dsm-max-wall", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        armed.clear()
        done.set()
        watchdog.join()
        # A signal the watchdog sent just before it stopped may still be on its way: under
        # the default disposition it would end the process, so the disarmed handler stays.
        if previous not in (signal.SIG_DFL, None):
            signal.signal(_INTERRUPT, previous)
