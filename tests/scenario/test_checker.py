"""The checker's invariants on hand-built histories: each one passing and each one failing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Generator
from typing import Any

import pytest

from dsm_sim import checker
from dsm_sim.history import (
    Event,
    EventKind,
    History,
    HistoryRecorder,
    KeyInfo,
    Observed,
    Op,
    OpName,
    Outcome,
    RecordView,
)
from dsm_sim.micros import micros_of as us
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import DsmError
from reference_engine.model import ReferenceModel
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.scenario

K = "tenant-1/4/node//inv-1"
LOCK = 60.0
EPOCH_2026 = dt.datetime(2026, 1, 1, 9, 0, tzinfo=dt.UTC)


class Recorder(HistoryRecorder):
    """A recorder these tests give instants in seconds (histories hold microseconds)."""

    def __init__(self, *, faults_stop: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults_stop = None if faults_stop is None else us(faults_stop)

    def invoke(  # type: ignore[override]
        self, process: str, op: OpName, key: str, at: float, **kwargs: Any
    ) -> int:
        return super().invoke(process, op, key, us(at), **kwargs)

    def complete(  # type: ignore[override]
        self,
        index: int,
        outcome: Outcome,
        at: float,
        *,
        store_time: float | None = None,
        **kwargs: Any,
    ) -> Op:
        store = None if store_time is None else us(store_time)
        return super().complete(index, outcome, us(at), store_time=store, **kwargs)

    def event(self, kind: EventKind, at: float, **kwargs: Any) -> Event:  # type: ignore[override]
        return super().event(kind, us(at), **kwargs)

    def final_state(  # type: ignore[override]
        self,
        key: str,
        status: str,
        attempt: int | None,
        at: float,
        store_time: float | None = None,
    ) -> None:
        store = None if store_time is None else us(store_time)
        super().final_state(key, status, attempt, us(at), store)


class Builder:
    """Terse history building: every op completes at its store instant (simulator style)."""

    def __init__(self, *, faults_stop: float | None = None) -> None:
        self.rec = Recorder(lock_duration=LOCK, sweep_interval=20.0, faults_stop=faults_stop)

    def op(
        self,
        process: str,
        name: OpName,
        at: float,
        *,
        outcome: Outcome = Outcome.OK,
        result: bool | int | str | None = None,
        token: int | None = None,
        status: str | None = None,
        error: str | None = None,
        keys: tuple[str, ...] = (),
        key: str = K,
        store: bool = True,
    ) -> int:
        execution = f"{process}-x1"
        index = self.rec.invoke(
            process, name, key, at - 0.01, token=token, status=status, execution=execution
        )
        returned = result if name is OpName.TRY_ACQUIRE_LOCK and isinstance(result, int) else None
        self.rec.complete(
            index,
            outcome,
            at,
            result=result,
            error=error,
            store_time=at if store else None,
            token=returned,
            keys=keys,
        )
        return index

    def acquire(self, process: str, at: float, token: int) -> int:
        return self.op(process, OpName.TRY_ACQUIRE_LOCK, at, result=token)

    def done(
        self,
        process: str,
        at: float,
        token: int,
        *,
        outcome: Outcome = Outcome.OK,
        error: str | None = None,
    ) -> int:
        return self.op(
            process, OpName.SET, at, token=token, status="processed", outcome=outcome, error=error
        )

    def effect(self, process: str, at: float, token: int | None) -> int:
        return self.rec.event(
            EventKind.SIDE_EFFECT,
            at,
            process=process,
            key=K,
            token=token,
            execution=f"{process}-x1",
        ).index

    def sweep(self, at: float, keys: tuple[str, ...] = (K,)) -> int:
        return self.op(
            "catchup", OpName.RESET_EXPIRED_LOCKS, at, result=len(keys), keys=keys, key=""
        )

    def final(self, status: str, at: float, attempt: int | None = 1) -> None:
        self.rec.final_state(K, status, attempt, at, at)

    def history(self) -> History:
        return self.rec.freeze()


def _happy() -> Builder:
    b = Builder(faults_stop=100.0)
    b.op("w1", OpName.EXISTS, 1.0, result=False)
    b.acquire("w1", 2.0, 1)
    b.effect("w1", 4.0, 1)
    b.done("w1", 5.0, 1)
    b.op("w2", OpName.EXISTS, 6.0, result=True)
    b.final("processed", 400.0)
    return b


def test_clean_history_keeps_every_invariant() -> None:
    results = checker.check_history(_happy().history())
    assert [r.name for r in results if not r.passed] == []
    assert {r.name for r in results} >= {
        "no_duplicate_side_effect",
        "at_most_one_live_lock",
        "stale_write_rejected",
        "allowed_transitions_only",
        "exists_agrees_with_model",
        "sweep_only_expired",
        "errors_agree_with_model",
        "terminal_within_deadline",
        "no_record_lost",
    }


# --- one live lock ---------------------------------------------------------------------------


def test_second_acquire_during_live_lock_is_a_violation() -> None:
    b = Builder()
    first = b.acquire("w1", 0.0, 1)
    second = b.acquire("w2", 10.0, 2)
    result = checker.at_most_one_live_lock(b.history())
    assert not result.passed
    assert result.violations[0].ops == (first, second)
    assert "two live locks" in result.violations[0].message


def test_acquire_after_expiry_is_allowed() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.acquire("w2", LOCK + 0.5, 2)
    assert checker.at_most_one_live_lock(b.history()).passed


def test_acquire_after_holder_released_is_allowed() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.op("w1", OpName.RELEASE_LOCK_AS_FAILED, 5.0, token=1)
    b.acquire("w2", 10.0, 2)
    assert checker.at_most_one_live_lock(b.history()).passed


def test_reused_token_is_a_violation() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.acquire("w2", LOCK + 5, 1)
    result = checker.at_most_one_live_lock(b.history())
    assert not result.passed
    assert "handed out twice" in result.violations[0].message


def test_backwards_clock_makes_a_takeover_a_violation() -> None:
    """Timeline order with store times going back: the later acquire lands inside the lease."""
    b = Builder()
    b.acquire("w1", 100.0, 1)
    # Complete later on the timeline, but the store clock reads earlier.
    index = b.rec.invoke("w2", OpName.TRY_ACQUIRE_LOCK, K, 119.0, execution="w2-x1")
    b.rec.complete(index, Outcome.OK, 120.0, result=2, store_time=50.0, token=2)
    assert not checker.at_most_one_live_lock(b.history()).passed


def test_wall_clock_overlap_is_only_flagged_when_certain() -> None:
    """Without store times an acquire may have happened anywhere in [invoke, complete]."""
    uncertain = Builder()
    i = uncertain.rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, 0.0, execution="a")
    uncertain.rec.complete(i, Outcome.OK, 1.0, result=1, token=1)
    j = uncertain.rec.invoke("w2", OpName.TRY_ACQUIRE_LOCK, K, 0.5, execution="b")
    uncertain.rec.complete(j, Outcome.OK, LOCK + 2.0, result=2, token=2)
    assert checker.at_most_one_live_lock(uncertain.history()).passed

    certain = Builder()
    i = certain.rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, 0.0, execution="a")
    certain.rec.complete(i, Outcome.OK, 1.0, result=1, token=1)
    j = certain.rec.invoke("w2", OpName.TRY_ACQUIRE_LOCK, K, 2.0, execution="b")
    certain.rec.complete(j, Outcome.OK, 3.0, result=2, token=2)
    assert not checker.at_most_one_live_lock(certain.history()).passed


# --- side effects ----------------------------------------------------------------------------


def test_duplicate_effect_under_two_live_leases_is_a_violation() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.acquire("w2", 1.0, 2)
    first = b.effect("w1", 3.0, 1)
    second = b.effect("w2", 4.0, 2)
    result = checker.no_duplicate_side_effect(b.history())
    assert not result.passed
    assert result.violations[0].events == (first, second)


def test_duplicate_effect_after_expired_lease_is_excused_and_explained() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.effect("w1", 90.0, 1)
    b.sweep(65.0)
    b.acquire("w2", 70.0, 2)
    b.effect("w2", 72.0, 2)
    b.done("w2", 73.0, 2)
    stale = b.done("w1", 95.0, 1, outcome=Outcome.FAIL, error="StaleLockError")
    result = checker.no_duplicate_side_effect(b.history())
    assert result.passed
    assert len(result.notes) == 1
    assert "lease 1" in result.notes[0]
    assert f"fencing rejected the stale set (op #{stale})" in result.notes[0]


def test_duplicate_effect_after_releasing_a_completed_effect_is_a_violation() -> None:
    """Releasing as Failed after the charge hands the charge to the next delivery."""
    b = Builder()
    b.acquire("w1", 0.0, 1)
    first = b.effect("w1", 2.0, 1)
    b.op("w1", OpName.RELEASE_LOCK_AS_FAILED, 3.0, token=1)
    b.acquire("w2", 10.0, 2)
    second = b.effect("w2", 12.0, 2)
    result = checker.no_duplicate_side_effect(b.history())
    assert not result.passed
    assert result.violations[0].events == (first, second)


def test_duplicate_effect_when_stale_holder_completed_is_a_violation() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.effect("w1", 50.0, 1)
    b.done("w1", 55.0, 1)
    b.acquire("w2", 70.0, 2)
    b.effect("w2", 72.0, 2)
    assert not checker.no_duplicate_side_effect(b.history()).passed


def test_two_effects_under_one_token_is_a_violation() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.effect("w1", 1.0, 1)
    b.effect("w2", 2.0, 1)
    result = checker.no_duplicate_side_effect(b.history())
    assert not result.passed
    assert "same token 1" in result.violations[0].message


def test_effect_without_token_is_a_violation() -> None:
    b = Builder()
    b.effect("w1", 1.0, None)
    b.effect("w2", 2.0, None)
    assert "without a fencing token" in (
        checker.no_duplicate_side_effect(b.history()).violations[0].message
    )


def _acquire_at(b: Builder, process: str, timeline: float, store: float, token: int) -> int:
    """An acquire whose store clock differs from the timeline (after a clock jump)."""
    index = b.rec.invoke(
        process, OpName.TRY_ACQUIRE_LOCK, K, timeline - 0.01, execution=f"{process}-x1"
    )
    b.rec.complete(index, Outcome.OK, timeline, result=token, store_time=store, token=token)
    return index


def test_duplicate_after_sweep_then_backwards_clock_is_excused() -> None:
    """The sweep ended lease 1; the store clock then stepped back before token 2 was taken."""
    b = Builder()
    b.acquire("w1", 7.0, 1)
    b.effect("w1", 10.0, 1)
    sweep = b.sweep(80.0)
    _acquire_at(b, "w2", 100.0, -0.3, 2)
    b.effect("w2", 103.0, 2)
    result = checker.no_duplicate_side_effect(b.history())
    assert result.passed
    assert f"was reset by the sweep (op #{sweep})" in result.notes[0]


# --- fencing ---------------------------------------------------------------------------------


def test_stale_write_accepted_after_sweep_is_a_violation() -> None:
    b = Builder()
    acquire = b.acquire("w1", 0.0, 1)
    sweep = b.sweep(70.0)
    write = b.done("w1", 80.0, 1)
    result = checker.stale_write_rejected(b.history())
    assert not result.passed
    assert result.violations[0].ops == (acquire, sweep, write)


def test_stale_write_rejected_after_takeover_is_noted() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.acquire("w2", 70.0, 2)
    b.done("w1", 80.0, 1, outcome=Outcome.FAIL, error="StaleLockError")
    result = checker.stale_write_rejected(b.history())
    assert result.passed
    assert "fencing rejected" in result.notes[0]


def test_own_write_after_expiry_without_sweep_is_accepted() -> None:
    """The spec: the holder's write lands if nobody swept or took over, even past expiry."""
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.done("w1", LOCK + 30, 1)
    assert checker.stale_write_rejected(b.history()).passed


