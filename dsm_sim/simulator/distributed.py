"""Run a plan of (scenario, seed) runs on a Dask cluster, handing outcomes back in plan order.

``--jobs`` spreads a sweep over the cores of one machine
(:mod:`dsm_sim.simulator.parallel`).  A team whose sweep outgrows one machine
already has, or can start, a Dask ``distributed`` cluster; this module sends
the same runs there instead of growing a scheduler of our own.  Each run is
the same :func:`~dsm_sim.simulator.parallel.run_one` a ``--jobs`` worker
executes, so a run gives the same result wherever it runs, and outcomes are
yielded in the order of the plan: output, reports and the exit code are the
ones a serial run gives.

Two ways in:

* ``address=None``: a ``LocalCluster`` of ``workers`` processes on this
  machine, started for the sweep and closed after it (what the tests use);
* ``address="tcp://scheduler:8786"``: an existing cluster.  Its workers must
  have this package (and the handler's) installed; the handler travels as its
  spec (``module:factory``, ``broken:NAME``, ``exec:CMD``) and is resolved on
  the worker.

A worker that dies is Dask's to handle: it reschedules the run elsewhere, and
a run that kills every worker it is given (``KilledWorker``) comes back as a
:class:`~dsm_sim.simulator.parallel.RunCrash`, as a crash in a ``--jobs``
pool does.  ``dask[distributed]`` is an optional dependency (the ``cluster``
extra); without it, asking for a cluster is a :class:`ClusterUnavailableError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.scenario import Scenario
from dsm_sim.simulator.bridge import CALL_TIMEOUT_ENV
from dsm_sim.simulator.parallel import (
    RunCrash,
    RunOutcome,
    Task,
    blocked_run,
    prepare_handler,
    run_one,
)
from dsm_sim.wall import patience
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = ["ClusterUnavailableError", "local_cluster", "quiet_on_give_up", "run_plan_on_cluster"]

#: Runs submitted ahead of the one being handed back, per worker: enough to keep
#: every worker busy while the parent waits for the oldest run.  They are sent in
#: batches (one message to the scheduler for half the window) rather than one
#: ``submit`` per run handed back: the scheduler shares this process, and two
#: cores, with the workers.
_AHEAD = 8


class ClusterUnavailableError(ConfigurationError):
    """The Dask cluster cannot be used: the package is missing or the scheduler unreachable."""

    def __init__(self, where: str, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(
            f"cannot run on the Dask cluster {where}: {reason}. Install the extra "
            "(pip install -e '.[cluster]'), check the scheduler address (tcp://HOST:8786), "
            "or run on this machine with --jobs"
        )


@contextlib.contextmanager
def quiet_on_give_up() -> Iterator[Callable[[], None]]:
    """Once the plan is given up on, Dask's own logs of the workers it kills stay quiet.

    Closing a cluster with runs in flight (a worker blocked in a thread, a
    Ctrl-C) makes Dask log the heartbeats, gathers and streams that break,
    with tracebacks, on stderr, after the command has said what it stopped
    and why.  Every ``distributed`` and ``tornado`` logger is silenced,
    including those Dask's logging configuration gives a level of their own
    (``tornado.application``); their levels come back when the cluster is
    closed.
    """
    saved: dict[str, int] = {}

    def give_up() -> None:
        known = list(logging.root.manager.loggerDict)
        for name in ["distributed", "tornado", *known]:
            if name.split(".")[0] in ("distributed", "tornado"):
                logger = logging.getLogger(name)
                saved.setdefault(name, logger.level)
                logger.setLevel(logging.CRITICAL + 1)

    try:
        yield give_up
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


#: How long a local worker's run holds the GIL before the worker's own event loop
#: may take it (Python's default is 5 ms).  A run is pure Python on its thread; the
#: event loop beside it wakes for messages and heartbeats, and at 5 ms every wake
#: forced a switch away from the run and back.  At 50 ms the event loop waits a
#: little longer (heartbeats are seconds apart) and the run keeps its cache warm:
#: 600 runs took 20.0 s against 20.35 s at 5 ms (alternating, three times each).
WORKER_SWITCH_INTERVAL = 0.05

#: How a local sweep's workers are set up, beside the switch interval above (set by
#: :func:`dask_setup` as each worker starts, a worker its nanny restarts included:
#: :func:`local_cluster` preloads this module): none of Dask's background work a
#: local sweep has no use for, that is the workers' statistical profiler (a thread
#: sampling every 10 ms, for a dashboard nobody opens), the system monitor, and
#: memory checks ten times a second for runs that hold a few MB.
_LOCAL_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, run in each worker of a cluster :func:`local_cluster` starts.

    Only our own workers get it: the interpreters of a cluster given by
    address are their owner's to tune.
    """
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)


