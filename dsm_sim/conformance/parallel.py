"""``dsm verify --jobs N``: the race matrix's chunks and the search's seeds in worker processes.

**The race matrix** is about 1,500 independent cells.  They are cut into
fixed chunks of contiguous cells (:func:`~dsm_sim.conformance.racing.chunked`),
which depend on the cells alone, never on ``--jobs``: one process runs them
one after the other, N processes side by side.  Each worker builds its own
machine from the factory, runs its chunk and sends back what it found, as it
ran (property, program, story, cell and interleaving), with its check
counters, gaps and coverage counts.  The parent takes the chunks' results in
chunk order and books each finding there, replayed alone, trimmed and
confirmed, exactly as a run in one process does.

**The search** runs seed after seed, and the same seed again after each
violation; a run depends on the runs before it only through the properties
found so far (:mod:`dsm_sim.conformance.seeds`).  So the workers run ahead:
when the search asks for a seed, the next seeds of the budget are sent too,
each with the properties known now, on the bet that each run passes.  A
result is kept when the properties known at its turn are those it ran with;
otherwise (the bet was lost: a run before it found something) it is run again
with the new set.  A worker's run is also kept only when it started from the
constants Hypothesis draws from here at its turn (see the seeds module), and
is run again in this process when a call hung in it or it stopped with an
error that names no property, so such a stop is met and told as ``--jobs 1``
tells it.  The parent books every run in the search's order, so the report, every
output file and the exit code are those of ``--jobs 1``.

The conventions are the simulator's (:mod:`dsm_sim.workers`): workers are
started with ``forkserver`` (``spawn`` where that is missing), the handler
travels as its ``MODULE:FACTORY`` string (or, from the API, as the factory
pickled; one that cannot be pickled is refused with
:class:`~dsm_sim.workers.UnpicklableFactoryError`), workers end on
``SIGTERM`` (with the handler processes they started), and a worker that
dies is reported for the work it held: when the pool breaks, every chunk or
seed it had not finished is run again alone, in a process of its own; a
chunk whose process dies again is reported as not exercised, its cells named,
and a seed as the ``search`` gap, its seed named, with how the process died.
Nothing is dropped silently.

The command's deadline (``--max-wall``) holds in the workers as in this
process: every call there is bounded by it, a call that blocks its thread is
interrupted just after it, and the parent waits for a worker no longer than
the deadline and its grace, then kills the workers.  What had not run is
NOT EXERCISED (the ``max-wall`` gap), as with ``--jobs 1``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from dsm_sim.conformance.cluster import ClusterWorkers, NoWorkersError, lost_worker_errors
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.execute.loop import VerificationHalted, call_timeout
from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.conformance.racing import ChunkResult, ChunkWork, run_chunk
from dsm_sim.conformance.seeds import (
    SearchSettings,
    SeedRun,
    SeedWork,
    constants_fingerprint,
    hypothesis_home,
    import_modules,
    local_modules,
    run_seed,
    use_hypothesis_home,
)
from dsm_sim.conformance.verification import Plan
from dsm_sim.hangs import hangs_seen
from dsm_sim.protocol.groups import stop_on_sigterm
from dsm_sim.wall import (
    RunStoppedError,
    interrupt_at,
    patience,
    wall_deadline,
    wall_now,
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
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory
from reference_engine.registry import load_factory

__all__ = [
    "MAX_JOBS",
    "ChunkTask",
    "MachineSpec",
    "SeedTask",
    "UnpicklableFactoryError",
    "WorkerPool",
    "check_jobs",
    "run_seed_task",
    "run_task",
    "sendable",
]

#: What the parent says when it stops waiting for a worker at the deadline and kills it.
_BLOCKED = "a handler call blocked its worker process past the --max-wall deadline"


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
        # Loaded as ``dsm verify`` loads it, so the worker imports no module the command did not.
        return build_machine(worker_factory(self.handler, load_factory), **kwargs)


@dataclass(frozen=True, slots=True)
class ChunkTask:
    """Everything a worker needs for one chunk, as picklable values."""

    spec: MachineSpec
    work: ChunkWork
    #: The command's deadline (a :func:`~dsm_sim.wall.wall_now` instant), if any.
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class SeedTask:
    """Everything a worker needs for one run of the search, as picklable values."""

    spec: MachineSpec
    search: SearchSettings
    work: SeedWork
    #: The local modules of the command's process, imported first (their constants).
    modules: tuple[str, ...]
    #: Where the command's process keeps Hypothesis' files.
    home: str
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class _Refused:
    """The factory does not load in the worker: a usage error, not a finding."""

    message: str


@dataclass(frozen=True, slots=True)
class _Halted:
    """The task was stopped: by the deadline, or by a call that hung (a chunk tells that itself)."""

    message: str
    deadline: bool

    def halt(self) -> VerificationHalted:
        return VerificationHalted(self.message, deadline=self.deadline)


_Outcome = TypeVar("_Outcome")


def _bounded(deadline: float | None, run: Callable[[], _Outcome]) -> _Outcome | _Halted:
    """``run()`` under the command's deadline: every call bounded by it, a blocked one interrupted."""
    try:
        with wall_deadline(deadline), interrupt_at(deadline):
            return run()
    except VerificationHalted as halt:
        return _Halted(str(halt), halt.deadline)
    except RunStoppedError as exc:  # a call that blocked this thread, interrupted
        return _Halted(str(exc), True)


