"""Run a plan of (scenario, seed) runs in worker processes, handing outcomes back in plan order.

A run is a pure function of its scenario, seed and handler, so runs can go
to separate processes; what must not change is everything a user reads.
Outcomes are therefore yielded in the order of the plan, never in the order
they finish: the caller prints, writes reports and computes the exit code
exactly as a serial run does, and ``--jobs 2`` output is byte-identical to
``--jobs 1``.

Workers are started with ``forkserver`` (``spawn`` where that is missing),
never ``fork``: a forked child would inherit the parent's asyncio loop,
freezegun patches and open handler connections.  A handler named by a spec
(``module:factory``, ``broken:NAME``, ``exec:CMD``) travels as that string
and is resolved inside the worker; a Python callable travels pickled, and
one that cannot be pickled or imported there is refused with
:class:`UnpicklableFactoryError` rather than breaking the pool.

The command's deadline (``--max-wall``) holds whatever a run does: a run
stops by itself at its next handler call past it, and one that does not
(a call that blocks its thread) is given :data:`~dsm_sim.wall.STOP_GRACE_S`
more, then the parent stops waiting, reports it stopped at the wall-clock
limit and kills the worker processes.  Serially, the same run is
interrupted in this process (:func:`~dsm_sim.wall.interrupt_at`).  Worker
processes end the handler processes they started when they are sent
``SIGTERM``, which is how the parent stops them, also when it is itself
interrupted (Ctrl-C, ``SIGTERM``).

A worker process that dies (a segfault in a C extension, the OOM killer, a
``SIGKILL``) breaks a ``ProcessPoolExecutor`` for every run in flight.
The runs caught in flight are then run again one by one, each in a process
of its own, so the crash is pinned on the run that causes it (a run is
deterministic, so it crashes again) and reported as a :class:`RunCrash`
for that scenario and seed; the other runs go on in a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.protocol.groups import stop_on_sigterm
from dsm_sim.scenario import Scenario
from dsm_sim.simulator.run import RunResult, run_scenario
from dsm_sim.wall import (
    WallClockLimitError,
    interrupt_at,
    past_deadline,
    patience,
    wall_deadline,
)
from dsm_sim.workers import (
    MAX_JOBS,
    PAST_DEADLINE,
    UnpicklableFactoryError,
    await_isolated,
    check_jobs,
    how_died,
    prepare_handler,
    stop_workers,
    worker_factory,
)
from reference_engine.errors import DsmError
from reference_engine.handler import HandlerFactory

__all__ = [
    "MAX_JOBS",
    "PAST_DEADLINE",
    "RunCrash",
    "RunOutcome",
    "Task",
    "UnpicklableFactoryError",
    "WorkerRunError",
    "await_isolated",
    "blocked_run",
    "prepare_handler",
    "run_one",
    "run_plan",
]

#: Runs submitted ahead of the one being handed back, per worker.  With 2 a long run
#: (1.7 s among runs of 0.05 s) left the other worker idle; every run in flight when a
#: pool breaks is run again alone, so the window is also what a crash costs.
_AHEAD = 8


class WorkerRunError(DsmError):
    """A run raised an exception in a worker that cannot be sent back as itself.

    Carries the exception's type and text and the worker's traceback, so the
    failure is not lost with the process it happened in.
    """

    def __init__(self, scenario: str, seed: int, kind: str, detail: str, trace: str) -> None:
        self.scenario, self.seed, self.kind, self.trace = scenario, seed, kind, trace
        super().__init__(
            f"{scenario} seed {seed} raised {kind} in its worker process: {detail}\n{trace}"
        )


@dataclass(frozen=True, slots=True)
class RunCrash:
    """The process running a scenario and seed died before it could hand back a result."""

    scenario: Scenario
    seed: int
    #: How it died: ``killed by SIGSEGV``, ``exit code 3``.
    how: str

    @property
    def message(self) -> str:
        return (
            f"the worker process running it died ({self.how}); nothing was checked. "
            f"Replay it in this process: dsm run {self.scenario.path} --seed {self.seed}"
        )


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one planned run gave: a result, the exception it raised, or a crash."""

    scenario: Scenario
    seed: int
    result: RunResult | None = None
    error: BaseException | None = None
    crash: RunCrash | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """Everything a worker needs, as plain picklable values."""

    scenario: Scenario
    seed: int
    #: A spec string resolved in the worker, or a factory pickled in the parent.
    handler: str | bytes
    handler_name: str | None
    system_clock: bool
    #: The command's deadline (:func:`~dsm_sim.simulator.bridge.wall_now` seconds) or None.
    deadline: float | None = None
    #: The semantics profile (or its name, or ``module:ATTRIBUTE``) given for the runs;
    #: ``None``: the one the factory declares, resolved in the worker.
    semantics: SemanticsProfile | str | None = None
    #: False: the result comes back without its history (:meth:`RunResult.without_history`),
    #: for a command that writes no report.
    keep_history: bool = True


