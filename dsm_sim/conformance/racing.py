"""The race matrix: every ordered pair of operations, from every start state, every interleaving.

A sampled race finds what its seed happens to draw: acquire against acquire
comes up often, a completion against the retention sweep on an expired lock
past its retention almost never.  So before the search the kit *lists* its
races.  A cell is a start state (:class:`~dsm_sim.conformance.generate.steps.StartState`)
and an ordered pair of operations from the whole alphabet
(:data:`~dsm_sim.conformance.generate.steps.MATRIX_OPS`), the first made
through one instance of the handler and the second through another, on the
same store.  Each cell runs on a fresh item:

* first with the two calls one after the other (the empty schedule), so a
  bug one call shows is reported as that call, not as a race;
* then, for a handler in this process, once per *preemption point*: every
  await of every task the first call runs (the tasks it creates included),
  with the second call run there to its end (one preemption, under ``ci``, at most twelve runs a cell),
  and under ``thorough`` with up to two preemptions, each a
  :data:`~dsm_sim.conformance.execute.scheduler.Schedule` that replays exactly.
  Bounded preemption over every await finds a race whose window lies deep
  inside a call (between a transaction's ``UPDATE`` and its ``COMMIT``) on
  every seed, where a random schedule finds it by luck;
* every cell first in sequence and at its first preemption point, then every
  cell again at all its points (iterative deepening): what the first await
  shows is found before the time deep windows take is spent.  The deeper
  pass branches from the first pass's runs of the cell, kept in the process
  that made them, instead of running them again (a worker that did not run
  the chunk's first pass runs them again, and books them once);
* a cell whose calls hand work to an executor thread is run as scheduled but
  reported *uncontrolled*: what the thread does is timing, not a choice;
* for a handler in another process, whose await points the kit cannot
  reach, the calls start together a few times and the store decides.

A cell that breaks a property is replayed alone, on a fresh store (its
``prepare`` and its ``race_pair``: a story of at most five steps), and
reported with that program.  Cells whose state could not be reached are
``NOT EXERCISED`` (the ``matrix`` gap), and the report prints the coverage:
cells exercised of those where both calls apply, the interleavings run, and
the preemption points seen and explored.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.instances import out_of_process
from dsm_sim.conformance.execute.loop import call_timeout
from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.execute.scheduler import ChoicePoint, Interleaving, Schedule
from dsm_sim.conformance.generate.steps import MATRIX_OPS, RaceOp, StartState
from dsm_sim.conformance.generate.worlds import ROLES, Role, World
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.properties import Finding, PropertyViolation
from dsm_sim.conformance.report import Coverage, Gap
from dsm_sim.conformance.tell.trim import replay
from dsm_sim.conformance.verification import Verification
from dsm_sim.hangs import hang_since, hangs_seen
from dsm_sim.model import WORLD_CONFIGS, ItemRef
from reference_engine.errors import ConfigurationError
from reference_engine.scope import Scope

__all__ = [
    "CHUNK_CELLS",
    "Cell",
    "ChunkResult",
    "ChunkRunner",
    "ChunkWork",
    "MatrixBudget",
    "RawFinding",
    "Runs",
    "cells",
    "chunked",
    "matrix_works",
    "matrix_world",
    "one_state_per_pair",
    "run_chunk",
    "run_matrix",
]


@dataclass(frozen=True, slots=True)
class Cell:
    """One start state and an ordered pair of operations."""

    state: StartState
    first: RaceOp
    second: RaceOp

    def applies(self) -> bool:
        """Both calls exist in this state: a token's write needs a lock ever taken."""
        return self.state.has_holder or not (self.first.needs_token or self.second.needs_token)

    def __str__(self) -> str:
        return f"{self.first.value} ‖ {self.second.value} from {self.state.value}"


@dataclass(frozen=True, slots=True)
class MatrixBudget:
    """How far a profile explores each cell."""

    #: Preemptions per interleaving (0: the calls in sequence only).
    preemptions: int
    #: Interleavings per cell at most (the sequential run included).
    per_cell: int
    #: Runs per cell of a handler in another process (the store decides each).
    repeats: int
    #: Every cell (True), or each ordered pair once, in a state of its own (a quick look).
    every_state: bool = True


