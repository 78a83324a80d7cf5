"""Time as a report writes it, and the state diagram as the explorer lays it out.

Every instant is the run's clock (``09:36:00``, as the demo narrates it), a
page has one time axis whose labels are evenly spaced round instants, and
the diagram reads along the lifecycle without a tangle of crossing edges.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import itertools
import re

import pytest

from dsm_sim.history import History, Op, OpName, Outcome
from dsm_sim.micros import micros_of as us
from dsm_sim.micros import micros_since
from dsm_sim.reports.explorer import explorer_view
from dsm_sim.reports.explorer.diagram import INITIAL, Point, state_diagram
from dsm_sim.reports.explorer.model import explorer_data
from dsm_sim.reports.html import swim_lanes
from dsm_sim.reports.instants import axis, tick_step, wall
from dsm_sim.teaching.diagram import EXPIRED_LOCK

pytestmark = pytest.mark.unit

EPOCH = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


# --- instants ---------------------------------------------------------------------------------


def test_an_instant_is_written_as_the_runs_clock_showed_it() -> None:
    assert wall(EPOCH, us(2160)) == "09:36:00.000"
    assert wall(EPOCH, us(2160), digits=0) == "09:36:00"
    assert wall(EPOCH, 400) == "09:00:00.000"
    assert wall(EPOCH, 500) == "09:00:00.001", "half a millisecond rounds up, as the page's"
    assert wall(EPOCH, us(86400 + 1.25)) == "2026-01-06 09:00:01.250", "another day says its date"
    assert wall(EPOCH, us(-1)) == "08:59:59.000"


def test_the_last_instant_a_record_holds_is_written_without_overflowing() -> None:
    last = micros_since(dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC), EPOCH)
    assert last is not None
    assert wall(EPOCH, last) == "9999-12-31 23:59:59.999", "cut, not rounded into year 10000"
    assert wall(EPOCH, last - 1_000) == "9999-12-31 23:59:59.999"


def test_axis_labels_are_evenly_spaced_round_instants() -> None:
    for end in (0.35, 7.0, 95.0, 250.0, 2220.0, 9 * 86400.0):
        ticks = axis(EPOCH, end).ticks
        step = tick_step(end)
        assert 2 <= len(ticks) <= 11, (end, ticks)
        assert [t for t, _ in ticks] == pytest.approx([i * step for i in range(len(ticks))])
        assert ticks[-1][0] <= end < ticks[-1][0] + step
        assert all(label == wall(EPOCH, us(t), 0 if step >= 1 else 3) for t, label in ticks)
    assert [label for _, label in axis(EPOCH, 2220.0).ticks][:3] == [
        "09:00:00",
        "09:05:00",
        "09:10:00",
    ]


def _op(index: int, t: float, store: float) -> Op:
    return Op(
        index, "w1", OpName.EXISTS, "k", us(t), us(t + 0.5), Outcome.OK, False, store_time=us(store)
    )


def test_the_run_report_has_one_axis_on_the_runs_clock() -> None:
    history = History(epoch=EPOCH, lock_duration=60.0, ops=(_op(0, 1.0, 1.0), _op(1, 64.0, 64.0)))
    lanes = swim_lanes(history, set(), set())
    labels = [label for _, label in lanes.ticks]
    assert labels == [f"09:0{s // 60}:{s % 60:02d}" for s in range(0, 61, 10)]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(lanes.ticks)]
    assert max(gaps) - min(gaps) < 0.02, "evenly spaced"
    assert lanes.left + 64.5 * lanes.scale == pytest.approx(max(s.x + s.w for s in lanes.shapes))
    data = explorer_data(history)
    assert data["epoch"] == EPOCH.isoformat() and data["digits"] == 3
    assert data["axis"] == [list(t) for t in axis(EPOCH, data["end"]).ticks]
    assert explorer_view(history).at(us(64.5)) == "09:01:04.500"


def test_the_demo_page_says_the_instants_its_narration_says() -> None:
    from dsm_sim.teaching.demo_page import record_demo, render_demo_html

    with contextlib.redirect_stdout(io.StringIO()):
        tape, outcome = asyncio.run(
            record_demo(handler="reference_engine.handlers.memory:in_memory_handler")
        )
    history = tape.history()
    sweep = next(op for op in history.ops if op.op is OpName.RESET_EXPIRED_LOCKS)
    assert wall(EPOCH, sweep.invoke, 0) == "09:36:00", "the timeline is the demo's own clock"
    data = explorer_data(history, store_clock=tape.store_clock)
    assert data["digits"] == 0, "the demo's clock reads whole seconds"
    narrated = set(re.findall(r"\[clock (\d\d:\d\d:\d\d)\]", "\n".join(tape.lines)))
    shown = {wall(EPOCH, us(t), 0) for t in data["instants"][1:]}
    assert narrated <= shown, (narrated, shown)
    page = render_demo_html(tape, outcome)
    assert "store clock 2160" not in page and "09:36:00" in page


# --- the diagram --------------------------------------------------------------------------------


def _samples(curve: tuple[Point, Point, Point, Point], n: int = 48) -> list[Point]:
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = curve
    out = []
    for i in range(n + 1):
        t = i / n
        u = 1 - t
        out.append(
            (
                u**3 * x0 + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3,
                u**3 * y0 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3,
            )
        )
    return out


def _cross(p: Point, q: Point, r: Point, s: Point) -> bool:
    def side(a: Point, b: Point, c: Point) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    return side(r, s, p) * side(r, s, q) < 0 and side(p, q, r) * side(p, q, s) < 0


def test_the_diagram_follows_the_lifecycle_left_to_right() -> None:
    nodes = {n.name: n for n in state_diagram().nodes}
    lifecycle = [INITIAL, "Processing", "Processed", "Superseded"]
    assert [nodes[n].x for n in lifecycle] == sorted(nodes[n].x for n in lifecycle)
    assert len({nodes[n].y for n in lifecycle}) == 1, "one row"
    row = nodes["Processing"].y
    assert nodes["Failed"].y > row and nodes[EXPIRED_LOCK].y > row, "beside, below Processing"
    assert nodes["Skipped"].y < min(n.y for n in nodes.values() if n.name != "Skipped")
    assert nodes["Expired"].y > max(n.y for n in nodes.values() if n.name != "Expired")


def test_the_diagram_has_no_tangle_of_crossing_edges() -> None:
    diagram = state_diagram()
    crossings = []
    for a, b in itertools.combinations(diagram.edges, 2):
        pa, pb = _samples(a.curve)[2:-2], _samples(b.curve)[2:-2]  # ends meet at shared nodes
        if any(
            _cross(p, q, r, s) for p, q in itertools.pairwise(pa) for r, s in itertools.pairwise(pb)
        ):
            crossings.append(f"{a.source}>{a.target} x {b.source}>{b.target}")
    assert crossings == ["Processing>Processed x Failed>Skipped"]
    through = [
        f"{e.source}>{e.target} through {n.name}"
        for e in diagram.edges
        for n in diagram.nodes
        if n.name not in (e.source, e.target)
        and any(abs(x - n.x) < n.w / 2 and abs(y - n.y) < n.h / 2 for x, y in _samples(e.curve))
    ]
    assert through == []
    inside = all(
        0 <= x <= diagram.width and 0 <= y <= diagram.height
        for e in diagram.edges
        for x, y in _samples(e.curve)
    )
    assert inside, "every edge is drawn on the page"
