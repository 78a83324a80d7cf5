"""Every process of a stress run journals on the run's one time base.

The checker orders two processes' calls by their journalled times, so those
times must be comparable across processes.  A process that anchored a clock
of its own (a wall-clock read, then a counter read) would be off by however
long it was descheduled between the two reads, or by a step of the wall
clock between two processes' starts: under load, a stress run of the
built-in handler once reported two live locks, a ``Failed -> Processed``
transition and an ``exists`` answered from the future, with no side effect
duplicated -- one process's whole journal was a constant off the other's.

Here the second process's wall clock reads off from its first read on (its
``time.time_ns`` is shifted by a ``sitecustomize`` that the stress processes
load): 30 ms early, the size that, with a clock of its own, reproduced those
findings; and ten minutes late, which with a clock of its own would time its
whole journal outside the run, whoever won which key.  Its journal must be
timed within the run, and the run must pass.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dsm_sim.micros import seconds_of
from dsm_sim.stress import StressSettings, run_stress

pytestmark = pytest.mark.integration

#: Ten minutes late would put a process's journal far outside a run of seconds.
LATE_S = 600.0

#: Loaded at start-up by every Python process that inherits ``PYTHONPATH``;
#: only the stress process named in the environment reads a shifted wall clock.
SITECUSTOMIZE = """\
import multiprocessing
import os
import time

_real_time_ns = time.time_ns
_SHIFT_NS = int(os.environ["DSM_TEST_WALL_SHIFT_NS"])
_PROCESS = os.environ["DSM_TEST_WALL_SHIFT_PROCESS"]


def _shifted_time_ns():
    late = multiprocessing.current_process().name == _PROCESS
    return _real_time_ns() + (_SHIFT_NS if late else 0)


time.time_ns = _shifted_time_ns
"""


@pytest.mark.parametrize("shift_s", [-0.03, LATE_S], ids=["30ms-early", "10min-late"])
def test_a_process_whose_wall_clock_is_off_is_timed_on_the_run_s_time_base(
    shift_s: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), inherited])))
    monkeypatch.setenv("DSM_TEST_WALL_SHIFT_NS", str(round(shift_s * 1e9)))
    monkeypatch.setenv("DSM_TEST_WALL_SHIFT_PROCESS", "dsm-stress-p1")
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / 'stress.db'}",
        processes=2,
        workers=2,
        keys=16,
        duplicates=2,
        fault_free=True,
    )
    report = asyncio.run(run_stress(settings, limit_s=120))

    history = report.history
    assert history is not None, report.summary()
    calls = {p: [op for op in history.ops if op.process == p] for p in ("p0", "p1")}
    assert calls["p0"] and calls["p1"], "both processes made calls"
    # The run takes seconds, so every call of it is timed within its first minutes.
    off = [op for op in history.ops if not 0 <= seconds_of(op.invoke) < LATE_S / 2]
    assert not off, (
        f"{off[0].process}'s op #{off[0].index} is timed at {seconds_of(off[0].invoke):.3f}s"
    )
    assert report.passed, report.summary()
    assert report.effects == settings.keys
    assert report.exit_codes == (0, 0)