BUDGETS: dict[str, MatrixBudget] = {
    "dev": MatrixBudget(preemptions=0, per_cell=1, repeats=1, every_state=False),
    "ci": MatrixBudget(preemptions=1, per_cell=12, repeats=2),
    "thorough": MatrixBudget(preemptions=2, per_cell=160, repeats=8),
}

#: Runs of each cell in the matrix's first pass: the calls in sequence, and the first preemption.
FIRST_PASS = 2
#: Worlds (of eight items each) between two ``settle`` steps.
SETTLE_EVERY = 8
#: The options of every matrix item: a short lock and retention keep ``settle`` short.
MATRIX_CONFIG = WORLD_CONFIGS["short"]


def matrix_world(number: int) -> World:
    """Eight unrelated fresh items, one per role: ``race<n>/<i>`` in one tenant and scope."""
    refs = tuple(
        ItemRef("t1", Scope.ELEMENT, f"race{number}/{index}", config=MATRIX_CONFIG)
        for index in range(len(ROLES))
    )
    return World(refs)


def cells(ops: tuple[RaceOp, ...]) -> list[Cell]:
    """Every cell, state by state, pair by pair, in the order the matrix runs them."""
    return [Cell(state, a, b) for state in StartState for a in ops for b in ops]


def one_state_per_pair(ops: tuple[RaceOp, ...]) -> list[Cell]:
    """Each ordered pair once, the states taking turns (every state meets several pairs).

    The pair's state is the next in turn where both its calls apply.
    """
    states = tuple(StartState)
    chosen: list[Cell] = []
    for index, (a, b) in enumerate((a, b) for a in ops for b in ops):
        for turn in range(len(states)):
            cell = Cell(states[(index + turn) % len(states)], a, b)
            if cell.applies():
                chosen.append(cell)
                break
    return sorted(chosen, key=lambda cell: states.index(cell.state))


def _schedules(happened: Interleaving, tried: Schedule, budget: MatrixBudget) -> Iterator[Schedule]:
    """Schedules that branch from ``happened`` at a choice point after the ones ``tried`` fixed.

    A branch runs another ready task where the call that ran last could
    have gone on (a preemption), at most ``budget.preemptions`` in all; the
    very first choice (which call starts) is the mirrored cell's, not a branch.
    """
    chosen = tuple(point.chosen for point in happened.choices)
    for index, point in _points(happened, budget):
        if index < max(len(tried), 1):
            continue
        for other in point.ready:
            if other != point.chosen and other != point.follows:
                yield (*chosen[:index], other)


def _points(happened: Interleaving, budget: MatrixBudget) -> Iterator[tuple[int, ChoicePoint]]:
    """The preemption points of a run that the budget still reaches, by choice index.

    A point is a choice where another task could run instead of the call
    going on; after the budget's preemptions are spent, none is reachable.
    """
    spent = 0
    for index, point in enumerate(happened.choices):
        if index >= 1 and point.follows is not None and spent < budget.preemptions:
            yield index, point
        spent += point.preempts


