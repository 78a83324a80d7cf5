"""What a verification hands back: one verdict per property, and what could not be exercised.

A green verdict is worth what it exercised.  So the report keeps, beside the
properties, every part of the verification that did not run as planned
(:class:`Gap`): a peer instance that failed to open (so nothing raced across
instances), a race-matrix cell whose state could not be set up, a probe a
store error stopped.  Those, and any property no test case reached, are
``NOT EXERCISED``; the verdict is PASSED only when there is none, or when
the user waived each by name (``dsm verify --waive NAME``).
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.program import Program
from dsm_sim.conformance.tell.flaky import FLAKY_EXPLANATION, RACE_EXPLANATION
from dsm_sim.conformance.tell.replayed import Replayed

__all__ = [
    "UTC_ZONE",
    "Coverage",
    "Gap",
    "HazardSeen",
    "PropertyResult",
    "ResultStatus",
    "VerificationReport",
]

#: The zone a replay needs no ``--tz`` for.
UTC_ZONE = "UTC"


class ResultStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    #: Violated once, but the same steps did not fail again: a race, most likely.
    FLAKY = "flaky"
    NOT_EXERCISED = "not exercised"
    #: The run stopped at an earlier violation before this property was settled.
    UNSETTLED = "unsettled"
    #: The semantics profile, or the user by name, declares the property does
    #: not apply; ``message`` says why.
    WAIVED = "waived"

    def __repr__(self) -> str:
        return f"ResultStatus.{self.name}"


@dataclass(frozen=True, slots=True)
class PropertyResult:
    """One property's verdict; a failure carries its trimmed program and its story.

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
    #: The property the first failing test case broke, before any trimming.
    found_as: str | None = None
    #: The POSIX ``TZ`` the failing test case ran in, when the machine reports one.
    time_zone: str | None = None
    #: What found the violation: an edge probe's name, ``race matrix``, or None (the search).
    found_by: str | None = None
    #: The failing program as data (None for results that did not fail).
    program: Program | None = None
    #: Replays of the reported program that broke the property again, of those tried.
    confirmed: tuple[int, int] | None = None
    #: The last confirmation as the explorer plays it, when it was recorded (``--report``).
    replayed: Replayed | None = field(default=None, compare=False, repr=False)

    @property
    def failed(self) -> bool:
        return self.status in (ResultStatus.FAILED, ResultStatus.FLAKY)

    @property
    def flaky(self) -> bool:
        return self.status is ResultStatus.FLAKY

    @property
    def story_steps(self) -> int:
        return sum(1 for line in self.story.splitlines() if line.strip()[:1].isdigit())

    def render(self) -> str:
        """The failure as a handler author should read it: sentence, story, program."""
        if not self.failed:
            return f"{self.name}: {self.status.value} ({self.checks} checks)"
        heading = f"{self.name} violated{' (flaky)' if self.flaky else ''}: {self.message}"
        parts = [heading, "", "What happened:", self.story]
        rate = self.flaky and self.confirmed is not None and self.confirmed[0] > 0
        if rate and self.confirmed is not None:
            hit, tried = self.confirmed
            parts.append(f"  (failed {hit} of {tried} replays of these steps)")
        if self.found_by is not None:
            what = "the race matrix" if self.found_by == "race matrix" else "the edge probe"
            name = "" if self.found_by == "race matrix" else f" {self.found_by!r}"
            parts[1:1] = ["", f"Found by {what}{name}, before the search."]
        if self.reproduction:
            parts += ["", "Minimal reproduction (paste and run):", self.reproduction]
            if self.confirmed is not None and not rate:
                hit, tried = self.confirmed
                parts += [f"(It broke the property again in {hit} of {tried} replays.)"]
        if self.flaky:
            parts += ["", f"Flaky: {RACE_EXPLANATION if rate else FLAKY_EXPLANATION}."]
        return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class Gap:
    """A part of the verification that did not run: it is no evidence, so it is no pass.

    ``name`` is what ``--waive`` takes (``peers``, ``matrix``, ``probe:<name>``).
    """

    name: str
    what: str
    reason: str

    def render(self) -> str:
        return f"NOT EXERCISED {self.name}: {self.what}: {self.reason}"


