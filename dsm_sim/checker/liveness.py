"""Liveness of the whole run: every delivered item ends done, or its end is explained.

The safety invariants all pass on a run in which nothing happened: a handler
whose every call raises takes no lock twice and charges nothing twice.  This
invariant is what makes such a verdict fail.  It reads the broker's dead
letters (each with the reason its last delivery failed) and the final record
of every delivered item, and accepts an item that is not done only when the
history shows a fault the scenario injects that accounts for it.

What a scenario allows is written into the history by its recorder
(``meta["dead_letter_reasons"]``, a comma-separated list of exception class
names plus ``Crash`` and ``Rejected``), so the check stays a pure function of
the history.  A history that does not say (a stress run, a hand-built one) is
only checked for having processed something.
"""

from __future__ import annotations

from dsm_sim.checker.leases import DONE, HOLDER_WRITES, InvariantResult, Violation, result_of
from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile
from dsm_sim.history import EventKind, History, Op, OpName, Outcome

__all__ = [
    "CRASH_REASON",
    "REASONS_META",
    "REJECTED_REASON",
    "UNSUPPORTED_REASON",
    "every_delivery_settles",
]

#: Where a recorder lists the dead-letter reasons its scenario allows.
REASONS_META = "dead_letter_reasons"
#: The reason of a delivery whose worker crashed (no exception reached the node).
CRASH_REASON = "Crash"
#: The reason of a delivery the node failed on purpose (a business rejection, not an exception).
REJECTED_REASON = "Rejected"
#: The reason of a delivery that needed an operation the semantics profile's library lacks.
UNSUPPORTED_REASON = "UnsupportedOperationError"

_NAME = "every_delivery_settles"
_DESCRIPTION = (
    "something was processed, and every delivered item ends done or dead-lettered "
    "for a reason the scenario's faults explain"
)


def _completion(op: Op) -> bool:
    return op.ok and (op.op is OpName.UPSERT or (op.op is OpName.SET and op.status in DONE))


def _completed(history: History) -> bool:
    """Whether any work was recorded as done: a final done record or an acknowledged completion."""
    if any(final.status in DONE for final in history.final):
        return True
    return any(_completion(op) for op in history.ops)


def _expected_deliveries(history: History) -> int:
    delivered = sum(1 for ev in history.events if ev.kind is EventKind.DELIVERY)
    declared = history.meta.get("deliveries")
    if isinstance(declared, int) and not isinstance(declared, bool):
        delivered = max(delivered, declared)
    return delivered


def _abandoned(history: History, key: str, allowed: frozenset[str]) -> str:
    """Which injected fault left ``key`` locked by an execution that could not finish, if any.

    A worker that crashed holding the lock, an acquire whose reply was lost
    (the lock landed, the node saw a ``StoreError`` and gave the delivery
    back), or a holder that could not give its lock back leaves a live lock
    that every later delivery skips.
    """
    if CRASH_REASON in allowed:
        crashes = history.events_for(key, EventKind.CRASH)
        if crashes:
            return f"a crashed holder (event #{crashes[-1].index})"
    if "StoreError" in allowed:
        unknown = [
            op.index
            for op in history.ops_for(key)
            if op.op is OpName.TRY_ACQUIRE_LOCK and op.outcome is Outcome.INFO
        ]
        if unknown:
            return f"an acquire whose reply was lost (op #{unknown[-1]})"
        stranded = _stranded_holder(history, key)
        if stranded:
            return stranded
    return ""


def _stranded_holder(history: History, key: str) -> str:
    """A holder that tried to give its lock back, and every attempt met a store error.

    Its release (or completion) did not land, or landed with its reply lost,
    so from the node's side the lock may still be live: the delivery fails
    with ``StoreError`` and the redeliveries find the lock held until it
    expires, exactly as after a lost acquire reply.
    """
    ops = history.ops_for(key)
    granted = [
        op.token
        for op in ops
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.ok and op.token is not None
    ]
    for token in reversed(granted):
        ending = [op for op in ops if op.op in HOLDER_WRITES and op.token == token]
        if ending and all(op.error == "StoreError" or op.outcome is Outcome.INFO for op in ending):
            return (
                f"a holder whose lock-ending writes all met a store error (op #{ending[-1].index})"
            )
    return ""


def every_delivery_settles(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """No vacuous pass: a run with deliveries must complete work, and explain what it did not.

    * deliveries were made but no item was ever recorded done: a violation,
      whatever the other invariants say;
    * a dead letter whose reason the scenario does not inject (a handler that
      raises ``RuntimeError`` on every ``exists``): a violation;
    * a delivered item that ends neither done nor dead-lettered is accepted
      only when an injected fault left it locked by an execution that could
      not finish (a crash, an acquire whose reply was lost, a holder whose
      every release or completion met a store error): the later
      deliveries found the lock live and skipped, and the sweep reset it after
      the last delivery.  Otherwise it is a violation: the item was delivered
      and silently dropped.

    Under a profile whose records vanish (a TTL, a delete on failure), an item
    whose completion was acknowledged counts as done even when its record is
    gone at the end; whether it was lost before its time is ``no_record_lost``'s
    question.
    """
    deliveries = _expected_deliveries(history)
    if deliveries == 0:
        return result_of(_NAME, _DESCRIPTION, (), ("not checked: the history has no deliveries",))
    violations: list[Violation] = []
    notes: list[str] = []
    if not _completed(history):
        violations.append(
            Violation(
                f"{deliveries} deliveries but no item was ever recorded done (no Processed, "
                "Skipped or Superseded record, no acknowledged completion): the run processed "
                "nothing, so its other verdicts are vacuous"
            )
        )
    raw = history.meta.get(REASONS_META)
    if not isinstance(raw, str):
        notes.append("dead letters not judged: the history does not say which reasons it allows")
        return result_of(_NAME, _DESCRIPTION, violations, notes)
    allowed = frozenset(r for r in raw.split(",") if r)
    dead: dict[str, list[int]] = {}
    for ev in history.events:
        if ev.kind is not EventKind.DEAD_LETTER:
            continue
        dead.setdefault(ev.key, []).append(ev.index)
        if ev.detail in allowed:
            continue
        violations.append(
            Violation(
                f"message {ev.execution or '?'}"
                + (f" (key {ev.key})" if ev.key else "")
                + f" was dead-lettered because its last delivery failed with {ev.detail!r}, "
                "which no fault of this scenario injects (allowed: "
                + (", ".join(sorted(allowed)) or "none")
                + ")",
                ev.key,
                (),
                (ev.index,),
            )
        )
    if dead:
        notes.append(f"{sum(len(v) for v in dead.values())} dead letter(s)")
    finals = {final.key: final.status for final in history.final}
    delivered = sorted(
        {ev.key for ev in history.events if ev.kind is EventKind.DELIVERY and ev.key}
    )
    for key in delivered:
        status = finals.get(key, "none")
        if status in DONE or key in dead:
            continue
        if (
            semantics.records_vanish
            and status == "none"
            and any(_completion(op) for op in history.ops_for(key))
        ):
            notes.append(f"key {key}: completed, and its record is gone by the library's design")
            continue
        cause = _abandoned(history, key, allowed)
        if cause:
            notes.append(
                f"key {key}: ends {status}, abandoned to the lock of {cause}; later "
                "deliveries skipped it while that lock was live"
            )
            continue
        violations.append(
            Violation(
                f"key {key}: delivered, but ends {status} without being dead-lettered, and "
                "no crash or lost acquire reply explains it: the item was dropped",
                key,
            )
        )
    return result_of(_NAME, _DESCRIPTION, violations, notes)
