"""The programmatic API: verify a handler factory and get a per-property report.

Hypothesis stops at the first failing example and shrinks it, so one run
finds one violation.  To report every property, :func:`verify` runs again
with the properties already found switched to "stop this test case quietly",
until a run passes; a correct handler costs one run per seed.  A profile
spreads its budget over several seeds (:class:`dsm_sim.profiles.Budget`):
every seed is run to a clean pass.  A clean run that never reached some
property is followed by up to :data:`TOP_UP_RUNS` more seeds (not under
``dev``), so "not exercised" means "not reached after the top-ups", not
"unlucky once".

A racy handler can break a property once and then answer the same steps
differently, so Hypothesis can neither shrink nor replay the failure: such a
result is :attr:`ResultStatus.FLAKY`, with the story of the run that broke it.

A handler call that does not return within the call timeout
(:mod:`dsm_sim.conformance.loop`) is a violation like any wrong answer.  The
search stops there: every later test case would wait out the timeout again,
so the other properties are left unsettled rather than paid for in hours.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import random
import re
import shlex
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import invariant, run_state_machine_as_test

from dsm_sim import profiles
from dsm_sim.conformance.clocks import ClockMode, parse_clock_mode
from dsm_sim.conformance.explain import render_reproduction
from dsm_sim.conformance.flaky import FLAKY_EXPLANATION, find_violation, is_flaky
from dsm_sim.conformance.loop import (
    call_timeout,
    default_call_timeout,
    timeouts_seen,
    validate_call_timeout,
)
from dsm_sim.conformance.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.probes import (
    UnbuildableMachine,
    applicable,
    fold_entered_world,
    probe_findings,
)
from dsm_sim.conformance.properties import PROPERTIES, PropertyViolation
from dsm_sim.conformance.reduce import parse_program, reduce_program, replay
from dsm_sim.conformance.semantics import SemanticsProfile, resolve_semantics
from dsm_sim.conformance.shrinking import (
    SETTLE_SECONDS,
    SHORT_STORY,
    SHRINK_SECONDS,
    shrink_budget,
)
from dsm_sim.conformance.world import RunStats
from dsm_sim.conformance.worlds import UTC_ZONE as WORLD_UTC
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "TOP_UP_RUNS",
    "UTC_ZONE",
    "PropertyResult",
    "ResultStatus",
    "VerificationReport",
    "factory_path",
    "profile_settings",
    "verify",
]

#: Clean runs (each on a new seed) added, at most, while some property has not been exercised.
TOP_UP_RUNS = 2
#: The zone a replay needs no ``--tz`` for.
UTC_ZONE = "UTC"
#: Called with (test cases run so far, test cases the profile plans in all).
Progress = Callable[[int, int], None]


class ResultStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    #: Violated once, but the same steps did not fail again: a race, most likely.
    FLAKY = "flaky"
    NOT_EXERCISED = "not exercised"
    #: The run stopped at an earlier violation before this property was settled.
    UNSETTLED = "unsettled"
    #: The semantics profile declares the property does not apply; ``message`` says why.
    WAIVED = "waived"

    def __repr__(self) -> str:
        return f"ResultStatus.{self.name}"


@dataclass(frozen=True, slots=True)
class PropertyResult:
    """One property's verdict; a failure carries its shrunk program and its story.

    ``stopped`` counts the later test cases that ran into this property once
    it was known to fail and were stopped there: every other property's pass
    is conditional on what those test cases would have done next.
    """

    name: str
    summary: str
    status: ResultStatus
    checks: int
    message: str = ""
    story: str = ""
    reproduction: str = ""
    examples_to_failure: int | None = None
    seconds_to_failure: float | None = None
    stopped: int = 0
    #: 1 for the first violation found, 2 for the next...; None when it did not fail.
    found_rank: int | None = None
    #: The seed of the run that found the violation.
    found_seed: int | None = None
    #: The property the first failing test case broke.  Generation is fixed by
    #: the seed, so this does not depend on the machine; the shrunk program may
    #: end on another property (shrinking keeps any failure, and its budget is
    #: in seconds), which is then the one ``name`` reports.
    found_as: str | None = None
    #: The POSIX ``TZ`` the failing test case ran in, when the machine reports one.
    time_zone: str | None = None
    #: The edge probe that found the violation (:mod:`dsm_sim.conformance.probes`),
    #: or None when the search did.
    found_by: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in (ResultStatus.FAILED, ResultStatus.FLAKY)

    @property
    def flaky(self) -> bool:
        return self.status is ResultStatus.FLAKY

    def render(self) -> str:
        """The failure as a handler author should read it: sentence, story, program."""
        if not self.failed:
            return f"{self.name}: {self.status.value} ({self.checks} checks)"
        heading = f"{self.name} violated{' (flaky)' if self.flaky else ''}: {self.message}"
        parts = [heading, "", "What happened:", self.story]
        if self.found_by is not None:
            parts[1:1] = ["", f"Found by the edge probe {self.found_by!r}, before the search."]
        if self.reproduction:
            parts += ["", "Minimal reproduction (paste and run):", self.reproduction]
        if self.flaky:
            parts += ["", f"Flaky: {FLAKY_EXPLANATION}."]
        return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """Per-property results of verifying one factory under one profile."""

    factory: str
    profile: str
    #: The seed of the first run (drawn when none was given): ``--seed`` replays it.
    seed: int
    clock_mode: ClockMode
    results: tuple[PropertyResult, ...]
    test_cases: int
    runs: int
    seconds: float
    error: str | None = None
    #: The time zone every test case ran in; None when each drew its own.
    time_zone: str | None = None
    #: Every seed a run was started from, in order.
    seeds: tuple[int, ...] = ()
    #: Rules executed over all test cases (steps of the state machine).
    steps: int = 0
    #: The semantics profile the handler was judged by.
    semantics: str = "dsm"
    #: The ``--semantics`` a replay needs (None when the factory declares its own).
    semantics_spec: str | None = None
    #: The per-call bound the run used, when a replay must pass it (None: the default).
    call_timeout: float | None = None
    #: Edge probes run before the search, and the steps they took.
    probes: int = 0
    probe_steps: int = 0

    @property
    def passed(self) -> bool:
        return self.error is None and not self.violations

    @property
    def violations(self) -> tuple[PropertyResult, ...]:
        """The violated properties in the order they were found."""
        failed = [r for r in self.results if r.failed]
        return tuple(sorted(failed, key=lambda r: r.found_rank or 0))

    @property
    def checks(self) -> int:
        return sum(r.checks for r in self.results)

    @property
    def stopped(self) -> int:
        """Test cases stopped at a violation already found (conditional passes)."""
        return sum(r.stopped for r in self.results)

    @property
    def replay_zone(self) -> str | None:
        """The ``--tz`` a replay needs: the zone chosen, else the first failing case's."""
        if self.time_zone is not None:
            return self.time_zone
        return next((v.time_zone for v in self.violations if v.time_zone), None)

    def result(self, name: str) -> PropertyResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def replay_command(self) -> str:
        """The ``dsm verify`` command that runs the same test cases again."""
        # Every word quoted for the shell, so a pasted line runs dsm and nothing else. An
        # out-of-process factory is named by ``dsm verify`` as ``--exec 'COMMAND'``, already quoted.
        factory = self.factory if self.factory.startswith("--exec") else shlex.quote(self.factory)
        words = ["--profile", self.profile, "--seed", str(self.seed)]
        if self.semantics_spec is not None:
            words += ["--semantics", self.semantics_spec]
        if self.call_timeout is not None:
            words += ["--call-timeout", f"{self.call_timeout:g}"]
        if self.clock_mode is not ClockMode.INJECTED:
            words += ["--clock", self.clock_mode.value]
        zone = self.replay_zone
        if zone is not None and zone not in (UTC_ZONE, WORLD_UTC):
            words += ["--tz", zone]
        return f"dsm verify {factory} {shlex.join(words)}"

    def explored(self) -> str:
        """How much was explored, in one line: what a green run is worth."""
        seeds = len(self.seeds) or 1
        probed = f"{self.probes} edge probes ({self.probe_steps} steps), " if self.probes else ""
        return (
            f"{probed}{self.test_cases} test cases, {self.steps} steps, {self.checks} checks, "
            f"{seeds} seed(s), {self.runs} run(s), {self.seconds:.1f}s"
        )


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


