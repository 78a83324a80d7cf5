"""In which orders a key's operations may have taken effect.

The simulator knows the instant each call took effect (its ``store_time``,
at which it also completes the operation), so completion order *is* the
store's order and the invariants replay it directly.  A wall-clock history
(the multi-process stress runner) does not: a process can commit a write and
be descheduled before it stamps the completion, so completion order can
invert two writes the store applied the other way round.  There, two calls
are ordered only when one provably precedes the other (``a.complete <
b.invoke``); overlapping calls are concurrent, and a replay that fails in
completion order is only a violation if *no* order consistent with the
windows explains what was observed.

That search is exact linearizability for one key, which is exponential in
the number of mutually overlapping calls.  It is bounded: beyond
:data:`MAX_CONCURRENT` overlapping writes on one key the check gives up on
that key and says so in a note starting with :data:`UNPROVEN`, rather than
report a violation it cannot prove.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from dsm_sim.checker.leases import Violation, order
from dsm_sim.history import History, Op

__all__ = [
    "MAX_CONCURRENT",
    "UNPROVEN",
    "Explanation",
    "Ordering",
    "Search",
    "explain",
    "is_wall_clock",
    "max_overlap",
    "may_lie_between",
    "precedes",
    "settle",
]

#: The most mutually overlapping writes on one key whose orders are all tried.
MAX_CONCURRENT = 8
#: Prefix of the note that replaces a violation the search could not settle.
UNPROVEN = "unproven on a wall-clock history"

StateT = TypeVar("StateT", bound=Hashable)

#: One replay step: the state after ``op``, and the violation ``op`` was from ``state`` (or None).
Step = Callable[[StateT, Op], tuple[StateT, object | None]]
#: Whether a read is consistent with the state at its place in the order.
Read = Callable[[StateT, Op], bool]


def is_wall_clock(history: History) -> bool:
    """No operation knows its store instant: each took effect somewhere in its window.

    Decided for the whole history, not per operation: the simulator leaves
    ``store_time`` unset on a few calls (a crash before the store saw them),
    and its verdicts must keep reading completion order as the store's.
    """
    return all(op.store_time is None for op in history.ops)


def precedes(a: Op, b: Op) -> bool:
    """``a`` surely took effect before ``b``: it completed before ``b`` was invoked."""
    return a.complete is not None and a.complete < b.invoke


def may_lie_between(first: Op, middle: Op, last: Op) -> bool:
    """Some order of the windows puts ``middle`` after ``first`` and before ``last``."""
    return not precedes(middle, first) and not precedes(last, middle)


@dataclass(frozen=True, slots=True)
class Ordering:
    """How a history's calls are ordered: by completion (simulator) or by proof (wall clock).

    ``before`` is for what a check blames: it must be certain.  ``between``
    is for what excuses: on a wall clock, anything the windows allow.
    """

    wall_clock: bool

    @classmethod
    def of(cls, history: History) -> Ordering:
        return cls(is_wall_clock(history))

    def before(self, a: Op, b: Op) -> bool:
        """``a`` took effect before ``b``."""
        return precedes(a, b) if self.wall_clock else order(a) < order(b)

    def between(self, first: Op, middle: Op, last: Op) -> bool:
        """``middle`` took effect (or, on a wall clock, may have) after ``first`` and before ``last``."""
        if self.wall_clock:
            return may_lie_between(first, middle, last)
        return order(first) < order(middle) < order(last)


def max_overlap(ops: Sequence[Op]) -> int:
    """The most windows ``[invoke, complete]`` that share one instant (closed intervals)."""
    edges: list[tuple[float, int]] = []
    for op in ops:
        edges.append((op.invoke, 0))  # opens sort before closes at the same instant
        edges.append((op.complete if op.complete is not None else float("inf"), 1))
    best = depth = 0
    for _, kind in sorted(edges):
        depth += 1 if kind == 0 else -1
        best = max(best, depth)
    return best


class Explanation(enum.Enum):
    """What the search concluded about a key."""

    #: Some order consistent with the windows replays without a violation.
    EXPLAINED = "explained"
    #: No such order exists: the violation is proven.
    UNEXPLAINED = "unexplained"
    #: Too many overlapping writes to try every order.
    UNPROVEN = "unproven"


@dataclass(frozen=True, slots=True)
class Search(Generic[StateT]):
    """A key's replay, to be tried in every order the windows allow.

    ``writes`` change the state through ``step``; ``reads`` only observe it.
    A read is placed where the writes that precede it are exactly the ones
    already replayed, so it must be concurrent with none of them (callers
    leave such reads out: they cannot be judged).
    """

    writes: Sequence[Op]
    start: StateT
    step: Step[StateT]
    reads: Sequence[Op] = ()
    read_ok: Read[StateT] | None = None


def explain(search: Search[StateT]) -> Explanation:
    """Whether some linearization of the writes replays, reads included, without a violation.

    A depth-first walk over (writes done, state), each pair visited once: the
    sets of writes done are the down-sets of the interval order, at most about
    ``len(writes) * 2 ** overlap`` of them.
    """
    writes = sorted(search.writes, key=lambda op: (op.invoke, op.index))
    if max_overlap(writes) > MAX_CONCURRENT:
        return Explanation.UNPROVEN
    needs = [sum(1 << j for j, other in enumerate(writes) if precedes(other, op)) for op in writes]
    reads_at: dict[int, list[Op]] = {}
    for read in search.reads:
        done = sum(1 << j for j, op in enumerate(writes) if precedes(op, read))
        reads_at.setdefault(done, []).append(read)
    full = (1 << len(writes)) - 1
    stack: list[tuple[int, StateT]] = [(0, search.start)]
    seen: set[tuple[int, StateT]] = set(stack)
    while stack:
        done, state = stack.pop()
        read_ok = search.read_ok
        if read_ok is not None and not all(read_ok(state, r) for r in reads_at.get(done, ())):
            continue
        if done == full:
            return Explanation.EXPLAINED
        for i, op in enumerate(writes):
            bit = 1 << i
            if done & bit or needs[i] & ~done:
                continue
            after, violation = search.step(state, op)
            node = (done | bit, after)
            if violation is not None or node in seen:
                continue
            seen.add(node)
            stack.append(node)
    return Explanation.UNEXPLAINED


def settle(
    key: str, found: Sequence[Violation], search: Search[StateT]
) -> tuple[list[Violation], list[str]]:
    """A wall-clock key's verdict: completion order's violations, kept only if no order explains them.

    ``found`` is what the completion-order replay reported.  That order is
    one of the orders the windows allow, so an empty ``found`` settles the
    key without searching.
    """
    if not found:
        return [], []
    outcome = explain(search)
    if outcome is Explanation.UNEXPLAINED:
        return [
            replace(v, message=f"{v.message} (and no order of the overlapping calls explains it)")
            for v in found
        ], []
    if outcome is Explanation.EXPLAINED:
        return [], [
            f"key {key}: completion order shows {len(found)} violation(s) (first: ops "
            f"{', '.join(f'#{i}' for i in found[0].ops)}), but an order of the overlapping "
            "calls within their windows explains every observation"
        ]
    return [], [
        f"{UNPROVEN}: key {key} has more than {MAX_CONCURRENT} mutually overlapping writes, "
        f"too many orders to try; not reported as a violation: {v.message}"
        for v in found
    ]
