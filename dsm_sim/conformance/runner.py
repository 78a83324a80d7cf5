"""The programmatic API: verify a handler factory and get a per-property report.

A verification is three stages over the same machine and the same judges,
each booking what it finds the same way (:meth:`_Verification.book`):

1. the **edge probes** (:mod:`dsm_sim.conformance.generate.probes`), fixed
   programs that walk each edge of the domain; under ``thorough`` also the
   **volume stage** (:mod:`dsm_sim.conformance.volume`), 100,000 ids of
   realistic shapes, each written and read back on its own;
2. the **race matrix** (:mod:`dsm_sim.conformance.racing`), every ordered pair
   of operations from every start state, in every interleaving the kit can
   force;
3. the **search**: Hypothesis draws worlds and steps, and shrinks a failure.
   It stops at the first failing example, so one run finds one violation; to
   report every property, the search runs again with the properties already
   found switched to "stop this test case quietly", until a run passes.  A
   profile spreads its budget over several seeds
   (:class:`dsm_sim.profiles.Budget`); a clean run that never reached some
   property is followed by up to :data:`TOP_UP_RUNS` more seeds (not under
   ``dev``).

Every finding is a program (data) that is trimmed to the steps it needs and
replayed before it is reported: a finding whose replay does not fail again
is :attr:`ResultStatus.FLAKY`, with the story of the run that broke it.

A handler call that does not return within the call timeout
(:mod:`dsm_sim.conformance.execute.loop`) is a violation like any wrong answer.
The search stops there: every later test case would wait out the timeout
again, so the other properties are left unsettled rather than paid for in hours.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable

from hypothesis import HealthCheck, Phase, settings

from dsm_sim import profiles
from dsm_sim.collector import frozen_heap
from dsm_sim.conformance.execute.clocks import ClockMode, parse_clock_mode
from dsm_sim.conformance.execute.loop import (
    VerificationHalted,
    default_call_timeout,
    validate_call_timeout,
)
from dsm_sim.conformance.execute.tokens import tokens_factory
from dsm_sim.conformance.judge.semantics import SemanticsProfile, resolve_semantics

# Imported whatever ``jobs`` is: Hypothesis draws from the literals of the modules this
# process has loaded, so a search run beside worker processes must have loaded the same.
from dsm_sim.conformance.parallel import SeedsAhead, WorkerPool, check_jobs, sendable
from dsm_sim.conformance.properties import PROPERTY_NAMES
from dsm_sim.conformance.racing import matrix_works, run_matrix
from dsm_sim.conformance.report import (
    UTC_ZONE,
    Gap,
    PropertyResult,
    ResultStatus,
    VerificationReport,
)
from dsm_sim.conformance.seeds import SeedWork
from dsm_sim.conformance.tell.shrink_budget import SETTLE_SECONDS, SHRINK_SECONDS
from dsm_sim.conformance.verification import (
    CONFIRMATIONS,
    TOP_UP_RUNS,
    Plan,
    Progress,
    Stage,
    Verification,
    trimmed,
)
from dsm_sim.conformance.volume import run_volume
from dsm_sim.wall import RunStoppedError, interrupt_at, wall_deadline, wall_now
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "CONFIRMATIONS",
    "TOP_UP_RUNS",
    "UTC_ZONE",
    "Gap",
    "PropertyResult",
    "ResultStatus",
    "VerificationReport",
    "factory_path",
    "profile_settings",
    "trimmed",
    "verify",
]


def factory_path(factory: HandlerFactory) -> str:
    """``module:qualname`` of a factory, as ``dsm verify`` and reproductions name it."""
    module = getattr(factory, "__module__", None) or "?"
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    return f"{module}:{name}"


def profile_settings(profile: str) -> settings:
    """The Hypothesis settings of one run (one seed) of a named profile, with the kit's choices."""
    if profile not in profiles.PROFILES:
        raise ConfigurationError(
            f"unknown profile {profile!r}; choose one of {', '.join(profiles.PROFILES)}"
        )
    # Built from the kit's table, never looked up by name: Hypothesis' own
    # ``ci`` profile would otherwise stand in for the kit's.
    base = profiles.profile_settings(profile)
    return settings(
        base,
        max_examples=profiles.budget(profile).max_examples,
        database=None,
        report_multiple_bugs=False,
        # The explain phase re-runs the failure to annotate lines of code; the
        # kit's own story says more, for less time.
        phases=[phase for phase in base.phases if phase is not Phase.explain],
        suppress_health_check=[*base.suppress_health_check, HealthCheck.filter_too_much],
    )