def _unexercised(
    checks: Counter[str], found: Mapping[str, PropertyResult], waived: Mapping[str, str]
) -> bool:
    return any(not checks[p.name] for p in PROPERTIES if p.name not in found | waived.keys())


#: How Hypothesis prints the counting invariant in a program; dropped from reproductions.
_COUNTER_CALL = "state.count_step()"


class _StepCounter:
    """Counts executed rules: Hypothesis checks invariants once per test case, then per step."""

    def __init__(self) -> None:
        self.invariant_calls = 0


def _counted(machine: type[ConformanceMachine], counter: _StepCounter) -> type[ConformanceMachine]:
    """The machine with an invariant that only counts; its name (and printed program) unchanged."""

    def count_step(self: ConformanceMachine) -> None:
        counter.invariant_calls += 1

    namespace = {
        "count_step": invariant()(count_step),
        "__module__": machine.__module__,
        "__qualname__": machine.__qualname__,
    }
    return type(machine.__name__, (machine,), namespace)


def _machine(
    factory: HandlerFactory,
    *,
    clock_mode: ClockMode,
    stats: RunStats,
    name: str,
    time_zone: str | None,
    semantics: SemanticsProfile,
) -> type[ConformanceMachine]:
    kwargs: dict[str, Any] = {"clock_mode": clock_mode, "stats": stats, "name": name}
    if not semantics.strict:
        kwargs["semantics"] = semantics
    if time_zone is not None:
        if "time_zone" not in inspect.signature(build_machine).parameters:
            raise ConfigurationError(
                f"time zone {time_zone!r} requested, but this version of the kit's state "
                "machine cannot pin one; leave the time zone unset"
            )
        kwargs["time_zone"] = time_zone
    return build_machine(factory, **kwargs)


