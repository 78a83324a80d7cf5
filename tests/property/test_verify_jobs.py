"""``dsm verify --jobs N``: the race matrix and the search in worker processes, the same report.

The matrix's cells are cut into fixed chunks; N workers run them side by
side and the parent books what each found in chunk order.  The search's
seeds run ahead in the workers, each kept when the properties known at its
turn are those it ran with.  So the text, the JSON and the exit code are
those of ``--jobs 1`` (elapsed seconds aside).  A worker that dies is
reported for the cells or the seed it held, the command's deadline holds in
the workers, and a factory that cannot reach a worker process is refused
before any work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dying_matrix_handler
import pytest
import slow_handler

from dsm_sim import workers
from dsm_sim.conformance import cli, suite
from dsm_sim.conformance.racing import CHUNK_CELLS, chunked
from dsm_sim.conformance.report import ResultStatus
from dsm_sim.conformance.runner import verify
from dsm_sim.simulator.parallel import MAX_JOBS, UnpicklableFactoryError
from reference_engine.handlers.memory import in_memory_handler

pytestmark = pytest.mark.property

FAILING = "dsm_sim.broken.handlers:CheckThenInsertAcquire"
CORRECT = "reference_engine.handlers.memory:in_memory_handler"
DYING = "dying_matrix_handler:make_handler"
SLOW = "slow_handler:make_handler"
#: Generous: far below what the slow handler's full verification takes (many minutes).
BOUND_S = 120.0
ROOT = Path(__file__).resolve().parents[2]
#: Elapsed seconds in the text (``, 12.3s``) and their fields in the JSON.
SECONDS = re.compile(r"\b\d+(\.\d+)?s\b")
TIMING_FIELDS = frozenset({"seconds", "seconds_to_failure"})


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    code = cli.main(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: None if k in TIMING_FIELDS else _untimed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _verify(
    tmp_path: Path, spec: str, jobs: int, *extra: str, name: str | None = None
) -> tuple[int, str, str, Any, int]:
    """``dsm verify`` as a command of its own, as a user runs it (each its own process).

    Not in this process: the search draws from the literals of the modules a
    process has loaded, so only a fresh process shows what a user would see.
    Also answers how many runs of the search ran in the command's own process
    (``verify_counting_runs.py``).
    """
    folder = tmp_path / (name or f"jobs{jobs}")
    folder.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)]),
        "DSM_CACHE_DIR": str(tmp_path / "cache"),
    }
    counting = [sys.executable, str(Path(__file__).parent / "verify_counting_runs.py")]
    command = [*counting, str(folder / "here.txt"), "verify", spec, "--seed", "0"]
    done = subprocess.run(
        [*command, "--jobs", str(jobs), "--json", "report.json", *extra],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    here = int((folder / "here.txt").read_text(encoding="utf-8"))
    return done.returncode, SECONDS.sub("<s>", done.stdout), done.stderr, _untimed(report), here


@pytest.mark.parametrize(
    ("spec", "profile", "code"),
    # The failing handler on every pull request; the correct one (same code path, no finding
    # to merge) with the thorough tier, which keeps the suite inside its time.
    [
        (FAILING, "ci", 1),
        pytest.param(CORRECT, "dev", 0, marks=pytest.mark.thorough),
        pytest.param(CORRECT, "ci", 0, marks=pytest.mark.thorough),
    ],
    ids=["failing", "correct-dev", "correct"],
)
def test_jobs_2_prints_and_writes_what_jobs_1_does(
    tmp_path: Path, spec: str, profile: str, code: int
) -> None:
    one = _verify(tmp_path, spec, 1, "--profile", profile)
    two = _verify(tmp_path, spec, 2, "--profile", profile)
    assert one[0] == two[0] == code, one[1]
    assert one[1] == two[1], "the text output differs"
    assert one[2] == two[2], "the standard error differs"
    assert one[3] == two[3], "the JSON report differs"
    # Every run of the search ran in a worker with --jobs 2 and was kept: the failing
    # handler's runs sent ahead with fewer properties known were run again there.
    assert one[4] == one[3]["explored"]["runs"] >= 1, one[3]["explored"]
    assert two[4] == 0, f"{two[4]} run(s) of the search ran in the command's process"
    # The matrix ran in several chunks, every cell of them (dev lists one state per pair).
    coverage = re.search(r"race matrix: (\d+) of (\d+) cells \((\d+)x(\d+) ordered pairs", one[1])
    assert coverage is not None, one[1]
    ran, cells, ops, _ = map(int, coverage.groups())
    assert ran == (ops * ops if profile == "dev" else cells), one[1]
    assert len(chunked(range(ran))) >= 2  # type: ignore[arg-type]


class _Ahead:
    """What the matrix took of the chunks sent ahead of the probes, and what it dropped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dsm_sim.conformance.parallel import WorkerPool

        self.sent = self.taken = self.dropped = 0
        send, take, drop = WorkerPool.send_ahead, WorkerPool.take_early, WorkerPool.drop_early

        def send_ahead(pool: WorkerPool, works: Any, then: Any = None) -> None:
            self.sent += len(works)
            send(pool, works, then)

        def take_early(pool: WorkerPool, task: Any) -> Any:
            future = take(pool, task)
            self.taken += future is not None
            return future

        def drop_early(pool: WorkerPool) -> None:
            self.dropped += sum(1 for _, future in pool.early if future is not None)
            drop(pool)

        monkeypatch.setattr(WorkerPool, "send_ahead", send_ahead)
        monkeypatch.setattr(WorkerPool, "take_early", take_early)
        monkeypatch.setattr(WorkerPool, "drop_early", drop_early)