def local_cluster(workers: int) -> Any:
    """A ``LocalCluster`` of ``workers`` single-threaded processes, as ``--cluster local`` starts.

    No dashboard, and the scheduler's own HTTP routes on a free loopback port:
    Dask's default, 8787, makes a second local cluster on the machine warn
    (or fail, with warnings as errors).  The workers log only what is
    critical: what goes wrong in a run comes back through its future (the
    run's error, or its crash), and the rest is Dask's own (a task cancelled
    as the cluster closes, a result whose client left while it was being
    sent, a busy event loop), with tracebacks, on the command's stderr.  The
    nannies, in this process, still say when a worker dies.  The workers'
    profiler and monitors run rarely or not at all and their runs keep the GIL
    longer (:data:`_LOCAL_WORKERS`): on two cores they took CPU and the GIL
    from the runs (200 runs: 8.45 s best of three with them, 7.99 s without;
    ``--jobs 2`` 6.19 s).  Raises ImportError without Dask.
    """
    import dask
    from distributed import LocalCluster

    # The nannies hand the configuration they were made under to their workers; preloads
    # the user configured stay, ours comes after them.
    preloads = [*dask.config.get("distributed.worker.preload", []), __name__]
    with dask.config.set({**_LOCAL_WORKERS, "distributed.worker.preload": preloads}):
        return LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL,
        )


def run_plan_on_cluster(
    plan: Sequence[tuple[Scenario, int]],
    handler: str | HandlerFactory,
    *,
    address: str | None = None,
    workers: int = 2,
    handler_name: str | None = None,
    system_clock: bool = False,
    deadline: float | None = None,
    connect_timeout: float = 10.0,
    semantics: SemanticsProfile | str | None = None,
    keep_history: bool = True,
) -> Iterator[RunOutcome]:
    """Run every (scenario, seed) of ``plan`` on a Dask cluster; yield outcomes in plan order.

    Raises :class:`ClusterUnavailableError` before any run when Dask is not
    installed or the scheduler does not answer within ``connect_timeout``
    seconds.  ``deadline`` is the command's wall-clock bound, as for
    :func:`~dsm_sim.simulator.parallel.run_plan`: the workers' clocks are
    trusted to agree with this one.  ``keep_history=False`` sends each result
    back without its history, as for ``run_plan``: what crosses the network
    is then the verdict, the stats and the violations of each run.
    """
    where = address or f"LocalCluster({workers} workers)"
    try:
        from distributed import Client
    except ImportError as exc:
        raise ClusterUnavailableError(where, f"dask.distributed is not installed ({exc})") from None
    if handler_name is None and isinstance(handler, str):
        handler_name = handler
    sent = prepare_handler(handler)
    timeout = os.environ.get(CALL_TIMEOUT_ENV)
    tasks = [
        Task(s, seed, sent, handler_name, system_clock, deadline, semantics, keep_history)
        for s, seed in plan
    ]
    stack = contextlib.ExitStack()
    try:
        if address is None:
            cluster = stack.enter_context(local_cluster(workers))
            client = stack.enter_context(Client(cluster))  # type: ignore[no-untyped-call]
        else:
            client = stack.enter_context(Client(address, timeout=connect_timeout))  # type: ignore[no-untyped-call]
    except Exception as exc:
        stack.close()
        raise ClusterUnavailableError(where, f"{type(exc).__name__}: {exc}") from None
    return _outcomes(stack, client, tasks, timeout, workers, deadline, own=address is None)