# --- transitions -----------------------------------------------------------------------------


def test_acquire_over_processed_is_a_forbidden_transition() -> None:
    b = _happy()
    late = b.acquire("w3", 200.0, 2)
    result = checker.allowed_transitions_only(b.history())
    assert not result.passed
    assert result.violations[0].ops == (late,)
    assert "Processed -> Processing" in result.violations[0].message


def test_retry_of_failed_item_is_allowed() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.op("w1", OpName.RELEASE_LOCK_AS_FAILED, 1.0, token=1)
    b.acquire("w2", 2.0, 2)
    b.done("w2", 3.0, 2)
    assert checker.allowed_transitions_only(b.history()).passed


def test_unknown_outcome_suspends_the_transition_check() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.done("w1", 1.0, 1, outcome=Outcome.INFO, error="StoreError")
    b.op("w1", OpName.RELEASE_LOCK_AS_FAILED, 2.0, token=1)
    assert checker.allowed_transitions_only(b.history()).passed


# --- reads -----------------------------------------------------------------------------------


def test_exists_true_for_unwritten_key_is_a_violation() -> None:
    b = Builder()
    read = b.op("w1", OpName.EXISTS, 1.0, result=True)
    result = checker.exists_agrees_with_model(b.history())
    assert not result.passed
    assert result.violations[0].ops == (read,)


