"""``index.html`` of a ``dsm run --report DIR``: every run, its verdict, a link to its page.

A reviewer deciding on a release opens the directory a CI job kept; the
index is where they start.  Failed runs come first, each with the properties
it broke; then the runs that passed.  Runs that stopped before a verdict (a
handler that broke the protocol, a hung call, a crashed worker process) have
no page, so the index lists them with the reason instead.  Like the run
pages it is one self-contained file, with nothing fetched when it is opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dsm_sim.outputs import write_report
from dsm_sim.reports.json_report import report_name
from dsm_sim.reports.rendering import template_environment
from dsm_sim.simulator.run import RunResult

__all__ = ["INDEX", "IndexRow", "index_rows", "render_index", "write_index"]

INDEX = "index.html"


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One run as the index lists it; ``page`` is the run's HTML file, relative to the index."""

    scenario: str
    seed: int
    passed: bool
    violated: tuple[str, ...]
    waived: tuple[str, ...]
    page: str
    data: str
    #: The dimensions the scenario asked for that the run did not reach (and not waived).
    not_exercised: tuple[str, ...] = ()


def index_rows(results: Sequence[RunResult]) -> tuple[IndexRow, ...]:
    """Failed runs first, then passed ones, each group in the order the runs were planned."""
    rows = [
        IndexRow(
            scenario=run.scenario.name,
            seed=run.seed,
            passed=run.passed,
            violated=tuple(run.violated),
            waived=tuple(r.name for r in run.waived),
            page=f"{report_name(run)}.html",
            data=f"{report_name(run)}.json",
            not_exercised=tuple(g.name for g in run.gaps if g.name not in run.waived_gaps),
        )
        for run in results
    ]
    return tuple(sorted(rows, key=lambda row: row.passed))


def render_index(results: Sequence[RunResult], stopped: Sequence[str] = ()) -> str:
    """The page: a verdict line, then one row per run; ``stopped`` are runs without a verdict."""
    environment = template_environment()
    rows = index_rows(results)
    bad = sum(1 for row in rows if not row.passed) + len(stopped)
    total = len(rows) + len(stopped)
    if bad:
        headline = f"{bad} of {total} run{'s' if total != 1 else ''} failed"
    else:
        headline = (
            "the run kept every invariant"
            if total == 1
            else f"all {total} runs kept every invariant"
        )
    return environment.get_template("index.html.j2").render(
        rows=rows,
        bad=bad,
        headline=headline,
        stopped=list(stopped),
        handlers=sorted({run.handler for run in results}),
    )


def write_index(results: Sequence[RunResult], directory: Path, stopped: Sequence[str] = ()) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    # As every other report: renamed into place, a symlink replaced, undecodable bytes escaped.
    return write_report(directory / INDEX, render_index(results, stopped))
