"""One verification's state: what was asked (:class:`Plan`), and what its stages found.

The stages (edge probes, race matrix, search) share one :class:`Verification`:
each books what it finds with :meth:`Verification.book`, which trims the
program, replays it to confirm it, and hands it on; :meth:`Verification.report`
makes the :class:`~dsm_sim.conformance.report.VerificationReport`.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.execute.loop import (
    VerificationHalted,
    call_timeout,
    threads_left_running,
)
from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.generate.probes import Probe
from dsm_sim.conformance.judge.semantics import SemanticsProfile
from dsm_sim.conformance.probing import UnbuildableMachine, applicable, probe_findings
from dsm_sim.conformance.program import Program
from dsm_sim.conformance.properties import PROPERTIES, PropertyViolation
from dsm_sim.conformance.report import (
    Coverage,
    Gap,
    HazardSeen,
    PropertyResult,
    ResultStatus,
    VerificationReport,
)
from dsm_sim.conformance.seeds import SearchSettings, SeedRun, SeedWork, run_seed
from dsm_sim.conformance.tell.repeat import REPEAT_SECONDS, failure_rate, shrink_by_repetition
from dsm_sim.conformance.tell.replayed import CallTape
from dsm_sim.conformance.tell.shrink_budget import SHORT_STORY
from dsm_sim.conformance.tell.trim import Trimmed, lighten_payloads, replay, trim
from dsm_sim.hangs import hang_since, hangs_seen
from dsm_sim.wall import wall_now
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory

__all__ = [
    "CONFIRMATIONS",
    "TOP_UP_RUNS",
    "Plan",
    "Progress",
    "SeedRunner",
    "Stage",
    "Verification",
    "trimmed",
]

#: Clean runs (each on a new seed) added, at most, while some property has not been exercised.
TOP_UP_RUNS = 2
#: Replays of a reported program: it must break its property in every one, or it is flaky.
CONFIRMATIONS = 2
#: Called with (test cases run so far, test cases the profile plans in all).
Progress = Callable[[int, int], None]
#: Called with (the stage running, its units done, its units planned).
Stage = Callable[[str, int, int], None]
#: Runs one run of the search elsewhere, told the runs expected after it if it passes;
#: None: run it in this process (:meth:`Verification.run_search`).
SeedRunner = Callable[[SeedWork, Sequence[SeedWork]], SeedRun | None]


def _summary(name: str) -> str:
    return next(p.summary for p in PROPERTIES if p.name == name)


def _story_steps(story: str) -> int:
    return sum(1 for line in story.splitlines() if line.strip()[:1].isdigit())


def trimmed(
    result: PropertyResult,
    machine: type[ConformanceMachine],
    seconds: float,
    *,
    render: Callable[[Program], str],
) -> PropertyResult:
    """The result with the steps its program does not need deleted, when any can go,
    and the payloads that play no part in it made as light as they can be.

    Shrinking stops at its time budget; :mod:`dsm_sim.conformance.tell.trim`
    then replays the program without the steps the violation does not need,
    within a number of replays and the same number of seconds, and then with
    each payload replaced by the lightest one (within as many seconds again).
    """
    program = result.program
    if result.status is not ResultStatus.FAILED or program is None:
        return result
    found: Trimmed | None = None
    if len(program.body) > SHORT_STORY or _story_steps(result.story) > SHORT_STORY:
        deadline = time.perf_counter() + seconds
        found = trim(machine, program, result.name, stop=lambda: time.perf_counter() > deadline)
    deadline = time.perf_counter() + seconds
    lighter = lighten_payloads(
        machine,
        program if found is None else found.program,
        result.name,
        stop=lambda: time.perf_counter() > deadline,
    )
    found = lighter or found
    if found is None:
        return result
    return dataclasses.replace(
        result,
        message=found.violation.finding.message,
        story=found.violation.story,
        program=found.program,
        reproduction=render(found.program),
    )


def _hung(what: str | None, stage: str) -> str:
    return (
        f"a handler call hung during {stage}: {what or 'a call did not return within its timeout'}. "
        "The verification stopped there, leaving the rest unsettled: every later call would "
        "wait the timeout out again. Fix the hang (or raise --call-timeout, or --exec-timeout "
        "for a handler in another process, if the handler is only slow) and run again"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What one verification was asked to do, decided once."""

    factory: HandlerFactory
    path: str
    profile: str
    seed: int
    mode: ClockMode
    name: str
    time_zone: str | None
    semantics: SemanticsProfile
    #: The ``--semantics`` a replay needs (None when the factory declares its own).
    spec: str | None
    limit: float | None
    chosen: settings
    seed_count: int
    top_ups: int
    shrink_seconds: float
    settle_seconds: float
    stop_on_first: bool
    #: Properties waived by the semantics profile, with their reasons.
    waived: Mapping[str, str]
    #: Properties and gaps the user waived by name.
    user_waived: Mapping[str, str]
    on_violation: Callable[[PropertyResult], None] | None
    progress: Progress | None
    #: Called with (stage, done, planned) as each stage goes: probes, matrix cells, test cases.
    stage: Stage | None = None
    #: Record the last confirmation of each counterexample for the explorer (``--report``).
    record: bool = False
    #: The deadline of the whole verification (a :func:`~dsm_sim.wall.wall_now` instant), if any,
    #: and the ``--max-wall`` seconds it was set from.
    deadline: float | None = None
    max_wall: float | None = None
    #: ``--tokens``: ``attempts`` (a token is the record's attempt) or ``ordered``.
    tokens: str = "attempts"

    def tell(self, stage: str, done: int, planned: int) -> None:
        if self.stage is not None:
            self.stage(stage, done, planned)

    def machine(self, stats: RunStats) -> type[ConformanceMachine]:
        kwargs: dict[str, Any] = {"clock_mode": self.mode, "stats": stats, "name": self.name}
        if not self.semantics.strict:
            kwargs["semantics"] = self.semantics
        if self.time_zone is not None:
            if "time_zone" not in inspect.signature(build_machine).parameters:
                raise ConfigurationError(
                    f"time zone {self.time_zone!r} requested, but this version of the kit's "
                    "state machine cannot pin one; leave the time zone unset"
                )
            kwargs["time_zone"] = self.time_zone
        if self.tokens != "attempts":
            kwargs["tokens"] = self.tokens
        return build_machine(self.factory, **kwargs)

    def render(self, program: Program) -> str:
        # The reproduction runs under the verification's token rule, or it fails for another reason.
        options = {"tokens": self.tokens} if self.tokens != "attempts" else None
        return program.render(
            self.path, machine_name=self.name, semantics=self.spec, options=options
        )

    def budget_seeds(self) -> range:
        """The seeds of the search's budget, in order (top-up seeds follow them when needed)."""
        return range(self.seed, self.seed + self.seed_count)

    def search(self) -> SearchSettings:
        """What every run of the search shares."""
        return SearchSettings.of(self.chosen, self.limit, self.shrink_seconds, self.settle_seconds)

    @property
    def judged(self) -> int:
        """Properties a violation can still be found for."""
        return len(PROPERTIES) - len(self.waived)