@dataclass(slots=True)
class _Explorer:
    """Runs cells on one machine at a time, a fresh item per run, eight items per world."""

    machine: type[ConformanceMachine]
    #: Properties that stop a run quietly from the start (found before, or waived).
    disabled: frozenset[str]
    budget: MatrixBudget
    controlled: bool = True
    state: ConformanceMachine | None = None
    world: World | None = None
    worlds: int = 0
    used: int = 0
    schedules: int = 0
    exercised: int = 0
    #: Preemption points the budget reaches, and those a run preempted at, over all cells.
    points_seen: int = 0
    points_explored: int = 0
    #: Cells whose calls handed work to threads, and the runs they had.
    threaded: list[str] = field(default_factory=list)
    threaded_runs: int = 0
    failures: list[str] = field(default_factory=list)
    #: What broke a property, in the order found; booked by the caller (:func:`book_finding`).
    findings: list[RawFinding] = field(default_factory=list)

    def known(self) -> frozenset[str]:
        """The properties a run stops at quietly: disabled from the start, or found here."""
        return self.disabled | {found.violation.property for found in self.findings}

    def _fresh(self) -> ConformanceMachine:
        if self.state is not None:
            self.close()
        self.machine.stats.disabled = self.known()
        state = self.machine()
        self.state = state
        self.world = None
        self.used = len(ROLES)
        return state

    def close(self) -> None:
        if self.state is None:
            return
        state, self.state = self.state, None
        # A close that fails is judged by the search, whose every test case closes.
        with contextlib.suppress(PropertyViolation):
            state.teardown()

    def _item(self) -> tuple[ConformanceMachine, Role]:
        """The next fresh item: a new world (after settling the store) every eight runs."""
        state = self.state if self.state is not None else self._fresh()
        if self.used >= len(ROLES):
            self.worlds += 1
            world = matrix_world(self.worlds)
            if self.world is None:
                Call.of("setup", world=world).run_on(state)
            else:
                if self.worlds % SETTLE_EVERY == 0:
                    Call.of("settle").run_on(state)
                Call.of("enter_world", world=world).run_on(state)
            self.world, self.used = world, 0
        role = ROLES[self.used]
        self.used += 1
        return state, role

    def run(self, cell: Cell, schedule: Schedule) -> Interleaving | None:
        """One interleaving of ``cell`` on a fresh item; None when it broke a property."""
        steps: list[Call] = []
        try:
            state, role = self._item()
            steps = [
                Call.of("prepare", item=role, state=cell.state),
                Call.of(
                    "race_pair",
                    item=role,
                    first=cell.first,
                    second=cell.second,
                    schedule=schedule,
                ),
            ]
            for call in steps:
                call.run_on(state)
        except PropertyViolation as violation:
            self._found(violation, cell, schedule)
            self._fresh()
            return None
        except Exception as exc:  # the store stopped the cell: no evidence either way
            self.failures.append(f"{cell}: {type(exc).__name__}: {exc}")
            self._fresh()
            return None
        happened = state.last_interleaving
        if state.diverged:
            # It stopped quietly at a property already found, and a diverged machine
            # runs no more steps: every later cell on it would be a no-op counted as run.
            self._fresh()
        return happened

    def _found(self, violation: PropertyViolation, cell: Cell, schedule: Schedule) -> None:
        self.findings.append(RawFinding(cell, schedule, violation))

    def explore(
        self, cell: Cell, limit: int | None = None, before: Runs = (), repeats: int = 0
    ) -> Runs:
        """Every interleaving of ``cell`` within the budget (and ``limit`` runs), in sequence first.

        ``before`` are runs of the cell made already (its first pass, on this
        machine's kind of handler): each is taken as run and branched from, not
        run again, so only schedules the first pass did not try cost a run.
        The first ``repeats`` runs repeat runs booked before (the first pass's,
        run again where they were not kept): they are not booked as
        interleavings again.  Returns this call's runs (``before``'s included)
        when every one ran to its end, else ``()``.
        """
        if not self.controlled:
            for _ in range(self.budget.repeats):
                self.schedules += 1
                if self.run(cell, ()) is None:
                    break
            self.exercised += 1
            return ()
        pending: list[Schedule] = [] if before else [()]
        tried: set[Schedule] = set()
        points: set[Schedule] = set()
        explored: set[Schedule] = set()
        made: list[tuple[Schedule, Interleaving]] = []
        runs = threaded = 0
        most = self.budget.per_cell if limit is None else min(limit, self.budget.per_cell)
        known = list(before)
        while (known or pending) and runs < most:
            if known:
                schedule, happened = known.pop(0)
                tried.add(schedule)
            else:
                schedule = pending.pop(0)
                if schedule in tried:
                    continue
                tried.add(schedule)
                self.schedules += runs >= repeats
                ran = self.run(cell, schedule)
                if ran is None:
                    made.clear()
                    runs += 1
                    break
                happened = ran
            made.append((schedule, happened))
            runs += 1
            threaded += happened.threaded > 0
            chosen = tuple(point.chosen for point in happened.choices)
            points.update(chosen[:index] for index, _ in _points(happened, self.budget))
            explored.update(
                chosen[:index] for index, point in enumerate(happened.choices) if point.preempts
            )
            pending.extend(s for s in _schedules(happened, schedule, self.budget) if s not in tried)
        self.exercised += 1
        self.points_seen += len(points)
        self.points_explored += len(explored & points)
        if threaded:
            self.threaded.append(str(cell))
            self.threaded_runs += runs
        return tuple(made)


