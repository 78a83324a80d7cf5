"""The house rules that a reviewer would otherwise have to check by eye."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsm_sim.conformance.cache import cache_dir

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference_engine", "dsm_sim")


def _run(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, env=env)


def _mypy_cache() -> str:
    """``MYPY_CACHE_DIR``, else ``mypy`` in dsm's cache directory (``cache_dir``).

    Outside the checkout, so a fresh clone (as CI makes) checks only what
    changed: mypy trusts a cached module only when its file's content hash
    matches, whatever the path or modification time.
    """
    return os.environ.get("MYPY_CACHE_DIR") or str(cache_dir() / "mypy")


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed with the dev extra")
def test_ruff_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed with the dev extra")
def test_ruff_format_clean() -> None:
    result = _run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_clean() -> None:
    pytest.importorskip("mypy")
    result = _run(sys.executable, "-m", "mypy", env={**os.environ, "MYPY_CACHE_DIR": _mypy_cache()})
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_system_clock_reads_the_wall_clock() -> None:
    pattern = re.compile(
        r"datetime\.now\(|datetime\.utcnow\(|date\.today\(|\btime\.(time|time_ns|monotonic"
        r"|monotonic_ns|perf_counter|perf_counter_ns)\(\)"
    )
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED_WALL_CLOCK or rel.startswith(ALLOWED_WALL_CLOCK_DIRS):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "read time from an injected Clock instead:\n" + "\n".join(offenders)


#: The system clock itself, and tools that measure real elapsed time on purpose:
#: the multi-process stress runner records a wall-clock history, and the
#: conformance kit reports how long verification took, and its shrink budget is
#: real seconds of shrinking (never a handler's now); ``dsm_sim/wall.py`` holds the
#: deadline of a whole ``dsm run --max-wall``, which is real seconds too.
ALLOWED_WALL_CLOCK = {
    "reference_engine/clock.py",
    "dsm_sim/conformance/verification.py",
    "dsm_sim/conformance/tell/shrink_budget.py",
    "dsm_sim/wall.py",
}
ALLOWED_WALL_CLOCK_DIRS = ("dsm_sim/stress/",)