def test_exists_true_while_processing_is_a_violation() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.op("w2", OpName.EXISTS, 1.0, result=True)
    assert not checker.exists_agrees_with_model(b.history()).passed


def test_exists_after_expired_lock_reads_as_not_done() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.op("w2", OpName.EXISTS, LOCK + 5, result=False)
    assert checker.exists_agrees_with_model(b.history()).passed


# --- sweeps ----------------------------------------------------------------------------------


def test_sweep_resetting_a_live_lock_is_a_violation() -> None:
    b = Builder()
    acquire = b.acquire("w1", 0.0, 1)
    sweep = b.sweep(30.0)
    result = checker.sweep_only_expired(b.history())
    assert not result.passed
    assert result.violations[0].ops == (acquire, sweep)


def test_sweep_of_an_expired_lock_is_fine() -> None:
    b = Builder()
    b.acquire("w1", 0.0, 1)
    b.sweep(LOCK + 1)
    assert checker.sweep_only_expired(b.history()).passed


def test_holder_fenced_off_while_live_is_a_violation() -> None:
    """Even without knowing which sweep did it: the lock vanished while live."""
    b = Builder()
    b.acquire("w1", 0.0, 1)
    write = b.done("w1", 10.0, 1, outcome=Outcome.FAIL, error="StaleLockError")
    result = checker.errors_agree_with_model(b.history())
    assert not result.passed
    assert write in result.violations[0].ops


