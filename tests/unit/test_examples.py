"""The workflow example runs as shipped, and the handler guide prints exactly that file.

The guide's copy is what readers paste, the file is what this test runs: the
test compares the two byte for byte, so neither can rot without failing here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "handler_workflow.py"
GUIDE = ROOT / "docs" / "writing-a-handler.md"
SECTION = "### Run a workflow on your handler"


def fenced_blocks(language: str) -> list[str]:
    """The ``language`` code blocks of the guide's section, as written."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(SECTION) + len(SECTION)
    ends = [i for i in (text.find("\n## ", start), text.find("\n### ", start)) if i != -1]
    section = text[start : min(ends, default=len(text))]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.S | re.M)


def run_example(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_guide_shows_the_example_file_verbatim() -> None:
    (snippet,) = fenced_blocks("python")
    assert snippet == EXAMPLE.read_text(encoding="utf-8")


def test_the_example_charges_once_and_prints_what_the_guide_says(tmp_path: Path) -> None:
    result = run_example(tmp_path)  # run from elsewhere: the example needs no checkout layout

    assert (result.returncode, result.stderr) == (0, "")
    (printed,) = fenced_blocks("text")
    assert result.stdout == printed
    assert "delivery 2: skip: invoice INV-1 already dispatched" in result.stdout
    assert result.stdout.endswith("charges for INV-1: 1\n")
    assert list(tmp_path.iterdir()) == [], "the example writes nothing"
