"""``pytest --pyargs dsm_sim.conformance --dsm-handler=mymod:factory`` from the module's folder.

This is the route docs/conformance.md gives a team with a handler in
``mymod.py``, run as they would run it: the ``pytest`` script in their
folder, which (unlike ``python -m pytest``) does not put that folder on the
import path, so ``-P`` keeps ``python`` from doing it here.  The kit must
import ``mymod`` from there, as ``dsm verify`` does, and leave the folder as
it found it: Hypothesis' files go to the same cache directory as ``dsm
verify``'s.  pytest's own cache and bytecode are switched off, so anything
else in the folder afterwards was left by the kit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: One worker runs the module, so the kit run two tests read is made once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("pytest route")]

ROOT = Path(__file__).resolve().parents[2]
HANDLER_MODULE = """\
from reference_engine.handlers.memory import in_memory_handler


def factory(clock):
    return in_memory_handler(clock)
"""


def run_kit(folder: Path, cache: Path, handler: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DSM_CACHE_DIR": str(cache),
    }
    env.pop("HYPOTHESIS_PROFILE", None)
    return subprocess.run(
        [
            sys.executable,
            "-P",  # as the pytest script: the working folder is not on the import path
            "-m",
            "pytest",
            "-c",
            "pytest.ini",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:benchmark",
            "--pyargs",
            "dsm_sim.conformance",
            f"--dsm-handler={handler}",
            "--dsm-profile=dev",
            "--dsm-seed=1",
            "-q",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _team_folder(parent: Path) -> Path:
    """A team's folder: its handler module, and an empty pytest configuration of its own."""
    here = parent / "team"
    here.mkdir()
    (here / "mymod.py").write_text(HANDLER_MODULE, encoding="utf-8")
    (here / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return here


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return _team_folder(tmp_path)


@dataclass(frozen=True)
class TeamRun:
    """A kit run from a team's folder: the folder, dsm's cache directory, what pytest did."""

    folder: Path
    cache: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def team_run(tmp_path_factory: pytest.TempPathFactory) -> TeamRun:
    """One kit run of the team's own module from its folder, which two tests read.

    A whole verification of the in-memory handler under ``dev`` is about ten
    seconds of CPU here; what the tests check of it (where the module was
    imported from, where Hypothesis wrote) needs only one.
    """
    parent = tmp_path_factory.mktemp("route")
    here = _team_folder(parent)
    cache = parent / "cache"
    return TeamRun(here, cache, run_kit(here, cache, "mymod:factory"))


def test_the_handler_module_is_imported_from_the_folder_pytest_runs_in(team_run: TeamRun) -> None:
    result = team_run.result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "22 passed" in result.stdout


def test_hypothesis_keeps_its_files_in_the_cache_directory_not_the_folder(
    team_run: TeamRun,
) -> None:
    result = team_run.result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert sorted(p.name for p in team_run.folder.iterdir()) == ["mymod.py", "pytest.ini"]
    assert (team_run.cache / "hypothesis").is_dir()


CLOSURE_MODULE = """\
from dsm_sim.broken import CATALOGUE


def _factory(base):
    def make(clock):
        return base(clock)

    return make


build = _factory(CATALOGUE["no_fencing"].factory)
"""


def test_a_closure_factory_is_replayed_by_the_name_it_was_given(
    folder: Path, tmp_path: Path
) -> None:
    (folder / "closures.py").write_text(CLOSURE_MODULE, encoding="utf-8")
    result = run_kit(folder, tmp_path / "cache", "closures:build")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert "replay this run: dsm verify closures:build --profile dev --seed 1" in result.stdout
    assert "from closures import build\n" in result.stdout
    assert "<locals>" not in result.stdout