def test_fenced_after_recorded_sweep_and_backwards_clock_is_not_a_lost_lock() -> None:
    b = Builder()
    b.acquire("w1", 56.0, 1)
    b.sweep(120.0)
    index = b.rec.invoke("w1", OpName.SET, K, 146.0, token=1, status="processed", execution="w1-x1")
    b.rec.complete(index, Outcome.FAIL, 146.1, error="StaleLockError", store_time=109.0)
    assert checker.errors_agree_with_model(b.history()).passed
    assert checker.sweep_only_expired(b.history()).passed


# --- liveness --------------------------------------------------------------------------------


def test_processing_after_deadline_is_a_violation() -> None:
    b = Builder(faults_stop=10.0)
    b.acquire("w1", 5.0, 1)
    b.final("processing", 5.0 + LOCK + 20.0 + 1)
    result = checker.terminal_within_deadline(b.history())
    assert not result.passed
    assert "past the deadline" in result.violations[0].message


def test_run_ending_before_deadline_is_reported() -> None:
    b = Builder(faults_stop=10.0)
    b.acquire("w1", 5.0, 1)
    b.final("processing", 30.0)
    assert "before the liveness deadline" in (
        checker.terminal_within_deadline(b.history()).violations[0].message
    )


def test_liveness_not_checked_without_faults_stop() -> None:
    b = Builder(faults_stop=None)
    b.acquire("w1", 5.0, 1)
    b.final("processing", 10_000.0)
    result = checker.terminal_within_deadline(b.history())
    assert result.passed
    assert "not checked" in result.notes[0]