@dataclass(slots=True)
class _Search:
    """What the runs of one verification have found and counted so far."""

    found: dict[str, PropertyResult]
    checks: Counter[str]
    stopped: Counter[str]
    test_cases: int = 0
    steps: int = 0


def _summary(name: str) -> str:
    return next(p.summary for p in PROPERTIES if p.name == name)


def _violated(
    violation: PropertyViolation,
    *,
    flaky: bool,
    search: _Search,
    stats: RunStats,
    run_seed: int,
    run_seconds: float,
    factory: str,
    semantics: str | None = None,
) -> PropertyResult:
    summary = _summary(violation.property)
    zone = getattr(violation, "time_zone", None)
    notes = [
        "\n".join(line for line in str(note).splitlines() if line.strip() != _COUNTER_CALL)
        for note in getattr(violation, "__notes__", [])
    ]
    reproduction = render_reproduction(notes, factory, semantics)
    # No program means Hypothesis could not replay the failure: the same steps passed.
    flaky = flaky or not reproduction
    return PropertyResult(
        name=violation.property,
        summary=summary,
        status=ResultStatus.FLAKY if flaky else ResultStatus.FAILED,
        checks=search.checks[violation.property],
        message=violation.finding.message,
        story=violation.story,
        reproduction=reproduction,
        examples_to_failure=stats.first_failure_case,
        seconds_to_failure=round(run_seconds, 3),
        found_rank=len(search.found) + 1,
        found_seed=run_seed,
        found_as=stats.first_failure_property,
        time_zone=zone if isinstance(zone, str) else None,
    )


#: A numbered line of a story (``  3. [09:30:00] worker 1: ...``).
_STORY_STEP = re.compile(r"^\s*\d+\. ", re.MULTILINE)


