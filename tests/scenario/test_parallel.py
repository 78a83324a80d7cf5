"""``dsm run --jobs``: worker processes change nothing a user reads, and a dying worker is reported.

The comparison is byte for byte and excludes nothing: the same command line
(same report directory, same JUnit path) is run with ``--jobs 1`` and
``--jobs 2``, and stdout, the exit code and every file written must match.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import crashing_handler
import pytest
from run_outputs import files_under

from dsm_sim.cli import main as dsm
from dsm_sim.reports.html import write_html
from dsm_sim.reports.json_report import write_json
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.parallel import UnpicklableFactoryError, run_plan
from dsm_sim.simulator.run import HistoryNotKeptError
from reference_engine.handlers.memory import in_memory_handler

pytestmark = pytest.mark.scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = dsm(argv)
    return code, capsys.readouterr().out


def test_two_jobs_give_byte_identical_stdout_reports_and_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broken handler, so the comparison covers FAIL lines, violations and replay commands
    # as well as passes; duplicate-storm has no slow worker, so fencing is never needed there.
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
    serial_code, serial_out = _run([*argv, "--jobs", "1"], capsys)
    serial_files = files_under(tmp_path / "out")
    shutil.rmtree(tmp_path / "out")
    parallel_code, parallel_out = _run([*argv, "--jobs", "2"], capsys)
    parallel_files = files_under(tmp_path / "out")

    assert serial_code == 1, "the broken handler must fail slow-worker, or nothing is compared"
    assert "duplicate-storm seed 1: PASS" in serial_out
    assert "FAIL slow-worker seed" in serial_out
    assert parallel_code == serial_code
    assert parallel_out == serial_out
    assert sorted(parallel_files) == sorted(serial_files)
    assert len(serial_files) == 10  # 4 runs x (HTML + JSON) + the index + JUnit
    for name, content in serial_files.items():
        assert parallel_files[name] == content, f"{name} differs between --jobs 1 and --jobs 2"


def test_without_reports_the_output_is_the_same_and_workers_send_back_no_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No --report: the workers keep each run's history to themselves, and what is
    # printed and written (the FAIL lines, violations, replays, JUnit) must not change.
    monkeypatch.chdir(tmp_path)
    argv = ["run", str(SCENARIOS / "duplicate-storm.toml"), str(SCENARIOS / "slow-worker.toml")]
    argv += ["--seeds", "2", "--handler", "broken:no_fencing", "--junit", "junit.xml"]
    serial_code, serial_out = _run([*argv, "--jobs", "1"], capsys)
    serial_junit = (tmp_path / "junit.xml").read_bytes()
    parallel_code, parallel_out = _run([*argv, "--jobs", "2"], capsys)

    assert serial_code == parallel_code == 1
    assert "FAIL slow-worker seed" in serial_out and "replay: dsm run" in serial_out
    assert parallel_out == serial_out
    assert (tmp_path / "junit.xml").read_bytes() == serial_junit


def test_a_result_sent_back_without_its_history_keeps_the_verdict_and_refuses_a_report(
    tmp_path: Path,
) -> None:
    plan = [(load_scenario(SCENARIOS / "slow-worker.toml"), seed) for seed in (1, 2)]
    serial = list(run_plan(plan, "broken:no_fencing"))
    sent = list(run_plan(plan, "broken:no_fencing", jobs=2, keep_history=False))
    for whole, slim in zip(serial, sent, strict=True):
        assert whole.result is not None and slim.result is not None, (whole, slim)
        assert whole.result.history_kept and whole.result.history.ops
        assert not slim.result.history_kept and slim.result.history.ops == ()
        assert slim.result.stats == whole.result.stats
        assert slim.result.results == whole.result.results  # violations, messages, notes
        assert slim.result.replay == whole.result.replay
        # The history is most of it (instants pickle as small ints: about 2/3 of it).
        assert len(pickle.dumps(slim)) * 5 < len(pickle.dumps(whole)) * 2
    failed = next(o.result for o in sent if o.result is not None and not o.result.passed)
    for write in (write_json, write_html):
        with pytest.raises(HistoryNotKeptError, match="keep_history=True"):
            write(failed, tmp_path / "reports")
    assert not list((tmp_path / "reports").glob("*"))


def _with_zone(source: Path, target: Path, name: str, zone: str | None) -> Path:
    text = source.read_text().replace(f'name = "{source.stem}"', f'name = "{name}"', 1)
    if zone is not None:
        text = text.replace("[run]\n", f'[run]\nhost_timezone = "{zone}"\n', 1)
    path = target / f"{name}.toml"
    path.write_text(text)
    assert load_scenario(path).name == name
    return path


def test_a_worker_process_that_dies_is_reported_for_its_runs_and_the_rest_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dying = _with_zone(
        SCENARIOS / "duplicate-storm.toml", tmp_path, "dies", crashing_handler.CRASH_ZONE
    )
    living = _with_zone(SCENARIOS / "duplicate-storm.toml", tmp_path, "lives", None)
    code, out = _run(
        [
            "run",
            str(dying),
            str(living),
            "--seeds",
            "2",
            "--jobs",
            "2",
            "--handler",
            "crashing_handler:make_handler",
        ],
        capsys,
    )
    assert code == 1
    for seed in (1, 2):
        assert (
            f"FAIL dies seed {seed}: the worker process running it died (killed by SIGSEGV)" in out
        )
        assert f"lives seed {seed}: PASS" in out
    assert f"dsm run {dying} --seed 1" in out, "the crash must say how to replay it"
    assert out.rstrip().endswith("2/2 runs kept every invariant; 2 crashed in their worker process")


def test_a_factory_that_cannot_reach_a_worker_is_refused_before_any_run() -> None:
    scenario = load_scenario(SCENARIOS / "duplicate-storm.toml")
    plan = [(scenario, 1), (scenario, 2)]
    with pytest.raises(UnpicklableFactoryError) as info:
        run_plan(plan, lambda clock: in_memory_handler(clock), jobs=2)
    message = str(info.value)
    assert "cannot be sent to a worker process" in message
    assert "'package.module:factory'" in message
    # The same callable is fine in this process.
    outcomes = list(run_plan(plan[:1], lambda clock: in_memory_handler(clock), jobs=1))
    assert outcomes[0].result is not None and outcomes[0].result.passed


@pytest.mark.parametrize("jobs", ["0", "-1", "65", "9" * 30, "two"])
def test_jobs_out_of_range_exits_2_naming_the_option(
    jobs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        dsm(["run", str(SCENARIOS / "duplicate-storm.toml"), "--jobs", jobs])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --jobs" in err
    assert "from 1 to 64" in err or "expected an integer" in err


def test_one_run_with_two_jobs_resolves_a_catalogue_spec_like_a_serial_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", str(SCENARIOS / "slow-worker.toml"), "--seed", "1"]
    argv += ["--handler", "broken:no_fencing"]
    serial = _run([*argv, "--jobs", "1"], capsys)
    assert serial[0] == 1
    assert _run([*argv, "--jobs", "2"], capsys) == serial
