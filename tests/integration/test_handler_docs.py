"""The Python snippets of ``docs/writing-a-handler.md`` run as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-handler.md"


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start : end if end != -1 else len(text)]


def test_the_workflow_snippet_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(
        r"```python\n(.*?)```", _section("### Use your handler in a workflow"), re.S
    )
    assert len(blocks) == 1
    exec(compile(blocks[0], f"<{DOC.name}>", "exec"), {"__name__": "__doc_snippet__"})
    assert capsys.readouterr().out.strip() == "InMemoryStateHandler"
