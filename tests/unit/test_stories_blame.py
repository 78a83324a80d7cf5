"""Stories that blame the right call (issue 34, item 7).

A finding is filed under the property the *first* deviating call breaks, by
that call's own check; a call that wrote (a peer instance's ``open()``) is a
line of the story; and payloads that play no part in the finding are made as
light as they can be before the story is told.
"""

from __future__ import annotations

import datetime as dt

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.generate.steps import RaceOp, StartState
from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD, Role
from dsm_sim.conformance.judge.judges import judge_retention_sweep
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.properties import PropertyViolation
from dsm_sim.conformance.racing import matrix_world
from dsm_sim.conformance.runner import verify
from dsm_sim.conformance.tell.trim import lighten_payloads, replay
from dsm_sim.model import Outcome
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

#: A payload just under the size limit: the kind the payloads probe passes.
HEAVY = {"blob": "\u00e9" * 131_000}


def _machine(name: str) -> type[ConformanceMachine]:
    return build_machine(CATALOGUE[name].factory, stats=RunStats())


def _violation(factory: HandlerFactory, program: Program) -> PropertyViolation:
    violation = replay(build_machine(factory, stats=RunStats()), program)
    assert violation is not None, "the program must break a property"
    return violation


# --- 1. filed under the first deviating call's own property -----------------------------------


def test_a_retention_count_short_by_the_history_rows_is_the_sweeps_finding() -> None:
    """The upserts kept their history (the sweep expired it): only the count is wrong."""
    program = Program(
        (
            Call.of("setup", world=DEFAULT_WORLD),
            Call.of("upsert", worker=1, item=Role.HOT, data={"n": 1}),
            Call.of("upsert", worker=1, item=Role.HOT, data={"n": 2}),
            Call.of("upsert", worker=1, item=Role.HOT, data={"n": 3}),
            Call.of("clock_jumps_past_retention", item=Role.HOT),
            Call.of("expire_past_retention"),
        )
    )
    violation = _violation(CATALOGUE["retention_counts_current_only"].factory, program)
    assert violation.property == "retention_sweep_agrees_with_model", violation
    assert "expire_past_retention()" in violation.finding.message


def test_the_retention_judge_files_any_wrong_count_under_the_sweep() -> None:
    now = dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC)
    finding = judge_retention_sweep(Outcome(1), Outcome(3), 2, now)
    assert finding is not None and finding.property == "retention_sweep_agrees_with_model"


def test_a_completion_that_never_landed_is_blamed_not_the_sweep_after_it() -> None:
    """In sequence: the holder's set answers ok and writes nothing; the sweep then resets the
    lock it left, and counts one reset where the model has none."""
    program = Program(
        (
            Call.of("setup", world=matrix_world(0)),
            Call.of("prepare", item=Role.HOT, state=StartState.EXPIRED),
            Call.of(
                "race_pair", item=Role.HOT, first=RaceOp.COMPLETE, second=RaceOp.SWEEP, schedule=()
            ),
        )
    )
    violation = _violation(CATALOGUE["completion_lost_on_expired_lock"].factory, program)
    assert violation.property == "completion_releases_lock", violation
    message = violation.finding.message
    assert message.startswith("worker 1's set(Processed)") and "never landed" in message


def test_a_correct_completion_before_the_sweep_is_not_blamed() -> None:
    program = Program(
        (
            Call.of("setup", world=matrix_world(0)),
            Call.of("prepare", item=Role.HOT, state=StartState.EXPIRED),
            Call.of(
                "race_pair", item=Role.HOT, first=RaceOp.COMPLETE, second=RaceOp.SWEEP, schedule=()
            ),
        )
    )
    assert replay(build_machine(InMemoryStateHandler, stats=RunStats()), program) is None


# --- 2. calls that write are lines of the story ------------------------------------------------


def test_a_peer_open_that_fails_a_live_lock_is_a_step_and_its_finding() -> None:
    program = Program(
        (
            Call.of("setup", world=DEFAULT_WORLD),
            Call.of("try_acquire_lock", worker=1, item=Role.HOT),
            Call.of("race_to_acquire", item=Role.HOT, guarded=False),
        )
    )
    violation = _violation(CATALOGUE["open_fails_live_locks"].factory, program)
    assert "open() of its own handler instance on the same store" in violation.story, (
        violation.story
    )
    assert "Processing (token 1) -> Failed (token 1)" in violation.story
    # The open broke it, before any worker raced: the race is not in the story.
    assert "race:" not in violation.story
    assert violation.property == "record_agrees_with_model"


def test_a_peer_open_that_writes_nothing_tells_nothing() -> None:
    machine = build_machine(InMemoryStateHandler, stats=RunStats())
    state = machine()
    try:
        state.setup(world=DEFAULT_WORLD)
        state.try_acquire_lock(worker=1, item=Role.HOT)
        state.race_to_acquire(item=Role.HOT, guarded=False)
        assert not any("open()" in step.render() for step in state.steps)
        assert len(state.instances.peers) == 2
    finally:
        state.teardown()


# --- 3. payloads that play no part are made light ---------------------------------------------


def test_a_heavy_payload_that_plays_no_part_is_replaced_by_an_empty_one() -> None:
    """A skip that clears the stored data fails with any data written before it."""
    machine = _machine("set_without_data_clears_data")
    program = Program(
        (
            Call.of("setup", world=DEFAULT_WORLD),
            Call.of("upsert", worker=2, item=Role.HOT, data=HEAVY),
            Call.of("skip_item", worker=3, item=Role.HOT),
        )
    )
    found = lighten_payloads(machine, program, "data_round_trip")
    assert found is not None
    assert found.program.body[0] == Call.of("upsert", worker=2, item=Role.HOT, data={})
    assert found.violation.property == "data_round_trip"
    assert "blob" not in found.violation.story


def test_a_payload_the_finding_needs_is_kept() -> None:
    """Empty lists left out of the data: only a payload that holds one shows it."""
    machine = _machine("drops_empty_values")
    program = Program(
        (
            Call.of("setup", world=DEFAULT_WORLD),
            Call.of("upsert", worker=2, item=Role.HOT, data={"items": []}),
        )
    )
    assert replay(machine, program) is not None
    assert lighten_payloads(machine, program, "data_round_trip") is None


def test_a_reported_story_carries_no_payload_it_does_not_need() -> None:
    """The payloads probe meets this bug at a payload at the size limit; the report does not."""
    spec = CATALOGUE["set_without_data_clears_data"]
    report = verify(spec.factory, "dev", seed=0, stop_on_first=True, matrix=False)
    caught = report.violations[0]
    assert caught.name == "data_round_trip"
    assert "blob" not in caught.story and "blob" not in caught.reproduction, caught.render()
    assert caught.story_steps <= 3
