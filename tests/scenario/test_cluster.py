"""``dsm run --cluster``: a sweep on a Dask cluster changes nothing a user reads.

A ``LocalCluster`` of two worker processes stands in for a real cluster: the
runs travel to other processes through Dask's scheduler exactly as they would
to other machines.  The comparison is byte for byte, as for ``--jobs``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from run_outputs import files_under

from dsm_sim.cli import EXIT_TERMINATED
from dsm_sim.cli import main as dsm
from dsm_sim.dask_cluster import WORKER_SWITCH_INTERVAL, ClusterUnavailableError, local_cluster
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.distributed import run_plan_on_cluster
from dsm_sim.simulator.parallel import run_plan

try:
    import distributed  # noqa: F401
except ImportError:  # pragma: no cover - the dev extra installs it
    if os.environ.get("CI", "").lower() == "true":
        raise  # CI=true: a missing dependency is a failure, not a skip
    pytest.skip("the 'cluster' extra (dask[distributed]) is not installed", allow_module_level=True)

pytestmark = pytest.mark.scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def test_a_local_cluster_gives_byte_identical_stdout_reports_and_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [
        "run",
        str(SCENARIOS / "duplicate-storm.toml"),
        str(SCENARIOS / "slow-worker.toml"),
        "--seeds",
        "2",
        "--handler",
        "broken:no_fencing",
        "--report",
        "out/reports",
        "--junit",
        "out/junit.xml",
    ]
    serial_code = dsm(argv)
    serial_out = capsys.readouterr().out
    serial_files = files_under(tmp_path / "out")
    shutil.rmtree(tmp_path / "out")
    cluster_code = dsm([*argv, "--cluster", "local", "--jobs", "2"])
    cluster_out = capsys.readouterr().out
    cluster_files = files_under(tmp_path / "out")

    assert serial_code == 1, "the broken handler must fail slow-worker, or nothing is compared"
    assert "FAIL slow-worker seed" in serial_out
    assert cluster_code == serial_code
    assert cluster_out == serial_out
    assert sorted(cluster_files) == sorted(serial_files) and len(serial_files) == 10
    for name, content in serial_files.items():
        assert cluster_files[name] == content, f"{name} differs between serial and the cluster"


def test_outcomes_come_back_in_plan_order_with_the_serial_results() -> None:
    plan = [
        (load_scenario(SCENARIOS / name), seed)
        for name in ("tenants-and-keys.toml", "duplicate-storm.toml", "short-locks.toml")
        for seed in (1, 2)
    ]
    handler = "reference_engine.handlers.memory:in_memory_handler"
    serial = list(run_plan(plan, handler))
    # With Dask's default port, 8787, held (as by another cluster on the machine),
    # the local cluster starts on free ports and says nothing about it.
    with socket.socket() as held, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with contextlib.suppress(OSError):  # already held by someone else: as good
            held.bind(("0.0.0.0", 8787))
            held.listen()
        remote = list(run_plan_on_cluster(plan, handler, workers=2, keep_history=False))
    assert not [w for w in said if "8787" in str(w.message)], [str(w.message) for w in said]
    assert [(o.scenario.name, o.seed) for o in remote] == [(s.name, seed) for s, seed in plan]
    for mine, theirs in zip(serial, remote, strict=True):
        assert mine.result is not None and theirs.result is not None, (mine, theirs)
        assert theirs.result.stats == mine.result.stats
        assert theirs.result.violated == mine.result.violated
        assert not theirs.result.history_kept and theirs.result.history.ops == ()


def test_a_scheduler_nobody_runs_is_a_named_error_before_any_run() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plan = [(load_scenario(SCENARIOS / "duplicate-storm.toml"), 1)]
    with pytest.raises(ClusterUnavailableError, match="cannot run on the Dask cluster") as caught:
        run_plan_on_cluster(
            plan, "broken:no_fencing", address=f"tcp://127.0.0.1:{port}", connect_timeout=2
        )
    assert caught.value.where == f"tcp://127.0.0.1:{port}"
    assert "--jobs" in str(caught.value)


def test_a_worker_lost_mid_sweep_costs_only_its_unfinished_runs() -> None:
    # A cluster of our own, so one of its workers can be killed while the sweep
    # runs: Dask gives that worker's unfinished runs to the worker left (or to
    # the one its nanny starts again), and every outcome is still the serial one.
    import signal

    from distributed import Client

    plan = [
        (load_scenario(SCENARIOS / name), seed)
        for name in ("tenants-and-keys.toml", "duplicate-storm.toml", "short-locks.toml")
        for seed in (1, 2, 3)
    ]
    handler = "reference_engine.handlers.memory:in_memory_handler"
    serial = list(run_plan(plan, handler))
    cluster = local_cluster(2)
    with cluster, Client(cluster) as client:  # type: ignore[no-untyped-call]
        pids = client.run(os.getpid)
        victim_at, victim = min(pids.items(), key=lambda item: item[1])
        # Our own workers let a run keep the GIL longer; this process keeps Python's own.
        intervals = client.run(sys.getswitchinterval).values()
        assert list(intervals) == [pytest.approx(WORKER_SWITCH_INTERVAL)] * 2, intervals
        assert sys.getswitchinterval() != pytest.approx(WORKER_SWITCH_INTERVAL)
        remote = []
        for n, outcome in enumerate(
            run_plan_on_cluster(plan, handler, address=cluster.scheduler_address)
        ):
            remote.append(outcome)
            if n == 0:
                os.kill(victim, signal.SIGKILL)
        # The worker its nanny started again (once it is back) is set up the same.
        until = time.monotonic() + 30
        while victim_at in client.run_on_scheduler(_worker_addresses):
            assert time.monotonic() < until, "the scheduler never dropped the killed worker"
            time.sleep(0.05)
        client.wait_for_workers(2, timeout=30)
        intervals = client.run(sys.getswitchinterval).values()
        assert list(intervals) == [pytest.approx(WORKER_SWITCH_INTERVAL)] * 2, intervals
    assert [(o.scenario.name, o.seed) for o in remote] == [(s.name, seed) for s, seed in plan]
    for mine, theirs in zip(serial, remote, strict=True):
        assert mine.result is not None and theirs.result is not None, (mine, theirs)
        assert theirs.result.stats == mine.result.stats
        assert theirs.result.violated == mine.result.violated


def test_a_sweep_stopped_on_a_local_cluster_says_nothing_of_dasks_teardown() -> None:
    # SIGTERM (as CI sends on a cancelled job) once the first run is reported: the
    # command ends as --jobs does, with its exit code and no word on stderr, instead
    # of the tracebacks of the gathers and streams Dask breaks as the cluster closes
    # and the workers' warnings about the runs cut short.
    import signal
    import subprocess

    command = [sys.executable, "-m", "dsm_sim.cli", "run", str(SCENARIOS)]
    command += ["--seeds", "20", "--cluster", "local", "--jobs", "2"]
    # Unbuffered, so the first run's line comes as it is printed, not 8 KB later.
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sweep:
        assert sweep.stdout is not None
        heard = [sweep.stdout.readline()]
        while heard[-1] and "PASS" not in heard[-1]:  # the plan's heading, then the first run
            heard.append(sweep.stdout.readline())
        sweep.send_signal(signal.SIGTERM)
        _, said = sweep.communicate(timeout=60)
    assert "PASS" in heard[-1], heard
    assert sweep.returncode == EXIT_TERMINATED, said
    assert said == "", said


def _worker_addresses(dask_scheduler: Any) -> list[str]:
    """The workers the scheduler counts, run on the scheduler."""
    return list(dask_scheduler.workers)
