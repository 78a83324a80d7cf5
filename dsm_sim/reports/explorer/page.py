"""What a template needs to embed the explorer: inline data, script, style, static rows.

The data goes into a ``<script type="application/json">`` element; every
``<`` is written as a JSON escape so no text in a history (keys are arbitrary strings) can close
that element early.  The faults are also rendered as a plain table, so a
reader without JavaScript still sees where the run was disturbed.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from markupsafe import Markup

from dsm_sim.history import History
from dsm_sim.micros import Micros
from dsm_sim.reports.explorer.diagram import Diagram, state_diagram
from dsm_sim.reports.explorer.model import (
    Chapter,
    FaultRow,
    TraceViolation,
    explorer_data,
    fault_rows,
)
from dsm_sim.reports.instants import wall

__all__ = ["ExplorerView", "explorer_view"]


@dataclass(frozen=True, slots=True)
class ExplorerView:
    """The explorer as a template places it; :meth:`at` writes an instant as the page does."""

    data_json: Markup
    script: Markup
    style: Markup
    diagram: Diagram
    faults: tuple[FaultRow, ...]
    data: dict[str, Any]
    epoch: dt.datetime
    digits: int

    def at(self, micros: Micros) -> str:
        """``micros`` since the run's epoch as the run's clock showed it (``09:36:00.250``)."""
        return wall(self.epoch, micros, self.digits)


def _asset(name: str) -> str:
    return resources.files("dsm_sim.reports.explorer").joinpath("assets", name).read_text("utf-8")


def explorer_view(
    history: History,
    violations: tuple[TraceViolation, ...] = (),
    *,
    title: str = "",
    chapters: tuple[Chapter, ...] = (),
    store_clock: dict[int, Micros] | None = None,
) -> ExplorerView:
    diagram = state_diagram()
    data = explorer_data(
        history,
        violations,
        title=title,
        chapters=chapters,
        store_clock=store_clock,
        diagram=diagram,
    )
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, sort_keys=True)
    text = text.replace("<", "\\u003c").replace("\x7f", "\\u007f")  # DEL: the one raw control left
    return ExplorerView(
        data_json=Markup(text),
        script=Markup(_asset("explorer.js").replace("</", "<\\/")),
        style=Markup(_asset("explorer.css")),
        diagram=diagram,
        faults=fault_rows(history),
        data=data,
        epoch=history.epoch,
        digits=int(data["digits"]),
    )
