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
* then, for a handler in this process, once per point where the first call
  awaits, with the second call run there to its end (one preemption), and
  under ``thorough`` with two preemptions, each a
  :data:`~dsm_sim.conformance.execute.scheduler.Schedule` that replays exactly;
* for a handler in another process, whose await points the kit cannot
  reach, the calls start together a few times and the store decides.

A cell that breaks a property is replayed alone, on a fresh store (its
``prepare`` and its ``race_pair``: a story of at most five steps), and
reported with that program.  Cells whose state could not be reached are
``NOT EXERCISED`` (the ``matrix`` gap), and the report prints the coverage:
cells exercised of those where both calls apply, and the interleavings run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.instances import out_of_process
from dsm_sim.conformance.execute.loop import call_timeout
from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.execute.scheduler import Interleaving, Schedule
from dsm_sim.conformance.generate.steps import MATRIX_OPS, RaceOp, StartState
from dsm_sim.conformance.generate.worlds import ROLES, Role, World
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.properties import PropertyViolation
from dsm_sim.conformance.report import Coverage, Gap
from dsm_sim.conformance.tell.trim import replay
from dsm_sim.conformance.verification import Verification
from dsm_sim.model import WORLD_CONFIGS, ItemRef
from reference_engine.errors import ConfigurationError
from reference_engine.scope import Scope

__all__ = ["Cell", "MatrixBudget", "cells", "matrix_world", "one_state_per_pair", "run_matrix"]


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
    "ci": MatrixBudget(preemptions=1, per_cell=2, repeats=2),
    "thorough": MatrixBudget(preemptions=2, per_cell=24, repeats=8),
}

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

    A branch runs another ready call where the one that ran last could have
    gone on (a preemption), at most ``budget.preemptions`` in all; the very
    first choice (which call starts) is the mirrored cell's, not a branch.
    """
    chosen = tuple(point.chosen for point in happened.choices)
    for index in range(max(len(tried), 1), len(happened.choices)):
        point = happened.choices[index]
        spent = sum(1 for p in happened.choices[:index] if p.preempts)
        for other in point.ready:
            if other == point.chosen or point.active is None:
                continue
            if spent + 1 <= budget.preemptions:
                yield (*chosen[:index], other)


@dataclass(slots=True)
class _Explorer:
    """Runs cells on one machine at a time, a fresh item per run, eight items per world."""

    machine: type[ConformanceMachine]
    verification: Verification
    budget: MatrixBudget
    controlled: bool = True
    state: ConformanceMachine | None = None
    world: World | None = None
    worlds: int = 0
    used: int = 0
    schedules: int = 0
    exercised: int = 0
    failures: list[str] = field(default_factory=list)

    def _fresh(self) -> ConformanceMachine:
        if self.state is not None:
            self.close()
        self.machine.stats.disabled = self.verification.known()
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
            self.schedules += 1
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
        return state.last_interleaving

    def _found(self, violation: PropertyViolation, cell: Cell, schedule: Schedule) -> None:
        """Book a cell's violation: alone on a fresh store when it fails so, else as it ran.

        A race with a sweep may need a record in another state than its own
        item's (the other cells' records are what the sweep met): the same
        race is then tried alone from every start state, and the first that
        breaks the same property is the reproduction.
        """
        states = [cell.state]
        if cell.first.sweeps or cell.second.sweeps:
            states += [state for state in StartState if state is not cell.state]
        for state in states:
            alone = Cell(state, cell.first, cell.second)
            if not alone.applies():
                continue
            again = replay(self.machine, _alone(alone, schedule))
            if again is not None and again.property == violation.property:
                violation = again
                break
        self.verification.book(violation, self.machine, found_by="race matrix", examples=0)

    def explore(self, cell: Cell) -> None:
        """Every interleaving of ``cell`` within the budget, the calls in sequence first."""
        if not self.controlled:
            for _ in range(self.budget.repeats):
                if self.run(cell, ()) is None:
                    break
            self.exercised += 1
            return
        pending: list[Schedule] = [()]
        seen: set[Schedule] = set()
        runs = 0
        while pending and runs < self.budget.per_cell:
            schedule = pending.pop(0)
            if schedule in seen:
                continue
            seen.add(schedule)
            runs += 1
            happened = self.run(cell, schedule)
            if happened is None:
                break
            pending.extend(s for s in _schedules(happened, schedule, self.budget) if s not in seen)
        self.exercised += 1


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


def _alphabet(machine: type[ConformanceMachine]) -> tuple[RaceOp, ...]:
    """The operations the machine can race: ``begin`` only where the handler answers it."""
    return tuple(op for op in MATRIX_OPS if op is not RaceOp.BEGIN or hasattr(machine, "begin"))


def run_matrix(verification: Verification, budget: str | None = None) -> None:
    """Run every applicable cell under a profile's budget (the plan's), booking what breaks.

    Every call, ``open`` and ``close`` included, is bounded by the plan's call
    limit, as in the probes and the search.
    """
    with call_timeout(verification.plan.limit):
        _run_matrix(verification, budget)


def _run_matrix(verification: Verification, budget: str | None) -> None:
    plan = verification.plan
    chosen = budget or plan.profile
    if chosen not in BUDGETS:
        raise ConfigurationError(
            f"unknown race-matrix budget {chosen!r}; choose one of {', '.join(BUDGETS)}"
        )
    budget_ = BUDGETS[chosen]
    stats = RunStats(verification.known())
    machine = plan.machine(stats)
    ops = _alphabet(machine)
    every = [cell for cell in cells(ops) if cell.applies()]
    listed = every if budget_.every_state else one_state_per_pair(ops)
    explorer = _Explorer(machine, verification, budget_)
    try:
        probe = explorer._fresh()
    except Exception:
        return  # a handler that cannot be built or opened: the search reports how
    explorer.controlled = not out_of_process(probe.handler)
    try:
        for done, cell in enumerate(listed, start=1):
            if plan.stop_on_first and verification.found:
                break
            if verification.all_found() or verification.halted():
                break
            explorer.explore(cell)
            plan.tell("race matrix (cells)", done, len(listed))
    finally:
        explorer.close()
    verification.checks.update(stats.checks)
    verification.note_gaps(stats)
    verification.coverage = Coverage(
        operations=len(ops),
        states=len(StartState),
        applicable=len(every),
        exercised=explorer.exercised,
        schedules=explorer.schedules,
        uncontrolled=0 if explorer.controlled else explorer.exercised,
    )
    if explorer.failures:
        verification.gaps.setdefault(
            "matrix",
            Gap(
                "matrix",
                f"{len(explorer.failures)} race-matrix cell(s)",
                "stopped by an error that was no answer to judge: "
                + "; ".join(explorer.failures[:3])
                + (" …" if len(explorer.failures) > 3 else ""),
            ),
        )
    if plan.stop_on_first and verification.found:
        verification.done = True
    elif verification.all_found():
        verification.done, verification.settled = True, True


def count_cells() -> int:
    """Cells in the full matrix (every operation, ``begin`` included), where both calls apply."""
    return sum(1 for cell in cells(MATRIX_OPS) if cell.applies())
