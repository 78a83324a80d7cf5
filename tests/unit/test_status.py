"""The transition table: every pair is either allowed or refused with a clear error."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from reference_engine.errors import ForbiddenTransitionError
from reference_engine.status import (
    TRANSITIONS,
    IdempotencyStatus,
    check_path,
    check_transition,
    is_allowed,
    mermaid_state_diagram,
)

pytestmark = pytest.mark.unit
S = IdempotencyStatus

#: The lifecycle as the design states it, written out independently of the table.
SPEC_ALLOWED = {
    (S.NONE, S.PROCESSING),
    (S.PROCESSING, S.PROCESSED),
    (S.PROCESSING, S.FAILED),
    (S.PROCESSED, S.SUPERSEDED),
    (S.FAILED, S.PROCESSING),
    (S.EXPIRED, S.PROCESSING),
    *((s, S.SKIPPED) for s in S),
    *((s, S.EXPIRED) for s in S if s not in (S.NONE, S.EXPIRED)),
}
ALL_PAIRS = list(itertools.product(S, S))


def test_table_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(S)


def test_nothing_leads_back_to_none() -> None:
    assert all(S.NONE not in targets for targets in TRANSITIONS.values())


@pytest.mark.parametrize(("source", "target"), sorted(SPEC_ALLOWED, key=repr))
def test_allowed_transition_passes(source: IdempotencyStatus, target: IdempotencyStatus) -> None:
    assert is_allowed(source, target)
    check_transition(source, target)


@pytest.mark.parametrize(
    ("source", "target"), [p for p in ALL_PAIRS if p not in SPEC_ALLOWED], ids=repr
)
def test_forbidden_transition_raises_named_error(
    source: IdempotencyStatus, target: IdempotencyStatus
) -> None:
    assert not is_allowed(source, target)
    with pytest.raises(ForbiddenTransitionError) as info:
        check_transition(source, target, item_key="INV-1")
    error = info.value
    assert (error.source, error.target) == (source.label, target.label)
    assert set(error.allowed) == {t.label for t in TRANSITIONS[source]}
    assert "INV-1" in str(error)
    assert f"{source.label} -> {target.label}" in str(error)


def test_check_path_checks_each_step() -> None:
    check_path([S.FAILED, S.PROCESSING, S.PROCESSED])
    with pytest.raises(ForbiddenTransitionError) as info:
        check_path([S.SKIPPED, S.PROCESSING, S.PROCESSED])
    assert info.value.source == "Skipped"


def test_repr_is_valid_python() -> None:
    for status in S:
        assert eval(repr(status), {"IdempotencyStatus": IdempotencyStatus}) is status


def test_semantics_doc_embeds_the_generated_diagram() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
    # The doc shows what ``dsm diagram`` prints: the table's edges, labelled.
    from dsm_sim.teaching.diagram import labelled_state_diagram

    assert labelled_state_diagram() in doc.read_text(encoding="utf-8")


def test_diagram_has_one_edge_per_allowed_transition() -> None:
    edges = [line for line in mermaid_state_diagram().splitlines() if "-->" in line]
    assert len(edges) == sum(len(t) for t in TRANSITIONS.values())
