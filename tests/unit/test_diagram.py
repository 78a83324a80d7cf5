"""``dsm diagram``: every edge is a transition of the table, labelled with what makes it.

The labels are checked twice: against the table (no transition without an
operation, no operation on a forbidden pair) and against the reference model
(each labelled operation, run from the edge's source state, lands in the
edge's target state), so a label cannot name the wrong operation either.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

import pytest

from dsm_sim import cli
from dsm_sim.teaching import diagram
from dsm_sim.teaching.diagram import (
    EXPIRED_LOCK,
    EXPIRED_LOCK_ONLY,
    OPERATIONS,
    RETENTION,
    SWEEP,
    UPSERT_THROUGH,
    labelled_state_diagram,
    transition_table_markdown,
)
from reference_engine.clock import UTC
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.model import ReferenceModel, effective_status
from reference_engine.status import TRANSITIONS, IdempotencyStatus

pytestmark = pytest.mark.unit
S = IdempotencyStatus

EDGE = re.compile(r"^    (\S+) --> (\S+) : (.+)$")
NODES = {("[*]" if s is S.NONE else s.label): s for s in S} | {EXPIRED_LOCK: S.PROCESSING}
#: The expired lock's own edges: no stored status changes on them.
NOT_IN_TABLE = {("Processing", EXPIRED_LOCK), (EXPIRED_LOCK, "Processing")}
NEVER_MADE = "never made (history is not current)"

LOCK = dt.timedelta(minutes=30)
KEEP = dt.timedelta(days=1)
T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TICK = dt.timedelta(seconds=1)


def edges() -> list[tuple[str, str, str]]:
    """``(from, to, operation)`` for every operation on every drawn edge."""
    found = []
    for line in labelled_state_diagram().splitlines():
        match = EDGE.match(line)
        if match:
            source, target, label = match.groups()
            found.extend((source, target, op) for op in label.split(" / "))
    return found


def test_every_transition_of_the_table_has_an_operation_and_no_other_pair_has_one() -> None:
    allowed = {(s, t) for s, targets in TRANSITIONS.items() for t in targets}
    unlabelled = sorted(f"{s.label} -> {t.label}" for s, t in allowed - set(OPERATIONS))
    assert not unlabelled, f"label these transitions in dsm_sim/teaching/diagram.py: {unlabelled}"
    assert set(OPERATIONS) <= allowed, "an operation is labelled on a forbidden transition"
    assert all(OPERATIONS[pair] for pair in allowed)


def test_a_transition_without_an_operation_cannot_be_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    partial = dict(OPERATIONS)
    del partial[(S.FAILED, S.PROCESSING)]
    monkeypatch.setattr(diagram, "OPERATIONS", partial)
    with pytest.raises(KeyError):
        labelled_state_diagram()


def test_the_diagram_draws_exactly_the_table_with_every_operation() -> None:
    drawn: dict[tuple[IdempotencyStatus, IdempotencyStatus], set[str]] = {}
    for source, target, op in edges():
        if (source, target) in NOT_IN_TABLE:
            continue
        drawn.setdefault((NODES[source], NODES[target]), set()).add(op)
    assert drawn == {pair: set(ops) for pair, ops in OPERATIONS.items()}


def test_the_expired_unswept_lock_is_drawn_with_its_take_over_and_its_sweep() -> None:
    text = labelled_state_diagram()
    assert f'state "Processing, lock expired, not yet swept" as {EXPIRED_LOCK}' in text
    out_of_expired = {(t, op) for s, t, op in edges() if s == EXPIRED_LOCK}
    assert ("Processing", "try_acquire_lock takes over (attempt + 1)") in out_of_expired
    assert ("Failed", SWEEP) in out_of_expired
    assert ("Expired", RETENTION) in out_of_expired
    assert ("Processing", EXPIRED_LOCK, "locked_until passes (no write)") in edges()
    # The sweeps never touch a live lock, so no sweep edge leaves Processing itself.
    assert not {op for s, _, op in edges() if s == "Processing"} & EXPIRED_LOCK_ONLY
    assert {
        op for (s, _), ops in OPERATIONS.items() for op in ops if s is S.PROCESSING
    } >= EXPIRED_LOCK_ONLY


# --- the labels against the reference model ------------------------------------------------


def ctx(token: int | None = None) -> StateHandlerContext:
    base = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="dispatch-invoice",
        entity_execution_id="exec-1",
        tenant_id="tenant-1",
        source_app_id="app-1",
        handler_config=HandlerConfig(lock_duration=LOCK, retention=KEEP),
    )
    return base.for_item("INV-1", lock_token=token)


class World:
    """One item in the reference model, driven into a drawn node, with the holder's token."""

    def __init__(self, node: str) -> None:
        self.model = ReferenceModel()
        self.now = T0
        self.token: int | None = None
        if node == "[*]":
            return
        if node == "Skipped":
            self.model.set(ctx(), S.SKIPPED, None, self.now)
            return
        token = self.model.try_acquire_lock(ctx(), self.now)
        if node in ("Processing", EXPIRED_LOCK):
            self.token = token
            self.now += LOCK + TICK if node == EXPIRED_LOCK else TICK
            return
        if node == "Failed":
            self.model.release_lock_as_failed(ctx(token), "billing down", self.now)
            return
        self.model.set(ctx(token), S.PROCESSED, {"n": 1}, self.now)
        if node == "Superseded":
            self.model.upsert(ctx(), {"n": 2}, self.now)
        elif node == "Expired":
            self.now += KEEP + TICK
            assert self.model.expire_past_retention(self.now) == 1

    def status(self, history: bool = False) -> IdempotencyStatus:
        if history:
            (old,) = self.model.superseded
            return old.status
        return effective_status(self.model.current.get(ctx().record_key), self.now)


