"""The explorer marks a transition as "NOT in the transition table" only when it is one.

A page that cries wolf on a passing run teaches its reader to ignore the
mark, so every passing report of the committed scenarios, and both demo
pages, must show none; and a handler that really moves a record along a
forbidden edge must still be marked on the page of the run that caught it.
The marks are read from the data inlined in the rendered page, which is what
the page's script draws in red.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.reports.html import render_html
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.toml"))
IN_MEMORY = "reference_engine.handlers.memory:in_memory_handler"


def page_data(html: str) -> dict[str, Any]:
    raw = html.split('<script type="application/json" id="dsm-explorer-data">', 1)[1]
    data: dict[str, Any] = json.loads(raw.split("</script>", 1)[0])
    return data


def marked(data: dict[str, Any]) -> list[str]:
    """Every change the page marks as not in the transition table, as ``op #N: A>B``."""
    changes, strings = data["changes"], data["strings"]
    return [
        f"op #{op}: {strings[edge]}"
        for op, edge, forbidden in zip(
            changes["op"], changes["edge"], changes["forbidden"], strict=True
        )
        if forbidden
    ]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_no_passing_report_marks_a_transition_as_forbidden(path: Path) -> None:
    scenario = load_scenario(path)
    for seed in (1, 2):
        run = run_scenario(scenario, seed, IN_MEMORY)
        assert run.passed, run.violated
        data = page_data(render_html(run))
        assert data["changes"]["op"], "a run that changed no record says nothing about marks"
        assert marked(data) == [], f"{scenario.name} seed {seed}"


@pytest.mark.parametrize("handler", [None, IN_MEMORY], ids=["sqlite", "in-memory"])
def test_the_demo_page_marks_nothing(handler: str | None, tmp_path: Path) -> None:
    from dsm_sim.teaching.demo_page import record_demo, render_demo_html

    with contextlib.redirect_stdout(io.StringIO()):
        tape, outcome = asyncio.run(record_demo(handler=handler))
    assert outcome.ok, outcome.problems
    data = page_data(render_demo_html(tape, outcome))
    assert marked(data) == []
    strings = data["strings"]
    assert "ExpiredLock>Failed" in {strings[e] for e in data["changes"]["edge"]}


def test_a_forbidden_transition_is_still_marked() -> None:
    """``acquire_over_processed`` takes a lock over a Processed record: Processed -> Processing."""
    broken = CATALOGUE["acquire_over_processed"]
    run = run_scenario(
        load_scenario(SCENARIOS[0].parent / "duplicate-storm.toml"),
        1,
        broken.factory,
        handler_name="broken:acquire_over_processed",
    )
    assert "allowed_transitions_only" in run.violated
    found = marked(page_data(render_html(run)))
    assert found, "the forbidden acquire is not marked"
    assert all(mark.endswith(": Processed>Processing") for mark in found), found