# --- nothing lost ----------------------------------------------------------------------------


def test_processed_record_missing_at_the_end_is_lost() -> None:
    b = _happy()
    b.rec._final.clear()
    b.final("none", 400.0, None)
    result = checker.no_record_lost(b.history())
    assert not result.passed
    assert "no record at the end" in result.violations[0].message


def test_exists_false_after_processed_is_lost() -> None:
    b = _happy()
    read = b.op("w3", OpName.EXISTS, 50.0, result=False)
    result = checker.no_record_lost(b.history())
    assert not result.passed
    assert read in result.violations[0].ops


# --- the format ------------------------------------------------------------------------------


def test_history_round_trips_through_json_byte_for_byte() -> None:
    history = _happy().history()
    text = history.dumps()
    again = History.loads(text)
    assert again == history
    assert again.dumps() == text


def test_pending_operation_freezes_as_info() -> None:
    rec = Recorder(lock_duration=LOCK)
    rec.invoke("w1", OpName.SET, K, 1.0, token=1, status="processed")
    op = rec.freeze(at=us(2.0)).ops[0]
    assert op.outcome is Outcome.INFO
    assert op.maybe


def test_wall_clock_recorders_convert_datetimes() -> None:
    epoch = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    rec = HistoryRecorder(epoch=epoch, lock_duration=LOCK)
    assert rec.micros(epoch + dt.timedelta(seconds=1.5)) == 1_500_000
    assert rec.freeze().instant(1_500_000) == epoch + dt.timedelta(seconds=1.5)
    with pytest.raises(ValueError, match="naive"):
        rec.micros(dt.datetime(2026, 3, 1, 12, 0))


# --- instants are exact to the microsecond, to the last one a record can hold ---------------

#: The last instant a record can hold, and one far from the epoch but within the range.
END_OF_TIME = dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)
YEAR_2200 = dt.datetime(2200, 6, 30, 23, 59, 59, 999_999, tzinfo=dt.UTC)


def _one_lock(locked_until: dt.datetime, *, lock: float = LOCK) -> History:
    """One probed acquire ``lock`` seconds before ``end``, far from the history's epoch (2026).

    The store clock reads ``end - lock``, and the record read after the call
    is locked until ``locked_until``.
    """
    epoch = EPOCH_2026
    rec = HistoryRecorder(epoch=epoch, lock_duration=lock, store_order=True)
    rec.key_info(
        K,
        KeyInfo(
            node="node",
            tenant="tenant-1",
            scope=4,
            entity="node",
            item_entity_key="",
            item="inv-1",
            lock_duration=lock,
            retention=None,
        ),
    )
    index = rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, 0, execution="w1-x1", app="billing")
    stamp = rec.micros(END_OF_TIME if locked_until > YEAR_2200 else YEAR_2200) - us(lock)
    after = RecordView(
        key=K,
        status="processing",
        attempt=1,
        locked_until=rec.micros(locked_until),
        created_at=stamp,
        updated_at=stamp,
        retain_until=None,
        data=None,
        audit=(None, "billing", "w1-x1"),
    )
    rec.complete(
        index,
        Outcome.OK,
        us(0.5),
        result=1,
        store_time=stamp,
        token=1,
        observed=Observed(None, after, None),
    )
    return rec.freeze()


@pytest.mark.parametrize("end", [YEAR_2200, END_OF_TIME], ids=["year-2200", "year-9999"])
def test_two_instants_a_microsecond_apart_are_told_apart(end: dt.datetime) -> None:
    """A lock that must end at ``end``, centuries from the epoch, is checked to the microsecond."""
    right = _one_lock(end)
    assert [r.name for r in checker.check_history(right) if not r.passed] == []
    early = _one_lock(end - dt.timedelta(microseconds=1))
    failed = {r.name: r for r in checker.check_history(early) if not r.passed}
    assert set(failed) == {"lock_duration_honoured"}, failed
    (violation,) = failed["lock_duration_honoured"].violations
    assert "left locked_until" in violation.message


