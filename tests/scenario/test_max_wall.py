"""``dsm run --max-wall`` is a deadline for the whole command, whatever the handler does.

A handler process that stops answering, and a handler call that blocks its
thread (which no event-loop timer can stop), are both stopped at the limit:
in this process, in ``--jobs`` worker processes and on a Dask cluster.  The
command then says it stopped at the wall-clock limit (``WallClockLimitError``,
exit 2) and keeps what the finished runs reported.

Each command runs in a process of its own, in a session of its own, under a
bound far above the limit: a command that does not stop fails the test
instead of hanging it, and whatever it left behind is killed.

Where a run must finish within the limit, the limit is not a fixed number of
seconds: how long the fine run takes (starting worker processes or a
cluster included) depends on the machine and its load, so the test first
times the same command with the fine scenario alone, here and now, and
gives the limited command a limit well above that.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from stuck_handlers import STUCK_ZONE

pytestmark = pytest.mark.scenario

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The limit the commands are given (at least), and how long a command may take before it
#: is called hung (at least: a command given a longer limit is given a longer bound).
MAX_WALL_S = 3
#: On a Dask cluster the limit also covers starting the scheduler and two worker
#: processes, which on a loaded two-core machine alone can take most of 3 s.
CLUSTER_MAX_WALL_S = 8
BOUND_S = 90
#: A limit that a run must finish within is this many times the time the same command
#: took with that run alone (measured just before), plus a second.
MARGIN = 1.5
#: How long the pool's manager thread is held up before it closes, in the test of the stop.
SLOW_MANAGER_S = 2.0
FINE = """\
name = "fine"
[run]
items = 2
workers = 1
arrival_window = "10s"
faults_until = "20s"
"""
STUCK = FINE.replace('"fine"', '"stuck"') + f'host_timezone = "{STUCK_ZONE}"\n'


def dsm_run(tmp_path: Path, *argv: str, bound_s: float = BOUND_S) -> tuple[int, str, str]:
    """``dsm run`` in a process (and session) of its own; fails the test past ``bound_s``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    command = [sys.executable, "-m", "dsm_sim.cli", "run", *argv]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"dsm run {' '.join(argv)} did not stop within {bound_s:g}s:\n{err}")
    finally:
        # Nothing of the command's (worker processes, handlers) may outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err


def limit_for_the_fine_run(tmp_path: Path, where: list[str], floor: int) -> int:
    """A ``--max-wall`` the fine run finishes within: ``MARGIN`` x its time alone, here, now."""
    alone = tmp_path / "alone"  # what it writes stays apart from the limited command's
    alone.mkdir()
    (alone / "fine.toml").write_text(FINE, encoding="utf-8")
    started = time.monotonic()
    code, out, err = dsm_run(
        alone, "fine.toml", "--seed", "1", "--handler", "stuck_handlers:make_handler", *where
    )
    took = time.monotonic() - started
    assert code == 0, out + err
    return max(floor, math.ceil(MARGIN * took + 1))


@pytest.fixture
def scenarios(tmp_path: Path) -> Path:
    (tmp_path / "fine.toml").write_text(FINE, encoding="utf-8")
    (tmp_path / "stuck.toml").write_text(STUCK, encoding="utf-8")
    return tmp_path


def test_a_silent_handler_process_is_stopped_at_the_limit_not_reported_as_a_protocol_error(
    tmp_path: Path, scenarios: Path
) -> None:
    silent = f"exec:{sys.executable} {HERE / 'stuck_handlers.py'}"
    code, out, err = dsm_run(
        tmp_path, "fine.toml", "--seed", "1", "--handler", silent, "--max-wall", str(MAX_WALL_S)
    )
    assert code == 2, out + err
    assert (
        "dsm run: WallClockLimitError: --max-wall 3s of real time expired while running fine" in err
    )
    # Cut by the limit, not by the handler's own request timeout (10 s, a protocol error).
    assert "protocol error" not in out, out
    assert "did not answer request" not in out + err


@pytest.mark.parametrize(
    "where", [[], ["--jobs", "2"], ["--cluster", "local", "--jobs", "2"]], ids=str
)
def test_a_handler_call_that_blocks_its_thread_is_stopped_at_the_limit(
    tmp_path: Path, scenarios: Path, where: list[str]
) -> None:
    floor = MAX_WALL_S
    if where[:1] == ["--cluster"]:
        pytest.importorskip("distributed")
        floor = CLUSTER_MAX_WALL_S
    # The fine run must finish within the limit, which must not depend on the machine.
    limit = limit_for_the_fine_run(tmp_path, where, floor)
    code, out, err = dsm_run(
        tmp_path,
        "fine.toml",
        "stuck.toml",
        "--seed",
        "1",
        "--handler",
        "stuck_handlers:make_handler",
        "--max-wall",
        str(limit),
        "--junit",
        "junit.xml",
        *where,
        bound_s=max(BOUND_S, 3 * limit),
    )
    assert code == 2, out + err
    assert "2 runs of 2 scenarios:" in out and "fine seed 1: PASS" in out
    assert "1/1 runs kept every invariant" in out
    assert (
        f"WallClockLimitError: --max-wall {limit}s of real time expired while running stuck seed 1"
        in err
    )
    assert "1 of 2 runs finished" in err
    assert (tmp_path / "junit.xml").read_text(encoding="utf-8").count("<testcase") == 1
    assert "Traceback" not in err


def test_a_call_blocked_in_this_thread_is_interrupted_after_the_deadline() -> None:
    """The serial path's guard: the blocked call raises, well before it would have returned."""
    from dsm_sim.wall import WallClockLimitError, interrupt_at, wall_now

    started = wall_now()
    with pytest.raises(WallClockLimitError, match="blocked its thread"), interrupt_at(started):
        time.sleep(BOUND_S)
    assert wall_now() - started < BOUND_S


def test_a_plan_stopped_at_its_deadline_leaves_no_pool_thread_running(
    scenarios: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop waits for the pool's manager thread to close, however slow the machine.

    A manager thread still closing its wake-up pipe at interpreter exit races the
    exit hook of ``concurrent.futures`` that writes to it (unlocked on Python 3.11):
    the exit then prints ``OSError: handle is closed`` or ``BrokenPipeError``.  Here
    the manager thread is slowed down, as a loaded machine slows it.
    """
    import concurrent.futures.process as pool_internals

    from dsm_sim.scenario import load_scenario
    from dsm_sim.simulator.parallel import run_plan
    from dsm_sim.wall import WallClockLimitError, wall_now

    manager = pool_internals._ExecutorManagerThread
    close = manager.join_executor_internals

    def slowly(self: object) -> None:
        time.sleep(SLOW_MANAGER_S)
        close(self)  # type: ignore[arg-type]

    monkeypatch.setattr(manager, "join_executor_internals", slowly)
    plan = [(load_scenario(scenarios / f"{n}.toml"), 1) for n in ("fine", "stuck")]
    outcomes = run_plan(
        plan, "stuck_handlers:make_handler", jobs=2, deadline=wall_now() + MAX_WALL_S
    )
    try:
        assert any(isinstance(o.error, WallClockLimitError) for o in outcomes)
    finally:
        outcomes.close()  # type: ignore[attr-defined]
    assert not [t for t in threading.enumerate() if isinstance(t, manager)]
    assert all(w._closed for w in pool_internals._threads_wakeups.values())
