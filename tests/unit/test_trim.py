"""Trimming after shrinking: padded programs lose the steps their violation does not need."""

from __future__ import annotations

import re

import pytest

from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD, Role
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.properties import PROPERTIES, PropertyViolation
from dsm_sim.conformance.runner import PropertyResult, ResultStatus, factory_path, trimmed
from dsm_sim.conformance.tell.trim import replay, trim
from reference_engine.clock import Clock
from reference_engine.handler import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

NAME = "HandlerConformance"
#: The two steps the bug needs: a lock taken, then given up.
NEEDED = [
    Call.of("try_acquire_lock", worker=1, item=Role.HOT),
    Call.of("release_lock_as_failed", worker=1, item=Role.HOT, error="boom"),
]
#: Steps that touch nothing the bug depends on.
PADDING = [
    Call.of("expire_past_retention"),
    Call.of("get", worker=2, item=Role.NEIGHBOUR),
    Call.of("exists", worker=3, item=Role.TENANT),
    Call.of("tick", seconds=1),
    Call.of("reset_expired_locks"),
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


def _padded() -> list[Call]:
    before = [PADDING[i % len(PADDING)] for i in range(15)]
    after = [PADDING[(i + 2) % len(PADDING)] for i in range(15)]
    return [*before, NEEDED[0], *after, NEEDED[1]]


def _program(steps: list[Call]) -> Program:
    return Program((Call.of("setup", world=DEFAULT_WORLD), *steps))


def _render(factory: type[InMemoryStateHandler], program: Program) -> str:
    return program.render(factory_path(factory), machine_name=NAME)


def _machine(factory: type[InMemoryStateHandler]) -> type[ConformanceMachine]:
    return build_machine(factory, name=NAME)


def _failing_property(factory: type[InMemoryStateHandler], program: Program) -> str:
    violation = replay(_machine(factory), program)
    assert violation is not None, "the program must fail before it is reduced"
    return violation.property


def test_a_padded_program_loses_its_padding_and_breaks_the_same_property() -> None:
    program = _program(_padded())
    assert len(program.body) == 32
    prop = _failing_property(ReleaseKeepsLock, program)
    reduced = trim(_machine(ReleaseKeepsLock), program, prop)
    assert reduced is not None
    assert list(reduced.program.body) == NEEDED
    assert reduced.violation.property == prop
    story_steps = re.findall(r"^\s*\d+\. ", reduced.violation.story, re.MULTILINE)
    assert len(story_steps) <= 3
    assert reduced.program.setup == program.setup  # the world is kept


def test_the_same_program_reduces_the_same_way_every_time() -> None:
    program = _program(_padded())
    prop = _failing_property(ReleaseKeepsLock, program)
    first = trim(_machine(ReleaseKeepsLock), program, prop)
    second = trim(_machine(ReleaseKeepsLock), program, prop)
    assert first is not None and second is not None
    assert first.program == second.program
    assert first.replays == second.replays


def test_the_reduced_reproduction_runs_as_pasted_and_fails_as_reported() -> None:
    program = _program(_padded())
    prop = _failing_property(ReleaseKeepsLock, program)
    reduced = trim(_machine(ReleaseKeepsLock), program, prop)
    assert reduced is not None
    text = _render(ReleaseKeepsLock, reduced.program)
    assert "from dsm_sim.conformance.execute.machine import build_machine" in text
    assert re.search(rf"^state = {NAME}\(\)$", text, re.MULTILINE)
    assert text.rstrip().endswith("finally:\n    state.teardown()")
    namespace: dict[str, object] = {}
    with pytest.raises(PropertyViolation) as raised:
        exec(compile(text, "<reduced reproduction>", "exec"), namespace)
    assert raised.value.property == prop
    assert raised.value.story == reduced.violation.story


def test_a_program_whose_every_step_is_needed_stays_as_it_is() -> None:
    program = _program(NEEDED)
    prop = _failing_property(ReleaseKeepsLock, program)
    assert trim(_machine(ReleaseKeepsLock), program, prop) is None


def test_a_program_that_breaks_another_property_once_shortened_is_not_shortened() -> None:
    program = _program(_padded())
    others = [p.name for p in PROPERTIES if p.name != _failing_property(ReleaseKeepsLock, program)]
    assert trim(_machine(ReleaseKeepsLock), program, others[0]) is None


def test_a_failure_that_stops_reproducing_keeps_the_original_program() -> None:
    BrokenOnlyAtFirst.built = 0
    program = _program(_padded())
    prop = _failing_property(BrokenOnlyAtFirst, program)
    # Candidates fail while the bug lasts; the confirming replay no longer does.
    assert trim(_machine(BrokenOnlyAtFirst), program, prop) is None


class CountedReleaseKeepsLock(ReleaseKeepsLock):
    """The same bug, counting the handlers built: one per replay."""

    built = 0

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        type(self).built += 1


def test_the_replays_are_bounded_by_count_and_by_the_stop_test() -> None:
    program = _program(_padded())
    machine = _machine(CountedReleaseKeepsLock)
    prop = _failing_property(CountedReleaseKeepsLock, program)
    CountedReleaseKeepsLock.built = 0
    reduced = trim(machine, program, prop, max_replays=4)
    assert CountedReleaseKeepsLock.built == 4
    assert reduced is not None and reduced.replays == 4
    assert len(reduced.program.body) < len(program.body)
    CountedReleaseKeepsLock.built = 0
    assert trim(machine, program, prop, stop=lambda: True) is None
    assert CountedReleaseKeepsLock.built == 0


def test_a_program_must_start_by_entering_its_world() -> None:
    with pytest.raises(ValueError, match="entering its world"):
        Program((Call.of("tick", seconds=1),))
    with pytest.raises(ValueError, match="entering its world"):
        Program(())


def test_long_text_prints_as_a_product_and_builds_the_same_value() -> None:
    value = {"blob": "x" * 5000 + "é", "n": [1.5e300, -0.0, 2**64]}
    program = _program([Call.of("upsert", worker=1, item=Role.HOT, data=value)])
    text = _render(ReleaseKeepsLock, program)
    assert "'x' * 5000 + 'é'" in text
    line = next(line for line in text.splitlines() if "state.upsert(" in line)
    assert len(line) < 200
    arguments = line.strip().removeprefix("state.upsert(").removesuffix(")")
    rebuilt = eval(f"dict({arguments})", {"Role": Role})
    assert rebuilt["data"] == value
    assert str(rebuilt["data"]["n"][1]) == "-0.0"


def test_the_runner_reports_the_trimmed_story_message_and_program() -> None:
    program = _program(_padded())
    violation = replay(_machine(ReleaseKeepsLock), program)
    assert violation is not None
    result = PropertyResult(
        name=violation.property,
        summary="",
        status=ResultStatus.FAILED,
        checks=1,
        message=violation.finding.message,
        story=violation.story,
        reproduction=_render(ReleaseKeepsLock, program),
        program=program,
    )

    def render(found: Program) -> str:
        return _render(ReleaseKeepsLock, found)

    reduced = trimmed(result, _machine(ReleaseKeepsLock), 60.0, render=render)
    assert reduced.name == result.name
    assert reduced.story.endswith(reduced.message)
    assert len(re.findall(r"^\s*\d+\. ", reduced.story, re.MULTILINE)) <= 3
    assert reduced.reproduction.count("\n    state.") == 1 + len(NEEDED) + 1
    assert reduced.program is not None and list(reduced.program.body) == NEEDED
    # A story already short is left to shrinking's result.
    short = _program(NEEDED)
    kept = PropertyResult(
        name=violation.property,
        summary="",
        status=ResultStatus.FAILED,
        checks=1,
        reproduction=render(short),
        program=short,
    )
    assert trimmed(kept, _machine(ReleaseKeepsLock), 60.0, render=render) is kept