def test_the_last_instant_a_record_holds_survives_the_history_file() -> None:
    history = _one_lock(END_OF_TIME)
    after = history.ops[0].after
    assert after is not None and after.locked_until is not None
    assert history.instant(after.locked_until) == END_OF_TIME
    text = history.dumps()
    assert '"locked_until":"251635042799.999999"' in text, "a string: no double holds it"
    assert '"store_time":"251635042739.999999"' in text
    again = History.loads(text)
    assert again == history
    assert again.dumps() == text
    assert [r.name for r in checker.check_history(again) if not r.passed] == []


@pytest.mark.parametrize(("expired", "lost"), [(0, True), (1, False)])
def test_only_a_retention_sweep_that_expired_something_excuses_a_missing_item(
    expired: int, lost: bool
) -> None:
    b = _happy()
    b.op("catchup", OpName.EXPIRE_PAST_RETENTION, 40.0, result=expired, key="")
    b.op("w3", OpName.EXISTS, 50.0, result=False)
    assert checker.no_record_lost(b.history()).passed is not lost


# --- wall-clock histories --------------------------------------------------------------------


def _window(
    b: Builder,
    process: str,
    name: OpName,
    invoke: float,
    complete: float,
    *,
    token: int | None = None,
    status: str | None = None,
    result: bool | int | None = None,
    store: bool = False,
) -> int:
    """A call seen by a wall-clock recorder: it landed somewhere in ``[invoke, complete]``.

    ``store=True`` stamps the completion as the store instant instead, which
    is how the simulator records, so the same calls can be read both ways.
    """
    index = b.rec.invoke(
        process, name, K, invoke, token=token, status=status, execution=f"{process}-x1"
    )
    returned = result if name is OpName.TRY_ACQUIRE_LOCK and isinstance(result, int) else None
    b.rec.complete(
        index,
        Outcome.OK,
        complete,
        result=result,
        token=returned,
        store_time=complete if store else None,
    )
    return index


def _release_races_takeover(release: tuple[float, float], *, store: bool = False) -> Builder:
    """w1's lock is released while w2 takes the item over and completes it; w3 then reads it."""
    b = Builder()
    _window(b, "w1", OpName.TRY_ACQUIRE_LOCK, 0.0, 1.0, result=1, store=store)
    _window(b, "w1", OpName.RELEASE_LOCK_AS_FAILED, release[0], release[1], token=1, store=store)
    _window(b, "w2", OpName.TRY_ACQUIRE_LOCK, 3.0, 4.0, result=2, store=store)
    _window(b, "w2", OpName.SET, 5.0, 5.5, token=2, status="processed", store=store)
    _window(b, "w3", OpName.EXISTS, 7.0, 8.0, result=True, store=store)
    b.rec.final_state(K, "processed", 2, 9.0)
    return b


ORDER_DEPENDENT = (
    "stale_write_rejected",
    "allowed_transitions_only",
    "exists_agrees_with_model",
)


def test_overlapping_writes_stamped_out_of_completion_order_are_no_violation() -> None:
    """The release committed at once but stamped its completion late: not a stale write."""
    wall = _release_races_takeover((2.0, 6.0)).history()
    assert checker.is_wall_clock(wall)
    results = {r.name: r for r in checker.check_history(wall)}
    assert [name for name, r in results.items() if not r.passed] == []
    transitions = results["allowed_transitions_only"]
    assert any("explains every observation" in note for note in transitions.notes)

    # The same calls stamped at completion (the simulator's reading) break all three.
    timed = _release_races_takeover((2.0, 6.0), store=True).history()
    assert not checker.is_wall_clock(timed)
    failed = {r.name for r in checker.check_history(timed) if not r.passed}
    assert failed >= set(ORDER_DEPENDENT)


