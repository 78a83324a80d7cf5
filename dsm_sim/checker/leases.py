"""The checker's vocabulary: verdicts, violations, and the leases a history implies.

A lease is a successful acquisition seen from the history: when it started
(on the store clock), when it surely or possibly expired, and how its holder
ended it.  Every invariant reasons about leases, so they are derived once,
here, with the same conservative reading of uncertain operations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from dsm_sim.history import History, Op, OpName, Outcome

__all__ = [
    "DONE",
    "HOLDER_WRITES",
    "InvariantResult",
    "Lease",
    "Violation",
    "acquired",
    "fmt",
    "leases_for",
    "order",
    "result_of",
    "retention_sweeps",
    "sweeps_resetting",
]

#: The writes with which a holder ends its own lease.
HOLDER_WRITES = (OpName.SET, OpName.RELEASE_LOCK_AS_FAILED, OpName.UPSERT)
#: Final statuses of an item whose work was recorded as done.
DONE = frozenset({"processed", "superseded", "skipped", "expired"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One proven breach: what happened, and the operations/events that show it."""

    message: str
    key: str = ""
    ops: tuple[int, ...] = ()
    events: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class InvariantResult:
    """The verdict on one invariant; ``notes`` explain tolerated cases (e.g. excused effects)."""

    name: str
    description: str
    passed: bool
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Lease:
    """A successful acquisition: the lock the holder may believe it has.

    ``start_lo``/``start_hi`` bound the store instant it was taken at; the
    lock is live up to at least ``start_lo + lock_duration``.  ``end`` is the
    holder's own lock-ending write (ok or info), if any.
    """

    key: str
    token: int | None
    acquire: Op
    start_lo: float
    start_hi: float
    expires_lo: float
    expires_hi: float
    end: Op | None

    @property
    def completed(self) -> bool:
        """The holder definitely recorded the work as done."""
        return (
            self.end is not None
            and self.end.ok
            and (
                self.end.op is OpName.UPSERT
                or (self.end.op is OpName.SET and self.end.status == "processed")
            )
        )

    def ended_before(self, other: Op) -> bool:
        """The holder ended the lease itself (or may have) before ``other`` took effect.

        Compared on the timeline, not the store clock, which may step backwards.
        """
        return self.end is not None and self.end.maybe and self.end.effect_lo <= other.effect_hi


def order(op: Op) -> tuple[float, int]:
    """Completion time, then the store's own order when the recorder knows it.

    Two calls completing at one instant (an upsert invoked earlier, a sweep
    invoked then) are ordered as the store ran them, not as they were invoked.
    """
    done = op.complete if op.complete is not None else math.inf
    return (done, op.index if op.seq is None else op.seq)


def acquired(op: Op) -> bool:
    """An ok try_acquire_lock that returned a token (``None``/``False`` mean "not acquired")."""
    return (
        op.op is OpName.TRY_ACQUIRE_LOCK
        and op.ok
        and isinstance(op.result, int)
        and not isinstance(op.result, bool)
    )


def fmt(value: float) -> str:
    return f"{value:.3f}s"


def leases_for(history: History, key: str) -> list[Lease]:
    """The key's ok acquisitions in timeline order, each with its holder's ending write."""
    duration = history.lock_duration_for(key)
    ops = sorted(history.ops_for(key), key=order)
    leases = []
    for op in ops:
        if not acquired(op):
            continue
        end = next(
            (
                w
                for w in ops
                if w.op in HOLDER_WRITES
                and w.token == op.token
                and w.execution == op.execution
                and w.outcome in (Outcome.OK, Outcome.INFO)
                and order(w) > order(op)
            ),
            None,
        )
        leases.append(
            Lease(
                key=key,
                token=op.token,
                acquire=op,
                start_lo=op.earliest,
                start_hi=op.latest,
                expires_lo=op.earliest + duration,
                expires_hi=op.latest + duration,
                end=end,
            )
        )
    return leases


def sweeps_resetting(history: History, key: str) -> list[Op]:
    return sorted(
        (
            op
            for op in history.sweeps_listing(key)
            if op.op is OpName.RESET_EXPIRED_LOCKS and op.maybe
        ),
        key=order,
    )


def retention_sweeps(history: History) -> list[Op]:
    """Retention sweeps that expired (or may have expired) something; an ok 0 changed nothing."""
    return sorted(
        (
            op
            for op in history.ops
            if op.op is OpName.EXPIRE_PAST_RETENTION and op.maybe and not (op.ok and op.result == 0)
        ),
        key=order,
    )


def result_of(
    name: str, description: str, violations: Iterable[Violation], notes: Iterable[str] = ()
) -> InvariantResult:
    """An :class:`InvariantResult` that passed iff there are no violations."""
    found = tuple(violations)
    return InvariantResult(name, description, not found, found, tuple(notes))