def run_task(task: ChunkTask) -> ChunkResult | _Refused | _Halted:
    """Run one chunk (in a worker); anything it raises comes back in the result."""
    try:
        machine = task.spec.machine(RunStats(task.work.disabled))
    except UnpicklableFactoryError as exc:
        return _Refused(str(exc))
    except Exception as exc:
        return ChunkResult(RunStats(), error=f"{type(exc).__name__}: {exc}", crashed=True)

    def chunk() -> ChunkResult:
        with call_timeout(task.spec.limit):
            return run_chunk(machine, task.work)

    return _bounded(task.deadline, chunk)


def run_seed_task(task: SeedTask) -> SeedRun | _Refused:
    """Run one seed of the search (in a worker), after importing the command's modules."""
    use_hypothesis_home(task.home)
    import_modules(task.modules)
    work = task.work
    stats = RunStats(work.known)
    try:
        machine = task.spec.machine(stats)
    except UnpicklableFactoryError as exc:
        return _Refused(str(exc))
    except Exception as exc:  # run here instead, where it fails as with --jobs 1
        return SeedRun(work, error=f"{type(exc).__name__}: {exc}")
    hangs = hangs_seen()

    def between(_: int) -> None:
        # As in the command's process: a test case that hung without failing, or the
        # deadline, ends the run before the next test case (a failing one is shrunk first).
        if stats.first_failure_case is not None:
            return
        if hangs_seen() > hangs:
            raise VerificationHalted("a handler call hung", deadline=False)
        if task.deadline is not None and wall_now() >= task.deadline:
            raise VerificationHalted("the --max-wall deadline passed")

    stats.on_test_case = between
    before, modules = constants_fingerprint(), set(local_modules())
    outcome = _bounded(
        task.deadline, lambda: run_seed(machine, work, task.search, hangs=hangs_seen)
    )
    if isinstance(outcome, _Halted):  # stopped outside the run's own bounds: nothing kept
        return SeedRun(work, halt=outcome.halt())
    outcome.constants = before
    outcome.loaded = tuple(name for name in local_modules() if name not in modules)
    return outcome


