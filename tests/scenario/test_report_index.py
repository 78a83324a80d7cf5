"""What ``dsm run`` says once, and the index a ``--report`` directory opens on.

A reviewer reads the summary and the report directory a CI job kept: the
number of runs is said once, not on every line, and ``index.html`` lists
every run with its verdict, the properties it broke, and a link to its page.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from dsm_sim.cli import main as dsm

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_the_index_lists_every_run_with_its_verdict_and_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    code = dsm(
        [
            "run",
            str(SCENARIOS / "slow-worker.toml"),
            str(SCENARIOS / "duplicate-storm.toml"),
            "--seed",
            "1",
            "--handler",
            "broken:no_fencing",
            "--report",
            str(reports),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0] == "2 runs of 2 scenarios:"
    assert lines[1:3] == ["slow-worker seed 1: FAIL", "duplicate-storm seed 1: PASS"]
    assert out.count("runs") == 2, "the count of runs is said once, and in the summary"
    assert f"reports in {reports / 'index.html'}" in lines[-1]

    page = (reports / "index.html").read_text(encoding="utf-8")
    rows = re.findall(
        r'<tr class="[^"]*" data-verdict="(\w+)"><td><a href="([^"]+)">([^<]+)</a></td>'
        r"<td>(\d+)</td><td>(\w+)</td><td>(.*?)</td>",
        page,
    )
    assert [(v, name, seed, shown) for v, _, name, seed, shown, _ in rows] == [
        ("fail", "slow-worker", "1", "FAIL"),  # failed runs first
        ("pass", "duplicate-storm", "1", "PASS"),
    ]
    for _, link, *_rest in rows:
        assert (reports / html.unescape(link)).is_file(), link
    broken = re.findall(r"<code>(\w+)</code>", rows[0][5])
    assert "stale_write_rejected" in broken and rows[1][5] == ""
    assert "1 of 2 runs failed" in page


def test_the_index_of_a_passing_run_says_so(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    assert dsm(["run", str(SCENARIOS / "swarm.toml"), "--seed", "1", "--report", str(reports)]) == 0
    page = (reports / "index.html").read_text(encoding="utf-8")
    assert "the run kept every invariant" in page
    assert 'data-verdict="fail"' not in page
