"""``dsm verify``, :func:`verify` and the pytest plugin, end to end, on handlers whose bug is certain.

Every handler here breaks a property in every test case (or exactly once), so
no test depends on a search being lucky: a run without a seed still has a
guaranteed outcome, and a seeded one is replayed to the same program.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsm_sim.conformance import cli
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.profiles import budget
from reference_engine.clock import Clock
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler

pytestmark = pytest.mark.property

REPO = Path(__file__).resolve().parents[2]


class CloseRaises(InMemoryStateHandler):
    """Breaks ``closes_cleanly`` in every test case: close() always raises."""

    async def close(self) -> None:
        raise RuntimeError("connection pool already closed")


class _CloseRaisesIfFirstOpened(InMemoryStateHandler):
    """Raises on close() when it was the first handler of its factory to be opened."""

    def __init__(self, clock: Clock, factory: CloseRaisesOnce) -> None:
        super().__init__(clock)
        self.factory = factory
        self.raises = False

    async def open(self) -> None:
        await super().open()
        if not self.factory.fired:
            self.factory.fired = self.raises = True

    async def close(self) -> None:
        if self.raises:
            raise RuntimeError("connection pool already closed")
        await super().close()


class CloseRaisesOnce:
    """A factory whose first opened handler's close() raises and every later one's does not.

    The same steps then pass when Hypothesis runs them again: a racy store's
    failure, made certain.  (The kit may build a handler it never opens, to see
    what the factory makes: that one does not count.)
    """

    __qualname__ = "CloseRaisesOnce"

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, clock: Clock) -> InMemoryStateHandler:
        return _CloseRaisesIfFirstOpened(clock, self)


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    code = cli.main(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unseeded_violation_prints_a_command_that_replays_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = f"{__name__}:CloseRaises"
    cache = ("--cache-dir", str(tmp_path))
    code, out, err = _run_cli(capsys, spec, "--profile", "dev", "--stop-on-first", *cache)
    assert code == 1
    found = re.search(rf"replay this run: (dsm verify {spec} --profile dev --seed (\d+))", err)
    assert found, err
    assert "closes_cleanly violated" in out
    again, out_again, _ = _run_cli(
        capsys, spec, "--profile", "dev", "--seed", found[2], "--stop-on-first", *cache
    )
    assert again == 1
    assert out_again[out_again.index("What happened:") :] == out[out.index("What happened:") :]


def test_a_violation_that_does_not_replay_is_reported_flaky_with_its_story() -> None:
    report = verify(CloseRaisesOnce(), "dev", seed=3)
    result = report.result("closes_cleanly")
    assert result.status is ResultStatus.FLAKY
    assert result.failed and not report.passed
    assert "connection pool already closed" in result.message
    assert result.story.endswith(result.message)
    assert report.error is None
    assert "answered the same steps differently" in result.render()
    # The other properties are still settled by the runs after it.
    assert all(
        r.status in (ResultStatus.PASSED, ResultStatus.NOT_EXERCISED)
        for r in report.results
        if r.name != "closes_cleanly"
    )


def test_a_later_case_that_hits_a_known_violation_is_counted_as_stopped() -> None:
    # Every test case breaks closes_cleanly: after the first run, every test case
    # of the second run is stopped at it, and the report says how many.
    report = verify(CloseRaises, "dev", seed=4)
    result = report.result("closes_cleanly")
    assert result.status is ResultStatus.FAILED
    assert result.stopped > 0
    assert report.stopped == result.stopped


def test_a_profile_runs_each_of_its_seeds_and_counts_what_it_explored() -> None:
    report = verify(in_memory_handler, "ci", seed=11, max_examples=3, seeds=3)
    assert report.passed
    assert report.seeds[:3] == (11, 12, 13)
    assert report.runs == len(report.seeds)
    assert report.steps > report.test_cases >= 9
    assert report.checks == sum(r.checks for r in report.results) > 0
    assert f"{report.steps} steps" in report.explored()
    assert budget("ci").seeds > 1  # the ci profile splits its budget


def _launcher(tmp_path: Path) -> Path:
    """A script like the ``dsm`` console script: its own folder, not the cwd, is sys.path[0]."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dsm.py"
    script.write_text("from dsm_sim.cli import main\nraise SystemExit(main())\n")
    return script


def test_verify_from_the_folder_of_the_module_leaves_no_hypothesis_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "mystore.py").write_text(
        textwrap.dedent(
            """
            from reference_engine.handlers.memory import in_memory_handler

            def make_handler(clock):
                return in_memory_handler(clock)
            """
        )
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "DSM_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    result = subprocess.run(
        [
            sys.executable,
            str(_launcher(tmp_path)),
            "verify",
            "mystore:make_handler",
            "--profile",
            "dev",
            "--seed",
            "2",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    assert not (project / ".hypothesis").exists()
    assert sorted(p.name for p in project.iterdir()) == ["mystore.py"]


def test_a_module_that_cannot_be_imported_says_where_to_run_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _run_cli(
        capsys, "no_such_store_module:make_handler", "--cache-dir", str(tmp_path)
    )
    assert code == 2 and out == ""
    assert "folder that holds no_such_store_module.py" in err


def test_the_pytest_plugin_prints_the_seed_and_the_replay_command(tmp_path: Path) -> None:
    spec = "dsm_sim.broken.handlers:TenantMissingFromKey"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--pyargs",
            "dsm_sim.conformance",
            f"--dsm-handler={spec}",
            "--dsm-profile=dev",
            "--dsm-seed=1",
            "-k",
            "tenant_isolation",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hyp")},
        timeout=240,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "tenant_isolation violated" in result.stdout
    assert "seed 1 (profile dev" in result.stdout
    assert f"replay this run: dsm verify {spec} --profile dev --seed 1" in result.stdout
