"""The state diagram the explorer highlights, drawn from ``dsm diagram``'s own output.

The edges and their labels are parsed from
:func:`dsm_sim.teaching.diagram.labelled_state_diagram`, which is generated
from the one transition table, so the page can never show a transition the
table does not have (or miss one it has).  Only the placement of the nodes
is decided here; a status added to the table without a place is still drawn,
in a spare row, rather than dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dsm_sim.teaching.diagram import EXPIRED_LOCK, labelled_state_diagram

__all__ = ["INITIAL", "Diagram", "DiagramEdge", "DiagramNode", "state_diagram"]

#: Mermaid's name for "no record yet".
INITIAL = "[*]"
_EDGE = re.compile(r"^\s*(\S+) --> (\S+)(?: : (.*))?$")
_W, _H = 118.0, 34.0
_PLACES = {
    INITIAL: (70.0, 160.0),
    "Processing": (250.0, 160.0),
    EXPIRED_LOCK: (250.0, 320.0),
    "Processed": (450.0, 60.0),
    "Failed": (450.0, 320.0),
    "Superseded": (650.0, 60.0),
    "Skipped": (650.0, 190.0),
    "Expired": (650.0, 320.0),
}
WIDTH = 730.0
HEIGHT = 370.0


@dataclass(frozen=True, slots=True)
class DiagramNode:
    name: str
    label: str
    x: float
    y: float
    w: float = _W
    h: float = _H

    @property
    def dom_id(self) -> str:
        return "dg-n-" + ("None" if self.name == INITIAL else self.name)


@dataclass(frozen=True, slots=True)
class DiagramEdge:
    source: str
    target: str
    label: str
    path: str
    label_x: float
    label_y: float

    @property
    def dom_id(self) -> str:
        return f"dg-e-{_id(self.source)}-{_id(self.target)}"


@dataclass(frozen=True, slots=True)
class Diagram:
    nodes: tuple[DiagramNode, ...]
    edges: tuple[DiagramEdge, ...]
    width: float = WIDTH
    height: float = HEIGHT

    def has(self, source: str, target: str) -> bool:
        return any(e.source == source and e.target == target for e in self.edges)


def _id(name: str) -> str:
    return "None" if name == INITIAL else name


def _border(cx: float, cy: float, dx: float, dy: float) -> tuple[float, float]:
    """Where a ray from a node's centre leaves its box (so arrows end at the border)."""
    scale = min(
        (_W / 2) / abs(dx) if dx else math.inf,
        (_H / 2) / abs(dy) if dy else math.inf,
    )
    return cx + dx * scale, cy + dy * scale


def _geometry(a: DiagramNode, b: DiagramNode) -> tuple[str, float, float]:
    if a.name == b.name:
        x, y = a.x + _W / 2 - 14, a.y - _H / 2
        return (
            f"M{x:.1f} {y:.1f} C{x + 10:.1f} {y - 34:.1f} {x + 40:.1f} {y - 14:.1f} "
            f"{x + 14:.1f} {y + 4:.1f}",
            x + 30,
            y - 22,
        )
    dx, dy = b.x - a.x, b.y - a.y
    length = math.hypot(dx, dy)
    # Bend every edge to its right, so A->B and B->A never overlap.
    nx, ny = -dy / length * 22, dx / length * 22
    x1, y1 = _border(a.x, a.y, dx + nx, dy + ny)
    x2, y2 = _border(b.x, b.y, -dx + nx, -dy + ny)
    cx, cy = (x1 + x2) / 2 + nx, (y1 + y2) / 2 + ny
    return f"M{x1:.1f} {y1:.1f} Q{cx:.1f} {cy:.1f} {x2:.1f} {y2:.1f}", cx, cy


def state_diagram() -> Diagram:
    """Nodes and edges of the labelled diagram, with the geometry the page draws."""
    names: list[str] = []
    pairs: list[tuple[str, str, str]] = []
    titles: dict[str, str] = {}
    for line in labelled_state_diagram().splitlines():
        state = re.match(r'^\s*state "(.*)" as (\S+)$', line)
        if state:
            titles[state.group(2)] = state.group(1)
            continue
        match = _EDGE.match(line)
        if not match:
            continue
        source, target, label = match.group(1), match.group(2), match.group(3) or ""
        pairs.append((source, target, label))
        names.extend(n for n in (source, target) if n not in names)
    spare = 0
    nodes: dict[str, DiagramNode] = {}
    for name in names:
        if name in _PLACES:
            x, y = _PLACES[name]
        else:
            x, y = 70.0 + 150.0 * spare, HEIGHT - 20.0
            spare += 1
        label = "no record" if name == INITIAL else name
        nodes[name] = DiagramNode(name, titles.get(name, label), x, y)
    edges = tuple(DiagramEdge(s, t, label, *_geometry(nodes[s], nodes[t])) for s, t, label in pairs)
    return Diagram(tuple(nodes.values()), edges)