def test_the_matrix_takes_the_chunks_sent_ahead_when_the_probes_find_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ahead = _Ahead(monkeypatch)
    report = verify(in_memory_handler, "dev", 0, jobs=2, factory_spec=CORRECT, volume=False)
    assert report.passed, report.gaps
    assert ahead.sent >= 2 and ahead.taken == ahead.sent and ahead.dropped == 0, vars(ahead)


def test_the_matrix_drops_the_chunks_sent_ahead_when_the_probes_found_something(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsm_sim.broken.handlers import CheckThenInsertAcquire

    ahead = _Ahead(monkeypatch)
    report = verify(CheckThenInsertAcquire, "dev", 0, jobs=2, factory_spec=FAILING)
    by_probe = {r.name for r in report.results if r.found_by not in (None, "race matrix")}
    assert by_probe, [(r.name, r.found_by) for r in report.results]
    # The chunks ran with fewer properties known than the matrix then knew: none was taken.
    assert ahead.sent >= 2 and ahead.taken == 0 and ahead.dropped == ahead.sent, vars(ahead)
    assert report.coverage is not None and report.coverage.exercised > 0
    assert "matrix" not in {gap.name for gap in report.gaps}


def test_a_worker_that_dies_is_reported_for_the_cells_and_seeds_it_held(tmp_path: Path) -> None:
    code, out, _, report, _ = _verify(tmp_path, DYING, 2, "--profile", "ci")
    assert code == 1, out
    # The search reaches an upsert over a Skipped record too: each seed whose worker died,
    # and died again alone, is named, and its test cases are not counted as run.
    search = next(g for g in report["gaps"] if g["name"] == "search")
    assert "died (killed by SIGKILL)" in search["reason"], search
    assert search["what"].startswith("the test cases of seed 0"), search
    assert "NOT EXERCISED search" in out
    gap = next(g for g in report["gaps"] if g["name"] == "matrix")
    assert "died (killed by SIGKILL)" in gap["reason"], gap
    # Each dead chunk names its cells (an upsert over a Skipped record kills its worker).
    named = re.findall(r"(\d+)-(\d+) \(from '[^']*'\)", gap["reason"])
    assert named, gap
    lost = sum(int(last) - int(first) + 1 for first, last in named)
    assert all(int(last) - int(first) < CHUNK_CELLS for first, last in named)
    assert gap["reason"].count("died") == 1, "one sentence for every chunk that died so"
    assert gap["what"] == f"{lost} race-matrix cell(s)"
    coverage = re.search(r"race matrix: (\d+) of (\d+) cells", out)
    assert coverage is not None, out
    assert int(coverage.group(1)) == int(coverage.group(2)) - lost, (out, lost)
    assert "NOT EXERCISED matrix" in out
    # The probes ran in this process, where the handler is correct.
    assert "violated" not in out
    assert not out.rstrip().endswith("PASSED") or "NOT PASSED" in out


def test_a_factory_that_cannot_be_pickled_is_refused_before_any_work() -> None:
    def local_factory(clock: Any) -> Any:
        return in_memory_handler(clock)

    with pytest.raises(UnpicklableFactoryError, match="cannot be sent to a worker process"):
        verify(local_factory, "dev", 0, jobs=2)
    # Named by a spec it travels as the spec, and the workers import it.
    report = verify(local_factory, "dev", 0, jobs=2, factory_spec=CORRECT, probes=False)
    assert report.coverage.exercised == 144, report.coverage  # dev: each ordered pair once
    assert report.passed and not report.gaps, report


def test_jobs_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run_cli(capsys, CORRECT, "--jobs", "0")
    assert cli.MAX_JOBS is workers.MAX_JOBS is MAX_JOBS  # one definition
    assert dying_matrix_handler.DiesInWorkers.begin is not None


@pytest.mark.parametrize(
    "where",
    # On a cluster with the thorough tier: its verification is --cluster's, tested above.
    [(), pytest.param(("--dsm-cluster=local",), marks=pytest.mark.thorough)],
    ids=["processes", "cluster"],
)
def test_the_pytest_plugin_passes_jobs_through(tmp_path: Path, where: tuple[str, ...]) -> None:
    """``--dsm-jobs 2`` (on a local Dask cluster with ``--dsm-cluster``): the suite's tests
    pass, the workers import the team's module too."""
    if where:
        _needs_dask()
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "mymod.py").write_text(
        "from reference_engine.handlers.memory import in_memory_handler\n\n\n"
        "def factory(clock):\n    return in_memory_handler(clock)\n",
        encoding="utf-8",
    )
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSM_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HYPOTHESIS_PROFILE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pytest",
            "-c",
            "pytest.ini",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "dsm_sim.conformance",
            "--dsm-handler=mymod:factory",
            "--dsm-profile=dev",
            "--dsm-seed=1",
            "--dsm-jobs=2",
            *where,
            "-q",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ passed\b", done.stdout), done.stdout


