"""Every broken handler in the catalogue is caught, by a property expected to catch it.

Each entry runs the conformance state machine under the ``ci`` profile until
its first violation (seed 0, as a user's first ``dsm verify --profile ci``
would), and the test prints how many generated examples and seconds that
took, the shrunk program and the story.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from dsm_sim.broken import CATALOGUE, BrokenHandlerSpec
from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.properties import PROPERTY_NAMES
from dsm_sim.conformance.runner import ResultStatus, verify
from reference_engine.clock import ManualClock
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.property

SEED = 0
#: Bugs no run of tidy callers opened once shows: the restart (a worker's
#: close() and open(), or its instance replaced by a new one on the same store)
#: and the caller that changes its objects are what catch them, and their
#: stories must show that step.
EXPOSED_BY: dict[str, tuple[str, ...]] = {
    "close_releases_locks": ("restarts: close(), then open()", "a new one joins on the same store"),
    "get_returns_cached_data": ("changes, in place, the payload it passed",),
}
#: The reproduction and clean-pass tests keep the old, smaller budget: they
#: check the program, not the reach.
STEPS = 30


def test_catalogue_is_large_and_well_formed() -> None:
    assert len(CATALOGUE) >= 30  # docs/conformance.md promises these bugs, one entry each
    for name, spec in CATALOGUE.items():
        assert spec.name == name
        assert spec.bug.endswith(".") and spec.bug.count(". ") == 0, spec.bug
        assert spec.expected_properties, name
        assert set(spec.expected_properties) <= set(PROPERTY_NAMES), name
        handler = spec.factory(ManualClock())
        assert isinstance(handler, StateHandler)
        assert isinstance(handler, InMemoryStateHandler), "each entry is a small subclass"
        assert type(handler) is not InMemoryStateHandler, f"{name} has no bug of its own"


@pytest.mark.parametrize("spec", list(CATALOGUE.values()), ids=list(CATALOGUE))
def test_broken_handler_is_caught(
    spec: BrokenHandlerSpec, record_property: Callable[[str, object], None]
) -> None:
    report = verify(spec.factory, "ci", seed=SEED, stop_on_first=True)
    assert report.error is None, report.error
    assert len(report.violations) == 1, f"{spec.name} ({spec.bug}) was not caught"
    caught = report.violations[0]
    print(
        f"\n{spec.name}: caught by {caught.name} after {caught.examples_to_failure} examples, "
        f"{caught.seconds_to_failure:.2f}s including shrinking\n{caught.render()}"
    )
    record_property("caught_by", caught.name)
    record_property("examples_to_failure", caught.examples_to_failure)
    record_property("seconds_with_shrinking", caught.seconds_to_failure)
    record_property("found_as", caught.found_as)
    # Which property the first failing test case broke is fixed by the seed;
    # the shrunk story may end on another one (a real violation too) when the
    # shrink budget, in seconds, runs out on a slow or busy machine.
    assert caught.found_as in spec.expected_properties, caught.render()
    assert caught.name in PROPERTY_NAMES
    assert caught.status is ResultStatus.FAILED
    assert caught.message and caught.story.endswith(caught.message)
    # The shrunk program is runnable Python: it builds the machine and calls rules.
    assert caught.reproduction.startswith(
        "from dsm_sim.conformance.execute.machine import build_machine"
    )
    assert re.search(r"^state = HandlerConformance\(\)$", caught.reproduction, re.MULTILINE)
    assert caught.reproduction.rstrip().endswith("state.teardown()")
    assert caught.examples_to_failure is not None
    # Every story is short enough to read, and its program fails every time it runs.
    assert caught.story_steps <= 6, caught.render()
    assert caught.confirmed is not None and caught.confirmed[0] == caught.confirmed[1]
    if spec.name in EXPOSED_BY:
        assert any(phrase in caught.story for phrase in EXPOSED_BY[spec.name]), caught.render()


@pytest.mark.parametrize("name", ["no_fencing", "tenant_missing_from_key"])
def test_reproduction_runs_and_fails_as_reported(name: str) -> None:
    spec = CATALOGUE[name]
    report = verify(spec.factory, "ci", seed=SEED, stop_on_first=True, step_count=STEPS)
    caught = report.violations[0]
    namespace: dict[str, object] = {}
    with pytest.raises(AssertionError, match=caught.name):
        exec(compile(caught.reproduction, f"<reproduction of {name}>", "exec"), namespace)
    state = namespace["state"]
    assert isinstance(state, ConformanceMachine)
    state.teardown()  # already run by the program's ``finally``: a second call is a no-op


@pytest.mark.thorough  # TestInMemoryHandler and a full ci run (test_conformance_memory) pass it on every PR
def test_correct_handler_is_not_flagged_under_the_same_settings() -> None:
    report = verify(InMemoryStateHandler, "ci", seed=SEED, max_examples=60, step_count=STEPS)
    assert report.passed, [v.render() for v in report.violations]
