"""The simulator's checker under a semantics profile, on hand-built histories.

Each history is what the simulator records around a store that behaves like
Powertools' idempotency layer: no audit fields, a lock that has ended at its
expiry instant (in milliseconds), a record deleted when its holder fails and
dropped by a TTL at the end of retention.  Both directions are pinned: what
that design does on purpose is reported by the spec's judge and not under
the ``powertools`` profile, and what is a hazard in any design (a stale
holder's completion or delete accepted, two live holders, a lost record, a
duplicate effect under a live lock) is reported under the profile too.
"""

from __future__ import annotations

import datetime as dt
import math
import pickle
from pathlib import Path
from types import MappingProxyType

import pytest

from dsm_sim import checker
from dsm_sim.conformance.judge.semantics import (
    DSM,
    OPERATIONS,
    POWERTOOLS,
    SemanticsProfile,
    UnsupportedOperationError,
)
from dsm_sim.conformance.properties import PROPERTY_NAMES, get_property
from dsm_sim.history import (
    EventKind,
    History,
    HistoryRecorder,
    KeyInfo,
    Observed,
    OpName,
    Outcome,
    RecordView,
)
from dsm_sim.micros import micros_of as us
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator import cli
from dsm_sim.simulator.run import run_scenario
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
EPOCH = dt.datetime(2026, 1, 1, 9, 0, tzinfo=dt.UTC)
K = "tenant-1/4/node//inv-1"
LOCK = 60.0
RETENTION = 120.0
#: ``created_at``/``updated_at`` as the Powertools adapter reports them: the Unix epoch.
UNIX = -(EPOCH - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()
OWNERSHIP = {"stale_write_rejected", "at_most_one_live_lock"}


class Store:
    """Records calls read around (before and after) the way the simulator does.

    ``record`` is what the store holds; each call's *after* becomes it.  Views
    are shaped like the Powertools adapter's: no writer or write times, the
    attempt is the last grant, retention stored in whole seconds.
    """

    def __init__(self, *, faults_stop: float | None = None) -> None:
        self.rec = HistoryRecorder(
            epoch=EPOCH, lock_duration=LOCK, sweep_interval=20.0, store_order=True
        )
        self.rec.faults_stop = None if faults_stop is None else us(faults_stop)
        self.rec.key_info(
            K,
            KeyInfo(
                node="node",
                tenant="tenant-1",
                scope=4,
                entity="node",
                item_entity_key="",
                item="inv-1",
                lock_duration=LOCK,
                retention=RETENTION,
            ),
        )
        self.record: RecordView | None = None
        self.grants = 0

    def view(self, status: str, at: float, *, lock: float | None = None) -> RecordView:
        return RecordView(
            key=K,
            status=status,
            attempt=self.grants,
            locked_until=None if lock is None else us(lock),
            created_at=us(UNIX),
            updated_at=us(UNIX),
            retain_until=us(math.floor(at) + RETENTION),
            data=None,
            audit=(None, "", ""),
        )

    def call(
        self,
        process: str,
        name: OpName,
        at: float,
        after: RecordView | None,
        *,
        token: int | None = None,
        status: str | None = None,
        result: bool | int | None = None,
        outcome: Outcome = Outcome.OK,
        error: str | None = None,
    ) -> int:
        before = self.record
        index = self.rec.invoke(
            process, name, K, us(at - 0.01), token=token, status=status, execution=f"{process}-x1"
        )
        granted = result if name is OpName.TRY_ACQUIRE_LOCK and type(result) is int else None
        self.rec.complete(
            index,
            outcome,
            us(at),
            result=result,
            error=error,
            store_time=us(at),
            token=granted,
            observed=Observed(before, after, None),
        )
        self.record = after
        return index

    def acquire(self, process: str, at: float) -> int:
        self.grants += 1
        lock = math.floor(at * 1000) / 1000 + LOCK  # milliseconds, as Powertools stores it
        self.call(
            process,
            OpName.TRY_ACQUIRE_LOCK,
            at,
            self.view("processing", at, lock=lock),
            result=self.grants,
        )
        return self.grants

    def refused(self, process: str, at: float) -> None:
        self.call(process, OpName.TRY_ACQUIRE_LOCK, at, self.record, result=None)

    def done(self, process: str, at: float, token: int, *, outcome: Outcome = Outcome.OK) -> None:
        error = "StoreError" if outcome is Outcome.INFO else None
        after = self.view("processed", at)
        self.call(
            process, OpName.SET, at, after, token=token, status="processed", outcome=outcome,
            error=error,
        )  # fmt: skip

    def release(self, process: str, at: float, token: int) -> None:
        self.call(process, OpName.RELEASE_LOCK_AS_FAILED, at, None, token=token)

    def exists(self, process: str, at: float, *, gone: bool = False) -> None:
        if gone:
            self.record = None
        found = self.record is not None and self.record.status == "processed"
        self.call(process, OpName.EXISTS, at, self.record, result=found)

    def effect(self, process: str, at: float, token: int) -> None:
        self.rec.event(
            EventKind.SIDE_EFFECT,
            us(at),
            process=process,
            key=K,
            token=token,
            execution=f"{process}-x1",
        )

    def final(self, at: float) -> History:
        status = "none" if self.record is None else self.record.status
        attempt = None if self.record is None else self.grants
        self.rec.final_state(K, status, attempt, us(at), us(at))
        return self.rec.freeze()


def failed(history: History, semantics: SemanticsProfile = DSM) -> set[str]:
    return {r.name for r in checker.check_history(history, semantics) if not r.passed}


# --- what Powertools does by design is not reported --------------------------------------------


def test_a_failure_that_deletes_the_record_is_the_design() -> None:
    s = Store()
    s.exists("w1", 1.0)
    token = s.acquire("w1", 1.5)
    s.release("w1", 5.0, token)  # the charge failed: delete_record
    s.exists("w2", 6.0)
    again = s.acquire("w2", 6.5)
    s.effect("w2", 7.0, again)
    s.done("w2", 8.0, again)
    history = s.final(200.0)
    assert {"record_agrees_with_model", "timestamps_in_utc"} <= failed(history)
    assert failed(history, POWERTOOLS) == set()


@pytest.mark.parametrize(
    ("taken", "taken_over", "spec_says"),
    [
        (1.0, 61.0, {"at_most_one_live_lock"}),  # the expiry instant
        (1.0004, 61.0002, {"at_most_one_live_lock"}),  # stored as 61.000: ended at 61.000
    ],
)
def test_a_lock_ends_at_its_expiry_instant_in_milliseconds(
    taken: float, taken_over: float, spec_says: set[str]
) -> None:
    s = Store()
    first = s.acquire("w1", taken)
    s.effect("w1", 2.0, first)
    second = s.acquire("w2", taken_over)
    s.done("w2", 62.0, second)
    history = s.final(200.0)
    assert spec_says <= failed(history)
    assert failed(history, POWERTOOLS) == set()


def test_a_record_dropped_by_its_ttl_is_gone_by_design() -> None:
    s = Store()
    first = s.acquire("w1", 1.0)
    s.effect("w1", 2.0, first)
    s.done("w1", 3.5, first)  # kept until 3.5 + 120 s (stored as 123 s)
    s.exists("w2", 123.2)  # past 123 s, within the exact end: still there
    s.exists("w2", 124.0, gone=True)
    second = s.acquire("w2", 124.5)
    s.effect("w2", 125.0, second)
    s.done("w2", 126.0, second)
    history = s.final(200.0)
    assert {"no_record_lost", "record_agrees_with_model", "no_duplicate_side_effect"} <= failed(
        history
    )
    results = {r.name: r for r in checker.check_history(history, POWERTOOLS)}
    assert [n for n, r in results.items() if not r.passed] == []
    assert any("TTL ran out" in note for note in results["no_duplicate_side_effect"].notes)


def test_an_expired_lock_left_unswept_is_not_stuck_without_a_lock_sweep() -> None:
    s = Store(faults_stop=10.0)
    s.acquire("w1", 1.0)  # its holder crashed; nothing sweeps it
    history = s.final(300.0)
    assert "terminal_within_deadline" in failed(history)
    results = {r.name: r for r in checker.check_history(history, POWERTOOLS)}
    assert results["terminal_within_deadline"].passed
    assert any("no lock sweep" in note for note in results["terminal_within_deadline"].notes)


def test_a_waived_property_is_neither_passed_nor_failed() -> None:
    s = Store()
    token = s.acquire("w1", 1.0)
    s.effect("w1", 2.0, token)
    s.done("w1", 3.0, token, outcome=Outcome.INFO)  # landed, the reply was lost
    s.done("w1", 4.0, token)  # the retry rewrites the record
    history = s.final(200.0)
    assert "spent_token_rejected" in failed(history)
    results = {r.name: r for r in checker.check_history(history, POWERTOOLS)}
    assert checker.all_passed(results.values())
    for name, reason in POWERTOOLS.waived.items():
        assert results[name].verdict == "waived"
        assert results[name].waived == reason
    spent = results["spent_token_rejected"]
    assert spent.violations == ()
    assert spent.notes == (f"1 finding(s) set aside: by design, {spent.waived}",)
    assert results["stale_write_rejected"].verdict == "passed"


# --- what is a hazard in any design still is ---------------------------------------------------


def test_a_stale_holders_completion_is_still_reported() -> None:
    s = Store()
    first = s.acquire("w1", 1.0)
    s.effect("w1", 2.0, first)
    s.refused("w2", 30.0)  # live: refused
    second = s.acquire("w2", 62.0)  # expired at 61: taken over
    s.done("w1", 70.0, first)  # the slow holder's save_success lands on w2's record
    history = s.final(200.0)
    assert {"stale_write_rejected"} <= failed(history, POWERTOOLS)
    assert second == 2


def test_two_judges_of_one_property_make_one_result_under_the_kits_name() -> None:
    """The history check and the call-by-call model judge both see the stale completion;
    the report has one ``stale_write_rejected``, failed, with both findings and the kit's words."""
    s = Store()
    first = s.acquire("w1", 1.0)
    s.effect("w1", 2.0, first)
    s.acquire("w2", 62.0)  # expired at 61: taken over
    s.done("w1", 70.0, first)
    results = checker.check_history(s.final(200.0))
    names = [r.name for r in results]
    assert len(names) == len(set(names)), names
    (stale,) = [r for r in results if r.name == "stale_write_rejected"]
    messages = [v.message for v in stale.violations]
    assert any("stale write accepted" in m for m in messages), messages  # the history's
    assert any("the spec says StaleLockError" in m for m in messages), messages  # the model's
    assert stale.description == get_property("stale_write_rejected").summary
    checker_only = {
        "no_duplicate_side_effect",
        "terminal_within_deadline",
        "no_record_lost",
        "every_delivery_settles",
    }
    assert set(names) - checker_only <= set(PROPERTY_NAMES), "a name the kit does not have"


def test_a_stale_holders_delete_is_still_reported() -> None:
    s = Store()
    first = s.acquire("w1", 1.0)
    s.acquire("w2", 62.0)
    s.release("w1", 70.0, first)  # the slow holder's delete_record removes w2's record
    history = s.final(100.0)
    reported = {r.name: r for r in checker.check_history(history, POWERTOOLS) if not r.passed}
    assert {"stale_write_rejected", "no_record_lost"} <= set(reported)
    assert "stale holder's delete" in reported["no_record_lost"].violations[0].message


def test_two_live_holders_and_their_two_effects_are_still_reported() -> None:
    s = Store()
    first = s.acquire("w1", 1.0)
    s.effect("w1", 2.0, first)
    second = s.acquire("w2", 30.0)  # granted over a live lock
    s.effect("w2", 31.0, second)
    history = s.final(200.0)
    assert {"at_most_one_live_lock", "no_duplicate_side_effect"} <= failed(history, POWERTOOLS)


def test_a_record_lost_before_its_ttl_is_still_reported() -> None:
    s = Store()
    token = s.acquire("w1", 1.0)
    s.done("w1", 3.0, token)
    s.exists("w2", 50.0, gone=True)  # 70 s before its TTL runs out
    history = s.final(60.0)
    assert {"record_agrees_with_model", "no_record_lost"} <= failed(history, POWERTOOLS)


def test_the_spec_profile_changes_nothing() -> None:
    s = Store()
    s.acquire("w1", 1.0)
    history = s.final(200.0)
    assert checker.check_history(history) == checker.check_history(history, DSM)


# --- the simulator under a profile -------------------------------------------------------------

NO_SWEEP = SemanticsProfile(
    name="no-sweep",
    summary="no lock sweep: the next acquisition takes an expired lock over",
    lock_sweep=False,
    waived=MappingProxyType(
        {"sweep_only_expired": "no lock sweep", "sweep_resets_expired": "no lock sweep"}
    ),
)
NO_UPSERT = SemanticsProfile(
    name="no-upsert",
    summary="no upsert",
    operations=OPERATIONS - {"upsert"},
    waived=MappingProxyType({"upsert_keeps_history": "no upsert"}),
)


def test_a_library_without_a_lock_sweep_is_never_asked_for_one() -> None:
    result = run_scenario(
        load_scenario(SCENARIOS / "crash-mid-dispatch.toml"), 1, semantics=NO_SWEEP
    )
    ops = {op.op for op in result.history.ops}
    assert OpName.RESET_EXPIRED_LOCKS not in ops
    assert OpName.EXPIRE_PAST_RETENTION in ops
    assert result.passed, result.violated  # the spec's handler, crashes and all
    assert {r.name for r in result.waived} == set(NO_SWEEP.waived)


class _NoUpsert(InMemoryStateHandler):
    async def upsert(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the simulator called an operation the profile says is missing")


def test_an_operation_the_library_lacks_is_refused_without_reaching_the_store() -> None:
    scenario = load_scenario(SCENARIOS / "correction-upserts.toml")
    result = run_scenario(scenario, 1, _NoUpsert, semantics=NO_UPSERT)
    refused = [op for op in result.history.ops if op.op is OpName.UPSERT]
    assert refused
    assert {(op.outcome, op.error, op.store_time) for op in refused} == {
        (Outcome.FAIL, "UnsupportedOperationError", None)
    }
    assert result.passed, result.violated  # the deliveries that needed it are dead-lettered
    dead = {ev.detail for ev in result.history.events if ev.kind is EventKind.DEAD_LETTER}
    assert dead == {"UnsupportedOperationError"}


def test_a_factory_declares_its_profile_and_the_replay_names_a_given_one() -> None:
    scenario = load_scenario(SCENARIOS / "crash-mid-dispatch.toml")

    def factory(clock: object) -> InMemoryStateHandler:
        return InMemoryStateHandler(clock)  # type: ignore[arg-type]

    factory.dsm_semantics = NO_SWEEP  # type: ignore[attr-defined]
    declared = run_scenario(scenario, 1, factory)
    assert declared.semantics is NO_SWEEP
    assert "--semantics" not in declared.replay
    given = run_scenario(scenario, 1, semantics="powertools")
    assert given.semantics is POWERTOOLS
    assert given.replay.endswith("--semantics powertools")
    assert run_scenario(scenario, 1).semantics is DSM


def test_an_unknown_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args([str(SCENARIOS / "crash-mid-dispatch.toml"), "--semantics", "nope"])
    assert cli.main(args) == 2
    assert "unknown semantics profile 'nope'" in capsys.readouterr().err


def test_profiles_and_the_refusal_travel_to_worker_processes() -> None:
    assert pickle.loads(pickle.dumps(POWERTOOLS)) is POWERTOOLS
    copy = pickle.loads(pickle.dumps(NO_SWEEP))
    assert copy == NO_SWEEP
    assert copy.waived == NO_SWEEP.waived
    error = UnsupportedOperationError(library="x", operation="upsert", supported="get")
    assert "x has no counterpart of upsert" in str(error)
