"""A handler that stamps the last instant a record can hold is judged, never a crash.

9999-12-31 23:59:59.999999 is an instant the docs allow; a float of seconds
since the run's epoch rounded it into year 10000, and ``dsm run`` ended with
``OverflowError`` (exit 3) on the first run that met it.  Histories hold
instants as whole microseconds now, so the wrong lock is a finding and every
scenario given still runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsm_sim.cli import main as dsm

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
RUNS = ("slow-worker", "crash-mid-dispatch")


@pytest.mark.parametrize(
    ("factory", "finding"),
    [("far_lock", "lock_duration_honoured"), ("far_zone", "timestamps_in_utc")],
    ids=["in-utc", "an-hour-past-it-in-utc"],
)
def test_a_lock_until_the_end_of_time_is_a_finding_in_every_run(
    factory: str, finding: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", *(str(SCENARIOS / f"{name}.toml") for name in RUNS), "--seed", "1"]
    argv += ["--handler", f"far_handlers:{factory}", "--report", str(tmp_path)]
    code = dsm(argv)
    out = capsys.readouterr().out
    assert code == 1, out
    for name in RUNS:
        assert f"FAIL {name} seed 1:" in out and finding in out.split(f"FAIL {name} seed 1:")[1]
    (report,) = tmp_path.glob("slow-worker-seed1-*.json")
    ops = json.loads(report.read_text())["history"]["ops"]
    locks = {
        op["after"]["locked_until"]
        for op in ops
        if op.get("after") and op["op"] == "try_acquire_lock"
    }
    # The lock's end, exactly, as the decimal seconds a double cannot hold.
    last = "251635042799.999999" if factory == "far_lock" else "251635046399.999999"
    assert last in locks
