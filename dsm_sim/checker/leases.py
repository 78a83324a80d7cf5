"""The checker's vocabulary: verdicts, violations, and the leases a history implies.

A lease is a successful acquisition seen from the history: when it started
(on the store clock), when it surely or possibly expired, and how its holder
ended it.  Every invariant reasons about leases, so they are derived once,
here, with the same conservative reading of uncertain operations.

Where a lock ends and when a record may vanish are the semantics profile's
(:mod:`dsm_sim.conformance.judge.semantics`): the spec's lock is live up to and
including ``locked_until``; a library may end it at that instant, at a
coarser resolution, and drop records by a TTL.  :func:`lock_end` and
:func:`vanish_from` turn those rules into store-clock instants (microseconds).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

from dsm_sim.conformance.judge.semantics import DSM, Retention, SemanticsProfile, truncate
from dsm_sim.conformance.properties import get_property
from dsm_sim.history import History, Op, OpName, Outcome
from dsm_sim.micros import MICROSECOND, Micros, micros_in, micros_of, micros_since

__all__ = [
    "DONE",
    "HOLDER_WRITES",
    "InvariantResult",
    "Lease",
    "Violation",
    "acquired",
    "fmt",
    "leases_for",
    "lock_end",
    "one_per_property",
    "order",
    "property_result",
    "result_of",
    "retention_sweeps",
    "sweeps_resetting",
    "ttl_gap",
    "vanish_from",
    "waived_result",
    "wrote",
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
    """The verdict on one invariant; ``notes`` explain tolerated cases (e.g. excused effects).

    ``waived`` is the reason a semantics profile gives for not judging the
    invariant at all: such a result is neither a failure nor a pass
    (``passed`` is True only so that it never fails a run; :attr:`verdict`
    says ``waived``).
    """

    name: str
    description: str
    passed: bool
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()
    waived: str | None = None

    @property
    def verdict(self) -> str:
        """``passed``, ``failed`` or ``waived``."""
        if self.waived is not None:
            return "waived"
        return "passed" if self.passed else "failed"


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
    """An instant of the history (microseconds) as a message writes it: seconds, to the ms."""
    return f"{value / 1_000_000:.3f}s"


def _shifted(history: History, micros: Micros, resolution: dt.timedelta) -> Micros:
    """``micros`` (since the history's epoch) cut down to ``resolution`` since the Unix epoch."""
    shifted = micros_since(truncate(history.instant(micros), resolution), history.epoch)
    assert shifted is not None
    return shifted


def lock_end(
    history: History, start: float, duration: float, semantics: SemanticsProfile = DSM
) -> float:
    """The last store instant at which a lock taken at ``start`` is still live.

    The spec's lock is live at ``locked_until`` itself, so that instant is the
    answer.  A profile that stores the lock's end at a coarser resolution
    ends it at that resolution's step, and one whose lock has ended at
    ``locked_until`` ends it a microsecond (the history's resolution) before.
    """
    if semantics.strict:
        return start + micros_of(duration)
    resolution = semantics.lock_resolution
    end = _shifted(history, int(start) + micros_of(duration), resolution)
    if semantics.lock_live_at_expiry:
        end += micros_in(max(resolution, MICROSECOND))
    return end - 1


def vanish_from(
    history: History,
    key: str,
    written: Micros,
    semantics: SemanticsProfile = DSM,
    write: Op | None = None,
) -> float:
    """The first store instant at which a record written at ``written`` may be gone by a TTL.

    ``inf`` unless the profile's retention is a TTL and the key's node keeps
    records for a finite time; the retention is taken in the profile's unit.
    ``write``: the call that wrote it, whose own options (a redeployed node)
    give the retention; else the key's.
    """
    info = history.keys.get(key)
    if semantics.retention is not Retention.TTL or info is None:
        return math.inf
    kept = info.retention if write is None else history.retention_of(write)
    if kept is None:
        return math.inf
    retention = dt.timedelta(microseconds=micros_of(kept))
    unit = semantics.retention_unit
    if unit > MICROSECOND:
        retention -= retention % unit
    resolution = max(semantics.retention_resolution, MICROSECOND)
    end = _shifted(history, int(written) + micros_in(retention), resolution)
    return end + micros_in(resolution)


def wrote(op: Op) -> bool:
    """``op`` surely wrote its key's record (and so restarted the record's retention)."""
    return op.ok and op.op.is_write and (op.op is not OpName.TRY_ACQUIRE_LOCK or acquired(op))


def ttl_gap(
    history: History, key: str, since: Op, until: float, semantics: SemanticsProfile = DSM
) -> bool:
    """A TTL may have dropped the key's record between ``since`` and store instant ``until``.

    Every write restarts the record's retention, so the record may have
    vanished only in a gap between two writes (or after the last one) at least
    as long as its retention.  Never under a profile without a TTL.
    """
    if semantics.retention is not Retention.TTL:
        return False
    writes = [
        w
        for w in history.ops_for(key)
        if wrote(w) and order(w) >= order(since) and w.latest <= until
    ]
    writes.sort(key=order)
    ends = [w.latest for w in writes[1:]] + [until]
    return bool(writes) and any(
        end >= vanish_from(history, key, w.earliest, semantics, w)
        for w, end in zip(writes, ends, strict=False)
    )


def leases_for(history: History, key: str, semantics: SemanticsProfile = DSM) -> list[Lease]:
    """The key's ok acquisitions in timeline order, each with its holder's ending write.

    A lease's expiry is the last instant its lock is live under ``semantics``.
    Four checks ask for a key's leases; they are worked out once per history,
    key and profile (the profile kept with them, so its id stays its own).
    """
    memo = history.derived()
    known = memo.get((leases_for, key, id(semantics)))
    if known is not None and known[0] is semantics:
        return list(known[1])
    leases = _leases(history, key, semantics)
    memo[(leases_for, key, id(semantics))] = (semantics, tuple(leases))
    return leases


def _leases(history: History, key: str, semantics: SemanticsProfile) -> list[Lease]:
    ops = sorted(history.ops_for(key), key=order)
    # The writes that can end a lease, in the same order, each with its order (once).
    ends = [
        (w, order(w))
        for w in ops
        if w.op in HOLDER_WRITES and w.outcome in (Outcome.OK, Outcome.INFO)
    ]
    leases = []
    for op in ops:
        if not acquired(op):
            continue
        taken = order(op)
        end = next(
            (
                w
                for w, at in ends
                if w.token == op.token and w.execution == op.execution and at > taken
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
                expires_lo=lock_end(history, op.earliest, history.lock_duration_of(op), semantics),
                expires_hi=lock_end(history, op.latest, history.lock_duration_of(op), semantics),
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


def property_result(
    name: str, violations: Iterable[Violation], notes: Iterable[str] = ()
) -> InvariantResult:
    """A result under a conformance kit property, described in the kit's own words.

    Where the checker judges what the kit judges, it reports under the kit's
    name, so a report has one name, and one meaning, per property.
    """
    return result_of(name, get_property(name).summary, violations, notes)


def one_per_property(results: Iterable[InvariantResult]) -> list[InvariantResult]:
    """One result per name, in the order names first appear: two judges of one property
    (a history check and the call-by-call model judge) make one verdict, failed if
    either found a violation, with both judges' violations and notes."""
    merged: dict[str, InvariantResult] = {}
    for result in results:
        seen = merged.get(result.name)
        if seen is None:
            merged[result.name] = result
            continue
        merged[result.name] = InvariantResult(
            seen.name,
            seen.description,
            seen.passed and result.passed,
            seen.violations + result.violations,
            seen.notes + result.notes,
        )
    return list(merged.values())


def waived_result(result: InvariantResult, reason: str) -> InvariantResult:
    """``result`` set aside: the semantics profile declares the invariant does not apply."""
    found = len(result.violations)
    notes = (f"{found} finding(s) set aside: by design, {reason}",) if found else ()
    return InvariantResult(result.name, result.description, True, (), notes, reason)
