"""When each network fault was active, in a form a history can mark.

A fault found by a checker is only useful next to the instant it was active:
a stale write that landed *after* a partition healed is fencing's case, one
that landed during it is not.  Every control of :class:`~.proxy.FaultProxy`
therefore opens or closes a :class:`FaultWindow`, timed by the proxy's clock,
so a test can set the windows beside its own history (the same clock makes
them comparable) and a report can draw them like clock jumps.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from dsm_sim.history import Event, EventKind
from dsm_sim.micros import micros_of

__all__ = ["Direction", "FaultKind", "FaultWindow", "history_events"]


class Direction(enum.Enum):
    """Which way bytes travel through the proxy."""

    #: Client (worker) to server (store): requests.
    TO_SERVER = "to_server"
    #: Server to client: replies.  Stalling only this one loses replies of writes that landed.
    TO_CLIENT = "to_client"


class FaultKind(enum.Enum):
    """The faults the proxy can inject."""

    LATENCY = "latency"
    STALL = "stall"
    PARTITION = "partition"
    RESET = "reset"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault from ``start`` to ``end`` (``None`` while still active; equal for a reset)."""

    kind: FaultKind
    start: float
    end: float | None
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.end is None

    def covers(self, instant: float) -> bool:
        """Whether the fault was active at ``instant`` (both ends included)."""
        return self.start <= instant and (self.end is None or instant <= self.end)


def history_events(
    windows: Iterable[FaultWindow], *, first_index: int = 0, process: str = "netfaults"
) -> list[Event]:
    """The windows as ``STORE_FAULT`` events of a history: one at each start and each end.

    The times are the proxy clock's; give the proxy the history's clock so they agree.
    """
    marks: list[tuple[float, str]] = []
    for window in windows:
        what = f"{window.kind.value}" + (f" ({window.detail})" if window.detail else "")
        if window.end is not None and window.end == window.start:
            marks.append((window.start, what))
            continue
        marks.append((window.start, f"{what} begins"))
        if window.end is not None:
            marks.append((window.end, f"{what} ends"))
    marks.sort(key=lambda mark: mark[0])
    return [
        Event(
            index=first_index + n,
            time=micros_of(t),
            kind=EventKind.STORE_FAULT,
            process=process,
            detail=d,
        )
        for n, (t, d) in enumerate(marks)
    ]