class WorkerPool:
    """Worker processes for one verification: the race matrix's chunks, then the search's seeds.

    Each worker starts and loads the factory (its module, its store's driver)
    while this process runs the edge probes, so the matrix does not wait for
    them.  :meth:`chunks` runs the matrix's chunks and yields their results
    in chunk order; :meth:`seeds` is the search's runner.  :meth:`close` ends
    the workers (also when nothing ran in them).
    """

    def __init__(
        self, plan: Plan, handler: str | bytes, jobs: int, cluster: ClusterWorkers | None = None
    ) -> None:
        self.spec = MachineSpec.of(plan, handler)
        self.deadline = plan.deadline
        self.ctx = _context()
        #: Where the tasks go instead of this machine's processes (``--cluster``), if anywhere.
        self.cluster = cluster
        #: What a future raises when the worker running its task died.
        self.lost: tuple[type[BaseException], ...] = (BrokenProcessPool,)
        if cluster is not None:
            self.lost += (NoWorkersError, *lost_worker_errors())
            jobs = max(jobs, cluster.workers())  # one task ahead per worker of the cluster
        self.jobs = check_jobs(min(jobs, MAX_JOBS))
        self.pool = _pool(self.jobs if cluster is None else 1, self.ctx)
        #: Everything sent to the workers: :meth:`close` waits for none of it.
        self.sent: list[Future[Any]] = []
        #: Called once the matrix's chunks are all sent: work for the workers to go on with.
        self.after_chunks: Callable[[], None] | None = None
        #: Chunks sent before the matrix asked for them (:meth:`send_ahead`), with their futures.
        self.early: list[tuple[ChunkTask, Future[Any] | None]] = []
        # Starting a worker waits for the forkserver to import the kit (a second or two on
        # a busy machine): a thread of its own starts them while this one runs the probes.
        self.starting = threading.Thread(
            target=self._start, args=(handler,), name="dsm-workers", daemon=True
        )
        self.starting.start()
        #: Sends the work of :meth:`send_ahead` (it waits for the workers to start).
        self.sending: threading.Thread | None = None

    def settle(self) -> None:
        """Wait until the workers have started and the work sent ahead has gone out."""
        self.starting.join()
        sending = self.sending
        if sending is not None and sending is not threading.current_thread():
            sending.join()

    def _start(self, handler: str | bytes) -> None:
        if self.cluster is not None:
            return  # its workers load the factory with their first task
        with contextlib.suppress(Exception):  # a pool that breaks here is renewed when used
            self.sent += [self.pool.submit(_warm, handler) for _ in range(self.jobs)]

    def chunks(self, works: Sequence[ChunkWork]) -> Generator[ChunkResult, None, None]:
        """The chunks' results, in chunk order (a :data:`~dsm_sim.conformance.racing.ChunkRunner`)."""
        self.renew()
        tasks = [ChunkTask(self.spec, work, self.deadline) for work in works]
        return _parallel(self, tasks)

    def send_ahead(
        self, works: Sequence[ChunkWork], then: Callable[[], None] | None = None
    ) -> None:
        """Send the matrix's first chunks, then call ``then``, from a thread of their own.

        ``works`` are the chunks as the matrix would send them if the stage
        running now (the edge probes) found nothing.  When the matrix starts,
        each chunk it asks for that equals one sent here takes that one's
        result; the rest are cancelled (a worker running one ends it first: a
        chunk is short).  So the bet changes what is computed, never what is
        reported.  Sending waits for the workers to start, which this thread
        does not: it goes on with the probes.  Everything else that sends or
        ends work waits for the sending first (:meth:`settle`).
        """
        tasks = [ChunkTask(self.spec, work, self.deadline) for work in works]

        def send() -> None:
            with contextlib.suppress(Exception):  # a pool that breaks is renewed when used
                self.renew()
                self.early = [(task, self.submit(run_task, task)) for task in tasks]
                if then is not None:
                    then()

        self.settle()
        self.sending = threading.Thread(target=send, name="dsm-send-ahead", daemon=True)
        self.sending.start()

    def take_early(self, task: ChunkTask) -> Future[Any] | None:
        """The future of a chunk sent ahead that equals ``task``, if there is one (taken once)."""
        for index, (sent, future) in enumerate(self.early):
            if future is not None and sent == task:
                del self.early[index]
                return future
        return None

    def drop_early(self) -> None:
        """Cancel the chunks sent ahead that the matrix did not take (what it knew changed)."""
        for _, future in self.early:
            if future is not None:
                future.cancel()
        self.early = []

    def result(self, future: Future[Any]) -> Any:
        """``future``'s result; :class:`FutureTimeoutError` once the command's deadline passed.

        On a cluster, a wait also ends when the scheduler has counted no worker
        for a while (:class:`~dsm_sim.conformance.cluster.NoWorkersError`, one
        of :attr:`lost`): Dask holds a task until a worker joins, and without a
        deadline the command would wait for one forever.
        """
        if self.cluster is None:
            return future.result(timeout=patience(self.deadline))
        return self.cluster.result(future, self.deadline)

    def seeds(self, search: SearchSettings) -> SeedsAhead:
        """The search's runner: each seed in a worker, the next ones run ahead."""
        return SeedsAhead(self, search)

    def submit(self, fn: Callable[[Any], Any], task: object) -> Future[Any] | None:
        """``fn(task)`` in a worker; None when the pool broke before taking it."""
        self.starting.join()
        try:
            if self.cluster is not None:
                future = self.cluster.submit(fn, task)
            else:
                future = self.pool.submit(fn, task)
        except BrokenProcessPool:
            return None
        self.sent.append(future)
        return future

    def stop(self) -> None:
        """End the workers now, whatever they run (stopped early, or at the deadline).

        A cluster's workers are not ended: what was sent to them is cancelled.
        """
        self.settle()
        if self.cluster is not None:
            self.cluster.stop(self.sent)
        stop_workers(self.pool)

    def close(self) -> None:
        """End the workers: at once if they still run something (a seed run ahead in vain)."""
        self.settle()
        if self.cluster is not None:
            self.cluster.close(self.sent)
        if all(future.done() for future in self.sent):
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            self.stop()

    def renew(self) -> None:
        """A fresh pool when the last one broke or was stopped."""
        self.settle()
        if self.pool._broken or self.pool._shutdown_thread:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = _pool(self.jobs, self.ctx)

    def isolated(self, main: Callable[[Connection, Any], None], task: object) -> object | None:
        """``task`` in a process of its own, so a crash is known to be its own; None if it died."""
        receive, send = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(target=main, args=(send, task), daemon=True)  # type: ignore[attr-defined]
        process.start()
        send.close()
        outcome = await_isolated(process, receive, self.deadline)
        if outcome is PAST_DEADLINE:
            return _Halted(_BLOCKED, True)
        if outcome is None:
            return how_died(process.exitcode)
        return outcome