@dataclass(frozen=True, slots=True)
class HazardSeen:
    """A hazard of the semantics profile that a test case showed: named, with its story.

    Not a violation (no handler of the interface can prevent it) and not a
    pass: the verdict prints it on a line of its own.
    """

    name: str
    summary: str
    #: The property whose check showed it.
    property_name: str
    message: str
    story: str
    #: How many test cases showed it.
    seen: int = 1

    @property
    def story_steps(self) -> int:
        return sum(1 for line in self.story.splitlines() if line.strip()[:1].isdigit())

    def again(self, before: int) -> HazardSeen:
        """This sighting, counting ``before`` earlier ones."""
        return HazardSeen(
            self.name, self.summary, self.property_name, self.message, self.story, before + 1
        )

    def line(self) -> str:
        return f"hazard: {self.name} — {self.summary}"

    def render(self) -> str:
        return "\n".join(
            [
                self.line(),
                f"  shown by {self.seen} test case(s); the shortest: {self.message}",
                "",
                "What happened:",
                self.story,
            ]
        )


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of the race matrix ran: ordered pairs of operations x start states."""

    operations: int = 0
    states: int = 0
    #: Cells (pair x state) whose calls both apply, and how many of them ran.
    applicable: int = 0
    exercised: int = 0
    #: Interleavings run in all (each cell runs its calls in sequence, then preempted),
    #: each booked once (the deeper pass does not book the first pass's runs again).
    schedules: int = 0
    #: Cells where the store itself decided the interleaving (no control: another process).
    uncontrolled: int = 0
    #: Preemption points (an await where the other call could run instead) the
    #: budget reaches, and how many of them a run preempted at.
    preemption_points: int = 0
    preemptions_explored: int = 0
    #: Cells whose calls handed work to executor threads, which no schedule reaches,
    #: and the real interleavings they ran.
    threaded: tuple[str, ...] = ()
    threaded_runs: int = 0

    def render(self) -> str:
        if not self.applicable:
            return "race matrix: not run"
        how = (
            f"{self.schedules} interleavings, preemption points seen / explored "
            f"{self.preemption_points} / {self.preemptions_explored}"
            if not self.uncontrolled
            else f"{self.schedules} runs ({self.uncontrolled} cells by the store's own timing)"
        )
        text = (
            f"race matrix: {self.exercised} of {self.applicable} cells "
            f"({self.operations}x{self.operations} ordered pairs x {self.states} states, "
            f"where both calls apply), {how}"
        )
        if self.threaded:
            shown = "; ".join(self.threaded[:3]) + (" …" if len(self.threaded) > 3 else "")
            text += (
                f"; {len(self.threaded)} cell(s) uncontrolled (work in threads): ran "
                f"{self.threaded_runs} real interleavings, not covered: {shown}"
            )
        return text


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
    #: What did not run, and why: each is NOT EXERCISED unless waived.
    gaps: tuple[Gap, ...] = ()
    #: What the user waived by name, with the reason shown in its place.
    waived: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    coverage: Coverage = field(default_factory=Coverage)
    #: Threads a hung call kept blocked (executor threads of the handler's calls), left
    #: running rather than waited for: the verdict says how many.
    threads_left: int = 0
    #: The most handler instances a test case's races went through (the factory's and its
    #: peers on one store; 0 when no handler opened), and whether each was a process.
    instances: int = 0
    out_of_process: bool = False
    #: The semantics profile's hazards the run showed (none under the spec's own).
    hazards: tuple[HazardSeen, ...] = ()
    #: ``--tokens``: how the handler's fencing tokens are judged (``attempts`` or ``ordered``).
    tokens: str = "attempts"

    def races(self) -> str:
        """Whether the races went through several processes (or instances), and how many."""
        one, kind = ("process", "processes") if self.out_of_process else ("instance", "instances")
        if self.instances > 1:
            return f"races: through {self.instances} {kind} on one store (peers)"
        if self.instances == 1:
            return f"races: through one {one} only (no peers: nothing raced across {kind})"
        return "races: none (no handler opened)"

    @property
    def violations(self) -> tuple[PropertyResult, ...]:
        """The violated properties in the order they were found."""
        failed = [r for r in self.results if r.failed]
        return tuple(sorted(failed, key=lambda r: r.found_rank or 0))

    @property
    def not_exercised(self) -> tuple[str, ...]:
        """Every NOT EXERCISED line: properties never reached, gaps not waived."""
        lines = [
            f"NOT EXERCISED {r.name}: no test case reached it ({r.summary})"
            for r in self.results
            if r.status is ResultStatus.NOT_EXERCISED
        ]
        lines += [gap.render() for gap in self.gaps if gap.name not in self.waived]
        return tuple(lines)

    @property
    def passed(self) -> bool:
        return self.error is None and not self.violations and not self.not_exercised

    @property
    def ignored_waivers(self) -> dict[str, str]:
        """The user's waivers that accepted nothing, and why: a waiver takes only what did not run.

        A violated property stays FAILED and one that was exercised and held is
        PASSED, whatever was waived; a gap's waiver matters only when the gap happened.
        """
        results = {r.name: r for r in self.results}
        gaps = {g.name for g in self.gaps}
        ignored: dict[str, str] = {}
        for name in self.waived:
            result = results.get(name)
            if result is None:
                if name not in gaps:
                    ignored[name] = "this run left no such gap: nothing to accept"
            elif result.failed:
                ignored[name] = "it was violated: a waiver accepts only what was not exercised"
            elif result.status is ResultStatus.PASSED:
                ignored[name] = f"it was exercised and held ({result.checks} checks): PASSED"
            elif result.status is ResultStatus.UNSETTLED:
                ignored[name] = "it was exercised; the run stopped before it was settled"
        return ignored

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
        if self.tokens != "attempts":
            words += ["--tokens", self.tokens]
        if self.call_timeout is not None:
            words += ["--call-timeout", f"{self.call_timeout:g}"]
        if self.clock_mode is not ClockMode.INJECTED:
            words += ["--clock", self.clock_mode.value]
        zone = self.replay_zone
        # Imported here: the generators import Hypothesis, and ``dsm run`` reads
        # this module (its gaps) without ever drawing a world.
        from dsm_sim.conformance.generate.worlds import UTC_ZONE as WORLD_UTC

        if zone is not None and zone not in (UTC_ZONE, WORLD_UTC):
            words += ["--tz", zone]
        for name in self.waived:
            words += ["--waive", name]
        return f"dsm verify {factory} {shlex.join(words)}"

    def explored(self) -> str:
        """How much was explored, in one line: what a green run is worth."""
        seeds = len(self.seeds) or 1
        probed = f"{self.probes} edge probes ({self.probe_steps} steps), " if self.probes else ""
        return (
            f"{probed}{self.test_cases} test cases, {self.steps} steps, {self.checks} checks, "
            f"{seeds} seed(s), {self.runs} run(s), {self.seconds:.1f}s"
        )