def run_one(task: Task) -> RunOutcome:
    """Run one task; any exception comes back in the outcome, never as a broken pool.

    What a ``--jobs`` worker process and a Dask worker
    (:mod:`dsm_sim.simulator.distributed`) both execute.
    """
    try:
        with wall_deadline(task.deadline):
            result = run_scenario(
                task.scenario,
                task.seed,
                worker_factory(task.handler),
                handler_name=task.handler_name,
                system_clock=task.system_clock,
                semantics=task.semantics,
            )
    except Exception as exc:
        return RunOutcome(task.scenario, task.seed, error=_sendable(task, exc))
    if not task.keep_history:
        result = result.without_history()
    return RunOutcome(task.scenario, task.seed, result=result)


def _sendable(task: Task, exc: Exception) -> BaseException:
    """``exc`` itself when it survives pickling, else a :class:`WorkerRunError` holding its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        import traceback

        trace = "".join(traceback.format_exception(exc))
        return WorkerRunError(task.scenario.name, task.seed, type(exc).__name__, str(exc), trace)
    return exc


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Imported once in the server, so each worker (and each isolated rerun) is a fork of
    # a process that already holds the simulator, not a fresh interpreter importing it.
    ctx.set_forkserver_preload([__name__])
    return ctx


def run_plan(
    plan: Sequence[tuple[Scenario, int]],
    handler: str | HandlerFactory,
    *,
    jobs: int = 1,
    handler_name: str | None = None,
    system_clock: bool = False,
    deadline: float | None = None,
    semantics: SemanticsProfile | str | None = None,
    keep_history: bool = True,
) -> Iterator[RunOutcome]:
    """Run every (scenario, seed) of ``plan``; yield the outcomes in plan order.

    ``jobs=1`` runs in this process, one run at a time, as ``dsm run`` always
    did.  ``deadline`` (a :func:`~dsm_sim.simulator.bridge.wall_now` instant)
    stops a run at its first handler call past it, in whichever process.
    ``semantics`` is the profile every run is judged by (see
    :func:`~dsm_sim.simulator.run.run_scenario`).

    ``keep_history=False``: a worker sends each result back without its
    history (the verdict, stats and violations only; no report can be written
    from it), which saves serialising most of what a run produces.  A run in
    this process keeps its history either way, as nothing is sent.

    Raises :class:`UnpicklableFactoryError` before any run when a callable
    ``handler`` cannot be pickled, and ``ConfigurationError`` for a ``jobs``
    outside 1..``MAX_JOBS``.
    """
    check_jobs(jobs)
    if handler_name is None and isinstance(handler, str):
        handler_name = handler  # what run_scenario names a run given by its spec
    if jobs == 1 or len(plan) <= 1:
        return _serial(plan, handler, handler_name, system_clock, deadline, semantics)
    sent = prepare_handler(handler)
    tasks = [
        Task(s, seed, sent, handler_name, system_clock, deadline, semantics, keep_history)
        for s, seed in plan
    ]
    return _parallel(tasks, min(jobs, len(tasks)), deadline)


def _serial(
    plan: Sequence[tuple[Scenario, int]],
    handler: str | HandlerFactory,
    handler_name: str | None,
    system_clock: bool,
    deadline: float | None,
    semantics: SemanticsProfile | str | None = None,
) -> Iterator[RunOutcome]:
    factory = worker_factory(handler) if isinstance(handler, str) else handler
    for scenario, seed in plan:
        try:
            with wall_deadline(deadline), interrupt_at(deadline):
                result = run_scenario(
                    scenario,
                    seed,
                    factory,
                    handler_name=handler_name,
                    system_clock=system_clock,
                    semantics=semantics,
                )
        except Exception as exc:
            yield RunOutcome(scenario, seed, error=exc)
            continue
        yield RunOutcome(scenario, seed, result=result)


#: An in-flight run: its task and its future, or ``None`` once it must be run alone.
_Slot = tuple[Task, "Future[RunOutcome] | None"]


def _parallel(tasks: list[Task], jobs: int, deadline: float | None) -> Iterator[RunOutcome]:
    ctx = _context()
    pending = deque(tasks)
    inflight: deque[_Slot] = deque()
    pool = _pool(jobs, ctx)
    completed = False
    try:
        while pending or inflight:
            while pending and len(inflight) < _AHEAD * jobs:
                task = pending.popleft()
                inflight.append((task, _submit(pool, task)))
                if inflight[-1][1] is None:  # the pool broke: start over with a fresh one
                    pool, inflight = _recover(pool, inflight, jobs, ctx)
            task, future = inflight.popleft()
            if future is None:
                yield _isolated(ctx, task)
                continue
            try:
                outcome = future.result(timeout=patience(deadline))
            except FutureTimeoutError:
                # Still running well past the deadline: its call blocks, and only a kill
                # ends it (the finally below).
                yield RunOutcome(task.scenario, task.seed, error=blocked_run())
                return
            except BrokenProcessPool:
                pool, inflight = _recover(pool, inflight, jobs, ctx)
                outcome = _isolated(ctx, task)
            except Exception as exc:  # the result itself could not be sent back
                outcome = RunOutcome(task.scenario, task.seed, error=exc)
            yield outcome
        completed = True
    finally:
        if not completed:
            # Stopped early: by the deadline (the caller stops pulling), by Ctrl-C or SIGTERM.
            # Runs still in flight are killed, with the handler processes they started.
            stop_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(jobs: int, ctx: BaseContext) -> ProcessPoolExecutor:
    """Worker processes that end their handler processes when they are sent SIGTERM."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=stop_on_sigterm)