def _call_limit(factory: HandlerFactory, seconds: float | None) -> float | None:
    """The per-call bound: as given, else the default, else none for a handler out of process.

    The protocol client bounds every request of an ``--exec`` handler itself
    (``--exec-timeout``) and kills a hung process; a second timer here would
    race it and leave the process running.
    """
    if seconds is not None:
        return validate_call_timeout(seconds)
    from dsm_sim.protocol.client import ExecFactory

    return None if isinstance(factory, ExecFactory) else default_call_timeout()


def _wall_limit(seconds: object) -> float:
    """A finite number of seconds above 0: the whole verification's limit."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigurationError(
            f"max_wall_s must be a finite number of seconds above 0, got {seconds!r}"
        )
    return float(seconds)


#: The gaps a user may waive by name (besides ``probe:<name>``).
GAP_NAMES = frozenset({"peers", "matrix", "time-zones"})
#: How a waiver names an edge probe: ``probe:`` and the probe's name.
PROBE_PREFIX = "probe:"


def _waivers(names: Iterable[str]) -> dict[str, str]:
    """The user's waivers by name, checked: a property, a gap (``peers``, ``matrix``...) or a probe.

    A name that could waive nothing is refused, a misspelt probe's as a misspelt
    property's: a waiver that silently matched nothing would leave the user
    believing a gap was accepted.
    """
    from dsm_sim.conformance.generate.probes import PROBES

    probes = [probe.name for probe in PROBES]
    waived: dict[str, str] = {}
    for name in names:
        if name.startswith(PROBE_PREFIX):
            if name.removeprefix(PROBE_PREFIX) not in probes:
                raise ConfigurationError(
                    f"--waive {name!r} names no edge probe; the probes are: "
                    + ", ".join(f"{PROBE_PREFIX}{probe}" for probe in probes)
                )
        elif name not in PROPERTY_NAMES and name not in GAP_NAMES:
            raise ConfigurationError(
                f"--waive {name!r} names nothing the kit exercises; waive a property "
                f"({', '.join(PROPERTY_NAMES)}), or one of {', '.join(sorted(GAP_NAMES))}, "
                f"or {PROBE_PREFIX}<name> (one of {', '.join(probes)})"
            )
        waived[name] = "waived by the user (--waive)"
    return waived


def verify(
    factory: HandlerFactory,
    profile: str = "ci",
    seed: int | None = None,
    *,
    clock_mode: ClockMode | str = ClockMode.INJECTED,
    stop_on_first: bool = False,
    max_examples: int | None = None,
    step_count: int | None = None,
    seeds: int | None = None,
    time_zone: str | None = None,
    progress: Progress | None = None,
    name: str = "HandlerConformance",
    on_violation: Callable[[PropertyResult], None] | None = None,
    semantics: SemanticsProfile | str | None = None,
    call_timeout_s: float | None = None,
    probes: bool = True,
    matrix: bool | str = True,
    volume: bool | str = True,
    waive: Iterable[str] = (),
    stage: Stage | None = None,
    record: bool = False,
    factory_spec: str | None = None,
    max_wall_s: float | None = None,
    started_at: float | None = None,
    tokens: str = "attempts",
    jobs: int = 1,
    cluster: str | None = None,
) -> VerificationReport:
    """Run the conformance kit against ``factory``; never raises on a violation.

    Without ``seed`` one is drawn at random and kept in the report, so any run,
    passing or failing, can be replayed with ``seed=report.seed``.  The search's
    runs use seeds ``seed``, ``seed + 1``, ... (``seeds`` of them: the profile's
    count, or one when ``max_examples`` is given); ``max_examples`` and
    ``step_count`` are per seed.
    ``time_zone`` pins every test case to one POSIX ``TZ``; by default each
    test case draws its own.
    ``on_violation`` is called with each violation as soon as it is booked,
    before the next run builds a handler: the last handler built is then the
    one that ran the reported counterexample (``dsm verify --exec`` writes its
    protocol messages to a replay file).
    ``semantics`` is the profile the handler is judged by: a name
    (``"powertools"``), ``module:ATTRIBUTE``, a profile, or None for the one
    the factory declares (``dsm_semantics``), else the spec itself.  Properties
    the profile waives are reported as waived, with its reason.
    ``call_timeout_s`` bounds every handler call, ``open`` and ``close`` included
    (default :func:`~dsm_sim.conformance.execute.loop.default_call_timeout`, 10 s;
    none of its own for a handler out of process, whose client has ``--exec-timeout``).
    ``stage`` is told (stage, done, planned) as each stage goes, for a progress line.
    ``probes`` runs the edge probes and ``matrix`` the race matrix before the
    search (a profile name: the race matrix of that profile's budget, as a test
    on a slow store may ask for ``"dev"``'s).  ``volume`` runs the volume
    stage of the profile (or of the profile it names; only ``thorough`` has
    one, :data:`~dsm_sim.conformance.volume.VOLUME`).  ``waive`` names properties or gaps
    (``peers``, ``matrix``, ``probe:<name>``) whose NOT EXERCISED must not fail the verdict;
    a waiver never hides a violation, and a waived property that was exercised and held
    is PASSED.
    ``record`` keeps each counterexample's last confirming replay as the
    explorer plays it (:attr:`PropertyResult.replayed`; ``dsm verify --report``).
    ``factory_spec`` is the ``MODULE:FACTORY`` the factory was loaded from, which
    the replay command and the reproduction import it by: its own ``module:qualname``
    does not import when it was made by a closure (``make_factory.<locals>.make``).
    ``max_wall_s`` is a deadline for the whole verification in real seconds
    (``dsm verify --max-wall``), counted from ``started_at`` (a
    :func:`~dsm_sim.wall.wall_now` instant; default: now): past it the stage
    running stops at its next call, no later stage runs, and the report says
    so as NOT EXERCISED (the ``max-wall`` gap, which cannot be waived).
    ``tokens`` is how the handler's fencing tokens are judged: ``"attempts"``
    (a token is the record's attempt number) or ``"ordered"`` (any value that
    grows with every grant of an item, judged by order;
    :mod:`dsm_sim.conformance.execute.tokens`).
    ``jobs`` runs the race matrix's chunks and the search's seeds in that many
    worker processes (:mod:`dsm_sim.conformance.parallel`); the report is the
    same as with one.
    The workers load the factory by ``factory_spec``, else pickled: a factory
    that cannot be pickled raises
    :class:`~dsm_sim.workers.UnpicklableFactoryError` before any
    work.  A handler in another process (``--exec``) runs with one job.
    ``cluster`` sends the same work to a Dask cluster instead
    (:mod:`dsm_sim.conformance.cluster`): ``"local"`` starts one of ``jobs``
    worker processes (at least two), an address (``tcp://scheduler:8786``)
    uses that cluster's workers; the report is again the same.  A cluster that
    cannot be used raises
    :class:`~dsm_sim.dask_cluster.ClusterUnavailableError` before any work.
    """
    max_wall = None if max_wall_s is None else _wall_limit(max_wall_s)
    semantics_of = resolve_semantics(semantics, factory)
    tokens_factory(factory, tokens)  # an unknown rule is a usage error before any work
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    chosen = profile_settings(profile)
    if max_examples is not None or step_count is not None:
        chosen = settings(
            chosen,
            max_examples=max_examples or chosen.max_examples,
            stateful_step_count=step_count or chosen.stateful_step_count,
        )
    # An explicit number of examples is a whole budget: one seed, unless ``seeds`` says more.
    default_seeds = 1 if max_examples is not None else profiles.budget(profile).seeds
    seed_count = seeds if seeds is not None else default_seeds
    if seed_count < 1:
        raise ConfigurationError(f"seeds must be at least 1, got {seed_count}")
    plan = Plan(
        factory=factory,
        path=factory_spec or factory_path(factory),
        profile=profile,
        seed=seed,
        mode=parse_clock_mode(clock_mode),
        name=name,
        time_zone=time_zone,
        semantics=semantics_of,
        spec=semantics if isinstance(semantics, str) and not semantics_of.strict else None,
        limit=_call_limit(factory, call_timeout_s),
        chosen=chosen,
        seed_count=seed_count,
        # Under dev an unexercised property is only a skip: keep the quick look quick.
        top_ups=0 if profile == "dev" else TOP_UP_RUNS,
        shrink_seconds=SHRINK_SECONDS.get(profile, SHRINK_SECONDS["ci"]),
        settle_seconds=SETTLE_SECONDS.get(profile, SETTLE_SECONDS["ci"]),
        stop_on_first=stop_on_first,
        waived=semantics_of.waived,
        user_waived=_waivers(waive),
        on_violation=on_violation,
        progress=progress,
        stage=stage,
        record=record,
        deadline=None if max_wall is None else (started_at or wall_now()) + max_wall,
        max_wall=max_wall,
        tokens=tokens,
    )
    workers = _worker_pool(plan, factory_spec, jobs, cluster)
    verification = Verification(plan)
    runs: SeedsAhead | None = None
    # Every real call waits no longer than the deadline, and one that blocks its thread
    # is interrupted just after it, as under ``dsm run --max-wall``.  The workers are
    # ended after that guard is down: ending them is bounded, and a signal meant for a
    # blocked call must not land in the pool's shutdown once the verdict is settled.
    try:
        if workers is not None:
            runs = workers.seeds(plan.search())
            # The search's first seeds go to the workers behind the matrix's chunks, with
            # the properties known when the matrix starts: kept if it finds nothing new.
            send = runs.send
            first = plan.budget_seeds()
            workers.after_chunks = lambda: send(
                [SeedWork(seed, verification.known()) for seed in first], len(first)
            )
        with wall_deadline(plan.deadline), interrupt_at(plan.deadline), frozen_heap():
            try:
                if workers is not None and runs is not None and probes and matrix:
                    _send_ahead(verification, workers, runs, matrix)
                if probes:
                    verification.run_probes()
                verification.stage = "the volume stage"
                if volume and not verification.done and not verification.halted():
                    run_volume(verification, budget=volume if isinstance(volume, str) else profile)
                verification.stage = "the race matrix"
                if matrix and not verification.done and not verification.halted():
                    budget = matrix if isinstance(matrix, str) else profile
                    chunks = None if workers is None else workers.chunks
                    run_matrix(verification, budget=budget, runner=chunks)
                verification.stage = "the search"
                if not verification.done and not verification.halted():
                    verification.run_search(runs)
            except VerificationHalted as halt:
                verification.stopped_by(halt)
            except RunStoppedError:
                # A call that blocked this thread, interrupted at the deadline outside any call.
                verification.cut_at_deadline()
    finally:
        if workers is not None:
            workers.close()
    zone_gap = _zone_gap(factory)
    if zone_gap is not None:
        verification.gaps.setdefault(zone_gap.name, zone_gap)
    return verification.report(call_timeout_s)


def _send_ahead(
    verification: Verification, workers: WorkerPool, runs: SeedsAhead, matrix: bool | str
) -> None:
    """The race matrix's first pass, then a first seed per worker, sent now, before the probes.

    This process runs the probes meanwhile.  The bet is that they find
    nothing (a handler that passes, the case every pull request hopes for):
    the matrix then asks for exactly these chunks and takes their results,
    and the search for these seeds with the properties known now.  Work the
    stages ask for otherwise replaces what was sent here, which is dropped
    (:meth:`~dsm_sim.conformance.parallel.WorkerPool.send_ahead`, and the
    seeds' own bet in :class:`~dsm_sim.conformance.parallel.SeedsAhead`):
    the bet changes what is computed, never what is reported.  One seed per
    worker bounds what a lost bet costs.  Anything wrong with the matrix's
    budget is left for the matrix to raise, at its turn, as with ``--jobs 1``.
    """
    budget = matrix if isinstance(matrix, str) else None
    try:
        _, _, works = matrix_works(verification, budget)
    except Exception:
        return
    known = verification.known()
    seeds = [SeedWork(seed, known) for seed in verification.plan.budget_seeds()]
    workers.send_ahead(
        [work for work in works if not work.deeper], lambda: runs.send(seeds, workers.jobs)
    )


def _worker_pool(
    plan: Plan, factory_spec: str | None, jobs: int, cluster: str | None = None
) -> WorkerPool | None:
    """Workers for the race matrix's chunks and the search's seeds, or None: one process.

    Worker processes on this machine, or a Dask cluster's workers (``cluster``:
    ``"local"`` or a scheduler's address).
    """
    if jobs == 1 and cluster is None:
        return None
    from dsm_sim.protocol.client import ExecFactory

    check_jobs(jobs)
    if isinstance(plan.factory, ExecFactory):
        return None  # its transcripts and failures are read from this process's factory
    handler = sendable(plan.factory, factory_spec)
    if cluster is None:
        return WorkerPool(plan, handler, jobs)
    from dsm_sim.conformance.cluster import ClusterWorkers

    where = None if cluster == "local" else cluster
    workers = ClusterWorkers(where, max(jobs, 2) if where is None else jobs)
    try:
        return WorkerPool(plan, handler, jobs, workers)
    except BaseException:
        workers.close(())
        raise


def _zone_gap(factory: HandlerFactory) -> Gap | None:
    """A handler server's process runs in the zone it was started in: the test cases' never reach it.

    The kit starts an ``--exec`` process per test case with the zone it drew
    in ``TZ``; a server's (``--exec-tcp``) it cannot start, so the time zone
    was not varied for the handler, which is no pass.
    """
    from dsm_sim.protocol.client import ExecFactory, TcpAddress

    if not isinstance(factory, ExecFactory) or not isinstance(factory.target, TcpAddress):
        return None
    return Gap(
        "time-zones",
        "the handler process's time zone (TZ), drawn per test case",
        f"the handler server at {factory.target} runs in the zone it was started in: the "
        "harness cannot set its TZ, so the zone was not varied for it (each open names the "
        "test case's zone, which a server may apply itself); start the server under "
        "another TZ to try one",
    )