def _outcomes(
    stack: contextlib.ExitStack,
    client: Any,
    tasks: list[Task],
    timeout: str | None,
    workers: int,
    deadline: float | None = None,
    *,
    own: bool = False,
) -> Iterator[RunOutcome]:
    """The outcomes in plan order; a run still going well past ``deadline`` is given up on.

    Each result is fetched as soon as its run completes, by the client's own
    thread (``as_completed(with_results=True)``), and held until the runs
    before it in the plan have been handed back: waiting on the oldest run
    and only then asking for its result cost one round trip to the
    scheduler per run, in plan order, while later results sat on the workers.
    New runs go out in batches once half the window is handed back
    (:data:`_AHEAD`).

    Leaving early (the deadline, Ctrl-C, SIGTERM, a caller that stops
    pulling) closes the client, and a cluster of our own (``own``) with it:
    its worker processes are ended, a run blocked in its thread included.
    The workers of a cluster given by address are not ours to kill; the runs
    in flight there are cancelled, and the command ends anyway.  The command
    says what it stopped and why; the streams and heartbeats that break as
    the cluster closes are not news, and Dask's logs of them stay quiet
    (:func:`quiet_on_give_up`), as ``--jobs`` workers say nothing when stopped.
    """
    from distributed import as_completed

    pending = deque(tasks)
    inflight: deque[tuple[Task, Any]] = deque()
    #: Results fetched ahead of their turn, by future key.
    fetched: dict[str, Any] = {}
    ahead = _AHEAD * max(1, workers)
    with quiet_on_give_up() as give_up, stack:
        if not own:
            # Our own workers are ended with the cluster: cancelling their runs first
            # only made each log the cancelled task.
            stack.callback(lambda: client.cancel([f for _, f in inflight], force=True))
        # Run first (the stack's callbacks run last in, first out), before anything
        # closes, however the plan is left: a Ctrl-C may come while the caller holds
        # an outcome, and this generator is then closed only when it is collected.
        stack.callback(give_up)
        done = as_completed(  # type: ignore[no-untyped-call]
            with_results=True, raise_errors=False, timeout=patience(deadline)
        )
        while pending or inflight:
            if pending and len(inflight) <= ahead // 2:
                batch = [pending.popleft() for _ in range(min(ahead - len(inflight), len(pending)))]
                futures = client.map(_remote, batch, [timeout] * len(batch), pure=False)
                for task, future in zip(batch, futures, strict=True):
                    inflight.append((task, future))
                    done.add(future)  # type: ignore[no-untyped-call]
            task, future = inflight[0]  # kept in flight (to be cancelled) until it is done
            try:
                while future.key not in fetched:
                    finished, result = next(done)
                    fetched[finished.key] = result
            except TimeoutError:
                # Well past the deadline: given up on (its worker closed with the cluster
                # by the stack, Dask's logs of it silenced first).
                yield RunOutcome(task.scenario, task.seed, error=blocked_run())
                return
            inflight.popleft()
            yield _outcome(task, future, fetched.pop(future.key))


def _outcome(task: Task, future: Any, result: Any) -> RunOutcome:
    """What a completed future gave: the outcome fetched, or why it has none.

    The result fetched as the run completed is not always its outcome: a
    worker lost before its result was fetched takes the result with it, and
    Dask runs the task again.  Asking the future itself then waits for that
    rerun; a run that kills every worker it is given, or whose outcome cannot
    be sent back, comes back as a crash or an error of its own.
    """
    from distributed import KilledWorker

    if isinstance(result, RunOutcome):
        return result
    try:
        outcome: RunOutcome = future.result()
    except KilledWorker as exc:
        return RunOutcome(
            task.scenario,
            task.seed,
            crash=RunCrash(task.scenario, task.seed, f"killed every worker it ran on: {exc}"),
        )
    except Exception as exc:  # the outcome could not be sent back
        return RunOutcome(task.scenario, task.seed, error=exc)
    return outcome


def _remote(task: Task, timeout: str | None) -> RunOutcome:
    """One run on a worker, with the caller's bound on each real handler call."""
    if timeout is not None:
        os.environ[CALL_TIMEOUT_ENV] = timeout
    return run_one(task)
