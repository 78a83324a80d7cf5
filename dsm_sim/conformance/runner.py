"""The programmatic API: verify a handler factory and get a per-property report.

Hypothesis stops at the first failing example and shrinks it, so one run
finds one violation.  To report every property, :func:`verify` runs again
with the properties already found switched to "stop this test case quietly",
until a run passes; a correct handler costs one run.  A clean run that never
reached some property is followed by up to :data:`TOP_UP_RUNS` more (not
under ``dev``), so "not exercised" means "not reached in three runs", not
"unlucky once".
"""

from __future__ import annotations

import enum
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from dsm_sim import profiles
from dsm_sim.conformance.clocks import ClockMode, parse_clock_mode
from dsm_sim.conformance.explain import render_reproduction
from dsm_sim.conformance.machine import build_machine
from dsm_sim.conformance.properties import PROPERTIES, PropertyViolation
from dsm_sim.conformance.world import RunStats
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "TOP_UP_RUNS",
    "PropertyResult",
    "ResultStatus",
    "VerificationReport",
    "factory_path",
    "profile_settings",
    "verify",
]

#: Clean runs added, at most, while some property has not been exercised yet.
TOP_UP_RUNS = 2
#: Called with (test cases run so far in this run, the profile's max_examples).
Progress = Callable[[int, int], None]


class ResultStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_EXERCISED = "not exercised"
    #: The run stopped at an earlier violation before this property was settled.
    UNSETTLED = "unsettled"

    def __repr__(self) -> str:
        return f"ResultStatus.{self.name}"


@dataclass(frozen=True, slots=True)
class PropertyResult:
    """One property's verdict; a failure carries its shrunk program and its story."""

    name: str
    summary: str
    status: ResultStatus
    checks: int
    message: str = ""
    story: str = ""
    reproduction: str = ""
    examples_to_failure: int | None = None
    seconds_to_failure: float | None = None

    @property
    def failed(self) -> bool:
        return self.status is ResultStatus.FAILED

    def render(self) -> str:
        """The failure as a handler author should read it: sentence, story, program."""
        if not self.failed:
            return f"{self.name}: {self.status.value} ({self.checks} checks)"
        parts = [f"{self.name} violated: {self.message}", "", "What happened:", self.story]
        if self.reproduction:
            parts += ["", "Minimal reproduction (paste and run):", self.reproduction]
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

    @property
    def passed(self) -> bool:
        return self.error is None and not self.violations

    @property
    def violations(self) -> tuple[PropertyResult, ...]:
        return tuple(r for r in self.results if r.failed)

    def result(self, name: str) -> PropertyResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)


def factory_path(factory: HandlerFactory) -> str:
    """``module:qualname`` of a factory, as ``dsm verify`` and reproductions name it."""
    module = getattr(factory, "__module__", None) or "?"
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    return f"{module}:{name}"


def profile_settings(profile: str) -> settings:
    """The Hypothesis settings of a named profile, with the kit's fixed choices."""
    if profile not in profiles.PROFILES:
        raise ConfigurationError(
            f"unknown profile {profile!r}; choose one of {', '.join(profiles.PROFILES)}"
        )
    # Built from the kit's table, never looked up by name: Hypothesis' own
    # ``ci`` profile would otherwise stand in for the kit's.
    base = profiles.profile_settings(profile)
    return settings(
        base,
        database=None,
        report_multiple_bugs=False,
        # The explain phase re-runs the failure to annotate lines of code; the
        # kit's own story says more, for less time.
        phases=[phase for phase in base.phases if phase is not Phase.explain],
        suppress_health_check=[*base.suppress_health_check, HealthCheck.filter_too_much],
    )


def _unexercised(checks: Counter[str], found: Mapping[str, PropertyResult]) -> bool:
    return any(not checks[p.name] for p in PROPERTIES if p.name not in found)


def _violation_in(exc: BaseException) -> PropertyViolation | None:
    if isinstance(exc, PropertyViolation):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _violation_in(inner)) is not None:
                return found
    return None


def verify(
    factory: HandlerFactory,
    profile: str = "ci",
    seed: int | None = None,
    *,
    clock_mode: ClockMode | str = ClockMode.INJECTED,
    stop_on_first: bool = False,
    max_examples: int | None = None,
    step_count: int | None = None,
    progress: Progress | None = None,
    name: str = "HandlerConformance",
) -> VerificationReport:
    """Run the conformance state machine against ``factory``; never raises on a violation.

    Without ``seed`` one is drawn at random and kept in the report, so any run,
    passing or failing, can be replayed with ``seed=report.seed``.
    """
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
    path = factory_path(factory)
    found: dict[str, PropertyResult] = {}
    checks: Counter[str] = Counter()
    test_cases = runs = top_ups = 0
    # Under dev an unexercised property is only a skip: keep the quick look quick.
    top_up_limit = 0 if profile == "dev" else TOP_UP_RUNS
    error: str | None = None
    settled = False
    started = time.perf_counter()
    while True:
        runs += 1
        on_case = None if progress is None else (lambda n: progress(n, chosen.max_examples))
        stats = RunStats(frozenset(found), on_case)
        machine = build_machine(factory, clock_mode=mode, stats=stats, name=name)
        machine = hypothesis_seed(seed + top_ups)(machine)
        run_started = time.perf_counter()
        try:
            run_state_machine_as_test(machine, settings=chosen)  # type: ignore[no-untyped-call,unused-ignore]
            violation = None
        except Exception as exc:
            violation = _violation_in(exc)
            if violation is None:
                error = f"the run stopped with {type(exc).__name__}: {exc}"
        test_cases += stats.test_cases
        for key, count in stats.checks.items():
            checks[key] = max(checks[key], count)
        if violation is None:
            settled = error is None
            if settled and top_ups < top_up_limit and _unexercised(checks, found):
                # Whether a property is reached at all is up to chance (swarm
                # testing switches rules off per test case); a clean run that
                # missed some gets more test cases before any is called
                # "not exercised".  A violation found meanwhile counts as usual.
                top_ups += 1
                continue
            break
        summary = next(p.summary for p in PROPERTIES if p.name == violation.property)
        found[violation.property] = PropertyResult(
            name=violation.property,
            summary=summary,
            status=ResultStatus.FAILED,
            checks=checks[violation.property],
            message=violation.finding.message,
            story=violation.story,
            reproduction=render_reproduction(getattr(violation, "__notes__", []), path),
            examples_to_failure=stats.first_failure_case,
            seconds_to_failure=round(time.perf_counter() - run_started, 3),
        )
        if stop_on_first or len(found) == len(PROPERTIES):
            settled = len(found) == len(PROPERTIES)
            break
    results = tuple(
        found.get(p.name)
        or PropertyResult(
            name=p.name,
            summary=p.summary,
            status=(
                ResultStatus.UNSETTLED
                if not settled
                else ResultStatus.PASSED
                if checks[p.name]
                else ResultStatus.NOT_EXERCISED
            ),
            checks=checks[p.name],
        )
        for p in PROPERTIES
    )
    return VerificationReport(
        factory=path,
        profile=profile,
        seed=seed,
        clock_mode=mode,
        results=results,
        test_cases=test_cases,
        runs=runs,
        seconds=round(time.perf_counter() - started, 3),
        error=error,
    )
