"""The broken handlers of the catalogue fail the scenarios that should catch them.

:data:`CATCHES` is the scenario -> broken-handler matrix: for each broken
handler, the scenarios whose faults expose its bug and the invariants that
must report it.  Handlers whose bug no node-level workload can observe (it
needs retention expiry, an exact boundary instant, a second scope, data
read-back or upserts) are listed in :data:`NOT_OBSERVABLE`; the conformance
kit catches those.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SEEDS = (1, 2, 3)

#: broken handler -> (scenarios that catch it, invariants that may report it)
CATCHES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "acquire_over_processed": (
        ("duplicate-storm",),
        frozenset({"only_allowed_transitions", "no_duplicate_side_effect"}),
    ),
    "check_then_insert_acquire": (
        ("duplicate-storm",),
        frozenset({"single_live_lock", "no_duplicate_side_effect"}),
    ),
    "exists_true_for_failed": (
        ("crash-mid-dispatch", "flaky-store", "catchup-outage"),
        frozenset({"exists_agrees_with_writes"}),
    ),
    "exists_true_for_processing": (
        ("duplicate-storm", "crash-mid-dispatch"),
        frozenset({"exists_agrees_with_writes"}),
    ),
    "lock_duration_in_milliseconds": (
        ("duplicate-storm", "slow-worker"),
        frozenset({"sweep_spares_live_locks", "single_live_lock"}),
    ),
    "no_fencing": (("slow-worker",), frozenset({"fencing_rejects_stale_writes"})),
    "release_keeps_lock": (("flaky-store",), frozenset({"only_allowed_transitions"})),
    "sweep_ignores_locked_until": (
        ("crash-mid-dispatch", "clock-jump-forward", "slow-worker"),
        frozenset({"sweep_spares_live_locks"}),
    ),
    "tenant_missing_from_key": (("duplicate-storm",), frozenset({"exists_agrees_with_writes"})),
    "token_not_incremented": (
        ("slow-worker", "crash-mid-dispatch"),
        frozenset({"single_live_lock"}),
    ),
}

#: Bugs no scenario can see through the invoice node; left to the conformance kit.
NOT_OBSERVABLE = frozenset(
    {
        "entity_missing_from_key",
        "expired_not_retryable",
        "expires_without_retention",
        "inclusive_lock_boundary",
        "inclusive_retention_boundary",
        "local_time_not_utc",
        "scope_missing_from_key",
        "set_keeps_lock",
        "set_without_data_clears_data",
        "upsert_overwrites_in_place",
    }
)

PAIRS = [(name, scenario) for name, (scenarios, _) in CATCHES.items() for scenario in scenarios]


def test_every_catalogue_entry_is_mapped() -> None:
    """A new broken handler must be added to the matrix (or explicitly left out)."""
    known = set(CATCHES) | NOT_OBSERVABLE
    present = set(CATALOGUE)
    assert present - known == set(), "add these to CATCHES or NOT_OBSERVABLE"
    assert known - present == set(), "these entries left the catalogue"


@pytest.mark.parametrize(("broken", "scenario_name"), PAIRS, ids=[f"{b}@{s}" for b, s in PAIRS])
def test_broken_handler_is_caught(broken: str, scenario_name: str) -> None:
    scenario = load_scenario(SCENARIOS / f"{scenario_name}.toml")
    expected = CATCHES[broken][1]
    caught = []
    for seed in SEEDS:
        result = run_scenario(
            scenario, seed, CATALOGUE[broken].factory, handler_name=f"broken:{broken}"
        )
        if not result.passed:
            caught.append(seed)
            assert set(result.violated) & expected, (
                f"seed {seed}: reported {result.violated}, expected one of {sorted(expected)}"
            )
            assert f"--handler broken:{broken}" in result.replay
    assert caught, f"{broken} survived {scenario_name} on seeds {SEEDS}"


def test_correct_handler_passes_where_broken_ones_fail() -> None:
    """The control: the same scenarios and seeds are clean with the reference handler."""
    for scenario_name in sorted({s for _, s in PAIRS}):
        scenario = load_scenario(SCENARIOS / f"{scenario_name}.toml")
        for seed in SEEDS:
            assert run_scenario(scenario, seed).passed, f"{scenario_name} seed {seed}"