#: A cell's runs, in the order they ran: each schedule tried and what it did.
Runs = tuple[tuple[Schedule, Interleaving], ...]


def _alone(cell: Cell, schedule: Schedule) -> Program:
    """A cell as a program of its own: a fresh world, ``prepare``, ``race_pair``."""
    role = ROLES[0]
    return Program(
        (
            Call.of("setup", world=matrix_world(0)),
            Call.of("prepare", item=role, state=cell.state),
            Call.of(
                "race_pair", item=role, first=cell.first, second=cell.second, schedule=schedule
            ),
        )
    )


def book_finding(
    verification: Verification, machine: type[ConformanceMachine], found: RawFinding
) -> None:
    """Book a cell's violation: alone on a fresh store when it fails so, else as it ran.

    A race with a sweep may need a record in another state than its own
    item's (the other cells' records are what the sweep met): the same
    race is then tried alone from every start state, and the first that
    breaks the same property is the reproduction.
    """
    cell, schedule, violation = found.cell, found.schedule, found.violation
    states = [cell.state]
    if cell.first.sweeps or cell.second.sweeps:
        states += [state for state in StartState if state is not cell.state]
    for state in states:
        alone = Cell(state, cell.first, cell.second)
        if not alone.applies():
            continue
        again = replay(machine, _alone(alone, schedule))
        if again is not None and again.property == violation.property:
            violation = again
            break
    verification.book(violation, machine, found_by="race matrix", examples=0)


def _alphabet(machine: type[ConformanceMachine]) -> tuple[RaceOp, ...]:
    """The operations the machine can race: ``begin`` only where the handler answers it."""
    return tuple(op for op in MATRIX_OPS if op is not RaceOp.BEGIN or hasattr(machine, "begin"))


#: Cells per chunk of the matrix, at most.  The chunks are fixed by the cells alone,
#: never by ``--jobs``: one process runs them one after the other, N processes side
#: by side, and the parent books what each found in chunk order, so the report is the
#: same either way.  Each chunk opens a machine of its own and finds a property again
#: even when an earlier chunk found it, which costs a few cells per chunk.
CHUNK_CELLS = 96


@dataclass(frozen=True, slots=True)
class RawFinding:
    """A cell's violation as it ran, before it is replayed alone and booked."""

    cell: Cell
    schedule: Schedule
    violation: PropertyViolation

    def __reduce__(self) -> tuple[Any, ...]:
        # A PropertyViolation does not rebuild from its args; it travels as its parts.
        v = self.violation
        parts = (v.finding, v.story, getattr(v, "time_zone", "UTC0"), v.program)
        return (_raw_finding, (self.cell, self.schedule, *parts))


def _raw_finding(
    cell: Cell, schedule: Schedule, finding: Finding, story: str, zone: str, program: Any
) -> RawFinding:
    violation = PropertyViolation(finding, story, zone)
    violation.program = program
    return RawFinding(cell, schedule, violation)


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """One chunk of the matrix: contiguous cells, and what the run knows before it starts."""

    #: The chunk's place: its number, and its first cell's index among the listed cells.
    index: int
    start: int
    cells: tuple[Cell, ...]
    budget: MatrixBudget
    #: Whether the kit controls the interleaving (a handler in this process).
    controlled: bool
    #: Properties that stop a run quietly (found by an earlier stage, or waived).
    disabled: frozenset[str]
    #: Properties found by an earlier stage, and how many can be found in all.
    found: frozenset[str]
    judged: int
    stop_on_first: bool
    #: Runs of each cell in this pass (None: the budget's); the first pass of an
    #: iteratively deepened matrix runs each cell in sequence and at its first point.
    limit: int | None = None
    #: The deeper pass revisits cells the first pass counted as exercised; the first
    #: pass leaves the preemption points to it.
    deeper: bool = False
    counts_points: bool = True
    #: The deeper pass: each cell's runs from the first pass (by its place in ``cells``;
    #: none when it broke or never ran), branched from instead of run again.
    before: tuple[Runs, ...] = ()


