"""Superseded rows are kept as history, and the retention sweep expires them when due.

No ``get`` reads a superseded row, so the call-by-call judge never sees one.
The history does: an upsert read around that found the item ``Processed``
and left a new ``Processed`` record (another ``created_at``) superseded the
record it found, which keeps its ``retain_until`` (docs/semantics.md,
"upsert" and "Retention sweep").  Replaying the upserts in store order gives
every superseded row and the instant it falls due; the retention sweep
answers how many records it expired, and the recorder knows which current
records those were, so the rest of its count is the superseded rows it
expired.  A count short of the rows due is history kept past its
retention (a sweep that pages through long histories and never turns the
page); a count past them is rows expired early or never written.

Judged only where it can be exact: a simulated history (store order, reads
around every call), under a profile that keeps history and sweeps retention
as the spec does.  An upsert that landed unseen a lost reply whose landing no read
shows, or a sweep that failed makes the ledger uncertain, and judging stops there, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsm_sim.checker.leases import InvariantResult, Violation, fmt, property_result
from dsm_sim.checker.orders import is_wall_clock
from dsm_sim.conformance.judge.semantics import DSM, Retention, SemanticsProfile
from dsm_sim.history import History, Op, OpName, Outcome
from dsm_sim.micros import Micros

__all__ = ["PROPERTY", "SupersededRow", "superseded_ledger", "superseded_rows_expire"]

PROPERTY = "retention_sweep_agrees_with_model"


@dataclass(frozen=True, slots=True)
class SupersededRow:
    """A record an upsert superseded: its key, the upsert that did, and when it falls due."""

    key: str
    upsert: int
    retain_until: Micros


@dataclass(frozen=True, slots=True)
class SweptRows:
    """What one retention sweep did to the superseded rows: those due, and those it claimed.

    Instants are exact (microseconds), so a row is due or not: at its
    ``retain_until`` itself it is kept, a microsecond later it is due.
    """

    sweep: Op
    due: tuple[SupersededRow, ...]
    claimed: int


class _Unknown(Exception):
    """An upsert whose effect on the history the reads around it cannot tell."""


def _supersedes(op: Op) -> SupersededRow | None:
    """The row ``op`` superseded, if it did; raises :class:`_Unknown` when no one can tell.

    An upsert without a token that found the item ``Processed`` and
    succeeded superseded it (with a token it is the holder's own completion,
    or a retry of one).  One whose reply was lost landed if the record
    changed; two upserts of the same data at the same instant leave no trace
    of the second, so that one is unknown.
    """
    before, after = op.before, op.after
    if op.op is not OpName.UPSERT or op.token is not None or op.outcome is Outcome.FAIL:
        return None
    if not op.probed:
        if op.ok:
            raise _Unknown(f"upsert op #{op.index} landed unseen")
        return None  # refused before it reached the store
    if before is None or before.status != "processed":
        return None
    if not op.ok and (after is None or after == before):
        raise _Unknown(f"whether upsert op #{op.index} (outcome unknown) landed")
    if before.retain_until is None:
        return None  # kept forever: never due
    return SupersededRow(op.key, op.index, before.retain_until)


def superseded_ledger(history: History) -> tuple[list[SweptRows], str | None]:
    """Every retention sweep with the superseded rows due at it; and why judging stopped, if it did."""
    rows: list[SupersededRow] = []
    swept: list[SweptRows] = []
    for op in sorted(history.ops, key=lambda o: (o.seq is None, o.seq or 0, o.index)):
        if op.op is OpName.UPSERT:
            try:
                row = _supersedes(op)
            except _Unknown as exc:
                return swept, f"{exc}: the history past it is unknown"
            if row is not None:
                rows.append(row)
            continue
        if op.op is not OpName.EXPIRE_PAST_RETENTION or op.store_time is None:
            continue
        result = op.result
        if not op.ok or not isinstance(result, int) or isinstance(result, bool) or result < 0:
            return swept, f"the retention sweep op #{op.index} did not answer a count"
        at = op.store_time
        due = tuple(r for r in rows if r.retain_until < at)
        claimed = result - len(op.keys)
        swept.append(SweptRows(op, due, claimed))
        gone = {id(r) for r in due}
        rows = [r for r in rows if id(r) not in gone]
    return swept, None


def superseded_rows_expire(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """Each retention sweep expires exactly the superseded rows past their ``retain_until``."""
    if is_wall_clock(history) or not semantics.strict or semantics.retention is not Retention.SWEEP:
        return property_result(PROPERTY, ())
    swept, stopped = superseded_ledger(history)
    violations = []
    for s in swept:
        op, due = s.sweep, len(s.due)
        at = fmt(op.store_time or 0)
        # A count below the current records the sweep expired claims no superseded row;
        # the shortfall itself is retention_sweep_agrees_with_model's to report.
        if max(s.claimed, 0) < due:
            kept = [r for r in s.due][: due - max(s.claimed, 0)]
            keys = sorted({r.key for r in kept})
            violations.append(
                Violation(
                    f"the retention sweep op #{op.index} at store {at} answered {op.result} "
                    f"with {len(op.keys)} current record(s) among them, but {due} superseded "
                    f"row(s) were past their retain_until (keys: {', '.join(keys[:3])}"
                    f"{', ...' if len(keys) > 3 else ''}; superseded by upsert op(s) "
                    f"#{', #'.join(str(r.upsert) for r in kept[:3])}): history kept past its "
                    "retention",
                    key=keys[0],
                    ops=(op.index, *(r.upsert for r in kept[:3])),
                )
            )
        elif s.claimed > due:
            violations.append(
                Violation(
                    f"the retention sweep op #{op.index} at store {at} answered {op.result}: "
                    f"{len(op.keys)} current record(s) and {s.claimed} more, but only "
                    f"{due} superseded row(s) were due",
                    ops=(op.index,),
                )
            )
    notes = [f"superseded rows judged up to where {stopped}"] if stopped else []
    return property_result(PROPERTY, violations, notes)
