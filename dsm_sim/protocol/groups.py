"""Handler processes in process groups of their own, each group ended with its handler.

A handler command is often a launcher: ``sh -c``, ``npm start``, ``dotnet
run``.  Killing the process the harness started then kills the launcher
and leaves the real handler running, and any helper process a handler
forks outlives it too.  So every handler process starts a new session
(``setsid``: its own process group, its pid as the group id) and is ended by
signalling the whole group: when it is killed, and after it exits by
itself, so that nothing it started is left behind.

The groups of live handler processes are known here, so a process of the
harness that is told to stop (``SIGTERM``, or interpreter exit) ends them
all: being in a session of their own, they no longer get the terminal's
Ctrl-C or a signal sent to the harness's own group.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from types import FrameType

__all__ = ["end_all", "end_group", "resume", "spawn", "stop_all", "stop_on_sigterm"]

#: pid (and process group id) -> the handler process, while its group may hold processes.
_live: dict[int, subprocess.Popen[bytes]] = {}
#: Set while this process is being stopped (SIGTERM): no handler process starts any more.
_stopping: list[bool] = []


def stop_all() -> None:
    """This process is being stopped: end every handler group now, and start no other.

    A handler process that stopped answering would otherwise hold every wait
    of the clean-up for its whole request timeout, and code that went on (a
    stop swallowed somewhere) would start new ones.  Ended, its requests fail
    at once.  :func:`resume` allows starting again (for a caller that ran a
    command in-process and goes on).
    """
    _stopping[:] = [True]
    end_all()


def resume() -> None:
    """Allow handler processes to start again after :func:`stop_all`."""
    _stopping.clear()


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    """Start a handler command with its pipes, as the leader of a process group of its own.

    Refused with ``KeyboardInterrupt`` while the process is being stopped (:func:`stop_all`).
    """
    if _stopping:
        raise KeyboardInterrupt
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    _live[process.pid] = process
    return process


def end_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of ``process``'s group, the leader first if it still runs.

    Safe after the leader exited: the group id stays in use while any member
    lives, so it cannot name an unrelated process group meanwhile.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is not None:
        _live.pop(process.pid, None)


def end_all() -> None:
    """End the group of every handler process this process started and has not ended."""
    for process in list(_live.values()):
        end_group(process)
        _live.pop(process.pid, None)


def stop_on_sigterm() -> None:
    """In a worker process: on SIGTERM, end every handler group it started, then exit.

    A worker stopped this way has nothing to report (the process that stops
    it does the reporting), so it exits at once with 128 + SIGTERM.
    """

    def handle(signum: int, frame: FrameType | None) -> None:
        end_all()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handle)


atexit.register(end_all)