def blocked_run() -> WallClockLimitError:
    """The outcome of a run still going well past the deadline: its process is killed."""
    return past_deadline("a handler call blocked its worker process, which was killed")


def _recover(
    pool: ProcessPoolExecutor, inflight: deque[_Slot], jobs: int, ctx: BaseContext
) -> tuple[ProcessPoolExecutor, deque[_Slot]]:
    """A fresh pool, and the runs the broken one left unfinished marked to be run alone."""
    pool.shutdown(wait=True, cancel_futures=True)
    kept = deque((t, f if _finished(f) else None) for t, f in inflight)
    return _pool(jobs, ctx), kept


def _submit(pool: ProcessPoolExecutor, task: Task) -> Future[RunOutcome] | None:
    """The task's future; ``None`` (run it alone) when the pool broke before taking it."""
    try:
        return pool.submit(run_one, task)
    except BrokenProcessPool:
        return None


def _finished(future: Future[RunOutcome] | None) -> bool:
    """A run that handed its outcome back before the pool broke keeps it."""
    return future is not None and future.done() and future.exception() is None


def _isolated(ctx: BaseContext, task: Task) -> RunOutcome:
    """Run ``task`` in a process of its own, so a crash is known to be this run's."""
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_isolated_main, args=(send, task), daemon=True)  # type: ignore[attr-defined]
    process.start()
    send.close()
    outcome = await_isolated(process, receive, task.deadline)
    if outcome is PAST_DEADLINE:
        return RunOutcome(task.scenario, task.seed, error=blocked_run())
    if isinstance(outcome, RunOutcome):
        return outcome
    return RunOutcome(
        task.scenario,
        task.seed,
        crash=RunCrash(task.scenario, task.seed, how_died(process.exitcode)),
    )


def _isolated_main(send: Connection, task: Task) -> None:
    stop_on_sigterm()
    send.send(run_one(task))
    send.close()
