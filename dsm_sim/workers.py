"""Worker processes of ``--jobs``: how a handler reaches one, how one is stopped, how it died.

``dsm run --jobs`` (:mod:`dsm_sim.simulator.parallel`) and ``dsm verify
--jobs`` (:mod:`dsm_sim.conformance.parallel`) hand work to worker processes
under the same conventions, kept here once:

* the handler travels as its spec string (``module:factory``, ``broken:NAME``,
  ``exec:CMD``), resolved in the worker, or as a Python factory pickled in the
  parent; one that cannot be pickled or imported is refused with
  :class:`UnpicklableFactoryError` rather than breaking the pool;
* a worker is stopped with ``SIGTERM`` (it ends the handler processes it
  started), then ``SIGKILL`` (:func:`stop_workers`);
* a task run in a process of its own is awaited with :func:`await_isolated`,
  so a crash is known to be that task's, and told by :func:`how_died`.

Light on purpose: ``dsm verify``'s argument parser reads :data:`MAX_JOBS`
from here without loading the simulator.
"""

from __future__ import annotations

import pickle
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final

from dsm_sim.processes import end_processes
from dsm_sim.wall import patience
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "MAX_JOBS",
    "PAST_DEADLINE",
    "UnpicklableFactoryError",
    "await_isolated",
    "check_jobs",
    "how_died",
    "prepare_handler",
    "stop_workers",
    "worker_factory",
]

#: The most worker processes ``--jobs`` may ask for: past the cores, more only costs memory.
MAX_JOBS = 64
#: How often (seconds) the parent looks whether an isolated task's process is still alive.
_POLL = 0.2
#: What :func:`await_isolated` answers for a process it ended at the deadline.
PAST_DEADLINE: Final = object()


class UnpicklableFactoryError(ConfigurationError):
    """A handler factory given as a Python object cannot reach a worker process.

    Worker processes are not forks: they receive the factory pickled, which
    works only for a function or class importable at module level.
    """

    def __init__(self, factory: object, reason: str) -> None:
        self.factory = repr(factory)
        super().__init__(
            f"the handler factory {factory!r} cannot be sent to a worker process ({reason}); "
            "pass it as a 'package.module:factory' string, define it at module level of an "
            "importable module, or run with jobs=1"
        )


def check_jobs(jobs: int) -> int:
    """``jobs`` if it is from 1 to :data:`MAX_JOBS`, else a ConfigurationError."""
    if not 1 <= jobs <= MAX_JOBS:
        raise ConfigurationError(f"jobs must be from 1 to {MAX_JOBS}, got {jobs}")
    return jobs


def prepare_handler(handler: str | HandlerFactory) -> str | bytes:
    """The handler as a worker receives it: its spec, or the factory pickled here."""
    if isinstance(handler, str):
        return handler
    try:
        return pickle.dumps(handler)
    except Exception as exc:
        raise UnpicklableFactoryError(handler, f"{type(exc).__name__}: {exc}") from None


_FACTORIES: dict[str | bytes, HandlerFactory] = {}


def worker_factory(
    handler: str | bytes, resolve: Callable[[str], HandlerFactory] | None = None
) -> HandlerFactory:
    """Resolve (once per worker process) the handler a task names: its spec, or its pickle.

    ``resolve`` loads a spec: by default the simulator's
    (:func:`~dsm_sim.simulator.targets.resolve_handler`, which also knows
    ``broken:NAME`` and ``exec:CMD``); a caller whose command loaded the
    factory otherwise passes its own loader, so a worker loads no module the
    command did not.
    """
    if handler not in _FACTORIES:
        if isinstance(handler, bytes):
            try:
                _FACTORIES[handler] = pickle.loads(handler)
            except Exception as exc:  # the pickled reference does not import here
                raise UnpicklableFactoryError(
                    "<pickled factory>", f"{type(exc).__name__}: {exc}"
                ) from None
        elif resolve is not None:
            _FACTORIES[handler] = resolve(handler)
        else:
            from dsm_sim.simulator.targets import resolve_handler

            _FACTORIES[handler] = resolve_handler(handler)
    return _FACTORIES[handler]


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End every worker process now (SIGTERM, each ends its handler processes, then SIGKILL),
    then shut the pool down in order: its manager thread sees its workers gone and exits.

    The workers go first, so the shutdown that waits for the manager thread cannot wait on
    a blocked task.  It waits however long the thread takes (on a loaded machine, seconds):
    a manager thread still running at interpreter exit would be closing its wake-up pipe
    while the exit hook of ``concurrent.futures`` writes to it, unlocked on Python 3.11,
    and the exit would print ``OSError: handle is closed`` or ``BrokenPipeError``.
    """
    end_processes(list((pool._processes or {}).values()))
    pool.shutdown(wait=True, cancel_futures=True)


def await_isolated(
    process: BaseProcess, receive: Connection, deadline: float | None = None
) -> object | None:
    """The one message a process started for a single task sends back on ``receive``.

    None when the process died first (a crash is then known to be that
    task's); :data:`PAST_DEADLINE` when ``deadline`` and its grace passed, after
    ending the process.  The pipe is closed either way, and the process is
    ended if the wait itself is interrupted.
    """
    try:
        while True:
            left = patience(deadline)
            if left is not None and left <= 0:
                end_processes([process])
                return PAST_DEADLINE
            if receive.poll(_POLL):
                try:
                    outcome: object = receive.recv()
                except EOFError:  # died after opening the pipe, before a whole message
                    break
                process.join()
                return outcome
            if not process.is_alive():
                if receive.poll():
                    continue
                break
        process.join()
    except BaseException:
        end_processes([process])
        raise
    finally:
        receive.close()
    return None


def how_died(exitcode: int | None) -> str:
    """How a worker process ended, in words: ``killed by SIGKILL``, ``exit code 3``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