class SeedsAhead:
    """The search's runner with workers: the seed asked for, and the next ones run ahead.

    Called with a run and the runs expected after it if it passes (the next
    seeds, with the same properties known), it keeps up to ``jobs`` of them
    in the workers and hands back the one asked for; None when it must be run
    in this process instead (see the module's docstring).
    """

    def __init__(self, workers: WorkerPool, search: SearchSettings) -> None:
        self.workers = workers
        self.search = search
        self.ahead: dict[SeedWork, Future[Any] | None] = {}
        #: Without Hypothesis' constants to compare, no run from a worker can be kept.
        self.comparable = constants_fingerprint() is not None
        self.home = hypothesis_home()

    def __call__(self, work: SeedWork, ahead: Sequence[SeedWork]) -> SeedRun | None:
        if not self.comparable:
            return None
        self.workers.settle()  # the seeds sent ahead of the probes are in ``ahead`` by now
        for stale in [w for w in self.ahead if w.known != work.known or w.seed < work.seed]:
            future = self.ahead.pop(stale)
            if future is not None:
                future.cancel()  # a lost bet: run with fewer properties known than now
        self.send([work, *ahead])
        task = SeedTask(self.workers.spec, self.search, work, (), self.home, self.workers.deadline)
        outcome = self._outcome(self.ahead.pop(work), task)
        if isinstance(outcome, _Refused):
            raise ConfigurationError(outcome.message)
        if isinstance(outcome, _Halted):
            return SeedRun(work, halt=outcome.halt())
        if isinstance(outcome, str):
            return SeedRun(work, crashed=outcome)
        assert isinstance(outcome, SeedRun)
        if outcome.halt is not None and outcome.halt.deadline:
            return outcome  # cut by the deadline: run here, it would stop at once too
        if (
            outcome.hangs
            or outcome.error is not None
            or outcome.constants != constants_fingerprint()
        ):
            return None
        import_modules(outcome.loaded)  # as this process would have, running it
        return outcome

    def send(self, works: Sequence[SeedWork], window: int | None = None) -> None:
        """The first of ``works`` to the workers, and the next ones while fewer than ``window``
        (default: one per worker) of the runs sent ahead are unfinished.

        A run sent ahead in vain (one before it found a violation) still takes a
        worker until it ends: the window bounds what a violation costs.
        """
        window = self.workers.jobs if window is None else window
        running = sum(1 for f in self.ahead.values() if f is not None and not f.done())
        modules: tuple[str, ...] | None = None
        for index, work in enumerate(works):
            if work in self.ahead:
                continue
            if index and running >= window:
                break
            if modules is None:
                self.workers.renew()
                modules = local_modules()
                constants_fingerprint()  # each module's constants on file before a worker reads them
            task = SeedTask(
                self.workers.spec, self.search, work, modules, self.home, self.workers.deadline
            )
            self.ahead[work] = self.workers.submit(run_seed_task, task)
            running += 1

    def _outcome(self, future: Future[Any] | None, task: SeedTask) -> object:
        """The run's outcome: from its worker; alone in a process of its own if the pool broke.

        A ``str`` says how the process running it died, twice.
        """
        if future is not None:
            try:
                return self.workers.result(future)
            except FutureTimeoutError:
                self.workers.stop()
                return _Halted(_BLOCKED, True)
            except self.workers.lost:
                pass  # a worker died: which run killed it is pinned by running each alone
            except Exception as exc:  # the result itself could not be sent back
                return f"its result could not be sent back: {type(exc).__name__}: {exc}"
        isolated = SeedTask(
            task.spec, task.search, task.work, local_modules(), task.home, task.deadline
        )
        outcome = self.workers.isolated(_isolated_seed, isolated)
        if isinstance(outcome, str):
            return f"the worker process running it died ({outcome})"
        return outcome


