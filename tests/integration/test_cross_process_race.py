"""A check-then-write race between handler processes on one SQLite file, end to end.

``sqlite_race_handler.py --racy`` reads the record, sleeps a few
milliseconds and writes the lock without checking again; the kit races it
through peer processes on one named store.  The finding is shrunk to a short
story (by repetition when its replays break it only sometimes), the replay
file holds every process's requests, and ``dsm replay`` sends them again in
as many processes and counts the runs that broke the reference model.  The
same handler without the race passes both.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dsm_sim.cli import main
from dsm_sim.conformance import verify
from dsm_sim.conformance.report import PropertyResult, ResultStatus
from dsm_sim.conformance.tell.shrink_budget import SHORT_STORY
from dsm_sim.protocol import exec_factory
from dsm_sim.protocol.replay import read_entries, write_replay

HANDLER = Path(__file__).with_name("sqlite_race_handler.py")


#: The racy handler's window when its requests are replayed: wide enough that two acquires
#: sent together both read before either writes, however loaded the machine.
REPLAY_WINDOW_S = 0.25


def _command(directory: Path, racy: bool, window: float | None = None) -> str:
    command = f"{sys.executable} {HANDLER} {directory}" + (" --racy" if racy else "")
    return command if window is None else f"{command} --window {window}"


def test_a_race_across_processes_is_shrunk_recorded_whole_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = exec_factory(_command(tmp_path / "db", racy=True), timeout=60)
    files: list[tuple[PropertyResult, list[bytes]]] = []

    def on_violation(result: PropertyResult) -> None:
        files.append((result, factory.last_recording.lines()))

    report = verify(
        factory,
        "dev",
        seed=1,
        stop_on_first=True,
        probes=False,
        matrix=False,
        volume=False,
        time_zone="UTC0",
        on_violation=on_violation,
    )
    (result,) = report.violations
    assert report.out_of_process and report.instances > 1
    assert result.story_steps <= SHORT_STORY, result.story
    assert result.confirmed is not None and result.confirmed[0] > 0
    if result.status is ResultStatus.FLAKY:
        hits, tried = result.confirmed
        assert f"(failed {hits} of {tried} replays of these steps)" in result.render()
    ((_, lines),) = files
    path = write_replay(lines, tmp_path, "race.jsonl")
    entries = read_entries(path)
    processes = {entry.process for entry in entries}
    assert len(processes) >= 2, "only the first process's requests were recorded"
    ops = [entry.request["op"] for entry in entries if entry.process != 1]
    assert "open" in ops and len(ops) > 2
    assert json.loads(path.read_text().splitlines()[0])["request"]["op"] == "open"

    assert (
        main(
            [
                "replay",
                str(path),
                "--exec",
                _command(tmp_path / "db", True, REPLAY_WINDOW_S),
                "--times",
                "10",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    broke = re.search(r"^broke (\d+) of 10 run\(s\)", out, re.MULTILINE)
    assert broke and int(broke[1]) >= 1, out
    assert f"to {len(processes)} processes" in out

    # The same requests against the handler without the race: no run breaks.
    assert (
        main(["replay", str(path), "--exec", _command(tmp_path / "db", False), "--times", "3"]) == 0
    )
    assert "broke 0 of 3 run(s)" in capsys.readouterr().out


def test_the_handler_without_the_race_passes(tmp_path: Path) -> None:
    factory = exec_factory(_command(tmp_path / "db", racy=False), timeout=60)
    report = verify(
        factory,
        "dev",
        seed=1,
        probes=False,
        matrix=False,
        volume=False,
        time_zone="UTC0",
        max_examples=10,
    )
    assert not report.violations, [r.render() for r in report.violations]
    assert report.out_of_process and report.instances > 1
