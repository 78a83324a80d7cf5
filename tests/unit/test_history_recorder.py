"""The recorder puts every field a call was invoked and completed with into its operation.

The recorder builds each :class:`~dsm_sim.history.Op` positionally, in the
dataclass' field order, because the simulator records every call it makes; a
field added to ``Op`` or moved in it must not land in its neighbour's place.
Every field is given a value of its own here, so a shifted field shows.
"""

from __future__ import annotations

import dataclasses

from dsm_sim.history import (
    CallOptions,
    EventKind,
    HistoryRecorder,
    Observed,
    Op,
    OpName,
    Outcome,
    RecordView,
    key_of,
)
from reference_engine.context import StateHandlerContext


def _view(key: str, attempt: int) -> RecordView:
    return RecordView(
        key, "processing", attempt, 70.0, 1.0, 2.0, None, "d1", True, (None, "a", "x")
    )


def test_a_completed_call_keeps_every_field_it_was_invoked_and_completed_with() -> None:
    rec = HistoryRecorder(lock_duration=60.0, store_order=True)
    options = CallOptions(30.0, 3600.0)
    before, after = _view("t/1/e//k", 1), _view("t/1/e//k", 2)
    index = rec.invoke(
        "w1",
        OpName.SET,
        "t/1/e//k",
        1.5,
        token=7,
        status="processed",
        execution="w1-x001",
        detail="why",
        app="billing",
        options=options,
    )
    done = rec.complete(
        index,
        Outcome.INFO,
        1.75,
        result="r",
        error="StoreError",
        store_time=1.625,
        keys=["b", "a"],
        candidates=["d", "c"],
        observed=Observed(before, after, "digest"),
    )
    expected = Op(
        index=0,
        process="w1",
        op=OpName.SET,
        key="t/1/e//k",
        invoke=1.5,
        complete=1.75,
        outcome=Outcome.INFO,
        result="r",
        token=7,
        status="processed",
        error="StoreError",
        store_time=1.625,
        execution="w1-x001",
        keys=("a", "b"),
        candidates=("c", "d"),
        data="digest",
        probed=True,
        before=before,
        after=after,
        seq=0,
        detail="why",
        app="billing",
        options=options,
    )
    assert done == expected
    assert rec.freeze().ops == (expected,)


def test_a_token_given_at_completion_replaces_the_invoked_one_and_seq_counts_completions() -> None:
    rec = HistoryRecorder(lock_duration=60.0, store_order=True)
    first = rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, "k", 0.0)
    second = rec.invoke("w2", OpName.EXISTS, "k", 0.0)
    rec.complete(second, Outcome.OK, 0.5, result=False)
    acquired = rec.complete(first, Outcome.OK, 0.75, result=3, token=3)
    assert (acquired.token, acquired.seq, acquired.probed, acquired.before) == (3, 1, False, None)


def test_a_call_never_completed_is_frozen_as_info_with_its_invocation() -> None:
    rec = HistoryRecorder(lock_duration=60.0)
    index = rec.invoke("w1", OpName.SET, "k", 2.0, token=4, status="processed", execution="x")
    rec.event(EventKind.CRASH, 2.5, process="w1", key="k", token=4, execution="x", detail="d")
    (op,) = rec.freeze(at=9.0).ops
    assert op == Op(
        index=index,
        process="w1",
        op=OpName.SET,
        key="k",
        invoke=2.0,
        complete=9.0,
        outcome=Outcome.INFO,
        token=4,
        status="processed",
        error="Crash",
        execution="x",
    )


def test_reads_observed_on_a_pending_call_stay_when_it_completes() -> None:
    rec = HistoryRecorder(lock_duration=60.0)
    index = rec.invoke("w1", OpName.UPSERT, "k", 0.0)
    view = _view("k", 1)
    rec.observe(index, None, view, "d1")
    done = rec.complete(index, Outcome.OK, 0.25)
    assert (done.probed, done.before, done.after, done.data) == (True, None, view, "d1")


def test_an_event_keeps_every_field() -> None:
    rec = HistoryRecorder(lock_duration=60.0)
    event = rec.event(
        EventKind.SIDE_EFFECT,
        3.0,
        process="w1",
        key="k",
        token=2,
        execution="w1-x002",
        detail="charge",
        value=1.25,
        node="n",
    )
    assert dataclasses.asdict(event) == {
        "index": 0,
        "time": 3.0,
        "kind": EventKind.SIDE_EFFECT,
        "process": "w1",
        "key": "k",
        "token": 2,
        "execution": "w1-x002",
        "detail": "charge",
        "value": 1.25,
        "node": "n",
    }


def test_a_context_has_the_history_key_of_its_record_key() -> None:
    base = StateHandlerContext(7, "Element", "node-1", "w1-x001", "tenant/a", "app")
    ctx = base.for_item("item:1", "entity-key", lock_token=3)
    assert key_of(ctx) == key_of(ctx.record_key) == "tenant/a/7/node-1/entity-key/item:1"
