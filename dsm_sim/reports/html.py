"""The HTML report of one run: swim lanes, the invariant table and the violating trace.

The page is self-contained (inline CSS, SVG and script, no external assets)
so it can be attached to a CI run or mailed.  Geometry is computed here, in
Python, so the template only places shapes and rows; the static tables are
the whole report without JavaScript, and the explorer
(:mod:`dsm_sim.reports.explorer`) is laid over them when scripts run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dsm_sim.history import EventKind, History, Op, Outcome
from dsm_sim.micros import Micros, micros_of, seconds_of
from dsm_sim.outputs import write_report
from dsm_sim.reports.explorer import TraceViolation, explorer_view
from dsm_sim.reports.instants import axis, wall
from dsm_sim.reports.json_report import report_name
from dsm_sim.reports.rendering import template_environment
from dsm_sim.simulator.run import RunResult

__all__ = ["Shape", "render_html", "swim_lanes", "write_html"]

#: A worker lane: ``w3``, or ``w3.2`` for the second item its instance holds.
_WORKER_LANE = re.compile(r"^w(\d+)(?:\.(\d+))?$")

_TEMPLATE = "report.html.j2"
_WIDTH = 1100.0
_LEFT = 90.0
_LANE = 30.0
_TOP = 24.0
#: Events drawn as a rule across every lane: they change the world, not one process.
#: A network fault's start and end (a stress run's ``--netfault``) is drawn like a clock jump.
_RULES = {
    EventKind.CLOCK_JUMP: "jump",
    EventKind.FAULTS_STOP: "stop",
    EventKind.STORE_FAULT: "netfault",
    EventKind.DEPLOYMENT: "deploy",
}


@dataclass(frozen=True, slots=True)
class Shape:
    """One SVG element: ``kind`` is rect, mark, tick or line; ``css`` picks the colour."""

    kind: str
    x: float
    y: float
    w: float
    h: float
    css: str
    title: str


@dataclass(frozen=True, slots=True)
class Lanes:
    """The run's swim lanes; ``x = left + t * scale`` places the instant ``t`` (the page's
    time axis, which the explorer's cursor moves along)."""

    names: tuple[str, ...]
    shapes: tuple[Shape, ...]
    width: float
    height: float
    ticks: tuple[tuple[float, str], ...]
    left: float
    scale: float


def _op_css(op: Op, flagged: set[int]) -> str:
    if op.error == "StaleLockError":
        css = "stale"
    elif op.outcome is Outcome.INFO:
        css = "info"
    elif op.outcome is Outcome.FAIL:
        css = "fail"
    else:
        css = "ok"
    return f"{css} flagged" if op.index in flagged else css


def _lane_order(history: History) -> list[str]:
    names = {op.process for op in history.ops} | {ev.process for ev in history.events if ev.process}
    # A worker's lanes (``w1``, then ``w1.2``, ... when an instance holds several items).
    lanes = {n: tuple(map(int, m.groups("1"))) for n in names if (m := _WORKER_LANE.match(n))}
    workers = sorted(lanes, key=lanes.__getitem__)
    return workers + sorted(names - set(workers))


def swim_lanes(history: History, flagged_ops: set[int], flagged_events: set[int]) -> Lanes:
    """Shapes for one lane per process; times scaled to the page width, labelled as the
    run's clock showed them (:mod:`dsm_sim.reports.instants`)."""
    names = _lane_order(history)
    row = {name: i for i, name in enumerate(names)}
    end = max(
        [seconds_of(op.complete or op.invoke) for op in history.ops]
        + [seconds_of(ev.time) for ev in history.events]
        + [1.0]
    )
    scale = _WIDTH / end

    def xs(seconds: float) -> float:
        return round(_LEFT + seconds * scale, 2)

    def x(t: Micros) -> float:
        return xs(seconds_of(t))

    def y(lane: str) -> float:
        return _TOP + row[lane] * _LANE

    def at(t: Micros) -> str:
        return wall(history.epoch, t)

    shapes: list[Shape] = []
    for op in history.ops:
        start, stop = op.invoke, op.complete if op.complete is not None else op.invoke
        title = (
            f"#{op.index} {op.process} {op.op.value} {op.key} token={op.token} "
            f"{op.outcome.value if op.outcome else ''} result={op.result} "
            f"{op.error or ''} {at(start)}-{at(stop)}"
        )
        shapes.append(
            Shape(
                "rect",
                x(start),
                y(op.process) + 6,
                max(2.0, round(seconds_of(stop - start) * scale, 2)),
                _LANE - 12,
                _op_css(op, flagged_ops),
                title,
            )
        )
    height = _TOP + len(names) * _LANE
    for ev in history.events:
        flagged = " flagged" if ev.index in flagged_events else ""
        title = (
            f"event #{ev.index} {ev.kind.value} {ev.key} token={ev.token} {ev.detail} {at(ev.time)}"
        )
        if ev.kind is EventKind.SIDE_EFFECT:
            begin = ev.time - micros_of(ev.value or 0.0)
            shapes.append(
                Shape(
                    "rect",
                    x(begin),
                    y(ev.process) + 9,
                    max(2.0, round((ev.value or 0.0) * scale, 2)),
                    _LANE - 18,
                    "effect" + flagged,
                    title,
                )
            )
        elif ev.kind is EventKind.CRASH:
            shapes.append(
                Shape("mark", x(ev.time), y(ev.process) + _LANE / 2, 0, 0, "crash" + flagged, title)
            )
        elif ev.kind in _RULES:
            shapes.append(Shape("line", x(ev.time), _TOP, 0, height - _TOP, _RULES[ev.kind], title))
        elif ev.kind is EventKind.DELIVERY and ev.process in row:
            shapes.append(
                Shape("tick", x(ev.time), y(ev.process) + 6, 0, _LANE - 12, "delivery", title)
            )
        elif ev.kind in (EventKind.CATCHUP_PAUSE, EventKind.CATCHUP_RESUME) and ev.process in row:
            shapes.append(
                Shape("mark", x(ev.time), y(ev.process) + _LANE / 2, 0, 0, "pause", title)
            )
    ticks = tuple((xs(t), label) for t, label in axis(history.epoch, end).ticks)
    return Lanes(tuple(names), tuple(shapes), _LEFT + _WIDTH + 20, height + 24, ticks, _LEFT, scale)


def render_html(run: RunResult) -> str:
    flagged_ops = {i for r in run.results for v in r.violations for i in v.ops}
    flagged_events = {i for r in run.results for v in r.violations for i in v.events}
    history = run.whole_history()
    trace = [op for op in history.ops if op.index in flagged_ops]
    trace_events = [ev for ev in history.events if ev.index in flagged_events]
    lanes = swim_lanes(history, flagged_ops, flagged_events)
    # In the order the template lists them, so data-violation="N" names the same one.
    violations = tuple(
        TraceViolation(r.name, v.message, v.key, tuple(v.ops), tuple(v.events))
        for r in run.results
        if not r.passed
        for v in r.violations
    )
    explorer = explorer_view(
        history, violations, title=f"{run.scenario.name} seed {run.seed} [{run.handler}]"
    )
    return (
        template_environment()
        .get_template(_TEMPLATE)
        .render(
            run=run,
            lanes=lanes,
            lane_rows=[(name, _TOP + i * _LANE) for i, name in enumerate(lanes.names)],
            trace=trace,
            trace_events=trace_events,
            finals=history.final,
            notes=[note for r in run.results for note in r.notes],
            lane=_LANE,
            explorer=explorer,
        )
    )


def write_html(run: RunResult, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report_name(run)}.html"
    return write_report(path, render_html(run))
