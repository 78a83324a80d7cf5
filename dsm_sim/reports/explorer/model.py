"""The explorer's data: a run's history turned into compact, per-instant arrays.

The page scrubs through tens of thousands of instants, so everything the
browser would otherwise recompute on every step is computed once, here: the
ordered instants, the record each write left behind (the *changes*), the
diagram node and edge each change moved the item along, the store clock at
every instant.  The browser only binary-searches these arrays.  Columns are
plain lists of numbers and indices into string tables, because one JSON
object per operation would make a 10^4-operation page slow to parse.
Instants are the history's microseconds until they are written: the page
holds float seconds, which is what its script computes with.

Records come from the reads the recorder took around each call
(:attr:`~dsm_sim.history.Op.before`/``after``).  A sweep is not read per key,
so its effect is derived: each key it reports as reset takes the sweep's
target status, the rest of the record unchanged.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsm_sim.history import EventKind, History, Op, OpName, Outcome, RecordView
from dsm_sim.micros import Micros, micros_of, seconds_of
from dsm_sim.reports.explorer.diagram import Diagram, state_diagram
from dsm_sim.reports.explorer.transitions import ChangePath, change_path, node_of
from dsm_sim.reports.instants import axis

__all__ = [
    "FAULT_KINDS",
    "STORE_ERROR",
    "Chapter",
    "FaultRow",
    "TraceViolation",
    "explorer_data",
    "fault_rows",
    "lane_order",
    "node_of",
]

#: A worker lane: ``w3``, or ``w3.2`` for the second item its instance holds.
_WORKER_LANE = re.compile(r"^w(\d+)(?:\.(\d+))?$")

#: Events the timeline marks as faults and the fault list names.
FAULT_KINDS: frozenset[EventKind] = frozenset(
    {
        EventKind.CRASH,
        EventKind.CLOCK_JUMP,
        EventKind.STORE_FAULT,
        EventKind.CATCHUP_PAUSE,
        EventKind.CATCHUP_RESUME,
        EventKind.FAULTS_STOP,
        EventKind.DEAD_LETTER,
        EventKind.DEPLOYMENT,
    }
)

#: The fault name of a call the store failed (the simulator records these as outcomes).
STORE_ERROR = "store_error"

_SWEEP_TARGET = {
    OpName.RESET_EXPIRED_LOCKS: "failed",
    OpName.EXPIRE_PAST_RETENTION: "expired",
}


@dataclass(frozen=True, slots=True)
class TraceViolation:
    """A violation as the explorer plays it: the operations and events that prove it."""

    invariant: str
    message: str
    key: str
    ops: tuple[int, ...]
    events: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Chapter:
    """A narrated step of a walk-through: it covers the operations from ``first_op`` on."""

    first_op: int
    title: str
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FaultRow:
    """One disturbance of the run: a fault event, or a call the store answered with an error."""

    time: Micros
    kind: str
    process: str
    key: str
    detail: str


def fault_rows(history: History) -> tuple[FaultRow, ...]:
    """Every fault, in time order: the events the injector marked and the failed store calls."""
    rows = [
        FaultRow(ev.time, ev.kind.value, ev.process, ev.key, ev.detail)
        for ev in history.events
        if ev.kind in FAULT_KINDS
    ]
    rows.extend(
        FaultRow(
            op.complete if op.complete is not None else op.invoke,
            STORE_ERROR,
            op.process,
            op.key,
            f"{op.op.value} #{op.index}: {op.outcome.value if op.outcome else ''} "
            f"({'may have happened' if op.outcome is Outcome.INFO else 'did not happen'})",
        )
        for op in history.ops
        if op.error == "StoreError"
    )
    return tuple(sorted(rows, key=lambda r: r.time))


def lane_order(history: History) -> list[str]:
    """Workers in numeric order first, then every other process by name (as the static lanes)."""
    names = {op.process for op in history.ops} | {ev.process for ev in history.events if ev.process}
    # A worker's lanes (``w1``, then ``w1.2``, ... when an instance holds several items).
    lanes = {n: tuple(map(int, m.groups("1"))) for n in names if (m := _WORKER_LANE.match(n))}
    workers = sorted(lanes, key=lanes.__getitem__)
    return workers + sorted(names - set(workers))


class _Strings:
    """A string table, so repeated texts (statuses, digests, names) are sent once."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str | None) -> int:
        if text is None:
            return -1
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.items)
            self.items.append(text)
        return found


