"""Stories that show what matters (issue 34, item 7).

Payloads that play no part in the finding are made as light as they can be
before the story is told.
"""

from __future__ import annotations

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.machine import ConformanceMachine, build_machine
from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD, Role
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.runner import verify
from dsm_sim.conformance.tell.trim import lighten_payloads, replay

pytestmark = pytest.mark.unit

#: A payload just under the size limit: the kind the payloads probe passes.
HEAVY = {"blob": "\u00e9" * 131_000}


def _machine(name: str) -> type[ConformanceMachine]:
    return build_machine(CATALOGUE[name].factory, stats=RunStats())


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
