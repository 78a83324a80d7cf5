"""``dsm verify --jobs N``: the race matrix's chunks in worker processes, booked in order.

The race matrix is about 1,500 independent cells.  They are cut into fixed
chunks of contiguous cells (:func:`~dsm_sim.conformance.racing.chunked`),
which depend on the cells alone, never on ``--jobs``: one process runs them
one after the other, N processes side by side.  Each worker builds its own
machine from the factory, runs its chunk and sends back what it found, as it
ran (property, program, story, cell and interleaving), with its check
counters, gaps and coverage counts.  The parent takes the chunks' results in
chunk order and books each finding there, replayed alone, trimmed and
confirmed, exactly as a run in one process does, so the report, every
output file and the exit code are those of ``--jobs 1``.

The pool is the simulator's (:mod:`dsm_sim.simulator.parallel`), with its
conventions: workers are started with ``forkserver`` (``spawn`` where that is
missing), the handler travels as its ``MODULE:FACTORY`` string (or, from the
API, as the factory pickled; one that cannot be pickled is refused with
:class:`~dsm_sim.simulator.parallel.UnpicklableFactoryError`), workers end on
``SIGTERM`` (with the handler processes they started), and a worker that dies
is reported for the work it held: when the pool breaks, every chunk it had
not finished is run again alone, in a process of its own, and a chunk whose
process dies again is reported as not exercised, its cells named, with how
the process died.  Nothing is dropped silently.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.execute.loop import call_timeout
from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.conformance.racing import ChunkResult, ChunkWork, run_chunk
from dsm_sim.conformance.verification import Plan
from dsm_sim.protocol.groups import stop_on_sigterm
from dsm_sim.simulator.parallel import (
    MAX_JOBS,
    UnpicklableFactoryError,
    _factory,
    _how,
    _stop,
    await_isolated,
    prepare_handler,
)
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "MAX_JOBS",
    "ChunkPool",
    "ChunkTask",
    "MachineSpec",
    "UnpicklableFactoryError",
    "check_jobs",
    "run_task",
    "sendable",
]


def check_jobs(jobs: int) -> int:
    """``jobs`` if it is from 1 to :data:`MAX_JOBS`, else a ConfigurationError."""
    if not 1 <= jobs <= MAX_JOBS:
        raise ConfigurationError(f"jobs must be from 1 to {MAX_JOBS}, got {jobs}")
    return jobs


def sendable(factory: HandlerFactory, spec: str | None) -> str | bytes:
    """The factory as a worker receives it: its spec, or the factory pickled here.

    Raises :class:`UnpicklableFactoryError` for a callable that cannot be
    pickled (a lambda, a closure, a local class) and was given without a spec.
    """
    return spec if spec is not None else prepare_handler(factory)


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """How a worker builds the plan's machine: :meth:`Plan.machine`, as plain values."""

    handler: str | bytes
    mode: ClockMode
    name: str
    semantics: SemanticsProfile
    time_zone: str | None
    limit: float | None
    tokens: str = "attempts"

    @classmethod
    def of(cls, plan: Plan, handler: str | bytes) -> MachineSpec:
        return cls(
            handler, plan.mode, plan.name, plan.semantics, plan.time_zone, plan.limit, plan.tokens
        )

    def machine(self, stats: RunStats) -> type[ConformanceMachine]:
        kwargs: dict[str, Any] = {"clock_mode": self.mode, "stats": stats, "name": self.name}
        if not self.semantics.strict:
            kwargs["semantics"] = self.semantics
        if self.time_zone is not None:
            kwargs["time_zone"] = self.time_zone
        if self.tokens != "attempts":
            kwargs["tokens"] = self.tokens
        return build_machine(_factory(self.handler), **kwargs)


@dataclass(frozen=True, slots=True)
class ChunkTask:
    """Everything a worker needs for one chunk, as picklable values."""

    spec: MachineSpec
    work: ChunkWork


@dataclass(frozen=True, slots=True)
class _Refused:
    """The factory does not load in the worker: a usage error, not a finding."""

    message: str