def _reduced(
    result: PropertyResult, machine: type[ConformanceMachine], seconds: float
) -> PropertyResult:
    """The result with the steps shrinking left in a long story deleted, when any can go.

    Shrinking stops at its time budget; :mod:`dsm_sim.conformance.reduce`
    then replays the printed program without the steps the violation does not
    need, within a number of replays and the same number of seconds.
    """
    program = parse_program(result.reproduction)
    if result.status is not ResultStatus.FAILED or program is None:
        return result
    if len(program.steps) <= SHORT_STORY and len(_STORY_STEP.findall(result.story)) <= SHORT_STORY:
        return result
    deadline = time.perf_counter() + seconds
    found = reduce_program(
        machine, program, result.name, stop=lambda: time.perf_counter() > deadline
    )
    if found is None:
        return result
    return dataclasses.replace(
        result,
        message=found.violation.finding.message,
        story=found.violation.story,
        reproduction=found.program.render(),
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


def _hung(limit: float | None) -> str:
    return (
        f"the search stopped after a handler call hung (it did not return within the "
        f"{limit:g}s call timeout): every later test case would wait it out again; fix the "
        "hang (or raise --call-timeout if the handler is only slow) and run again"
    )


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
) -> VerificationReport:
    """Run the conformance state machine against ``factory``; never raises on a violation.

    Without ``seed`` one is drawn at random and kept in the report, so any run,
    passing or failing, can be replayed with ``seed=report.seed``.  The runs
    use seeds ``seed``, ``seed + 1``, ... (``seeds`` of them: the profile's
    count, or one when ``max_examples`` is given); ``max_examples`` and
    ``step_count`` are per seed.
    ``time_zone`` pins every test case to one POSIX ``TZ``; by default each
    test case draws its own.
    ``on_violation`` is called with each violation as soon as its run ends,
    before the next run builds a handler: the last handler built is then the
    one that ran the shrunk counterexample (``dsm verify --exec`` writes its
    protocol messages to a replay file).
    ``semantics`` is the profile the handler is judged by: a name
    (``"powertools"``), ``module:ATTRIBUTE``, a profile, or None for the one
    the factory declares (``dsm_semantics``), else the spec itself.  Properties
    the profile waives are reported as waived, with its reason.
    ``call_timeout_s`` bounds every handler call, ``open`` and ``close`` included
    (default :func:`~dsm_sim.conformance.loop.default_call_timeout`, 10 s; none of
    its own for a handler out of process, whose client has ``--exec-timeout``).
    ``probes`` runs the edge probes (:mod:`dsm_sim.conformance.probes`) before
    the search; their findings come first, and the search looks for the rest.
    """
    profile_of = resolve_semantics(semantics, factory)
    waived = profile_of.waived
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    mode = parse_clock_mode(clock_mode)
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
    planned = chosen.max_examples * seed_count
    limit = _call_limit(factory, call_timeout_s)
    path = factory_path(factory)
    search = _Search(found={}, checks=Counter(), stopped=Counter())
    runs = seed_index = 0
    # Under dev an unexercised property is only a skip: keep the quick look quick.
    top_up_limit = 0 if profile == "dev" else TOP_UP_RUNS
    error: str | None = None
    settled = False
    started = time.perf_counter()
    used: list[int] = []
    probed = _Probing()
    if probes:
        error, done = _probe(
            factory,
            search,
            probed,
            mode=mode,
            name=name,
            time_zone=time_zone,
            semantics=profile_of,
            spec=semantics if isinstance(semantics, str) and not profile_of.strict else None,
            limit=limit,
            shrink_seconds=SHRINK_SECONDS.get(profile, SHRINK_SECONDS["ci"]),
            seed=seed,
            on_violation=on_violation,
            stop_on_first=stop_on_first,
            judged=len(PROPERTIES) - len(waived.keys() - search.found.keys()),
        )
        settled = done and error is None
    while not probed.stop:
        runs += 1
        run_seed = seed + seed_index
        if run_seed not in used:
            used.append(run_seed)
        done_before = search.test_cases
        on_case = (
            None
            if progress is None
            else (lambda n, before=done_before: progress(before + n, planned))
        )
        # A waived property stops a test case quietly, as one already found does.
        stats = RunStats(frozenset(search.found) | frozenset(waived), on_case)
        counter = _StepCounter()
        machine = _machine(
            factory,
            clock_mode=mode,
            stats=stats,
            name=name,
            time_zone=time_zone,
            semantics=profile_of,
        )
        machine = hypothesis_seed(run_seed)(_counted(machine, counter))
        run_started = time.perf_counter()
        violation: PropertyViolation | None = None
        flaky = False
        hung_before = timeouts_seen()
        try:
            with (
                call_timeout(limit),
                shrink_budget(
                    SHRINK_SECONDS.get(profile, SHRINK_SECONDS["ci"]),
                    SETTLE_SECONDS.get(profile, SETTLE_SECONDS["ci"]),
                ),
            ):
                run_state_machine_as_test(machine, settings=chosen)  # type: ignore[no-untyped-call,unused-ignore]
        except Exception as exc:
            violation = find_violation(exc)
            flaky = is_flaky(exc)
            if violation is None:
                error = (
                    f"{FLAKY_EXPLANATION.split(',')[0]} and Hypothesis could not tell which "
                    f"property broke ({type(exc).__name__}: {exc})"
                    if flaky
                    else f"the run stopped with {type(exc).__name__}: {exc}"
                )
        search.test_cases += stats.test_cases
        search.steps += max(0, counter.invariant_calls - stats.test_cases)
        search.stopped.update(stats.suppressed)
        for key, count in stats.checks.items():
            search.checks[key] = max(search.checks[key], count)
        if violation is None:
            if error is None and timeouts_seen() > hung_before:
                # Hung calls only in test cases already stopped at a known violation.
                error = _hung(limit)
            settled = error is None
            if not settled:
                break
            seed_index += 1
            if seed_index < seed_count:
                continue  # the next seed of the profile's budget
            if seed_index < seed_count + top_up_limit and _unexercised(
                search.checks, search.found, waived
            ):
                # Whether a property is reached at all is up to chance (swarm
                # testing switches rules off per test case); a clean run that
                # missed some gets more test cases before any is called
                # "not exercised".  A violation found meanwhile counts as usual.
                continue
            break
        search.found[violation.property] = _violated(
            violation,
            flaky=flaky,
            search=search,
            stats=stats,
            run_seed=run_seed,
            run_seconds=time.perf_counter() - run_started,
            factory=path,
            semantics=semantics if isinstance(semantics, str) and not profile_of.strict else None,
        )
        if mode is ClockMode.INJECTED:
            # Replayed like the run's test cases, but with nothing already found switched off.
            replayed = _machine(
                factory,
                clock_mode=mode,
                stats=RunStats(),
                name=name,
                time_zone=time_zone,
                semantics=profile_of,
            )
            reducing = timeouts_seen()
            with call_timeout(limit):
                reduced = _reduced(
                    search.found[violation.property],
                    replayed,
                    SHRINK_SECONDS.get(profile, SHRINK_SECONDS["ci"]),
                )
            hung_before += timeouts_seen() - reducing  # a replay's hang is no hang of the run
            search.found[violation.property] = dataclasses.replace(
                reduced, seconds_to_failure=round(time.perf_counter() - run_started, 3)
            )
        if on_violation is not None:
            on_violation(search.found[violation.property])
        if timeouts_seen() > hung_before:
            error = _hung(limit)
            break
        judged = len(PROPERTIES) - len(waived.keys() - search.found.keys())
        if stop_on_first or len(search.found) == judged:
            settled = len(search.found) == judged
            break
    return VerificationReport(
        factory=path,
        profile=profile,
        seed=seed,
        clock_mode=mode,
        results=_results(search, settled, waived),
        test_cases=search.test_cases,
        runs=runs,
        seconds=round(time.perf_counter() - started, 3),
        error=error,
        time_zone=time_zone,
        seeds=tuple(used),
        steps=search.steps,
        semantics=profile_of.name,
        semantics_spec=semantics if isinstance(semantics, str) and not profile_of.strict else None,
        call_timeout=None if call_timeout_s is None else limit,
        probes=probed.probes,
        probe_steps=probed.steps,
    )


