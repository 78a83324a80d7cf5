"""Per-process, append-only journals of Jepsen-style events, and reading them back.

Each process writes one JSON line per event and flushes it at once, so a
process killed with SIGKILL leaves everything up to its last call on disk; an
``invoke`` without its completion is read back as ``info`` ("may have
happened"), exactly what a checker must assume about it.

Timestamps are wall-clock nanoseconds on the run's one time base: the process
that drives the run reads the wall clock once (:class:`WallClock`) and hands
that anchor to every process it starts, and each advances it with the
system-wide monotonic counter (``perf_counter_ns``, the same counter in every
process on one machine).  A process never anchors a clock of its own: a
process descheduled between its wall-clock read and its counter read (a
loaded machine does that), or a wall clock stepped between two processes'
starts, would put its whole journal a constant off the others', and the
checker would read the true order of two processes' calls backwards.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dsm_sim.history import OpName

__all__ = [
    "RESOLVED",
    "EventType",
    "Journal",
    "Operation",
    "WallClock",
    "read_marks",
    "read_operations",
]


class EventType(enum.Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


#: The journal event that turns an earlier ``info`` completion into ``ok`` (:meth:`Journal.resolve`).
RESOLVED = "resolved"

#: Wall-clock reads tried for an anchor; the one most tightly bracketed by counter reads wins.
ANCHOR_READS = 5


def _anchor() -> tuple[int, int]:
    """``(wall_ns, counter_ns)`` read as nearly at one instant as this process can manage."""
    best: tuple[int, int, int] | None = None
    for _ in range(ANCHOR_READS):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall, (before + after) // 2)
    assert best is not None
    return best[1], best[2]


class WallClock:
    """Wall-clock nanoseconds, anchored once and advanced by the monotonic counter.

    ``WallClock()`` takes a new anchor: only the process that drives a run
    does.  Every other clock of the run is ``WallClock(driver.anchor)``, so
    all of them read one time base (see the module's docstring).
    """

    def __init__(self, anchor: tuple[int, int] | None = None) -> None:
        self._wall, self._mono = _anchor() if anchor is None else anchor

    @property
    def anchor(self) -> tuple[int, int]:
        """``(wall_ns, counter_ns)``: what a clock in another process of the run starts from."""
        return self._wall, self._mono

    def now_ns(self) -> int:
        return self._wall + (time.perf_counter_ns() - self._mono)


@dataclass(frozen=True, slots=True)
class Operation:
    """One call: its invocation, and how it completed (``info`` if it never did)."""

    process: int
    worker: int
    execution: str
    op: OpName
    key: str
    outcome: EventType
    invoke_ns: int
    complete_ns: int | None
    token: int | None = None
    status: str | None = None
    value: Any = None
    error: str | None = None
    keys: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome is EventType.OK


class Journal:
    """Writes one process's events; not shared between processes."""

    def __init__(self, path: Path, process: int, clock: WallClock) -> None:
        self.path = path
        self.process = process
        self.clock = clock
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._next = 0

    def invoke(
        self,
        worker: int,
        execution: str,
        op: OpName,
        key: str,
        token: int | None = None,
        status: str | None = None,
        keys: Sequence[str] = (),
    ) -> int:
        """Log an invocation; the returned id pairs it with its completion."""
        self._next += 1
        self._write(
            {
                "id": self._next,
                "type": EventType.INVOKE.value,
                "worker": worker,
                "execution": execution,
                "op": op.value,
                "key": key,
                "token": token,
                "status": status,
                "keys": list(keys),
            }
        )
        return self._next

    def complete(
        self, op_id: int, outcome: EventType, value: Any = None, error: str | None = None
    ) -> None:
        self._write({"id": op_id, "type": outcome.value, "value": value, "error": error})

    def resolve(self, op_id: int, value: Any) -> None:
        """An ``info`` call found later to have landed (a lost reply, read back): ``value`` is its result.

        Read back, the call is ``ok`` and completes at this event's time: it
        landed somewhere between its invocation and the read that proved it,
        so the checker places it anywhere in that window.  Without this, an
        acquisition a worker reclaimed after a lost reply would hold a token
        the history never granted.
        """
        self._write({"id": op_id, "type": RESOLVED, "value": value})

    def mark(self, name: str, **fields: Any) -> None:
        """A non-operation marker (e.g. "stalled"), for tests that act on a run mid-way."""
        self._write({"type": "mark", "name": name, **fields})

    def close(self) -> None:
        self._file.close()

    def _write(self, event: dict[str, Any]) -> None:
        event["p"] = self.process
        event["t"] = self.clock.now_ns()
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.endswith("\n"):
                return  # torn last line of a killed process: its call counts as unfinished
            yield json.loads(line)


def read_marks(paths: Iterable[Path], name: str) -> list[dict[str, Any]]:
    """Markers named ``name`` written so far by any of the journals."""
    found: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            found.extend(e for e in _events(path) if e["type"] == "mark" and e["name"] == name)
    return found


def read_operations(paths: Iterable[Path]) -> list[Operation]:
    """Pair every invocation with its completion, ordered by invocation time."""
    operations: list[Operation] = []
    for path in paths:
        pending: dict[int, dict[str, Any]] = {}
        completions: dict[int, dict[str, Any]] = {}
        done: list[dict[str, Any]] = []
        for event in _events(path):
            kind = event["type"]
            if kind == EventType.INVOKE.value:
                pending[event["id"]] = event
            elif kind == RESOLVED:
                completions[event["id"]] = {**event, "type": EventType.OK.value, "error": None}
            elif kind != "mark":
                invoke = pending.pop(event["id"])
                completions[event["id"]] = event
                done.append(invoke)
        done.extend(pending.values())
        for invoke in done:
            completion = completions.get(invoke["id"])
            operations.append(
                Operation(
                    process=invoke["p"],
                    worker=invoke["worker"],
                    execution=invoke["execution"],
                    op=OpName(invoke["op"]),
                    key=invoke["key"],
                    outcome=EventType.INFO if completion is None else EventType(completion["type"]),
                    invoke_ns=invoke["t"],
                    complete_ns=None if completion is None else completion["t"],
                    token=invoke["token"],
                    status=invoke["status"],
                    keys=tuple(invoke.get("keys", ())),
                    value=None if completion is None else completion["value"],
                    error=None if completion is None else completion["error"],
                )
            )
    operations.sort(key=lambda o: (o.invoke_ns, o.process, o.worker))
    return operations
