"""The README's two commands, and ``.ci/run`` running exactly the second.

CI runs what a user runs: if the README's test command and ``.ci/run``
drifted apart, a green CI would no longer say the README's command works.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up and run (two commands)", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_the_readme_gives_two_commands_one_for_the_demo_and_one_for_the_tests() -> None:
    demo, tests = _readme_commands()
    assert demo.endswith("dsm demo invoice")
    assert tests.endswith("python3 -m pytest")


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, tests = _readme_commands()
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert lines[-1] == tests