def _r(value: Micros | None) -> float | None:
    """An instant as the page reads it: seconds since the epoch."""
    return None if value is None else seconds_of(value)


def _record(view: RecordView | None, s: _Strings) -> list[Any] | None:
    if view is None:
        return None
    return [
        s(view.status),
        view.attempt,
        _r(view.locked_until),
        s(view.data),
        _r(view.created_at),
        _r(view.updated_at),
        _r(view.retain_until),
        view.utc,
    ]


def _css(op: Op, flagged: set[int]) -> str:
    if op.error == "StaleLockError":
        css = "stale"
    elif op.outcome is Outcome.INFO:
        css = "info"
    elif op.outcome is Outcome.FAIL:
        css = "fail"
    else:
        css = "ok"
    if op.error == "StoreError":
        css += " " + STORE_ERROR
    return f"{css} flagged" if op.index in flagged else css


def _store_clock(history: History) -> tuple[list[Micros], list[Micros]]:
    """Cumulative store-clock offsets after each clock jump, for ``store = t + offset``."""
    times: list[Micros] = []
    offsets: list[Micros] = []
    total = 0
    for ev in sorted(history.events, key=lambda e: (e.time, e.index)):
        if ev.kind is EventKind.CLOCK_JUMP and ev.value is not None:
            total += micros_of(ev.value)
            times.append(ev.time)
            offsets.append(total)
    return times, offsets