@dataclass(slots=True)
class _Probing:
    """What the edge probes did: how many ran, their steps, and whether the search is needed."""

    probes: int = 0
    steps: int = 0
    stop: bool = False


def _probe(
    factory: HandlerFactory,
    search: _Search,
    probed: _Probing,
    *,
    mode: ClockMode,
    name: str,
    time_zone: str | None,
    semantics: SemanticsProfile,
    spec: str | None,
    limit: float | None,
    shrink_seconds: float,
    seed: int,
    on_violation: Callable[[PropertyResult], None] | None,
    stop_on_first: bool,
    judged: int,
) -> tuple[str | None, bool]:
    """Run the edge probes, booking what they find as the search would; (error, settled).

    ``probed.stop`` is set when the search is not needed: a violation under
    ``stop_on_first``, every judged property found, or a hung call.
    """
    stats = RunStats()
    machine = _machine(
        factory, clock_mode=mode, stats=stats, name=name, time_zone=time_zone, semantics=semantics
    )
    waived = frozenset(semantics.waived)
    path = factory_path(factory)
    applied = applicable(machine)
    probed.probes = len(applied)
    probed.steps = sum(len(probe.calls) for probe in applied)
    hung_before = timeouts_seen()
    started = time.perf_counter()
    with call_timeout(limit):
        findings = probe_findings(
            machine, path, found=lambda: frozenset(search.found) | waived, semantics=spec
        )
        while True:
            try:
                finding = next(findings)
            except StopIteration:
                break
            except UnbuildableMachine:
                # A handler that cannot even be built or opened: the search reports how.
                probed.probes = probed.steps = 0
                return None, False
            violation = finding.violation
            prop = violation.property
            zone = getattr(violation, "time_zone", None)
            result = PropertyResult(
                name=prop,
                summary=_summary(prop),
                status=ResultStatus.FAILED,
                checks=stats.checks[prop],
                message=violation.finding.message,
                story=violation.story,
                reproduction=finding.reproduction,
                examples_to_failure=0,
                found_rank=len(search.found) + 1,
                found_seed=seed,
                found_as=prop,
                time_zone=zone if isinstance(zone, str) else None,
                found_by=finding.probe.name,
            )
            again = replay(machine, finding.program)
            if again is None or again.property != prop:
                # The same steps passed, or broke something else: a race, most likely.
                result = dataclasses.replace(result, status=ResultStatus.FLAKY)
            elif mode is ClockMode.INJECTED:
                reducing = timeouts_seen()
                result = _reduced(result, machine, shrink_seconds)
                hung_before += timeouts_seen() - reducing
            result = dataclasses.replace(
                result, reproduction=fold_entered_world(result.reproduction)
            )
            search.found[prop] = dataclasses.replace(
                result, seconds_to_failure=round(time.perf_counter() - started, 3)
            )
            if on_violation is not None:
                on_violation(search.found[prop])
            if timeouts_seen() > hung_before:
                probed.stop = True
                return _hung(limit), False
            if stop_on_first or len(search.found) == judged:
                probed.stop = True
                return None, len(search.found) == judged
    search.checks.update(stats.checks)
    if timeouts_seen() > hung_before:
        probed.stop = True
        return _hung(limit), False
    return None, False


def _results(
    search: _Search, settled: bool, waived: Mapping[str, str]
) -> tuple[PropertyResult, ...]:
    results: list[PropertyResult] = []
    for p in PROPERTIES:
        if p.name in search.found:
            failed = search.found[p.name]
            results.append(dataclasses.replace(failed, stopped=search.stopped[p.name]))
            continue
        if p.name in waived:
            results.append(
                PropertyResult(
                    name=p.name,
                    summary=p.summary,
                    status=ResultStatus.WAIVED,
                    checks=search.checks[p.name],
                    message=waived[p.name],
                    stopped=search.stopped[p.name],
                )
            )
            continue
        status = (
            ResultStatus.UNSETTLED
            if not settled
            else ResultStatus.PASSED
            if search.checks[p.name]
            else ResultStatus.NOT_EXERCISED
        )
        results.append(
            PropertyResult(
                name=p.name,
                summary=p.summary,
                status=status,
                checks=search.checks[p.name],
                stopped=search.stopped[p.name],
            )
        )
    return tuple(results)
