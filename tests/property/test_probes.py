"""The edge probes: every run meets the domain's edges, whatever its seed.

A probe is a fixed program; these tests check that each one runs to its end
on a correct handler without a finding, that the edge bugs of the catalogue
are found by the probes alone (no search), and that a probe's finding is
reported like the search's: first, trimmed, with a program that replays it.
"""

from __future__ import annotations

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.generate.payloads import ERROR_DETAILS
from dsm_sim.conformance.generate.probes import PROBES
from dsm_sim.conformance.generate.worlds import UTC_ZONE, ZONES, Role, Spelt
from dsm_sim.conformance.probing import probe_findings
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.conformance.tell.trim import replay
from dsm_sim.model import WORLD_CONFIGS, ItemRef
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler
from reference_engine.handlers.sql.factory import sqlite_file_handler
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.property

PATH = "reference_engine.handlers.memory:in_memory_handler"

#: Catalogue entries whose bug sits on an edge of the domain: the probes alone find each.
EDGE_BUGS = (
    "error_detail_trimmed",
    "error_detail_truncated_in_bytes",
    "truncates_long_keys",
    "strips_keys",
    "normalises_unicode_keys",
    "entity_id_truncated",
    "tenant_case_folded",
    "lock_rounded_to_seconds",
    "retention_as_int32_seconds",
    "naive_local_expiry",
    "inclusive_lock_boundary",
    "inclusive_retention_boundary",
    "sweeps_on_updated_at",
    "integers_clamped_to_decimal65",
    "numbers_as_doubles",
    "drops_empty_values",
    "jsonb_refuses_nul",
    "payload_merged_into_record",
    "parses_json_looking_text",
    "error_detail_crlf_to_lf",
    "token_compared_as_text",
    "hash_placed_keys",
)


def test_the_probes_walk_every_edge_table() -> None:
    """Every error detail, configuration, zone and spelt field has a probe that uses it."""
    text = "\n".join(
        line
        for probe in PROBES
        for line in (repr(probe.world), *(call.render() for call in probe.calls))
    )
    assert all(probe.program.render(PATH) for probe in PROBES)
    for detail in ERROR_DETAILS:
        shown = repr(detail) if len(detail) <= 64 else repr(detail[0])
        assert shown in text, f"no probe releases with {detail[:20]!r}"
    for name in WORLD_CONFIGS:
        if name != "standard":
            assert f"config=ItemRef.CONFIGS[{name!r}]" in text or (
                name == "forever" and "ItemRef.FOREVER" in text
            ), name
    for zone in ZONES:
        if zone != UTC_ZONE:
            assert f"zone={zone!r}" in text, zone
    names = {probe.name for probe in PROBES}
    for spelt in Spelt:
        assert f"near spellings of the {spelt.value.replace('_', ' ')}" in names


# On a SQL store with the thorough tier: on every pull request the suite classes of
# tests/property/test_conformance_sql.py run every probe on SQLite and PostgreSQL.
@pytest.mark.parametrize(
    "factory", [in_memory_handler, pytest.param(sqlite_file_handler, marks=pytest.mark.thorough)]
)
def test_every_probe_runs_to_its_end_on_a_correct_handler(factory: HandlerFactory) -> None:
    machine = build_machine(factory, stats=RunStats())
    for probe in PROBES:
        program = probe.program
        state = machine()
        try:
            for call in program.steps:  # a probe step that raises fails this test
                call.run_on(state)
            assert not state.diverged, probe.name
            steps = sum(1 for call in probe.calls if call.rule != "enter_world")
            # Rules with nothing to act on (no retention to reach) write no step.
            assert len(state.steps) >= steps * 0.8, probe.name
        finally:
            state.teardown()
    assert not list(probe_findings(machine, found=frozenset))


@pytest.mark.parametrize("name", EDGE_BUGS)
def test_the_probes_alone_find_each_edge_bug(name: str) -> None:
    spec = CATALOGUE[name]
    machine = build_machine(spec.factory, stats=RunStats())
    findings = list(probe_findings(machine, found=frozenset))
    assert findings, f"{name} ({spec.bug}) passed every probe"
    assert findings[0].violation.property in spec.expected_properties, findings[
        0
    ].violation.finding.message


def test_a_probe_finding_comes_first_trimmed_and_replays() -> None:
    spec = CATALOGUE["entity_id_truncated"]
    report = verify(spec.factory, "dev", seed=0, stop_on_first=True)
    first = report.violations[0]
    assert first.found_by == "near spellings of the entity"
    assert first.status is ResultStatus.FAILED and first.examples_to_failure == 0
    assert "Found by the edge probe 'near spellings of the entity'" in first.render()
    program = first.program
    assert program is not None
    assert "state.setup(world=" in first.reproduction
    # Trimmed from the probe's dozens of worlds to the steps that matter.
    assert len(program.body) <= 5 and first.story_steps <= 6
    violation = replay(build_machine(spec.factory, stats=RunStats()), program)
    assert violation is not None and violation.property == first.name
    assert report.test_cases == 0  # stop_on_first: the search never ran


def test_the_search_explores_the_same_test_cases_with_or_without_probes() -> None:
    probed = verify(in_memory_handler, "dev", seed=5)
    alone = verify(in_memory_handler, "dev", seed=5, probes=False)
    assert not probed.violations and not alone.violations
    assert (probed.test_cases, probed.steps) == (alone.test_cases, alone.steps)
    assert probed.probes == len(PROBES) and alone.probes == 0
    assert "edge probes" in probed.explored() and "edge probes" not in alone.explored()


def test_a_world_entered_over_existing_records_starts_from_them() -> None:
    """enter_world reads back a record an earlier world left: no false transition."""
    machine = build_machine(in_memory_handler, stats=RunStats())
    world = PROBES[0].world
    renamed = type(world)(
        tuple(
            ItemRef(ref.tenant, ref.scope, ref.item, ref.entity, ref.entity_key, ref.config)
            for ref in world.refs
        )
    )
    program = Program(
        (
            Call.of("setup", world=world),
            Call.of("try_acquire_lock", worker=1, item=Role.HOT),
            Call.of("set", worker=1, item=Role.HOT, status=IdempotencyStatus.PROCESSED, data=None),
            Call.of("enter_world", world=renamed),
            Call.of("skip_item", worker=2, item=Role.HOT),
        )
    )
    assert replay(machine, program) is None


def test_a_leading_entered_world_is_folded_into_setup() -> None:
    first, second = PROBES[2].world, PROBES[3].world
    program = Program(
        (
            Call.of("setup", world=first),
            Call.of("enter_world", world=second),
            Call.of("try_acquire_lock", worker=1, item=Role.HOT),
        )
    )
    folded = program.folded()
    assert folded.setup == Call.of("setup", world=second)
    assert [call.rule for call in folded.body] == ["try_acquire_lock"]
    assert folded.folded() == folded  # nothing left to fold


def test_the_begin_probe_runs_only_where_the_handler_has_its_own_begin() -> None:
    plain = type("PlainSubclass", (InMemoryStateHandler,), {})
    without = verify(plain, "dev", seed=1, max_examples=1)
    with_begin = verify(in_memory_handler, "dev", seed=1, max_examples=1)
    needs_begin = [probe for probe in PROBES if probe.requires == "begin"]
    assert needs_begin
    assert without.probes == len(PROBES) - len(needs_begin)
    assert with_begin.probes == len(PROBES)
