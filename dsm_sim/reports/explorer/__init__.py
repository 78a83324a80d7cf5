"""The interactive explorer a run report and the demo page embed.

A time scrubber over the whole run, the record of every item at the chosen
instant, the state diagram with the current state and the last transition
highlighted, operation details, violation traces played step by step, and
the faults on the timeline.  The page stays one self-contained file: the data
is inline JSON, the script and style are inlined from ``assets/``, nothing is
fetched when it is viewed, and without JavaScript the static tables remain.
"""

from __future__ import annotations

from dsm_sim.reports.explorer.diagram import Diagram, state_diagram
from dsm_sim.reports.explorer.model import Chapter, TraceViolation, explorer_data
from dsm_sim.reports.explorer.page import ExplorerView, explorer_view

__all__ = [
    "Chapter",
    "Diagram",
    "ExplorerView",
    "TraceViolation",
    "explorer_data",
    "explorer_view",
    "state_diagram",
]
