"""A counterexample opens in the explorer as its story (``dsm verify --report``).

The page is drawn from the last confirming replay, recorded by a tape that
adds no handler call: so recording changes no verdict and no story, and the
page shows the calls each step of the story made, with the violating step's
calls flagged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import markupsafe
import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.conformance import verify
from dsm_sim.conformance.tell.outputs import write_html

pytestmark = pytest.mark.property

SEED = 0


def _explorer_data(page: Path) -> dict[str, Any] | None:
    found = re.search(r'id="dsm-explorer-data">(.*?)</script>', page.read_text("utf-8"), re.S)
    if found is None:
        return None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


@pytest.mark.parametrize(
    "name", ["no_fencing", "check_then_insert_acquire", "sweep_ignores_locked_until"]
)
def test_a_counterexample_page_plays_its_story(name: str, tmp_path: Path) -> None:
    spec = CATALOGUE[name]
    plain = verify(spec.factory, "ci", seed=SEED, stop_on_first=True)
    recorded = verify(spec.factory, "ci", seed=SEED, stop_on_first=True, record=True)
    # Listening changes nothing the report says.
    assert [(v.name, v.story) for v in recorded.violations] == [
        (v.name, v.story) for v in plain.violations
    ]
    (violation,) = recorded.violations
    assert violation.replayed is not None and violation.replayed.reproduced
    write_html(recorded, tmp_path)
    data = _explorer_data(tmp_path / f"{violation.name}.html")
    assert data is not None, "the counterexample page has no explorer"
    chapters = data["chapters"]
    story_steps = [line for line in violation.story.splitlines() if re.match(r"\s*\d+\. ", line)]
    # Every chapter is a line of the story, in order; steps without a call join the next.
    titles = [c["title"] for c in chapters]
    assert titles == [t for t in (s.strip() for s in story_steps) if t in titles]
    assert chapters and all(
        line.strip() in violation.story for c in chapters for line in c["lines"]
    )
    # The flagged calls are those of the last chapter: the step that broke the property.
    (flagged,) = data["violations"]
    assert flagged["invariant"] == violation.name
    last = chapters[-1]["first_op"]
    assert flagged["ops"] and min(flagged["ops"]) == last
    assert len(data["ops"]["index"] if isinstance(data["ops"], dict) else data["ops"]) > 0


def test_without_record_the_page_has_the_story_only(tmp_path: Path) -> None:
    report = verify(CATALOGUE["no_fencing"].factory, "ci", seed=SEED, stop_on_first=True)
    (violation,) = report.violations
    assert violation.replayed is None
    write_html(report, tmp_path)
    page = tmp_path / f"{violation.name}.html"
    assert _explorer_data(page) is None
    first_line = violation.story.splitlines()[0].strip()
    assert str(markupsafe.escape(first_line)) in page.read_text("utf-8")