def test_the_plugin_runs_a_closure_factory_with_one_job_and_says_so() -> None:
    def closure(clock: Any) -> Any:
        return in_memory_handler(clock)

    with pytest.warns(UserWarning, match=r"--dsm-jobs 2 ignored.*cannot be sent"):
        assert suite._sendable(closure, None, 2, None) is False
    with pytest.warns(UserWarning, match=r"--dsm-cluster local ignored.*cannot be sent"):
        assert suite._sendable(closure, None, 1, "local") is False
    assert suite._sendable(closure, CORRECT, 2, None) is True
    assert suite._sendable(closure, None, 1, None) is True


def _needs_dask() -> None:
    """Skipped without Dask on a user's machine; under CI=true its absence is a failure."""
    if os.environ.get("CI", "").lower() != "true":
        pytest.importorskip("distributed")


def test_a_local_cluster_prints_and_writes_what_jobs_1_does(tmp_path: Path) -> None:
    _needs_dask()
    # dev: the same code paths as ci (chunks, seeds, findings booked) in a fifth of the time.
    one = _verify(tmp_path, FAILING, 1, "--profile", "dev")
    two = _verify(tmp_path, FAILING, 2, "--profile", "dev", "--cluster", "local", name="cluster")
    assert one[0] == two[0] == 1, one[1]
    assert one[1] == two[1], "the text output differs"
    assert one[2] == two[2], "the standard error differs"
    assert one[3] == two[3], "the JSON report differs"
    assert two[4] == 0, f"{two[4]} run(s) of the search ran in the command's process"


def test_a_scheduler_nobody_runs_is_a_usage_error_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from dsm_sim.conformance import cluster

    _needs_dask()
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 2.0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    code, out, err = _run_cli(capsys, CORRECT, "--seed", "0", "--cluster", address)
    assert code == 2, out + err
    assert f"cannot run on the Dask cluster {address}" in err, err
    assert "--jobs" in err and out == "", (out, err)


def test_the_matrix_goes_on_after_a_cell_stops_at_a_property_already_found() -> None:
    """A cell that stops quietly at a known property leaves its machine diverged.

    A diverged machine runs no more steps, so every later cell on it was a
    no-op counted as run: in one chunk, the probes' at_most_one_live_lock hid
    allowed_transitions_only (an acquire inserting over a record another
    call set between its check and its insert).
    """
    from dsm_sim.broken.handlers import CheckThenInsertAcquire
    from dsm_sim.conformance.execute.bookkeeping import RunStats
    from dsm_sim.conformance.execute.machine import build_machine
    from dsm_sim.conformance.generate.steps import MATRIX_OPS, RaceOp
    from dsm_sim.conformance.properties import PROPERTIES
    from dsm_sim.conformance.racing import BUDGETS, ChunkWork, cells, run_chunk

    known = frozenset({"at_most_one_live_lock"})
    machine = build_machine(CheckThenInsertAcquire, stats=RunStats(known))
    ops = tuple(op for op in MATRIX_OPS if op is not RaceOp.BEGIN)  # it has no begin of its own
    listed = tuple(cell for cell in cells(ops) if cell.applies())
    work = ChunkWork(0, 0, listed, BUDGETS["ci"], True, known, known, len(PROPERTIES), False)
    result = run_chunk(machine, work)
    found = [raw.violation.property for raw in result.findings]
    assert "allowed_transitions_only" in found, found
    assert result.exercised == len(listed)


def test_the_deadline_stops_the_race_matrix_in_the_workers() -> None:
    started = time.monotonic()
    report = verify(
        slow_handler.make_handler, "ci", 1, jobs=2, factory_spec=SLOW, probes=False, max_wall_s=3.0
    )
    assert time.monotonic() - started < BOUND_S
    gap = next(g for g in report.gaps if g.name == "max-wall")
    assert "expired during the race matrix" in gap.reason, gap
    assert not report.passed
    assert ResultStatus.PASSED not in {r.status for r in report.results}


def test_the_deadline_stops_the_search_in_the_workers() -> None:
    started = time.monotonic()
    report = verify(
        slow_handler.make_handler,
        "ci",
        1,
        jobs=2,
        factory_spec=SLOW,
        probes=False,
        matrix=False,
        max_wall_s=3.0,
    )
    assert time.monotonic() - started < BOUND_S
    gap = next(g for g in report.gaps if g.name == "max-wall")
    assert "expired during the search" in gap.reason, gap
    assert any("NOT EXERCISED max-wall" in line for line in report.not_exercised)
    assert ResultStatus.PASSED not in {r.status for r in report.results}
