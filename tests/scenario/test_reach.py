"""Each class of handler bug is caught end to end: real nodes, real checker, a seeded scenario.

The handlers are this directory's own (:mod:`local_broken`), not the
catalogue's, so the scenarios are not tuned to the bugs they are proven
against.  Each case names the scenario that targets the bug's class and the
properties that may report it; the control case runs the same scenarios and
seeds with the reference handler and must pass.
"""

from __future__ import annotations

from pathlib import Path

import local_broken as lb
import pytest

from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario
from reference_engine.handler import HandlerFactory

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SEEDS = (1, 2, 3)

#: handler, the scenario that targets its class, the properties that may report it
REACH: dict[str, tuple[HandlerFactory, str, frozenset[str]]] = {
    "lock_duration_honoured": (
        lb.AlwaysThirtyMinuteLocks,
        "short-locks",
        frozenset({"lock_duration_honoured"}),
    ),
    "sweep_resets_expired": (
        lb.SweepsOnUpdatedAt,
        "short-locks",
        frozenset({"sweep_resets_expired", "terminal_within_deadline"}),
    ),
    "upsert_keeps_history": (
        lb.UpsertUpdatesInPlace,
        "correction-upserts",
        frozenset({"upsert_keeps_history"}),
    ),
    "key_identity": (
        lb.StripsAndLowercasesKeys,
        "tenants-and-keys",
        frozenset({"key_identity"}),
    ),
    "tenant_isolation": (
        lb.KeysWithoutTenant,
        "tenants-and-keys",
        frozenset({"tenant_isolation"}),
    ),
    "scope_isolation": (
        lb.KeysWithoutScope,
        "screening-rules",
        frozenset({"scope_isolation"}),
    ),
    "spent_token_rejected": (
        lb.FencesOnAttemptOnly,
        "lost-replies",
        frozenset({"spent_token_rejected", "stale_write_rejected"}),
    ),
    "timestamps_in_utc": (
        lb.NaiveLocalExpiry,
        "time-grid",
        frozenset({"timestamps_in_utc", "lock_duration_honoured"}),
    ),
    "at_most_one_live_lock": (
        lb.InclusiveExpiry,
        "time-grid",
        frozenset({"at_most_one_live_lock"}),
    ),
    "record_agrees_with_model": (
        lb.RetentionFromFirstWrite,
        "retention-window",
        frozenset({"record_agrees_with_model"}),
    ),
    "data_round_trip": (
        lb.StripsNulAndRoundsFloats,
        "tenants-and-keys",
        frozenset({"data_round_trip"}),
    ),
    "exists_agrees_with_model": (
        lb.ExistsTrueForExpiredLock,
        "short-locks",
        frozenset({"exists_agrees_with_model"}),
    ),
}


@pytest.mark.parametrize("prop", sorted(REACH))
def test_bug_class_is_caught_end_to_end(prop: str) -> None:
    factory, scenario_name, expected = REACH[prop]
    scenario = load_scenario(SCENARIOS / f"{scenario_name}.toml")
    for seed in SEEDS:
        result = run_scenario(scenario, seed, factory, handler_name=f"local:{prop}")
        if not result.passed:
            assert set(result.violated) & expected, (
                f"seed {seed}: reported {result.violated}, expected one of {sorted(expected)}"
            )
            return
    pytest.fail(f"{factory.__name__} survived {scenario_name} on seeds {SEEDS}")


def test_reference_handler_passes_the_same_runs() -> None:
    """The control: every scenario above is clean with the reference handler."""
    for name in sorted({scenario for _, scenario, _ in REACH.values()}):
        scenario = load_scenario(SCENARIOS / f"{name}.toml")
        for seed in SEEDS:
            result = run_scenario(scenario, seed)
            assert result.passed, f"{name} seed {seed}: {result.violated}"
