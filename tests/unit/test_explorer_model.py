"""The explorer's data, without a browser: the diagram is the table's, changes follow the reads."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from dsm_sim import cli
from dsm_sim.history import History, Op, OpName, Outcome, RecordView
from dsm_sim.micros import micros_of as us
from dsm_sim.reports.explorer import explorer_view
from dsm_sim.reports.explorer.diagram import INITIAL, state_diagram
from dsm_sim.reports.explorer.model import explorer_data
from dsm_sim.reports.explorer.transitions import resolve_edge
from dsm_sim.teaching.diagram import EXPIRED_LOCK
from reference_engine.status import TRANSITIONS, IdempotencyStatus

pytestmark = pytest.mark.unit

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _node(status: IdempotencyStatus) -> str:
    return INITIAL if status is IdempotencyStatus.NONE else status.label


def test_the_diagram_has_every_transition_of_the_table_and_only_those() -> None:
    diagram = state_diagram()
    drawn = {(e.source, e.target) for e in diagram.edges}
    table = {(_node(s), t.label) for s, targets in TRANSITIONS.items() for t in targets}
    lapsed = {(EXPIRED_LOCK, t) for s, t in table if s == "Processing"}
    extra = {("Processing", EXPIRED_LOCK), (EXPIRED_LOCK, "Processing")}
    assert table - lapsed <= drawn | {("Processing", t) for _, t in lapsed}
    assert drawn <= table | lapsed | extra
    assert len({n.dom_id for n in diagram.nodes}) == len(diagram.nodes)


def test_changes_are_resolved_on_the_diagram_or_named_as_not_in_it() -> None:
    diagram = state_diagram()
    assert resolve_edge(diagram, INITIAL, "Processing") == "[*]>Processing"
    assert resolve_edge(diagram, EXPIRED_LOCK, "Processed") == "Processing>Processed"
    assert resolve_edge(diagram, INITIAL, "Processed", upsert=True) == "[*]>Processing>Processed"
    assert resolve_edge(diagram, "Failed", "Processed") == "Failed>Processed"
    assert not diagram.has("Failed", "Processed")


def _view(status: str, attempt: int, locked_until: float | None) -> RecordView:
    lock = None if locked_until is None else us(locked_until)
    return RecordView("k", status, attempt, lock, 0, 0, None, "d")


def test_a_sweep_fails_the_keys_it_reset_and_the_lapsed_lock_is_its_own_node() -> None:
    acquire = Op(
        0, "w1", OpName.TRY_ACQUIRE_LOCK, "k", 0, us(1.0), Outcome.OK, 1, token=1,
        store_time=us(1.0), probed=True, before=None, after=_view("processing", 1, 61.0),
    )  # fmt: skip
    sweep = Op(
        1, "catchup", OpName.RESET_EXPIRED_LOCKS, "", us(70.0), us(70.5), Outcome.OK, 1,
        store_time=us(70.5), keys=("k",),
    )  # fmt: skip
    history = History(epoch=EPOCH, lock_duration=60.0, ops=(acquire, sweep))
    data = explorer_data(history)
    strings = data["strings"]
    assert [strings[e] for e in data["changes"]["edge"]] == ["[*]>Processing", "ExpiredLock>Failed"]
    assert [strings[r[0]] for r in data["changes"]["record"]] == ["processing", "failed"]
    assert data["changes"]["record"][1][2] is None, "the sweep ends the lock"
    assert data["changes"]["t"] == [1.0, 70.5]


def test_no_text_in_a_history_can_close_the_inline_data() -> None:
    key = "</script><script>alert(1)</script>"
    op = Op(0, "w1", OpName.EXISTS, key, 0, us(0.5), Outcome.OK, False)
    view = explorer_view(History(epoch=EPOCH, lock_duration=60.0, ops=(op,)))
    assert "<" not in str(view.data_json)
    assert json.loads(str(view.data_json))["keys"] == [key]


def test_the_demo_prints_the_same_walk_through_with_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = "reference_engine.handlers.memory:in_memory_handler"
    assert cli.main(["demo", "invoice", "--handler", handler]) == 0
    plain = capsys.readouterr().out
    page = tmp_path / "walk.html"
    assert cli.main(["demo", "invoice", "--handler", handler, "--html", str(page)]) == 0
    printed = capsys.readouterr()
    assert printed.out == plain, "the narration is the same with --html"
    assert printed.err == f"dsm demo: explorer page written to {page}\n"
    text = page.read_text(encoding="utf-8")
    raw = text.split('<script type="application/json" id="dsm-explorer-data">', 1)[1]
    data = json.loads(raw.split("</script>", 1)[0])
    titles = [c["title"] for c in data["chapters"]]
    assert any(t.startswith("Step 5. Crash") for t in titles)
    names = [data["op_names"][i] for i in data["ops"]["op"]]
    assert "reset_expired_locks" in names and names.count("try_acquire_lock") >= 3
    assert '<tr class="fault" ' in text and 'data-kind="crash"' in text