@dataclass(slots=True)
class ChunkResult:
    """What a chunk ran and found; merged by the parent in chunk order."""

    stats: RunStats
    findings: list[RawFinding] = field(default_factory=list)
    #: Cells explored (the chunk stops early once nothing is left to find).
    exercised: int = 0
    schedules: int = 0
    points_seen: int = 0
    points_explored: int = 0
    threaded: list[str] = field(default_factory=list)
    threaded_runs: int = 0
    failures: list[str] = field(default_factory=list)
    #: Why the chunk stopped before its last cell without finishing it, if it did:
    #: an error outside any cell, or the death of the process running it.
    error: str | None = None
    crashed: bool = False
    #: A first pass's runs of each cell that ran to its end, by the cell's number in
    #: the matrix: the deeper pass branches from them.
    kept: dict[int, Runs] = field(default_factory=dict)


#: Runs chunks and yields their results in the chunks' order (closed when no more are wanted).
ChunkRunner = Callable[[Sequence[ChunkWork]], Generator[ChunkResult, None, None]]


def chunked(listed: Sequence[Cell]) -> list[tuple[int, tuple[Cell, ...]]]:
    """The listed cells in contiguous chunks of at most :data:`CHUNK_CELLS`, sized evenly."""
    count = max(1, -(-len(listed) // CHUNK_CELLS))
    bounds = [len(listed) * index // count for index in range(count + 1)]
    return [(bounds[i], tuple(listed[bounds[i] : bounds[i + 1]])) for i in range(count)]


def run_chunk(machine: type[ConformanceMachine], work: ChunkWork) -> ChunkResult:
    """Explore a chunk's cells in order on fresh items of ``machine`` (whose stats it returns).

    The chunk stops after its first finding under ``stop_on_first``, and once
    every property is found (those found before it, and its own).
    """
    explorer = _Explorer(machine, work.disabled, work.budget, controlled=work.controlled)
    kept: dict[int, Runs] = {}
    error: str | None = None
    hangs = hangs_seen()
    try:
        for number, cell in enumerate(work.cells):
            found = work.found | {raw.violation.property for raw in explorer.findings}
            if (work.stop_on_first and explorer.findings) or len(found) >= work.judged:
                break
            if hangs_seen() > hangs:
                # One hung call ends the matrix: every later cell would wait it out again.
                error = f"a handler call hung ({hang_since(hangs)})"
                break
            if work.deeper:
                before = work.before[number] if number < len(work.before) else ()
                explorer.explore(cell, work.limit, before, 0 if before else FIRST_PASS)
            elif work.limit is not None:
                made = explorer.explore(cell, work.limit)
                if made:
                    kept[work.start + number] = made
            else:
                explorer.explore(cell, work.limit)
    except Exception as exc:  # the handler could not even be built again: no evidence
        error = f"{type(exc).__name__}: {exc}"
    finally:
        explorer.close()
    points = work.counts_points
    return ChunkResult(
        stats=machine.stats,
        findings=explorer.findings,
        exercised=explorer.exercised,
        schedules=explorer.schedules,
        points_seen=explorer.points_seen if points else 0,
        points_explored=explorer.points_explored if points else 0,
        threaded=explorer.threaded if points else [],
        threaded_runs=explorer.threaded_runs if points else 0,
        failures=explorer.failures,
        error=error,
        kept=kept,
    )


def in_process(
    machine: Callable[[RunStats], type[ConformanceMachine]],
) -> ChunkRunner:
    """Run the chunks one after the other in this process, each on a machine of its own."""

    def run(works: Sequence[ChunkWork]) -> Generator[ChunkResult, None, None]:
        for work in works:
            yield run_chunk(machine(RunStats(work.disabled)), work)

    return run


def run_matrix(
    verification: Verification, budget: str | None = None, runner: ChunkRunner | None = None
) -> None:
    """Run every applicable cell under a profile's budget (the plan's), booking what breaks.

    Every call, ``open`` and ``close`` included, is bounded by the plan's call
    limit, as in the probes and the search.  ``runner`` runs the chunks
    (:func:`chunked`): in this process by default, or in worker processes
    (:mod:`dsm_sim.conformance.parallel`); either way the findings are booked
    here, in chunk order.
    """
    with call_timeout(verification.plan.limit):
        _run_matrix(verification, budget, runner)


def _budget(name: str) -> MatrixBudget:
    """The race matrix's budget of a profile, or a ConfigurationError naming those there are."""
    if name not in BUDGETS:
        raise ConfigurationError(
            f"unknown race-matrix budget {name!r}; choose one of {', '.join(BUDGETS)}"
        )
    return BUDGETS[name]


def matrix_works(
    verification: Verification,
    budget: str | None = None,
    machine: type[ConformanceMachine] | None = None,
    *,
    controlled: bool = True,
) -> tuple[list[Cell], list[Cell], list[ChunkWork]]:
    """The matrix's cells (every applicable one, and the listed ones) and its chunks' work.

    What a chunk is given depends on the cells, the budget and what the
    verification knows when the matrix starts, never on ``--jobs``: so work
    computed before an earlier stage ends (``dsm verify --jobs`` sends the
    matrix to its workers while this process runs the edge probes) is the
    matrix's work exactly when that stage found nothing, which equality tells.
    """
    plan = verification.plan
    budget_ = _budget(budget or plan.profile)
    ops = _alphabet(machine or plan.machine(RunStats()))
    every = [cell for cell in cells(ops) if cell.applies()]
    listed = every if budget_.every_state else one_state_per_pair(ops)
    # Iterative deepening: every cell in sequence and at its first preemption point,
    # then every cell again at every point (branching from its first runs, which the
    # first pass's results carry), so a race the first await shows is found before
    # the deep windows take their time.
    deepens = controlled and budget_.per_cell > FIRST_PASS
    chunks = chunked(listed)
    passes = [(FIRST_PASS, False), (None, True)] if deepens else [(None, False)]
    works = [
        ChunkWork(
            index=index + number * len(chunks),
            start=start,
            cells=chunk,
            budget=budget_,
            controlled=controlled,
            disabled=verification.known(),
            found=frozenset(verification.found),
            judged=plan.judged,
            stop_on_first=plan.stop_on_first,
            limit=limit,
            deeper=deeper,
            counts_points=deeper or not deepens,
        )
        for number, (limit, deeper) in enumerate(passes)
        for index, (start, chunk) in enumerate(chunks)
    ]
    return every, listed, works


def _run_matrix(verification: Verification, budget: str | None, runner: ChunkRunner | None) -> None:
    plan = verification.plan
    chosen = budget or plan.profile
    stats = RunStats(verification.known())
    machine = plan.machine(stats)
    ops = _alphabet(machine)
    explorer = _Explorer(machine, verification.known(), _budget(chosen))
    try:
        probe = explorer._fresh()
    except Exception:
        return  # a handler that cannot be built or opened: the search reports how
    controlled = not out_of_process(probe.handler)
    explorer.close()
    every, listed, works = matrix_works(verification, chosen, machine, controlled=controlled)
    # Findings are replayed alone and booked on a machine of their own, as they come.
    replayed = RunStats()
    replayer = plan.machine(replayed)
    checks: Counter[str] = Counter(stats.checks)
    merged = ChunkResult(stats=stats)
    missing: dict[str, list[str]] = {}
    #: Chunks (by their first cell) whose first pass did not finish: their deeper pass is no news.
    died: set[int] = set()
    missed = done = 0
    results = _passes(runner or in_process(plan.machine), works)
    try:
        for work, result in results:
            checks.update(result.stats.checks)
            verification.note_gaps(result.stats)
            _add(merged, result, work)
            if result.error is not None and not (work.deeper and work.start in died):
                left = work.cells[result.exercised :] if not result.crashed else work.cells
                missed += 0 if work.deeper else len(left)
                why = f"{result.error} (at their deeper points)" if work.deeper else result.error
                missing.setdefault(why, []).append(_unrun(work, left))
                died.add(work.start)
            for found in result.findings:
                if found.violation.property in verification.known():
                    continue  # an earlier chunk found it first
                replayed.disabled = verification.known()
                book_finding(verification, replayer, found)
                if plan.stop_on_first:
                    break
            done += len(work.cells)
            if work.deeper:
                plan.tell("race matrix (deeper points)", done - len(listed), len(listed))
            else:
                plan.tell("race matrix (cells)", done, len(listed))
            if (
                (plan.stop_on_first and verification.found)
                or verification.all_found()
                or verification.halted()
            ):
                break
    finally:
        results.close()
    checks.update(replayed.checks)
    verification.checks.update(checks)
    verification.note_gaps(replayed)
    verification.coverage = Coverage(
        operations=len(ops),
        states=len(StartState),
        applicable=len(every),
        exercised=merged.exercised,
        schedules=merged.schedules,
        uncontrolled=0 if controlled else merged.exercised,
        preemption_points=merged.points_seen,
        preemptions_explored=merged.points_explored,
        threaded=tuple(merged.threaded),
        threaded_runs=merged.threaded_runs,
    )
    reasons = []
    if merged.failures:
        reasons.append(
            "stopped by an error that was no answer to judge: "
            + "; ".join(merged.failures[:3])
            + (" …" if len(merged.failures) > 3 else "")
        )
    reasons += [
        f"cells {', '.join(ranges)} of {len(listed)} did not run: {why}"
        for why, ranges in missing.items()
    ]
    if reasons:
        verification.gaps.setdefault(
            "matrix",
            Gap(
                "matrix",
                f"{len(merged.failures) + missed} race-matrix cell(s)",
                "; ".join(reasons),
            ),
        )
    if plan.stop_on_first and verification.found:
        verification.done = True
    elif verification.all_found():
        verification.done, verification.settled = True, True


def _passes(
    runner: ChunkRunner, works: Sequence[ChunkWork]
) -> Generator[tuple[ChunkWork, ChunkResult], None, None]:
    """Each chunk's work and result in order: the first pass's chunks, then the deeper pass's.

    The deeper pass's chunks are sent once the first pass's results are in,
    each carrying its cells' first runs: wherever a chunk runs (this process
    or any worker), it branches from them instead of running them again, so
    what is run and reported does not depend on ``--jobs``.
    """
    first = [work for work in works if not work.deeper]
    deeper = [work for work in works if work.deeper]
    kept: dict[int, Runs] = {}
    for number, batch in enumerate((first, deeper)):
        if number and kept:
            batch = [
                replace(
                    work,
                    before=tuple(kept.get(work.start + i, ()) for i in range(len(work.cells))),
                )
                for work in batch
            ]
        if not batch:
            continue
        results = runner(batch)
        try:
            for work, result in zip(batch, results, strict=False):
                kept.update(result.kept)
                yield work, result
        finally:
            results.close()


def _add(merged: ChunkResult, result: ChunkResult, work: ChunkWork) -> None:
    merged.exercised += 0 if work.deeper else result.exercised
    merged.schedules += result.schedules
    merged.points_seen += result.points_seen
    merged.points_explored += result.points_explored
    merged.threaded += result.threaded
    merged.threaded_runs += result.threaded_runs
    merged.failures += result.failures


def _unrun(work: ChunkWork, left: Sequence[Cell]) -> str:
    """The cells of a chunk that did not run, by their numbers in the matrix's order."""
    first = work.start + len(work.cells) - len(left) + 1
    return f"{first}-{work.start + len(work.cells)} (from '{left[0]}')"


def count_cells() -> int:
    """Cells in the full matrix (every operation, ``begin`` included), where both calls apply."""
    return sum(1 for cell in cells(MATRIX_OPS) if cell.applies())
