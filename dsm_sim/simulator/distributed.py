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
import os
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.dask_cluster import ClusterUnavailableError, local_cluster, quiet_on_give_up
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
from reference_engine.handler import HandlerFactory

__all__ = ["run_plan_on_cluster"]

#: Runs submitted ahead of the one being handed back, per worker: enough to keep
#: every worker busy while the parent waits for the oldest run.  They are sent in
#: batches (one message to the scheduler for half the window) rather than one
#: ``submit`` per run handed back: the scheduler shares this process, and two
#: cores, with the workers.
_AHEAD = 8


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