def _pass_time(w: World, by: dt.timedelta) -> None:
    w.now += by


def holder(w: World) -> StateHandlerContext:
    """The holder's context: an operation "by the holder" needs a lock to hold."""
    assert w.token is not None, "only a locked item has a holder"
    return ctx(w.token)


OPERATION_CALLS: dict[str, Callable[[World], object]] = {
    "try_acquire_lock": lambda w: w.model.try_acquire_lock(ctx(), w.now),
    "try_acquire_lock (retry)": lambda w: w.model.try_acquire_lock(ctx(), w.now),
    "try_acquire_lock takes over (attempt + 1)": lambda w: w.model.try_acquire_lock(ctx(), w.now),
    UPSERT_THROUGH: lambda w: w.model.upsert(ctx(), {"n": 2}, w.now),
    "upsert": lambda w: w.model.upsert(ctx(w.token), {"n": 2}, w.now),
    "set(Skipped)": lambda w: w.model.set(ctx(), S.SKIPPED, None, w.now),
    "set(Skipped) by the holder": lambda w: w.model.set(holder(w), S.SKIPPED, None, w.now),
    "set(Processed) by the holder": lambda w: w.model.set(holder(w), S.PROCESSED, {}, w.now),
    "release_lock_as_failed by the holder": lambda w: w.model.release_lock_as_failed(
        holder(w), "billing down", w.now
    ),
    SWEEP: lambda w: w.model.reset_expired_locks(w.now),
    RETENTION: lambda w: (_pass_time(w, KEEP + TICK), w.model.expire_past_retention(w.now)),
    "locked_until passes (no write)": lambda w: _pass_time(w, LOCK + TICK),
}


def test_every_label_is_an_operation_the_model_check_can_run() -> None:
    labels = {op for _, _, op in edges()} - {NEVER_MADE}
    assert labels == set(OPERATION_CALLS)


@pytest.mark.parametrize(
    ("source", "target", "operation"),
    [edge for edge in edges() if edge[2] != NEVER_MADE],
    ids=lambda part: str(part),
)
def test_each_labelled_operation_makes_its_edge_in_the_reference_model(
    source: str, target: str, operation: str
) -> None:
    world = World(source)
    before = world.model.current.get(ctx().record_key)
    attempt = None if before is None else before.attempt

    OPERATION_CALLS[operation](world)

    if (source, target) == ("Processed", "Superseded"):
        assert world.status(history=True) is S.SUPERSEDED
        assert world.status() is S.PROCESSED
    elif source == "Superseded":
        assert world.status(history=True) is S.EXPIRED
    elif operation == UPSERT_THROUGH:
        assert NODES[target] is S.PROCESSING
        assert world.status() is S.PROCESSED, "upsert goes on through Processing"
    elif target == EXPIRED_LOCK:
        record = world.model.current[ctx().record_key]
        assert record.status is S.PROCESSING, "nothing was written"
        assert world.status() is S.FAILED, "but every operation reads it as Failed"
    else:
        assert world.status() is NODES[target]
    if operation.startswith("try_acquire_lock"):
        assert world.model.current[ctx().record_key].attempt == (attempt or 0) + 1


def test_dsm_diagram_prints_the_labelled_diagram_and_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["diagram"]) == 0
    assert capsys.readouterr().out == labelled_state_diagram() + "\n"
    assert cli.main(["diagram", "--format", "table"]) == 0
    assert capsys.readouterr().out == transition_table_markdown() + "\n"