def run_task(task: ChunkTask) -> ChunkResult | _Refused:
    """Run one chunk (in a worker); anything it raises comes back in the result."""
    try:
        machine = task.spec.machine(RunStats(task.work.disabled))
    except UnpicklableFactoryError as exc:
        return _Refused(str(exc))
    except Exception as exc:
        return ChunkResult(RunStats(), error=f"{type(exc).__name__}: {exc}", crashed=True)
    with call_timeout(task.spec.limit):
        return run_chunk(machine, task.work)


class ChunkPool:
    """Worker processes for the race matrix's chunks, started when the verification starts.

    Each worker starts and loads the factory (its module, its store's driver)
    while this process runs the edge probes, so the matrix does not wait for
    them.  Called with the chunks, it yields their results in chunk order;
    :meth:`close` ends the workers (also when the matrix never ran).
    """

    def __init__(self, plan: Plan, handler: str | bytes, jobs: int) -> None:
        self.spec = MachineSpec.of(plan, handler)
        self.jobs = check_jobs(jobs)
        self.ctx = _context()
        self.pool = _pool(self.jobs, self.ctx)
        self.warming = [self.pool.submit(_warm, handler) for _ in range(self.jobs)]

    def __call__(self, works: Sequence[ChunkWork]) -> Generator[ChunkResult, None, None]:
        return _parallel(self.pool, self.ctx, [ChunkTask(self.spec, work) for work in works])

    def close(self) -> None:
        if all(future.done() for future in self.warming):
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            _stop(self.pool)


def _warm(handler: str | bytes) -> None:
    """Load the factory in a new worker, before any chunk needs it (a failure is the chunk's)."""
    try:
        _factory(handler)
    except Exception:  # run_task meets it again and reports it
        return


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Each worker is a fork of a server that already imported the kit.
    ctx.set_forkserver_preload([__name__])
    return ctx


def _pool(jobs: int, ctx: BaseContext) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=stop_on_sigterm)


def _parallel(
    pool: ProcessPoolExecutor, ctx: BaseContext, tasks: list[ChunkTask]
) -> Generator[ChunkResult, None, None]:
    futures: list[Future[ChunkResult | _Refused] | None] = []
    for task in tasks:
        try:
            futures.append(pool.submit(run_task, task))
        except BrokenProcessPool:
            futures.append(None)
    broken = False
    completed = False
    try:
        for task, future in zip(tasks, futures, strict=True):
            outcome: ChunkResult | _Refused
            if broken and not _finished(future):
                outcome = _isolated(ctx, task)
            elif future is None:
                broken = True
                outcome = _isolated(ctx, task)
            else:
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    # A worker died: which chunk killed it is pinned by running each
                    # unfinished chunk again alone.
                    broken = True
                    outcome = _isolated(ctx, task)
                except Exception as exc:  # the result itself could not be sent back
                    outcome = ChunkResult(
                        RunStats(),
                        error=f"its result could not be sent back: {type(exc).__name__}: {exc}",
                        crashed=True,
                    )
            if isinstance(outcome, _Refused):
                raise ConfigurationError(outcome.message)
            yield outcome
        completed = True
    finally:
        if not completed:
            # Stopped early (nothing left to find, Ctrl-C, SIGTERM): end the workers now.
            _stop(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _finished(future: Future[ChunkResult | _Refused] | None) -> bool:
    return future is not None and future.done() and future.exception() is None


def _isolated(ctx: BaseContext, task: ChunkTask) -> ChunkResult | _Refused:
    """Run ``task`` in a process of its own, so a crash is known to be this chunk's."""
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_isolated_main, args=(send, task), daemon=True)  # type: ignore[attr-defined]
    process.start()
    send.close()
    outcome = await_isolated(process, receive)
    if isinstance(outcome, ChunkResult | _Refused):
        return outcome
    return ChunkResult(
        RunStats(),
        error=f"the worker process running them died ({_how(process.exitcode)}); "
        "run with --jobs 1 to meet it in this process",
        crashed=True,
    )


def _isolated_main(send: Connection, task: ChunkTask) -> None:
    stop_on_sigterm()
    outcome = run_task(task)
    try:
        send.send(outcome)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        send.send(
            ChunkResult(
                RunStats(),
                error=f"its result could not be sent back: {type(exc).__name__}: {exc}",
                crashed=True,
            )
        )
    send.close()
