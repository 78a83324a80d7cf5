"""A run's memory is bounded: its history stops at ``MAX_HISTORY_ENTRIES``, with a named error.

A scenario within every documented limit (500 items, 16 nodes of 10
revisions, 20 copies of every message, 50 deliveries each) asks for tens of
millions of operations; the checker judges a history whole, in memory, so
without a bound the run grew by megabytes a second until ``--max-wall``.
The bound is lowered here so that a catalogue scenario reaches it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsm_sim import cli
from dsm_sim.history import HistoryLimitError, HistoryRecorder, OpName
from dsm_sim.simulator import run as simulator_run

pytestmark = pytest.mark.scenario

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "tenants-and-keys.toml"


def test_a_run_that_reaches_the_history_limit_stops_with_a_named_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(simulator_run, "MAX_HISTORY_ENTRIES", 300)
    code = cli.main(["run", str(SCENARIO), "--seed", "1", "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "STOPPED tenants-and-keys seed 1: the run's history reached 300 operations" in out
    assert "lower run.items" in out
    assert "1 stopped at the history limit (not judged)" in out
    assert "Traceback" not in out


def test_the_recorder_refuses_an_entry_past_its_limit() -> None:
    recorder = HistoryRecorder(lock_duration=60.0, limit=2)
    recorder.invoke("w1", OpName.EXISTS, "k", 0)
    recorder.invoke("w1", OpName.EXISTS, "k", 1_000_000)
    with pytest.raises(HistoryLimitError, match="reached 2 operations and events at 2s"):
        recorder.invoke("w1", OpName.EXISTS, "k", 2_000_000)
    assert len(recorder.freeze().ops) == 2