@dataclass(slots=True)
class Verification:
    """What the stages of one verification have found and counted so far."""

    plan: Plan
    found: dict[str, PropertyResult] = field(default_factory=dict)
    checks: Counter[str] = field(default_factory=Counter)
    stopped: Counter[str] = field(default_factory=Counter)
    gaps: dict[str, Gap] = field(default_factory=dict)
    #: The semantics profile's hazards shown so far, by name.
    hazards: dict[str, HazardSeen] = field(default_factory=dict)
    test_cases: int = 0
    steps: int = 0
    runs: int = 0
    seeds: list[int] = field(default_factory=list)
    error: str | None = None
    settled: bool = False
    done: bool = False
    probes: int = 0
    probe_steps: int = 0
    coverage: Coverage = field(default_factory=Coverage)
    started: float = field(default_factory=time.perf_counter)
    #: Calls that hit the bound while a finding was trimmed or replayed: no hang of the run.
    hung_allowance: int = 0
    #: The most handler instances a test case raced through, and whether they were processes.
    instances: int = 0
    out_of_process: bool = False
    #: The stage running now, as the report names it when the verification stops in it.
    stage: str = "the edge probes"
    #: Calls that had hung in this process before this verification started.
    hangs_before: int = field(default_factory=hangs_seen)
    #: Executor threads left running in this process before this verification started.
    threads_before: int = field(default_factory=threads_left_running)
    #: The deadline cut the verification (what had not run is not exercised).
    cut: bool = False
    #: Runs of the search (by seed) whose worker process died, and how.
    lost: dict[int, str] = field(default_factory=dict)

    # --- booking ---------------------------------------------------------------------------

    def known(self) -> frozenset[str]:
        """Properties that stop a test case quietly: found already, or waived by the semantics.

        Never the user's waivers (``--waive``): they accept a property that was
        not exercised, so a waived property is judged like any other, and its
        violation is found and reported.
        """
        return frozenset(self.found) | frozenset(self.plan.waived)

    def note_gaps(self, stats: RunStats) -> None:
        """What a stage's run could not exercise, and how many instances its races went through."""
        for gap in stats.gaps:
            self.gaps.setdefault(gap.name, gap)
        for name, seen in stats.hazards.items():
            known = self.hazards.get(name)
            before = seen.seen - 1 + (0 if known is None else known.seen)
            if known is None or seen.story_steps < known.story_steps:
                self.hazards[name] = seen.again(before)
            else:
                self.hazards[name] = known.again(before)
        stats.hazards.clear()
        self.instances = max(self.instances, stats.instances)
        self.out_of_process |= stats.out_of_process

    def book(
        self,
        violation: PropertyViolation,
        machine: type[ConformanceMachine],
        *,
        flaky: bool = False,
        found_by: str | None = None,
        run_seed: int | None = None,
        examples: int | None = None,
        found_as: str | None = None,
    ) -> PropertyResult:
        """Record a violation: trim its program, confirm it by replays, call ``on_violation``."""
        plan = self.plan
        prop = violation.property
        program = violation.program
        zone = getattr(violation, "time_zone", None)
        result = PropertyResult(
            name=prop,
            summary=_summary(prop),
            status=ResultStatus.FLAKY if flaky or program is None else ResultStatus.FAILED,
            checks=self.checks[prop],
            message=violation.finding.message,
            story=violation.story,
            reproduction="" if program is None else plan.render(program),
            examples_to_failure=examples,
            found_rank=len(self.found) + 1,
            found_seed=plan.seed if run_seed is None else run_seed,
            found_as=found_as or prop,
            time_zone=zone if isinstance(zone, str) else None,
            found_by=found_by,
            program=program,
        )
        try:
            with call_timeout(plan.limit):
                if plan.mode is ClockMode.INJECTED and result.status is ResultStatus.FAILED:
                    result = trimmed(result, machine, plan.shrink_seconds, render=plan.render)
                result = self._confirmed(result, machine)
                if result.status is ResultStatus.FLAKY and result.program is not None:
                    result = self._repeated(result, machine)
        except VerificationHalted as halt:
            self.stopped_by(halt)  # the deadline: the finding stands as found, unconfirmed
        if result.program is not None:
            folded = result.program.folded()
            if folded != result.program:
                result = dataclasses.replace(
                    result, program=folded, reproduction=plan.render(folded)
                )
        result = dataclasses.replace(
            result, seconds_to_failure=round(time.perf_counter() - self.started, 3)
        )
        self.found[prop] = result
        if plan.on_violation is not None:
            plan.on_violation(result)
        return result

    def _confirmed(
        self, result: PropertyResult, machine: type[ConformanceMachine]
    ) -> PropertyResult:
        """Replay the reported program: a program that does not fail every time is flaky."""
        program = result.program
        if program is None or result.status is not ResultStatus.FAILED:
            return result
        hits = 0
        tape: CallTape | None = None
        again: PropertyViolation | None = None
        for attempt in range(CONFIRMATIONS):
            # The last confirmation is the one the explorer shows, when asked for.
            if self.plan.record and attempt == CONFIRMATIONS - 1:
                tape = CallTape()
            again = replay(machine, program, tape=tape)
            hits += again is not None and again.property == result.name
        if tape is not None:
            reproduced = again is not None and again.property == result.name
            shown = tape.replayed(
                property_name=result.name,
                message=again.finding.message
                if again is not None and reproduced
                else result.message,
                reproduced=reproduced,
            )
            result = dataclasses.replace(result, replayed=shown)
        if hits == CONFIRMATIONS:
            return dataclasses.replace(result, confirmed=(hits, CONFIRMATIONS))
        return dataclasses.replace(
            result, status=ResultStatus.FLAKY, confirmed=(hits, CONFIRMATIONS)
        )

    def _repeated(
        self, result: PropertyResult, machine: type[ConformanceMachine]
    ) -> PropertyResult:
        """A finding whose replays break it only sometimes: shrunk by repetition, then its rate.

        See :mod:`dsm_sim.conformance.tell.repeat`: a step goes when the
        program without it still breaks the property within a few replays,
        and the program reported is replayed to count how often it breaks.
        """
        plan = self.plan
        program = result.program
        assert program is not None
        long = len(program.body) > SHORT_STORY or _story_steps(result.story) > SHORT_STORY
        if plan.mode is ClockMode.INJECTED and long:
            seconds = REPEAT_SECONDS.get(plan.profile, REPEAT_SECONDS["ci"])
            found = shrink_by_repetition(machine, program, result.name, seconds)
            if found is not None:
                program = found.program
                result = dataclasses.replace(
                    result,
                    message=found.violation.finding.message,
                    story=found.violation.story,
                    program=program,
                    reproduction=plan.render(program),
                )
        rate = failure_rate(machine, program, result.name, record=plan.record)
        result = dataclasses.replace(result, confirmed=(rate.hits, rate.replays))
        if rate.violation is not None:
            result = dataclasses.replace(
                result, message=rate.violation.finding.message, story=rate.violation.story
            )
        if rate.tape is not None:
            shown = rate.tape.replayed(
                property_name=result.name, message=result.message, reproduced=True
            )
            result = dataclasses.replace(result, replayed=shown)
        return result

    def all_found(self) -> bool:
        return len(self.found) >= self.plan.judged

    def halted(self) -> bool:
        """Whether the verification must stop now: a call hung, or the deadline passed.

        One hung call ends every stage, in-process or in another process
        (:mod:`dsm_sim.hangs`): every later call would wait its timeout out
        again.  The deadline (``--max-wall``) ends them too; what had not run
        by then is not exercised.  Said once, by the first stage that asks.
        """
        if self.error is not None or self.cut:
            return True
        if hangs_seen() > self.hangs_before:
            self.error, self.done = _hung(hang_since(self.hangs_before), self.stage), True
            return True
        deadline = self.plan.deadline
        if deadline is not None and wall_now() >= deadline:
            self.cut_at_deadline()
            return True
        return False

    def cut_at_deadline(self) -> None:
        """The deadline passed during the current stage: it and every later one are not exercised."""
        if self.cut:
            return
        self.cut, self.done, self.settled = True, True, False
        limit = f"{self.plan.max_wall:g}s " if self.plan.max_wall is not None else ""
        self.gaps.setdefault(
            "max-wall",
            Gap(
                "max-wall",
                f"{self.stage} and every stage after it",
                f"the verification's --max-wall {limit}of real time expired during {self.stage}, "
                "so what had not run by then was not exercised; raise --max-wall, or choose a "
                "lighter --profile",
            ),
        )

    def stopped_by(self, halt: VerificationHalted) -> None:
        """A stage was stopped mid-way: by the deadline, or at a hung call."""
        if self.error is not None or self.cut:
            return
        if halt.deadline:
            self.cut_at_deadline()
        elif not self.halted():
            self.error, self.done = f"the verification stopped during {self.stage}: {halt}", True

    # --- stages ------------------------------------------------------------------------------

    def run_probes(self) -> None:
        """The edge probes; their findings come first, and the search looks for the rest."""
        plan = self.plan
        self.stage = "the edge probes"
        stats = RunStats()
        machine = plan.machine(stats)
        applied = applicable(machine)
        self.probes = len(applied)
        self.probe_steps = sum(len(probe.calls) for probe in applied)
        ran: list[Probe] = []
        with call_timeout(plan.limit):
            done = [0]

            def probed(probe: Probe) -> None:
                done[0] += 1
                ran.append(probe)
                self.stage = f"the edge probe {probe.name!r}"
                plan.tell("edge probes", done[0], len(applied))

            findings = probe_findings(machine, found=self.known, on_probe=probed, stop=self.halted)
            try:
                while True:
                    try:
                        finding = next(findings)
                    except StopIteration:
                        break
                    except UnbuildableMachine:
                        # A handler that cannot even be built or opened: the search reports
                        # how, unless it hung (said once, here).
                        self.probes = self.probe_steps = 0
                        self.halted()
                        return
                    self.book(finding.violation, machine, found_by=finding.probe.name, examples=0)
                    if self.halted():
                        return
                    if plan.stop_on_first or self.all_found():
                        self.done, self.settled = True, self.all_found()
                        return
            except VerificationHalted as halt:
                self.stopped_by(halt)
            finally:
                self.checks.update(stats.checks)
                self.note_gaps(stats)
                if self.probes and (self.error is not None or self.cut):  # say what ran
                    self.probes = len(ran)
                    self.probe_steps = sum(len(probe.calls) for probe in ran)
        self.halted()

    def run_seed_here(self, work: SeedWork) -> SeedRun:
        """One run of the search in this process, its progress told test case by test case."""
        plan = self.plan
        planned = plan.chosen.max_examples * plan.seed_count
        before = self.test_cases
        stats = RunStats(work.known)

        def on_case(n: int) -> None:
            # A test case that hung without failing (its call was judged, or stopped
            # quietly) ends the run before the next one; a failing one is shrunk first.
            if stats.first_failure_case is None and self.halted():
                raise VerificationHalted("a handler call hung", deadline=False)
            if plan.progress is not None:
                plan.progress(before + n, planned)
            plan.tell("search (test cases)", before + n, planned)

        stats.on_test_case = on_case
        return run_seed(plan.machine(stats), work, plan.search(), hangs=hangs_seen)

    def run_search(self, runner: SeedRunner | None = None) -> None:
        """Hypothesis' search, run after run, until a run passes on every seed of the budget.

        Each run is a seed and the properties known at its turn
        (:class:`~dsm_sim.conformance.seeds.SeedWork`).  ``runner`` may run it
        elsewhere (worker processes, :mod:`dsm_sim.conformance.parallel`),
        told the runs that come next if it passes; it answers None for a run
        that must run here.  Every run is booked here, in this order.
        """
        plan = self.plan
        self.stage = "the search"
        planned = plan.chosen.max_examples * plan.seed_count
        seed_index = 0
        while not self.done and not self.halted():
            self.runs += 1
            run_seed = plan.seed + seed_index
            if run_seed not in self.seeds:
                self.seeds.append(run_seed)
            work = SeedWork(run_seed, self.known())
            ran: SeedRun | None = None
            if runner is not None:
                later = plan.budget_seeds()[seed_index + 1 :]
                ran = runner(work, [SeedWork(seed, work.known) for seed in later])
                if ran is not None:
                    if plan.progress is not None:
                        plan.progress(self.test_cases + ran.test_cases, planned)
                    plan.tell("search (test cases)", self.test_cases + ran.test_cases, planned)
            if ran is None:
                ran = self.run_seed_here(work)
            violation = ran.violation
            if ran.halt is not None:
                self.stopped_by(ran.halt)
            elif violation is None and ran.error is not None and not self.halted():
                self.error = ran.error
            if ran.crashed is not None:
                self._lost(run_seed, ran.crashed)
            self.test_cases += ran.test_cases
            self.steps += ran.steps
            self.stopped.update(ran.suppressed)
            self.note_gaps(ran.stats())
            for key, count in ran.checks.items():
                self.checks[key] = max(self.checks[key], count)
            if violation is None:
                # Hung calls in test cases that did not fail (stopped at a known violation).
                self.settled = not self.halted() and self.error is None
                if not self.settled:
                    return
                seed_index += 1
                if seed_index < plan.seed_count:
                    continue  # the next seed of the profile's budget
                if seed_index < plan.seed_count + plan.top_ups and self._unexercised():
                    # Whether a property is reached at all is up to chance (swarm
                    # testing switches rules off per test case); a clean run that
                    # missed some gets more test cases before any is called
                    # "not exercised".  A violation found meanwhile counts as usual.
                    continue
                return
            replayed = plan.machine(RunStats())
            try:
                self.book(
                    violation,
                    replayed,
                    flaky=ran.flaky,
                    run_seed=run_seed,
                    examples=ran.first_failure_case,
                    found_as=ran.first_failure_property,
                )
            except VerificationHalted as halt:
                self.stopped_by(halt)
                return
            if self.halted():
                return
            if plan.stop_on_first or self.all_found():
                self.settled = self.all_found()
                return

    def _lost(self, run_seed: int, how: str) -> None:
        """A run of the search whose worker process died, alone too: its test cases did not run."""
        self.lost[run_seed] = how
        seeds = ", ".join(str(seed) for seed in self.lost)
        self.gaps["search"] = Gap(
            "search",
            f"the test cases of seed {seeds} of the search",
            "; ".join(dict.fromkeys(self.lost.values()))
            + "; run with --jobs 1 to meet it in this process",
        )

    def _unexercised(self) -> bool:
        skip = self.found.keys() | self.plan.waived.keys() | self.plan.user_waived.keys()
        return any(not self.checks[p.name] for p in PROPERTIES if p.name not in skip)

    # --- the report --------------------------------------------------------------------------

    def results(self) -> tuple[PropertyResult, ...]:
        """One result per property.

        The semantics profile's waivers are by design: the property does not
        apply.  The user's (``--waive``) accept only what was not exercised:
        a violated property stays FAILED and one that was exercised and held
        is PASSED, whatever was waived.
        """
        results: list[PropertyResult] = []
        user = self.plan.user_waived
        for p in PROPERTIES:
            if p.name in self.found:
                failed = self.found[p.name]
                results.append(dataclasses.replace(failed, stopped=self.stopped[p.name]))
                continue
            waived = self.plan.waived.get(p.name)
            if waived is None and p.name in user and not self.checks[p.name]:
                waived = user[p.name]
            if waived is not None:
                results.append(
                    PropertyResult(
                        name=p.name,
                        summary=p.summary,
                        status=ResultStatus.WAIVED,
                        checks=self.checks[p.name],
                        message=waived,
                        stopped=self.stopped[p.name],
                    )
                )
                continue
            status = (
                ResultStatus.NOT_EXERCISED  # the deadline came before anything checked it
                if self.cut and not self.checks[p.name]
                else ResultStatus.UNSETTLED
                if not self.settled
                else ResultStatus.PASSED
                if self.checks[p.name]
                else ResultStatus.NOT_EXERCISED
            )
            results.append(
                PropertyResult(
                    name=p.name,
                    summary=p.summary,
                    status=status,
                    checks=self.checks[p.name],
                    stopped=self.stopped[p.name],
                )
            )
        return tuple(results)

    def report(self, call_timeout_s: float | None) -> VerificationReport:
        plan = self.plan
        return VerificationReport(
            factory=plan.path,
            profile=plan.profile,
            seed=plan.seed,
            clock_mode=plan.mode,
            results=self.results(),
            test_cases=self.test_cases,
            runs=self.runs,
            seconds=round(time.perf_counter() - self.started, 3),
            error=self.error,
            time_zone=plan.time_zone,
            seeds=tuple(self.seeds) or (plan.seed,),
            steps=self.steps,
            semantics=plan.semantics.name,
            semantics_spec=plan.spec,
            call_timeout=None if call_timeout_s is None else plan.limit,
            probes=self.probes,
            probe_steps=self.probe_steps,
            gaps=tuple(self.gaps.values()),
            waived=dict(plan.user_waived),
            coverage=self.coverage,
            instances=self.instances,
            out_of_process=self.out_of_process,
            threads_left=threads_left_running() - self.threads_before,
            hazards=tuple(self.hazards.values()),
            tokens=plan.tokens,
        )
