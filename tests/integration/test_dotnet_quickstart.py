"""The C# quick start of ``docs/dotnet.md`` runs as printed on this machine.

The section's ``csharp`` blocks that open with a file name (``// Program.cs``)
are written to an empty folder, and its shell commands run there one after the
other through ``bash``, word for word: ``$DSM`` is this checkout and ``dsm`` is
the command of this checkout.  Each must exit as the section says (0 unless the
command ends in ``# exit N``) and print every line the section shows under it
(``...`` stands for lines left out; a line ending in ``...`` is a prefix).  The
``apt-get install`` line is the only one not run: the test checks instead that
every package it names is installed, which is what running it would ensure.
Needs Mono: skipped where a package is missing, and a failure under ``CI=true``
(``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "dotnet.md"
SECTION = "## C# quick start on a clean machine"
_EXIT = re.compile(r"#\s*exit (\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Command:
    """One ``$`` command of the section, with the status and the lines the doc gives it."""

    line: str
    exit_status: int
    shown: tuple[str, ...]


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    return text[start : end if end != -1 else len(text)]


def source_files() -> dict[str, str]:
    """The ``csharp`` blocks that name their file on their first line, by file name."""
    files = {}
    for block in re.findall(r"^```csharp\n(.*?)^```$", section(), re.S | re.M):
        named = re.match(r"// (\w+\.cs)\b", block)
        if named:
            files[named.group(1)] = block
    return files


def commands() -> list[Command]:
    """The ``console`` blocks' commands in order, each with what the doc shows it print."""
    found: list[Command] = []
    for block in re.findall(r"^```console\n(.*?)^```$", section(), re.S | re.M):
        for line in block.splitlines():
            if line.startswith("$ "):
                status = _EXIT.search(line)
                found.append(Command(line[2:], int(status.group(1)) if status else 0, ()))
            else:
                last = found[-1]
                found[-1] = Command(last.line, last.exit_status, (*last.shown, line))
    return found


def missing_packages(line: str) -> list[str]:
    words = shlex.split(line)
    packages = [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
    missing = []
    for package in packages:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package],
            capture_output=True,
            text=True,
            check=False,
        )
        if status.stdout.strip() != "install ok installed":
            missing.append(package)
    return missing


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing toolchain is a failure, not a skip)")
    pytest.skip(message)


def shows(output: str, shown: tuple[str, ...]) -> list[str]:
    """The shown lines the output lacks."""
    lines = [line.rstrip() for line in output.splitlines()]
    lacking = []
    for expected in shown:
        if expected == "...":
            continue
        if expected.endswith("..."):
            prefix = expected[:-3]
            if not any(line.startswith(prefix) for line in lines):
                lacking.append(expected)
        elif expected.rstrip() not in lines:
            lacking.append(expected)
    return lacking


def test_the_section_has_the_steps_it_promises() -> None:
    """The parse finds the install, the builds, a verdict and both replays (else the run proves little)."""
    lines = [c.line for c in commands()]
    assert [line.split()[0] for line in lines] == [
        "sudo", "mcs", "mcs", "dsm", "mcs", "dsm", "dsm", "dsm"
    ]  # fmt: skip
    assert set(source_files()) == {"Program.cs", "MyHandler.cs", "Unfenced.cs"}
    assert [c.exit_status for c in commands() if c.line.startswith("dsm ")] == [0, 1, 1, 0]
    assert all("-debug" in line for line in lines if line.startswith("mcs "))


def test_the_quick_start_runs_as_printed(tmp_path: Path) -> None:
    steps = commands()
    (install,) = [c for c in steps if "apt-get install" in c.line]
    if shutil.which("dpkg-query") is None:
        _missing("dpkg-query is not here: the quick start is for Debian and Ubuntu")
    missing = missing_packages(install.line)
    if missing:
        _missing(f"not installed: {' '.join(missing)} (the quick start's step 1 installs them)")

    work = tmp_path / "work"
    work.mkdir()
    for name, text in source_files().items():
        (work / name).write_text(text, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dsm = bin_dir / "dsm"  # this checkout's `dsm` (pyproject's dsm_sim.cli:main)
    dsm.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dsm_sim.cli "$@"\n')
    dsm.chmod(0o755)
    env = {
        **os.environ,
        "DSM": str(ROOT),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "DSM_CACHE_DIR": str(tmp_path / "cache"),
    }

    for step in steps:
        if step is install:
            continue
        done = subprocess.run(
            ["bash", "-c", step.line],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == step.exit_status, f"$ {step.line}\n{output}"
        lacking = shows(output, step.shown)
        assert not lacking, f"$ {step.line}\nmissing lines: {lacking}\n{output}"
    # The replay file and its NUnit form are where step 5 says.
    assert (work / "replays" / "stale_write_rejected-seed0.jsonl").is_file()
    assert (work / "replays" / "stale_write_rejected-seed0.cs").is_file()


def test_a_shown_line_the_output_lacks_is_reported() -> None:
    output = "header\nFAILED (1 violated: stale_write_rejected)\nbroke 1 of 1 run(s): x\n"
    assert (
        shows(output, ("...", "FAILED (1 violated: stale_write_rejected)", "broke 1 of 1...")) == []
    )
    assert shows(output, ("PASSED", "broke 0 of 1...")) == ["PASSED", "broke 0 of 1..."]
