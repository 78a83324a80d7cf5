"""Step deletion after shrinking: padded programs lose the steps their violation does not need."""

from __future__ import annotations

import re

import pytest

from dsm_sim.conformance.explain import render_reproduction
from dsm_sim.conformance.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.properties import PROPERTIES, PropertyViolation
from dsm_sim.conformance.reduce import Program, parse_program, reduce_program, replay
from dsm_sim.conformance.runner import PropertyResult, ResultStatus, _reduced, factory_path
from dsm_sim.conformance.worlds import DEFAULT_WORLD
from reference_engine.clock import Clock
from reference_engine.handler import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

NAME = "HandlerConformance"
#: The two steps the bug needs: a lock taken, then given up.
NEEDED = [
    "state.try_acquire_lock(item=Role.HOT, worker=1)",
    "state.release_lock_as_failed(error='boom', item=Role.HOT, worker=1)",
]
#: Steps that touch nothing the bug depends on.
PADDING = [
    "state.expire_past_retention()",
    "state.get(item=Role.NEIGHBOUR, worker=2)",
    "state.exists(item=Role.TENANT, worker=3)",
    "state.tick(seconds=1)",
    "state.reset_expired_locks()",
]


class ReleaseKeepsLock(InMemoryStateHandler):
    """``release_lock_as_failed`` does nothing: the record stays Processing, the lock live."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        return None


class BrokenOnlyAtFirst(ReleaseKeepsLock):
    """The same bug in the first three handlers built, then none: a failure that stops failing."""

    built = 0

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        type(self).built += 1

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        if type(self).built > 3:
            await InMemoryStateHandler.release_lock_as_failed(self, ctx, error_detail)


def _text(factory: type[InMemoryStateHandler], steps: list[str]) -> str:
    """A reproduction as the kit prints one, from the program Hypothesis would print."""
    note = "\n".join(
        [f"state = {NAME}()", f"state.setup(world={DEFAULT_WORLD!r})", *steps, "state.teardown()"]
    )
    return render_reproduction([note], factory_path(factory))


def _padded() -> list[str]:
    before = [PADDING[i % len(PADDING)] for i in range(15)]
    after = [PADDING[(i + 2) % len(PADDING)] for i in range(15)]
    return [*before, NEEDED[0], *after, NEEDED[1]]


def _program(factory: type[InMemoryStateHandler], steps: list[str]) -> Program:
    program = parse_program(_text(factory, steps))
    assert program is not None
    return program


def _machine(factory: type[InMemoryStateHandler]) -> type[ConformanceMachine]:
    return build_machine(factory, name=NAME)


def _failing_property(factory: type[InMemoryStateHandler], program: Program) -> str:
    violation = replay(_machine(factory), program)
    assert violation is not None, "the program must fail before it is reduced"
    return violation.property


def test_a_padded_program_loses_its_padding_and_breaks_the_same_property() -> None:
    program = _program(ReleaseKeepsLock, _padded())
    assert len(program.steps) == 32
    prop = _failing_property(ReleaseKeepsLock, program)
    reduced = reduce_program(_machine(ReleaseKeepsLock), program, prop)
    assert reduced is not None
    assert [call.text for call in reduced.program.steps] == NEEDED
    assert reduced.violation.property == prop
    story_steps = re.findall(r"^\s*\d+\. ", reduced.violation.story, re.MULTILINE)
    assert len(story_steps) <= 3
    assert reduced.program.setup == program.setup  # the world is kept


def test_the_same_program_reduces_the_same_way_every_time() -> None:
    program = _program(ReleaseKeepsLock, _padded())
    prop = _failing_property(ReleaseKeepsLock, program)
    first = reduce_program(_machine(ReleaseKeepsLock), program, prop)
    second = reduce_program(_machine(ReleaseKeepsLock), program, prop)
    assert first is not None and second is not None
    assert first.program.render() == second.program.render()
    assert first.replays == second.replays


def test_the_reduced_reproduction_runs_as_pasted_and_fails_as_reported() -> None:
    program = _program(ReleaseKeepsLock, _padded())
    prop = _failing_property(ReleaseKeepsLock, program)
    reduced = reduce_program(_machine(ReleaseKeepsLock), program, prop)
    assert reduced is not None
    text = reduced.program.render()
    assert text.startswith("from dsm_sim.conformance.machine import build_machine")
    assert re.search(rf"^state = {NAME}\(\)$", text, re.MULTILINE)
    assert text.rstrip().endswith("finally:\n    state.teardown()")
    namespace: dict[str, object] = {}
    with pytest.raises(PropertyViolation) as raised:
        exec(compile(text, "<reduced reproduction>", "exec"), namespace)
    assert raised.value.property == prop
    assert raised.value.story == reduced.violation.story


def test_a_program_whose_every_step_is_needed_stays_as_it_is() -> None:
    program = _program(ReleaseKeepsLock, NEEDED)
    prop = _failing_property(ReleaseKeepsLock, program)
    assert reduce_program(_machine(ReleaseKeepsLock), program, prop) is None


def test_a_program_that_breaks_another_property_once_shortened_is_not_shortened() -> None:
    program = _program(ReleaseKeepsLock, _padded())
    others = [p.name for p in PROPERTIES if p.name != _failing_property(ReleaseKeepsLock, program)]
    assert reduce_program(_machine(ReleaseKeepsLock), program, others[0]) is None


def test_a_failure_that_stops_reproducing_keeps_the_original_program() -> None:
    BrokenOnlyAtFirst.built = 0
    program = _program(BrokenOnlyAtFirst, _padded())
    prop = _failing_property(BrokenOnlyAtFirst, program)
    # Candidates fail while the bug lasts; the confirming replay no longer does.
    assert reduce_program(_machine(BrokenOnlyAtFirst), program, prop) is None


class CountedReleaseKeepsLock(ReleaseKeepsLock):
    """The same bug, counting the handlers built: one per replay."""

    built = 0

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        type(self).built += 1


def test_the_replays_are_bounded_by_count_and_by_the_stop_test() -> None:
    program = _program(CountedReleaseKeepsLock, _padded())
    machine = _machine(CountedReleaseKeepsLock)
    prop = _failing_property(CountedReleaseKeepsLock, program)
    CountedReleaseKeepsLock.built = 0
    reduced = reduce_program(machine, program, prop, max_replays=4)
    assert CountedReleaseKeepsLock.built == 4
    assert reduced is not None and reduced.replays == 4
    assert len(reduced.program.steps) < len(program.steps)
    CountedReleaseKeepsLock.built = 0
    assert reduce_program(machine, program, prop, stop=lambda: True) is None
    assert CountedReleaseKeepsLock.built == 0


def test_a_program_not_in_the_printed_format_is_left_alone() -> None:
    assert parse_program("") is None
    assert parse_program("state = M()\ntry:\n    v1 = state.rule()\nfinally:\n    pass") is None
    text = _text(ReleaseKeepsLock, NEEDED).replace("state.setup(", "state.tick(seconds=1)\n#(")
    assert parse_program(text) is None


def test_the_runner_reports_the_reduced_story_message_and_program() -> None:
    text = _text(ReleaseKeepsLock, _padded())
    program = parse_program(text)
    assert program is not None
    violation = replay(_machine(ReleaseKeepsLock), program)
    assert violation is not None
    result = PropertyResult(
        name=violation.property,
        summary="",
        status=ResultStatus.FAILED,
        checks=1,
        message=violation.finding.message,
        story=violation.story,
        reproduction=text,
    )
    reduced = _reduced(result, _machine(ReleaseKeepsLock), seconds=60.0)
    assert reduced.name == result.name
    assert reduced.story.endswith(reduced.message)
    assert len(re.findall(r"^\s*\d+\. ", reduced.story, re.MULTILINE)) <= 3
    assert reduced.reproduction.count("\n    state.") == 1 + len(NEEDED) + 1
    # A story already short is left to shrinking's result.
    short = _text(ReleaseKeepsLock, NEEDED)
    kept = PropertyResult(
        name=violation.property,
        summary="",
        status=ResultStatus.FAILED,
        checks=1,
        reproduction=short,
    )
    assert _reduced(kept, _machine(ReleaseKeepsLock), seconds=60.0) is kept
