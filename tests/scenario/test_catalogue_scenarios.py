"""The broken handlers of the catalogue fail the scenarios that should catch them.

:data:`CATCHES` is the scenario -> broken-handler matrix: for each broken
handler, the scenarios whose faults expose its bug and the invariants that
must report it.  Handlers whose bug no scenario sees through the nodes (a race inside one
call that the history cannot place, an error detail longer than any node
writes, a ``set`` without data, key parts joined into one string) are listed
in :data:`NOT_OBSERVABLE`, each with the reason no node path reaches it; the
conformance kit catches those.
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
        frozenset(
            {"acquire_agrees_with_model", "allowed_transitions_only", "no_duplicate_side_effect"}
        ),
    ),
    "acquire_rereads_clock": (
        ("slow-worker",),
        frozenset({"errors_agree_with_model", "sweep_only_expired"}),
    ),
    "case_insensitive_keys": (
        ("tenants-and-keys",),
        frozenset({"exists_agrees_with_model", "key_identity"}),
    ),
    "check_then_insert_acquire": (
        ("duplicate-storm",),
        frozenset(
            {
                "at_most_one_live_lock",
                "errors_agree_with_model",
                "no_duplicate_side_effect",
                "sweep_only_expired",
            }
        ),
    ),
    "instance_locked_acquire": (
        ("duplicate-storm",),
        frozenset({"at_most_one_live_lock", "no_duplicate_side_effect"}),
    ),
    "completion_reads_then_writes": (
        ("time-grid",),
        frozenset({"allowed_transitions_only", "stale_write_rejected"}),
    ),
    "entity_missing_from_key": (
        ("correction-upserts",),
        frozenset({"allowed_transitions_only", "entity_isolation", "exists_agrees_with_model"}),
    ),
    "exists_true_for_failed": (
        ("crash-mid-dispatch",),
        frozenset({"exists_agrees_with_model"}),
    ),
    "exists_true_for_processing": (
        ("duplicate-storm",),
        frozenset({"exists_agrees_with_model"}),
    ),
    "expired_not_retryable": (
        ("retention-window",),
        frozenset({"acquire_agrees_with_model"}),
    ),
    "expires_without_retention": (
        ("retention-window",),
        frozenset({"retention_sweep_agrees_with_model"}),
    ),
    "fencing_ignores_status": (
        ("slow-worker",),
        frozenset({"allowed_transitions_only", "stale_write_rejected"}),
    ),
    "first_node_options_for_all": (
        ("correction-upserts",),
        frozenset({"lock_duration_honoured"}),
    ),
    "floats_to_fifteen_digits": (
        ("correction-upserts",),
        frozenset({"errors_agree_with_model"}),
    ),
    "ignores_configured_lock_duration": (
        ("duplicate-storm",),
        frozenset({"lock_duration_honoured"}),
    ),
    "inclusive_lock_boundary": (
        ("time-grid",),
        frozenset({"at_most_one_live_lock", "no_duplicate_side_effect"}),
    ),
    "inclusive_retention_boundary": (
        ("time-grid",),
        frozenset({"retention_sweep_agrees_with_model"}),
    ),
    "jsonb_refuses_nul": (
        ("correction-upserts",),
        frozenset({"record_agrees_with_model"}),
    ),
    "local_time_not_utc": (
        ("duplicate-storm",),
        frozenset({"timestamps_in_utc"}),
    ),
    "lock_duration_in_milliseconds": (
        ("duplicate-storm",),
        frozenset(
            {
                "at_most_one_live_lock",
                "errors_agree_with_model",
                "lock_duration_honoured",
                "no_duplicate_side_effect",
                "sweep_only_expired",
            }
        ),
    ),
    "naive_local_expiry": (
        ("time-grid",),
        frozenset(
            {
                "at_most_one_live_lock",
                "errors_agree_with_model",
                "lock_duration_honoured",
                "no_duplicate_side_effect",
                "sweep_only_expired",
            }
        ),
    ),
    "no_fencing": (
        ("slow-worker",),
        frozenset({"allowed_transitions_only", "stale_write_rejected"}),
    ),
    "normalises_unicode_keys": (
        ("tenants-and-keys",),
        frozenset({"exists_agrees_with_model", "key_identity"}),
    ),
    "numbers_as_doubles": (
        ("correction-upserts",),
        frozenset({"data_round_trip"}),
    ),
    "release_keeps_lock": (
        ("flaky-store",),
        frozenset({"allowed_transitions_only", "record_agrees_with_model"}),
    ),
    "status_compare_and_set_acquire": (
        ("race-windows",),
        frozenset(
            {"at_most_one_live_lock", "no_duplicate_side_effect", "record_agrees_with_model"}
        ),
    ),
    "release_reads_then_writes": (
        ("race-windows",),
        frozenset({"allowed_transitions_only", "stale_write_rejected"}),
    ),
    "retention_from_created_at": (
        ("duplicate-storm",),
        frozenset({"record_agrees_with_model"}),
    ),
    "scope_missing_from_key": (
        ("screening-rules",),
        frozenset({"exists_agrees_with_model", "scope_isolation"}),
    ),
    "set_keeps_lock": (
        ("duplicate-storm",),
        frozenset({"completion_releases_lock"}),
    ),
    "strips_keys": (
        ("tenants-and-keys",),
        frozenset({"exists_agrees_with_model", "key_identity"}),
    ),
    "sweep_ignores_locked_until": (
        ("duplicate-storm",),
        frozenset({"errors_agree_with_model", "sweep_only_expired"}),
    ),
    "sweeps_on_updated_at": (
        ("crash-mid-dispatch",),
        frozenset({"sweep_resets_expired"}),
    ),
    "tenant_case_folded": (
        ("tenants-and-keys",),
        frozenset({"exists_agrees_with_model", "tenant_isolation"}),
    ),
    "tenant_missing_from_key": (
        ("duplicate-storm",),
        frozenset({"exists_agrees_with_model", "tenant_isolation"}),
    ),
    "token_not_incremented": (
        ("crash-mid-dispatch",),
        frozenset(
            {"acquire_agrees_with_model", "at_most_one_live_lock", "no_duplicate_side_effect"}
        ),
    ),
    "truncates_long_keys": (
        ("tenants-and-keys",),
        frozenset({"exists_agrees_with_model", "key_identity"}),
    ),
    "upsert_overwrites_in_place": (
        ("correction-upserts",),
        frozenset({"upsert_keeps_history"}),
    ),
    # Reached by the approval node and the option extremes (empty objects, integers past
    # 65 digits, blank details, several source apps, sub-second and day-long locks,
    # retention past 2038, keys outside Latin-1) and by worker restarts.
    "accent_insensitive_keys": (
        ("option-extremes",),
        frozenset({"exists_agrees_with_model", "key_identity"}),
    ),
    "close_releases_locks": (
        ("crash-mid-dispatch",),
        frozenset(
            {
                "at_most_one_live_lock",
                "errors_agree_with_model",
                "record_agrees_with_model",
                "sweep_only_expired",
            }
        ),
    ),
    "drops_empty_values": (("approvals",), frozenset({"data_round_trip"})),
    "error_detail_trimmed": (("option-extremes",), frozenset({"record_agrees_with_model"})),
    "get_returns_cached_data": (("approvals",), frozenset({"data_round_trip"})),
    "integers_clamped_to_decimal65": (("approvals",), frozenset({"data_round_trip"})),
    "lock_rounded_to_seconds": (
        ("option-extremes",),
        frozenset({"at_most_one_live_lock", "lock_duration_honoured", "no_duplicate_side_effect"}),
    ),
    "retention_as_int32_seconds": (
        ("option-extremes",),
        frozenset({"record_agrees_with_model", "retention_sweep_agrees_with_model"}),
    ),
    "source_app_from_insert": (("approvals",), frozenset({"record_agrees_with_model"})),
    # Reached by the scenario dimensions (month-end): a start just before midnight, a node
    # redeployed with other options mid-run, histories longer than a page expired by
    # retention mid-run, and a tenant whose records are only ever upserted.
    "lock_wraps_at_midnight": (
        ("month-end",),
        frozenset(
            {
                "at_most_one_live_lock",
                "lock_duration_honoured",
                "record_agrees_with_model",
                "sweep_only_expired",
            }
        ),
    ),
    "keeps_first_lock_duration": (
        ("month-end",),
        frozenset(
            {
                "acquire_agrees_with_model",
                "at_most_one_live_lock",
                "lock_duration_honoured",
                "record_agrees_with_model",
                "sweep_only_expired",
            }
        ),
    ),
    "history_sweep_pages_newest": (
        ("month-end",),
        frozenset({"retention_sweep_agrees_with_model", "upsert_keeps_history"}),
    ),
    "sweep_skips_tenants_never_acquired": (
        ("month-end",),
        frozenset({"retention_sweep_agrees_with_model", "upsert_keeps_history"}),
    ),
    "retention_counts_current_only": (
        ("retention-window",),
        frozenset({"retention_sweep_agrees_with_model"}),
    ),
    "completion_lost_on_expired_lock": (
        ("time-grid",),
        frozenset(
            {"record_agrees_with_model", "allowed_transitions_only", "no_duplicate_side_effect"}
        ),
    ),
    "open_fails_live_locks": (
        ("crash-mid-dispatch",),
        frozenset({"record_agrees_with_model", "no_duplicate_side_effect"}),
    ),
}

#: Bugs no node path reaches, each with why; left to the conformance kit.
#: The simulator splits a call into round trips at the call's own bare awaits; a
#: task the call starts runs to its end inside one of them.
_IN_A_CHILD_TASK = (
    "its race runs inside a task the call starts, which the simulator runs within one round "
    "trip: the conformance kit's scheduler interleaves it"
)
NOT_OBSERVABLE: dict[str, str] = {
    "acquire_in_child_task": _IN_A_CHILD_TASK,
    "upsert_shielded": _IN_A_CHILD_TASK,
    "completion_under_wait_for": _IN_A_CHILD_TASK,
    "release_in_gather": _IN_A_CHILD_TASK,
    "entity_id_truncated": "the entity id is the node id, at most 63 characters: none is cut at 128",
    "get_reads_payload_apart": (
        "the record it stitches has the new data under the old status, and a node acts on "
        "what get returned only through its data, which is right"
    ),
    "keys_limited_in_bytes": (
        "the workload's longest key parts are 256 ASCII characters: no key reaches 2,704 bytes"
    ),
    "error_detail_truncated_in_bytes": "no node writes an error detail near 4,000 bytes",
    "fencing_by_execution_id": (
        "an execution takes at most one lock per item, so its execution id and its token agree"
    ),
    "joins_key_parts_with_colon": (
        "a collision needs a colon shifted across a part boundary; node ids hold no colon"
    ),
    "retention_sweep_keeps_version": (
        "the catch-up worker runs the lock sweep right before the retention sweep, so an expired "
        "lock is reset (and its version bumped) before retention can expire it under its holder"
    ),
    "retention_sweep_selects_then_updates": (
        "the simulator runs each sweep in one step: no call lands between its select and update"
    ),
    "set_without_data_clears_data": "every node's set carries data",
    "payload_merged_into_record": (
        "the payloads the nodes store read back unchanged under it: none has a field the "
        "record document keeps (approvals and duplicate-storm, seeds 1-3, pass)"
    ),
    "parses_json_looking_text": "no node writes text that parses as JSON into its payload",
    "error_detail_crlf_to_lf": "the decline reasons break lines with LF alone, never CRLF",
    "token_compared_as_text": (
        "a holder's late write meets a token past a digit boundary only after ten take-overs "
        "of one item, which no committed scenario's seeds reach"
    ),
    "hash_placed_keys": "the workload's keys are invoice numbers: no two share a CRC-32",
    "upsert_checks_then_writes": (
        "an acquire must land in the one round trip between the upsert's check and its write; "
        "lock-free amendments never meet an approval there on the committed scenarios' seeds"
    ),
}

PAIRS = [(name, scenario) for name, (scenarios, _) in CATCHES.items() for scenario in scenarios]


def test_every_catalogue_entry_is_mapped() -> None:
    """A new broken handler must be added to the matrix (or explicitly left out)."""
    known = set(CATCHES) | set(NOT_OBSERVABLE)
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
