"""The state diagram the explorer highlights, drawn from ``dsm diagram``'s own output.

The edges and their labels are parsed from
:func:`dsm_sim.teaching.diagram.labelled_state_diagram`, which is generated
from the one transition table, so the page can never show a transition the
table does not have (or miss one it has).  Only the placement is decided
here, along the lifecycle, left to right: no record, Processing, Processed,
Superseded, with the lapsed lock and Failed under Processing, where a lock
ends early and a retry starts again.  Skipped and Expired can follow almost
every state ("any -> Skipped", the retention sweep), so they are drawn as
two bars, above and below the rest: each edge into them is a short straight
line, and none of them crosses the lifecycle.  One crossing is left, where
Failed goes up to Skipped past Processing -> Processed.  A status added to
the table without a place is still drawn, in a spare row, rather than dropped.

Every edge is a cubic Bezier (:attr:`DiagramEdge.curve`), so a test can
count the crossings of the drawing it will show.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dsm_sim.teaching.diagram import EXPIRED_LOCK, labelled_state_diagram

__all__ = ["INITIAL", "Diagram", "DiagramEdge", "DiagramNode", "Point", "state_diagram"]

#: Mermaid's name for "no record yet".
INITIAL = "[*]"
_EDGE = re.compile(r"^\s*(\S+) --> (\S+)(?: : (.*))?$")
_W, _H = 118.0, 34.0
WIDTH = 800.0
HEIGHT = 410.0
_ROW_A, _ROW_B = 140.0, 255.0
_SKIPPED, _EXPIRED = "Skipped", "Expired"
#: Bars: (centre x, centre y, width, x of the label).
_BARS = {_SKIPPED: (390.0, 40.0, 700.0, 590.0), _EXPIRED: (390.0, 380.0, 700.0, 590.0)}
_PLACES = {
    INITIAL: (90.0, _ROW_A),
    "Processing": (260.0, _ROW_A),
    "Processed": (520.0, _ROW_A),
    "Superseded": (680.0, _ROW_A),
    EXPIRED_LOCK: (170.0, _ROW_B),
    "Failed": (390.0, _ROW_B),
}
#: Where an edge into a bar leaves its node, when not from the node's centre line.
_INTO_BAR_X = {("Failed", _SKIPPED): 405.0, ("Failed", _EXPIRED): 380.0}

Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class DiagramNode:
    name: str
    label: str
    x: float
    y: float
    w: float = _W
    h: float = _H
    #: Where the name is written (a bar's is off its centre, clear of the edges into it).
    text_x: float | None = None

    @property
    def dom_id(self) -> str:
        return "dg-n-" + ("None" if self.name == INITIAL else self.name)

    @property
    def name_x(self) -> float:
        return self.x if self.text_x is None else self.text_x

    @property
    def top(self) -> float:
        return self.y - self.h / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h / 2

    @property
    def right(self) -> float:
        return self.x + self.w / 2


@dataclass(frozen=True, slots=True)
class DiagramEdge:
    source: str
    target: str
    label: str
    #: The cubic Bezier drawn: start, two control points, end.
    curve: tuple[Point, Point, Point, Point]

    @property
    def dom_id(self) -> str:
        return f"dg-e-{_id(self.source)}-{_id(self.target)}"

    @property
    def path(self) -> str:
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = self.curve
        return f"M{x0:.1f} {y0:.1f} C{x1:.1f} {y1:.1f} {x2:.1f} {y2:.1f} {x3:.1f} {y3:.1f}"


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


def _border(node: DiagramNode, dx: float, dy: float) -> Point:
    """Where a ray from a node's centre leaves its box (so arrows end at the border)."""
    scale = min(
        (node.w / 2) / abs(dx) if dx else math.inf,
        (node.h / 2) / abs(dy) if dy else math.inf,
    )
    return node.x + dx * scale, node.y + dy * scale


def _line(a: Point, b: Point) -> tuple[Point, Point, Point, Point]:
    return (
        a,
        (a[0] + (b[0] - a[0]) / 3, a[1] + (b[1] - a[1]) / 3),
        (
            a[0] + 2 * (b[0] - a[0]) / 3,
            a[1] + 2 * (b[1] - a[1]) / 3,
        ),
        b,
    )


def _bent(a: DiagramNode, b: DiagramNode) -> tuple[Point, Point, Point, Point]:
    """A curve bent to its right, so A->B and B->A never overlap."""
    dx, dy = b.x - a.x, b.y - a.y
    length = math.hypot(dx, dy)
    nx, ny = -dy / length * 16, dx / length * 16
    x1, y1 = _border(a, dx + nx, dy + ny)
    x2, y2 = _border(b, -dx + nx, -dy + ny)
    qx, qy = (x1 + x2) / 2 + nx, (y1 + y2) / 2 + ny
    # The quadratic through (qx, qy) as a cubic.
    return (
        (x1, y1),
        (x1 + 2 / 3 * (qx - x1), y1 + 2 / 3 * (qy - y1)),
        (x2 + 2 / 3 * (qx - x2), y2 + 2 / 3 * (qy - y2)),
        (x2, y2),
    )


def _curve(a: DiagramNode, b: DiagramNode, both_ways: bool) -> tuple[Point, Point, Point, Point]:
    """The drawing of ``a -> b``: straight into a bar, around the outside between the bars,
    bent when ``b -> a`` is drawn too, else straight."""
    if a.name == b.name:  # a loop over the node's top, near its right end
        x = a.right - 40
        return (x, a.top), (x - 10, a.top - 22), (x + 30, a.top - 22), (x + 20, a.top)
    if b.name in _BARS and a.name not in _BARS:
        x = _INTO_BAR_X.get((a.name, b.name), a.x)
        if b.y < a.y:
            return _line((x, a.top), (x, b.bottom))
        return _line((x, a.bottom), (x, b.top))
    if (a.name, b.name) == (_SKIPPED, _EXPIRED):  # down the right side, inside
        x = a.right - 8
        return (x, a.bottom), (x + 22, a.bottom + 90), (x + 22, b.top - 90), (x, b.top)
    if (a.name, b.name) == (_EXPIRED, _SKIPPED):  # up the right side, outside
        x = a.right
        return (x, a.y), (x + 50, a.y - 60), (x + 50, b.y + 60), (b.right, b.y)
    if a.name == _EXPIRED:  # a retry: up the left, round the lapsed lock, into the node
        start = (a.x - a.w / 2 + 20, a.top)
        end = (b.x - b.w / 2 + 4, b.bottom)
        return start, (start[0], start[1] - 136), (end[0] - 55, end[1] + 43), end
    if both_ways:
        return _bent(a, b)
    dx, dy = b.x - a.x, b.y - a.y
    return _line(_border(a, dx, dy), _border(b, -dx, -dy))


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
        label = titles.get(name, "no record" if name == INITIAL else name)
        if name in _BARS:
            x, y, w, text_x = _BARS[name]
            nodes[name] = DiagramNode(name, label, x, y, w, 28.0, text_x)
            continue
        if name in _PLACES:
            x, y = _PLACES[name]
        else:
            x, y = 70.0 + 150.0 * spare, HEIGHT - 60.0
            spare += 1
        nodes[name] = DiagramNode(name, label, x, y)
    drawn = {(s, t) for s, t, _ in pairs}
    edges = tuple(
        DiagramEdge(s, t, label, _curve(nodes[s], nodes[t], (t, s) in drawn))
        for s, t, label in pairs
    )
    return Diagram(tuple(nodes.values()), edges)