def explorer_data(
    history: History,
    violations: Sequence[TraceViolation] = (),
    *,
    title: str = "",
    chapters: Sequence[Chapter] = (),
    store_clock: Mapping[int, Micros] | None = None,
    diagram: Diagram | None = None,
) -> dict[str, Any]:
    """Everything the page's script reads, as JSON-ready columns (see the module docstring).

    ``store_clock`` gives, per operation index, the store clock a recorder
    knows better than ``t + clock jumps`` (the demo's manual clock).
    """
    s = _Strings()
    diagram = diagram or state_diagram()
    lanes = lane_order(history)
    lane_index = {name: i for i, name in enumerate(lanes)}
    keys = history.item_keys()
    key_index = {key: i for i, key in enumerate(keys)}
    flagged = {i for v in violations for i in v.ops}
    ops = sorted(history.ops, key=lambda o: (o.invoke, o.index))
    jump_t, jump_off = _store_clock(history)

    def store_at(t: Micros) -> Micros:
        i = bisect.bisect_right(jump_t, t)
        return t + (jump_off[i - 1] if i else 0)

    # --- instants: every boundary of an operation or event ----------------------------------
    instants = sorted(
        {0}
        | {o.invoke for o in ops}
        | {o.complete for o in ops if o.complete is not None}
        | {e.time for e in history.events}
    )
    step_of = {t: i for i, t in enumerate(instants)}
    step_op = [-1] * len(instants)
    for op in ops:
        for t in (op.invoke, op.complete):
            if t is not None:
                step_op[step_of[t]] = op.index
    for i in range(1, len(step_op)):
        if step_op[i] < 0:
            step_op[i] = step_op[i - 1]
    step_store = [store_at(t) for t in instants]
    if store_clock:
        # The recorder's reading holds from the call's invocation to its completion.
        known = {
            step_of[t]: store_clock[o.index]
            for o in ops
            if o.index in store_clock
            for t in (o.invoke, o.complete)
            if t is not None
        }
        last = step_store[0]
        for i in range(len(step_store)):
            last = known.get(i, last)
            step_store[i] = last

    # --- changes: the record each call or sweep left behind ------------------------------------
    changes: list[tuple[Micros, int, int, ChangePath, RecordView | None]] = []
    current: dict[str, RecordView | None] = {}
    for op in sorted(ops, key=lambda o: o.complete if o.complete is not None else o.invoke):
        at = op.complete if op.complete is not None else op.invoke
        now = op.store_time if op.store_time is not None else store_at(at)
        if op.probed and op.key in key_index:
            if op.after != op.before:
                path = change_path(diagram, op, op.before, op.after, now)
                changes.append((at, key_index[op.key], op.index, path, op.after))
            current[op.key] = op.after
        elif op.op in _SWEEP_TARGET and op.maybe:
            for key in op.keys:
                before = current.get(key)
                if key not in key_index or before is None or before.status == _SWEEP_TARGET[op.op]:
                    continue  # nothing of this key's record for the sweep to change
                after = RecordView(
                    key=before.key,
                    status=_SWEEP_TARGET[op.op],
                    attempt=before.attempt,
                    locked_until=None,
                    created_at=before.created_at,
                    updated_at=now,
                    retain_until=before.retain_until,
                    data=before.data,
                    utc=before.utc,
                )
                path = change_path(diagram, op, before, after, now)
                changes.append((at, key_index[key], op.index, path, after))
                current[key] = after
    changes.sort(key=lambda c: c[0])

    # --- events ---------------------------------------------------------------------------------
    events = sorted(history.events, key=lambda e: (e.time, e.index))
    kinds = [k.value for k in EventKind]
    end = seconds_of(max(instants[-1], 1))
    return {
        "title": title,
        "end": end,
        # The run's clock: every instant is written as epoch + seconds, to the millisecond
        # unless every store-clock reading of the page is a whole second (the demo's clock).
        "epoch": history.epoch.isoformat(),
        "digits": 0 if all(t % 1_000_000 == 0 for t in step_store) else 3,
        "axis": [list(tick) for tick in axis(history.epoch, end).ticks],
        "instants": [seconds_of(t) for t in instants],
        "step_op": step_op,
        "step_store": [seconds_of(t) for t in step_store],
        "lanes": lanes,
        "keys": keys,
        "op_names": [n.value for n in OpName],
        "outcomes": [o.value for o in Outcome],
        "ops": _op_columns(ops, lane_index, key_index, flagged, s),
        "events": {
            "index": [e.index for e in events],
            "t": [seconds_of(e.time) for e in events],
            "kind": [kinds.index(e.kind.value) for e in events],
            "lane": [lane_index.get(e.process, -1) for e in events],
            "key": [key_index.get(e.key, -1) for e in events],
            "token": [e.token for e in events],
            "detail": [s(e.detail) for e in events],
            "value": [None if e.value is None else round(e.value, 6) for e in events],
        },
        "event_kinds": kinds,
        "faults": [[seconds_of(f.time), f.kind, s(f.detail)] for f in fault_rows(history)],
        "fault_kinds": sorted(k.value for k in FAULT_KINDS),
        "changes": {
            "t": [seconds_of(c[0]) for c in changes],
            "key": [c[1] for c in changes],
            "op": [c[2] for c in changes],
            "edge": [s(c[3].edge) for c in changes],
            "forbidden": [c[3].forbidden for c in changes],
            "record": [_record(c[4], s) for c in changes],
        },
        "violations": [
            {
                "invariant": v.invariant,
                "message": v.message,
                "key": v.key,
                "ops": list(v.ops),
                "events": list(v.events),
            }
            for v in violations
        ],
        "chapters": [
            {"first_op": c.first_op, "title": c.title, "lines": list(c.lines)} for c in chapters
        ],
        "diagram": {
            "nodes": [n.name for n in diagram.nodes],
            "edges": [f"{e.source}>{e.target}" for e in diagram.edges],
        },
        "strings": s.items,
    }


def _op_columns(
    ops: Iterable[Op],
    lane_index: Mapping[str, int],
    key_index: Mapping[str, int],
    flagged: set[int],
    s: _Strings,
) -> dict[str, list[Any]]:
    """One list per field, ops in invocation order; ``detail`` holds what the panel shows."""
    names = [n for n in OpName]
    outcomes = [o for o in Outcome]
    cols: dict[str, list[Any]] = {
        k: [] for k in ("index", "lane", "key", "op", "t0", "t1", "outcome", "css", "detail")
    }
    for op in ops:
        cols["index"].append(op.index)
        cols["lane"].append(lane_index[op.process])
        cols["key"].append(key_index.get(op.key, -1))
        cols["op"].append(names.index(op.op))
        cols["t0"].append(seconds_of(op.invoke))
        cols["t1"].append(seconds_of(op.complete if op.complete is not None else op.invoke))
        cols["outcome"].append(-1 if op.outcome is None else outcomes.index(op.outcome))
        cols["css"].append(s(_css(op, flagged)))
        cols["detail"].append(
            [
                op.token,
                s(op.status),
                s(op.error),
                op.result,
                _r(op.store_time),
                s(op.data),
                s(op.execution),
                [s(k) for k in op.keys],
                op.probed,
                _record(op.before, s),
                _record(op.after, s),
            ]
        )
    return cols