def test_stale_write_after_a_provably_earlier_takeover_is_a_violation() -> None:
    """Token 2 was handed out before the release with token 1 was even invoked."""
    b = _release_races_takeover((4.5, 6.0))
    results = {r.name: r for r in checker.check_history(b.history())}
    fencing = results["stale_write_rejected"]
    assert not fencing.passed
    assert "stale write accepted" in fencing.violations[0].message
    assert fencing.violations[0].ops == (0, 2, 1)
    transitions = results["allowed_transitions_only"]
    assert not transitions.passed
    assert "no order of the overlapping calls explains it" in transitions.violations[0].message


@pytest.mark.parametrize(("upserts", "unproven"), [(2, False), (8, True)])
def test_too_many_overlapping_writes_give_a_note_not_a_violation(
    upserts: int, unproven: bool
) -> None:
    b = _release_races_takeover((2.0, 30.0))
    for n in range(upserts):
        _window(b, f"u{n}", OpName.UPSERT, 2.5, 29.0)
    result = checker.allowed_transitions_only(b.history())
    assert result.passed
    flagged = [note for note in result.notes if note.startswith(checker.UNPROVEN)]
    assert bool(flagged) is unproven
    if unproven:
        assert f"more than {checker.MAX_CONCURRENT} mutually overlapping writes" in flagged[0]
        assert "Processed -> Failed" in flagged[0]


RACE_LOCK = 2.0
RACE_SPREAD = 1.5
RACE_SEEDS = range(150)


class _Race:
    """Workers racing through exists -> acquire -> set/release on one key of the reference model.

    Recorded twice: as a wall-clock recorder would (each call lands at a point
    inside its window, and only the window is kept), and stamped at each
    completion as the simulator would, to show that reading is wrong here.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.model = ReferenceModel()
        self.base = StateHandlerContext(
            scope_id=int(Scope.ELEMENT),
            scope_code=Scope.ELEMENT.code,
            entity_id="node",
            entity_execution_id="",
            tenant_id="tenant-1",
            source_app_id="checker-test",
            handler_config=HandlerConfig(lock_duration=dt.timedelta(seconds=RACE_LOCK)),
        )
        self.epoch = dt.datetime(2026, 1, 1, 9, 0, tzinfo=dt.UTC)
        self.wall = Recorder(epoch=self.epoch, lock_duration=RACE_LOCK)
        self.timed = Recorder(epoch=self.epoch, lock_duration=RACE_LOCK)
        self.ready: dict[str, float] = {}

    def call(
        self, worker: str, name: OpName, at: float, token: int | None = None
    ) -> bool | int | None:
        """Run one call at instant ``at``; record a window around it in both recorders."""
        ctx = dataclasses.replace(
            self.base.for_item("inv-1", lock_token=token), entity_execution_id=worker
        )
        now = self.epoch + dt.timedelta(seconds=at)
        status = "processed" if name is OpName.SET else None
        invoke = self.rng.uniform(max(self.ready.get(worker, 0.0), at - RACE_SPREAD), at)
        complete = at + self.rng.uniform(0.0, RACE_SPREAD)
        self.ready[worker] = complete
        outcome, error = Outcome.OK, None
        result: bool | int | None = None
        try:
            if name is OpName.EXISTS:
                result = self.model.exists(ctx, now)
            elif name is OpName.TRY_ACQUIRE_LOCK:
                result = self.model.try_acquire_lock(ctx, now)
            elif name is OpName.SET:
                self.model.set(ctx, IdempotencyStatus.PROCESSED, None, now)
            else:
                self.model.release_lock_as_failed(ctx, "boom", now)
        except DsmError as exc:
            outcome, error = Outcome.FAIL, type(exc).__name__
        for rec, store in ((self.wall, None), (self.timed, complete)):
            index = rec.invoke(
                worker, name, K, invoke, token=token, status=status, execution=worker
            )
            returned = result if isinstance(result, int) and not isinstance(result, bool) else None
            rec.complete(
                index,
                outcome,
                complete,
                result=result,
                error=error,
                store_time=store,
                token=returned,
            )
        return result

    def run(self, workers: int) -> None:
        """Each worker's calls in program order; a global instant picks who goes next."""
        plans = {f"w{i}": self._flow(f"w{i}") for i in range(workers)}
        for plan in plans.values():
            next(plan)
        at = 0.0
        while plans:
            at += self.rng.uniform(0.05, 0.6)
            ready = sorted(w for w in plans if self.ready.get(w, 0.0) < at)
            if not ready:
                continue
            worker = self.rng.choice(ready)
            try:
                plans[worker].send(at)
            except StopIteration:
                del plans[worker]

    def _flow(self, worker: str) -> Generator[None, float]:
        at = yield
        if self.call(worker, OpName.EXISTS, at) is True:
            return
        at = yield
        token = self.call(worker, OpName.TRY_ACQUIRE_LOCK, at)
        if not isinstance(token, int):
            return
        if self.rng.random() < 0.3:  # slow business work: the lock may expire meanwhile
            self.ready[worker] += self.rng.uniform(0.5, 2 * RACE_LOCK)
        at = yield
        if self.rng.random() < 0.7:
            self.call(worker, OpName.SET, at, token)
        else:
            self.call(worker, OpName.RELEASE_LOCK_AS_FAILED, at, token)