def _warm(handler: str | bytes) -> None:
    """Load the factory in a new worker, before any chunk needs it (a failure is the chunk's)."""
    try:
        worker_factory(handler, load_factory)
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


def _parallel(workers: WorkerPool, tasks: list[ChunkTask]) -> Generator[ChunkResult, None, None]:
    taken = [workers.take_early(task) for task in tasks]
    workers.drop_early()
    futures = [
        early if early is not None else workers.submit(run_task, task)
        for task, early in zip(tasks, taken, strict=True)
    ]
    # A first pass is followed by the deeper pass's chunks, sent once its results are in.
    last = not tasks or tasks[-1].work.deeper or tasks[-1].work.limit is None
    if workers.after_chunks is not None and last:
        workers.after_chunks()  # the search's first seeds, for the workers the last chunks free
    broken = False
    completed = False
    try:
        for task, future in zip(tasks, futures, strict=True):
            outcome: object
            if broken and not _finished(future):
                outcome = _isolated(workers, task)
            elif future is None:
                broken = True
                outcome = _isolated(workers, task)
            else:
                try:
                    outcome = workers.result(future)
                except FutureTimeoutError:
                    outcome = _Halted(_BLOCKED, True)
                except workers.lost:
                    # A worker died: which chunk killed it is pinned by running each
                    # unfinished chunk again alone.  A cluster gave this task to every
                    # worker it had already: only this one runs alone.
                    broken = workers.cluster is None
                    outcome = _isolated(workers, task)
                except Exception as exc:  # the result itself could not be sent back
                    outcome = ChunkResult(
                        RunStats(),
                        error=f"its result could not be sent back: {type(exc).__name__}: {exc}",
                        crashed=True,
                    )
            if isinstance(outcome, _Refused):
                raise ConfigurationError(outcome.message)
            if isinstance(outcome, _Halted):
                raise outcome.halt()
            assert isinstance(outcome, ChunkResult)
            # Closed after the last result is no early stop: the workers go on with the search.
            completed = task is tasks[-1]
            yield outcome
        completed = True
    finally:
        if not completed:
            # Stopped early (nothing left to find, the deadline, Ctrl-C, SIGTERM): end the
            # workers now; the search, if it runs, starts a fresh pool.
            workers.stop()


def _finished(future: Future[Any] | None) -> bool:
    return future is not None and future.done() and future.exception() is None


def _isolated(workers: WorkerPool, task: ChunkTask) -> object:
    """Run ``task`` in a process of its own, so a crash is known to be this chunk's."""
    outcome = workers.isolated(_isolated_main, task)
    if not isinstance(outcome, str):
        return outcome
    return ChunkResult(
        RunStats(),
        error=f"the worker process running them died ({outcome}); "
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


def _isolated_seed(send: Connection, task: SeedTask) -> None:
    stop_on_sigterm()
    outcome = run_seed_task(task)
    try:
        send.send(outcome)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        why = f"its result could not be sent back: {type(exc).__name__}: {exc}"
        send.send(SeedRun(task.work, crashed=why))
    send.close()
