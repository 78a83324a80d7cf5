"""A sweep that raises or answers a broken value is a finding, with its story.

The catch-up worker trusts a lock sweep's answer.  A sweep that silently
does nothing is caught by the liveness checks; one that raises, or answers
``None``, -1 or a count that disagrees with the locks it reset, used to pass
most runs of the scenarios that exercise the sweep.  Each is now reported by
the kit's property it breaks (``errors_agree_with_model`` for a sweep that
raises or answers no count, ``sweep_only_expired`` or ``sweep_resets_expired``
for a count that disagrees) on every one of those scenarios, with the sweep
operation and what it answered; the reference handler passes the same runs.
"""

from __future__ import annotations

from pathlib import Path

import local_broken as lb
import pytest

from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.memory import in_memory_handler

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
#: The scenarios whose runs exercise the lock sweep.
SWEPT = ("crash-mid-dispatch", "catchup-outage", "short-locks", "slow-worker", "clock-jump-forward")
SEED = 1

#: broken handler -> a phrase of its finding
BROKEN: dict[str, tuple[HandlerFactory, str, str]] = {
    "raises": (lb.SweepRaises, "errors_agree_with_model", "raised RuntimeError"),
    "answers None": (
        lb.SweepAnswersNothing,
        "errors_agree_with_model",
        "answered None, which is not a count",
    ),
    "answers -1": (
        lb.SweepAnswersMinusOne,
        "errors_agree_with_model",
        "answered -1, which is not a count",
    ),
    "counts one more": (
        lb.SweepCountsOneMore,
        "sweep_only_expired",
        "must be the number of locks it reset",
    ),
}
#: What the reference handler's sweeps are judged under.
SWEEP_PROPERTIES = ("errors_agree_with_model", "sweep_only_expired", "sweep_resets_expired")


@pytest.mark.parametrize("scenario", SWEPT)
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_sweep_that_cannot_be_trusted_is_a_finding_with_its_story(
    broken: str, scenario: str
) -> None:
    factory, name, phrase = BROKEN[broken]
    run = run_scenario(load_scenario(SCENARIOS / f"{scenario}.toml"), SEED, factory)
    assert name in run.violated, run.violated
    result = next(r for r in run.results if r.name == name)
    first = next(v for v in result.violations if phrase in v.message)
    assert first.message.startswith("the lock sweep (op #")
    (index,) = first.ops
    assert run.history.ops[index].op.value == "reset_expired_locks"


def test_a_sweep_that_hides_the_locks_it_reset_is_a_finding() -> None:
    # Answering 0 is only wrong when the sweep did reset something: crash-mid-dispatch
    # leaves expired locks behind for it on every seed.
    run = run_scenario(
        load_scenario(SCENARIOS / "crash-mid-dispatch.toml"), SEED, lb.SweepAlwaysAnswersZero
    )
    result = next(r for r in run.results if r.name == "sweep_resets_expired")
    assert not result.passed
    assert any("answered 0 but changed" in v.message for v in result.violations)


@pytest.mark.parametrize("scenario", SWEPT)
def test_the_reference_handlers_sweeps_answer_truthfully(scenario: str) -> None:
    run = run_scenario(load_scenario(SCENARIOS / f"{scenario}.toml"), SEED, in_memory_handler)
    for name in SWEEP_PROPERTIES:
        result = next(r for r in run.results if r.name == name)
        assert result.passed, [v.message for v in result.violations]
    swept = [op for op in run.history.ops if op.op.value == "reset_expired_locks"]
    assert swept and all(op.ok for op in swept)
    assert all(op.result == len(op.keys) for op in swept)
