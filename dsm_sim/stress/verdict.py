"""Reading the checker's verdicts on a wall-clock history.

Three invariants (``fencing_rejects_stale_writes``,
``only_allowed_transitions`` and ``exists_agrees_with_writes``) replay a
key's writes in completion order.  In the simulator a call takes effect at its completion, so that order is
the store's.  In a real run it is not: a process can commit a write and be
descheduled before it reads the clock, so another process's later write can
carry the earlier completion stamp.  A violation of those invariants
is therefore only proven on a wall-clock history when the key's writes up
to it do not overlap in time; otherwise it is kept as a note, not a failure.
The other invariants already reason on ``[invoke, complete]`` intervals.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

from dsm_sim.checker import InvariantResult, Violation
from dsm_sim.history import History, Op

__all__ = ["ORDER_DEPENDENT", "UNPROVEN", "concurrent", "order_proven", "wall_clock_verdicts"]

#: Invariants that trust completion order to be the store's order.
ORDER_DEPENDENT = frozenset(
    {"fencing_rejects_stale_writes", "only_allowed_transitions", "exists_agrees_with_writes"}
)
#: Prefix of the note that replaces a demoted violation.
UNPROVEN = "unproven on a wall-clock history"


def concurrent(a: Op, b: Op) -> bool:
    """Whether two calls' ``[invoke, complete]`` windows overlap (their order is unknown)."""
    return a.invoke < b.latest and b.invoke < a.latest


def order_proven(history: History, violation: Violation) -> bool:
    """True unless two writes on the key, up to the violation's last op, were concurrent."""
    if not violation.ops:
        return True
    cited = [history.ops[i] for i in violation.ops]
    horizon = max(op.latest for op in cited)
    writes = [
        op
        for op in history.ops_for(violation.key)
        if (op.op.is_write or op.op.is_sweep) and op.maybe and op.invoke <= horizon
    ]
    return not any(concurrent(a, b) for a, b in itertools.combinations(writes, 2))


def wall_clock_verdicts(
    history: History, results: Iterable[InvariantResult]
) -> tuple[InvariantResult, ...]:
    """The checker's results with order-dependent violations that the clock cannot prove demoted."""
    judged = []
    for result in results:
        if result.name not in ORDER_DEPENDENT or result.passed:
            judged.append(result)
            continue
        kept = tuple(v for v in result.violations if order_proven(history, v))
        demoted = [
            f"{UNPROVEN} (concurrent writes on the key): {v.message}"
            for v in result.violations
            if v not in kept
        ]
        judged.append(
            dataclasses.replace(
                result,
                passed=not kept,
                violations=kept,
                notes=(*result.notes, *demoted),
            )
        )
    return tuple(judged)
