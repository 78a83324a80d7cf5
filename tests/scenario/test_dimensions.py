"""Scenario dimensions: reached where asked, judged with the options each call carried, and
a dimension a run never reached is NOT EXERCISED (failed) unless waived by name."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.checker.history_rows import superseded_ledger, superseded_rows_expire
from dsm_sim.cli import main
from dsm_sim.history import EventKind, History, Op, OpName, Outcome, RecordView
from dsm_sim.micros import micros_of as us
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.dimensions import Dimension, asked
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.scenario

MONTH_END = Path(__file__).resolve().parents[2] / "scenarios" / "month-end.toml"

#: A scenario that asks for a start, busy instances and a redeploy, and reaches only the
#: instances: its day ends long before midnight, and its redeploy comes after every write.
UNREACHED = """\
# Asks for dimensions its run cannot reach.
name = "unreached"
[run]
items = 4
workers = 2
instance_items = 2
arrival_window = "10s"
faults_until = "5m"
start = "2026-03-01T09:00:00Z"
[[nodes]]
id = "inv"
kind = "invoice"
[[deployments]]
at = "4m"
lock_duration = "30s"
"""


@pytest.fixture(scope="module")
def month_end() -> list[History]:
    scenario = load_scenario(MONTH_END)
    results = [run_scenario(scenario, seed) for seed in (1, 2)]
    assert all(r.passed and not r.gaps for r in results)
    return [r.history for r in results]


def test_month_end_asks_for_every_dimension() -> None:
    assert asked(load_scenario(MONTH_END)) == list(Dimension)


def test_each_seed_starts_on_its_own_month_end(month_end: list[History]) -> None:
    assert [h.epoch.isoformat() for h in month_end] == [
        "2026-02-28T23:59:00+00:00",
        "2026-12-31T23:58:45+00:00",
    ]


def test_calls_after_a_redeploy_carry_their_options(month_end: list[History]) -> None:
    history = month_end[0]
    (deployed,) = [e for e in history.events if e.kind is EventKind.DEPLOYMENT]
    later = [op for op in history.ops if op.options is not None]
    assert later and all(op.options.lock_duration == 45.0 for op in later if op.options)
    assert min(op.invoke for op in later) >= deployed.time
    # Options survive the report's JSON.
    again = History.from_json(json.loads(json.dumps(history.to_json())))
    assert [op.options for op in again.ops] == [op.options for op in history.ops]


def test_instances_hold_several_items_through_one_handler(month_end: list[History]) -> None:
    lanes = {op.process for op in month_end[0].ops}
    assert {"w1", "w1.2", "w1.3"} <= lanes


def test_superseded_rows_are_followed_and_expired(month_end: list[History]) -> None:
    for history in month_end:
        swept, stopped = superseded_ledger(history)
        assert stopped is None
        assert sum(len(s.due) for s in swept) > 6
        assert superseded_rows_expire(history).passed


def test_a_sweep_that_keeps_old_history_is_named() -> None:
    broken = CATALOGUE["history_sweep_pages_newest"].factory
    result = run_scenario(load_scenario(MONTH_END), 1, broken)
    messages = [
        v.message
        for r in result.results
        if r.name == "retention_sweep_agrees_with_model"
        for v in r.violations
    ]
    assert any("history kept past its retention" in m for m in messages), messages


def test_a_dimension_not_reached_is_not_exercised(tmp_path: Path) -> None:
    path = tmp_path / "unreached.toml"
    path.write_text(UNREACHED, encoding="utf-8")
    result = run_scenario(load_scenario(path), 1)
    assert result.violated == []
    assert [g.name for g in result.gaps] == ["midnight", "deployments"]
    assert not result.passed
    assert all(line.startswith("NOT EXERCISED ") for line in result.not_exercised)
    waived = dataclasses.replace(result, waived_gaps=frozenset({"midnight"}))
    assert not waived.passed and "--waive midnight" in waived.replay
    both = dataclasses.replace(result, waived_gaps=frozenset({"midnight", "deployments"}))
    assert both.passed


def test_dsm_run_fails_what_it_did_not_reach_unless_waived(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "unreached.toml"
    path.write_text(UNREACHED, encoding="utf-8")
    assert main(["run", str(path), "--seeds", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL unreached seed 1: NOT EXERCISED" in out
    assert "NOT EXERCISED midnight: " in out and "NOT EXERCISED deployments: " in out
    assert main(["run", str(path), "--seeds", "1", "--waive", "midnight"]) == 1
    capsys.readouterr()
    waive = ["--waive", "midnight", "--waive", "deployments"]
    assert main(["run", str(path), "--seeds", "1", *waive]) == 0
    out = capsys.readouterr().out
    assert "WAIVED unreached seed 1: midnight: " in out and "not a pass" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(path), "--seeds", "1", "--waive", "bogus"])
    assert exit_info.value.code == 2


def test_history_options_only_on_calls_that_differ(month_end: list[History]) -> None:
    history = month_end[1]
    acquired = [op for op in history.ops if op.op is OpName.TRY_ACQUIRE_LOCK and op.ok]
    assert {history.lock_duration_of(op) for op in acquired} >= {20.0, 45.0}


def _processed(at: float, retention: float = 10.0) -> RecordView:
    return RecordView("k", "processed", 1, None, us(at), us(at), us(at + retention), f"d{at}")


def _ledger_history(*ops: Op) -> History:
    epoch = dt.datetime(2026, 1, 31, 23, 59, tzinfo=dt.UTC)
    return History(epoch=epoch, lock_duration=5.0, ops=ops)


def _upsert(index: int, at: float, before: RecordView | None, after: RecordView | None) -> Op:
    return Op(
        index, "w1", OpName.UPSERT, "k", us(at), us(at), Outcome.OK, store_time=us(at), seq=index,
        probed=True, before=before, after=after,
    )  # fmt: skip


def _sweep(index: int, at: float, count: int) -> Op:
    return Op(
        index, "catchup", OpName.EXPIRE_PAST_RETENTION, "", us(at), us(at), Outcome.OK,
        result=count, store_time=us(at), seq=index,
    )  # fmt: skip


def test_the_ledger_expects_each_superseded_row_when_its_retention_ends() -> None:
    """Two supersedes (one at the instant its record was written), then sweeps either side of
    their ends: the count must follow them, short or long."""
    first, second, third = _processed(1.0), _processed(1.0), _processed(3.0)
    ops = [_upsert(0, 1.0, None, first), _upsert(1, 1.0, first, second)]
    ops += [_upsert(2, 3.0, second, third)]
    good = _ledger_history(*ops, _sweep(3, 11.0, 0), _sweep(4, 11.5, 2))
    swept, stopped = superseded_ledger(good)
    assert stopped is None and [len(s.due) for s in swept] == [0, 2]
    assert superseded_rows_expire(good).passed
    short = _ledger_history(*ops, _sweep(3, 11.5, 1))
    (violation,) = superseded_rows_expire(short).violations
    assert "history kept past its retention" in violation.message
    early = _ledger_history(*ops, _sweep(3, 10.5, 1))
    assert (
        "only 0 superseded row(s) were due" in superseded_rows_expire(early).violations[0].message
    )


def test_a_sweep_counting_fewer_than_the_records_it_expired_claims_no_superseded_row() -> None:
    # A handler whose keys collide (tenant_missing_from_key) expires two current records
    # and answers 1. The shortfall is retention_sweep_agrees_with_model's to report; here
    # the sweep claimed no superseded row, which is right when none was due and a
    # violation when one was.
    sweep = dataclasses.replace(_sweep(2, 20.0, 1), keys=("k", "k2"))
    first = _processed(1.0)
    none_due = _ledger_history(_upsert(0, 1.0, None, first), sweep)
    assert superseded_rows_expire(none_due).passed
    second = _processed(2.0)
    one_due = _ledger_history(_upsert(0, 1.0, None, first), _upsert(1, 2.0, first, second), sweep)
    (violation,) = superseded_rows_expire(one_due).violations
    assert "but 1 superseded row(s) were past their retain_until" in violation.message


def test_a_lost_reply_no_read_can_place_stops_the_ledger_with_a_note() -> None:
    first = _processed(1.0)
    lost = dataclasses.replace(
        _upsert(1, 1.0, first, first), outcome=Outcome.INFO, error="StoreError"
    )
    history = _ledger_history(_upsert(0, 1.0, None, first), lost, _sweep(2, 20.0, 5))
    swept, stopped = superseded_ledger(history)
    assert swept == [] and stopped is not None and "upsert op #1" in stopped
    result = superseded_rows_expire(history)
    assert result.passed and "superseded rows judged up to where" in result.notes[0]