def test_correct_wall_clock_races_are_never_flagged() -> None:
    """Soundness: a history the reference model produced is never a violation on the wall clock.

    The same calls stamped at their completions (the simulator's reading)
    are flagged for some seeds: the windows do hide the store's order.
    """
    misread = 0
    for seed in RACE_SEEDS:
        race = _Race(seed)
        race.run(workers=4)
        wall = race.wall.freeze()
        failed = [r.name for r in checker.check_history(wall) if not r.passed]
        assert failed == [], f"seed {seed}: {failed}\n{wall.dumps()}"
        timed = race.timed.freeze()
        misread += any(
            not r.passed for r in checker.check_history(timed) if r.name in ORDER_DEPENDENT
        )
    assert misread > 0


def _tie_at_the_store(*, store_order: bool) -> History:
    """An upsert invoked before a retention sweep, both reaching the store at 18.25.

    The store ran the sweep first (Processed -> Expired), then the upsert
    (Expired -> Processed), then a later sweep expired the new record.
    """
    rec = Recorder(lock_duration=LOCK, sweep_interval=20.0, store_order=store_order)
    acquire = rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, 1.0, execution="w1-x1")
    rec.complete(acquire, Outcome.OK, 1.0, result=1, store_time=1.0, token=1)
    done = rec.invoke("w1", OpName.SET, K, 2.0, token=1, status="processed", execution="w1-x1")
    rec.complete(done, Outcome.OK, 2.0, store_time=2.0)
    upsert = rec.invoke("w2", OpName.UPSERT, K, 18.0, execution="w2-x1")
    sweep = rec.invoke("catchup", OpName.EXPIRE_PAST_RETENTION, "", 18.25)
    rec.complete(sweep, Outcome.OK, 18.25, result=1, store_time=18.25, keys=(K,))
    rec.complete(upsert, Outcome.OK, 18.25, store_time=18.25)
    later = rec.invoke("catchup", OpName.EXPIRE_PAST_RETENTION, "", 30.0)
    rec.complete(later, Outcome.OK, 30.0, result=1, store_time=30.0, keys=(K,))
    return rec.freeze()


def test_calls_at_one_instant_are_judged_in_the_order_the_store_ran_them() -> None:
    assert checker.allowed_transitions_only(_tie_at_the_store(store_order=True)).passed
    # Without the store's order the tie falls back to invocation order, which
    # replays the upsert before the sweep and misreads the later sweep.
    result = checker.allowed_transitions_only(_tie_at_the_store(store_order=False))
    assert not result.passed
    assert "Expired -> Expired" in result.violations[0].message


def test_the_store_order_survives_the_json_history() -> None:
    history = _tie_at_the_store(store_order=True)
    again = History.from_json(history.to_json())
    assert [op.seq for op in again.ops] == [op.seq for op in history.ops]
    assert checker.allowed_transitions_only(again).passed
