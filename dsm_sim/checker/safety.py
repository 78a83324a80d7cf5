"""Safety invariants about locks and effects: one live lock, fencing, one charge, careful sweeps.

Each check that judges a conformance kit property is named, and reports,
after it (:func:`~dsm_sim.checker.leases.property_result`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dsm_sim.checker.leases import (
    HOLDER_WRITES,
    InvariantResult,
    Lease,
    Violation,
    acquired,
    fmt,
    leases_for,
    order,
    property_result,
    result_of,
    sweeps_resetting,
    ttl_gap,
)
from dsm_sim.checker.orders import Ordering
from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile
from dsm_sim.history import Event, EventKind, History, OpName

__all__ = [
    "at_most_one_live_lock",
    "duplicate_effects",
    "effect_ledger",
    "errors_agree_with_model",
    "no_duplicate_side_effect",
    "stale_write_rejected",
    "sweep_only_expired",
]

# --- one live lock ---------------------------------------------------------------------------


def at_most_one_live_lock(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """At most one live lock per key: no acquisition while another lease is surely live.

    Whether a lease is still live is decided by ``semantics``' lock rule.
    """
    violations = []
    timeline = Ordering.of(history)
    for key in history.item_keys():
        leases = leases_for(history, key, semantics)
        sweeps = sweeps_resetting(history, key)
        seen: dict[int | None, Lease] = {}
        for lease in leases:
            earlier = seen.get(lease.token)
            if earlier is not None:
                violations.append(
                    Violation(
                        f"key {key}: fencing token {lease.token} was handed out twice "
                        f"(ops #{earlier.acquire.index} and #{lease.acquire.index})",
                        key,
                        (earlier.acquire.index, lease.acquire.index),
                    )
                )
            seen[lease.token] = lease
        for i, later in enumerate(leases):
            for held in leases[:i]:
                if later.start_hi > held.expires_lo:
                    continue  # the earlier lease may have expired
                if held.ended_before(later.acquire):
                    continue
                if any(timeline.between(held.acquire, s, later.acquire) for s in sweeps):
                    continue  # a sweep ended it; sweep_only_expired judges that
                violations.append(
                    Violation(
                        f"key {key}: two live locks -- token {later.token} acquired by "
                        f"{later.acquire.process} (op #{later.acquire.index}) at store "
                        f"{fmt(later.start_hi)} while token {held.token} of "
                        f"{held.acquire.process} (op #{held.acquire.index}) was live until at "
                        f"least {fmt(held.expires_lo)}",
                        key,
                        (held.acquire.index, later.acquire.index),
                    )
                )
    return property_result("at_most_one_live_lock", violations)


# --- fencing ---------------------------------------------------------------------------------


def stale_write_rejected(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """A write under token t must be refused once another token was acquired or t was swept.

    On a wall-clock history the takeover or sweep must provably fall between
    the write's own acquisition and the write: a call that overlaps either
    may have landed outside that span.  A stale write is a hazard under any
    semantics, so ``semantics`` changes nothing here.
    """
    violations = []
    notes = []
    before = Ordering.of(history).before
    for key in history.item_keys():
        ops = sorted(history.ops_for(key), key=order)
        acquires = [op for op in ops if acquired(op)]
        sweeps = sweeps_resetting(history, key)
        for write in ops:
            if write.op not in HOLDER_WRITES or write.token is None:
                continue
            own = [a for a in acquires if a.token == write.token and before(a, write)]
            if not own:
                continue
            start = own[-1]
            usurper = next(
                (
                    a
                    for a in acquires
                    if a.token != write.token and before(start, a) and before(a, write)
                ),
                None,
            )
            sweep = next((s for s in sweeps if before(start, s) and before(s, write)), None)
            if usurper is None and sweep is None:
                continue
            culprit = usurper if usurper is not None else sweep
            assert culprit is not None
            why = (
                f"token {culprit.token} was acquired by {culprit.process} (op #{culprit.index})"
                if culprit is usurper
                else f"the lock was swept (op #{culprit.index})"
            )
            if write.ok:
                violations.append(
                    Violation(
                        f"key {key}: stale write accepted -- {write.op.value} by "
                        f"{write.process} under token {write.token} (op #{write.index}) "
                        f"succeeded after {why}",
                        key,
                        (own[-1].index, culprit.index, write.index),
                    )
                )
            elif write.error == "StaleLockError":
                notes.append(
                    f"key {key}: fencing rejected {write.op.value} op #{write.index} of "
                    f"{write.process} under token {write.token} after {why}"
                )
    return property_result("stale_write_rejected", violations, notes)


# --- side effects ----------------------------------------------------------------------------


def no_duplicate_side_effect(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """At most one side effect per key, unless an earlier lease provably ended first.

    A second effect is excused when the earlier effect's lease expired (or its
    holder released it) before the later token was acquired and the earlier
    holder never recorded the work as done; the note says which lease and how
    its stale write fared.
    """
    violations = []
    notes = []
    ledger = effect_ledger(history)
    for (key, _node), effects in sorted(ledger.items()):
        if len(effects) <= 1:
            continue
        leases = {lease.token: lease for lease in leases_for(history, key, semantics)}
        by_token: dict[int | None, list[int]] = {}
        for ev in effects:
            by_token.setdefault(ev.token, []).append(ev.index)
        for token, indices in sorted(by_token.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if token is None:
                violations.append(
                    Violation(
                        f"key {key}: side effect without a fencing token (no lock held)",
                        key,
                        events=tuple(indices),
                    )
                )
            elif len(indices) > 1:
                violations.append(
                    Violation(
                        f"key {key}: {len(indices)} side effects under the same token {token}",
                        key,
                        events=tuple(indices),
                    )
                )
        tokens = sorted(t for t in by_token if t is not None)
        for earlier_t, later_t in itertools.pairwise(tokens):
            earlier, later = leases.get(earlier_t), leases.get(later_t)
            events = (by_token[earlier_t][0], by_token[later_t][0])
            if earlier is None or later is None:
                violations.append(
                    Violation(
                        f"key {key}: duplicate side effect under tokens {earlier_t} and "
                        f"{later_t}, and the history has no acquisition for one of them",
                        key,
                        events=events,
                    )
                )
                continue
            reason = _lease_end_reason(history, earlier, later)
            window = _window_closed(history, earlier, later, semantics)
            if window is not None:
                notes.append(
                    f"key {key}: effect repeated after the idempotency window closed -- "
                    f"lease {earlier_t} completed, {window}; token {later_t} acquired by "
                    f"{later.acquire.process} (op #{later.acquire.index})"
                )
                continue
            if reason is None or earlier.completed:
                violations.append(
                    Violation(
                        f"key {key}: duplicate side effect -- under token {earlier_t} "
                        f"({earlier.acquire.process}) and token {later_t} "
                        f"({later.acquire.process}), but token {later_t} was acquired "
                        f"(op #{later.acquire.index}) while lease {earlier_t} was live or "
                        "already completed",
                        key,
                        (earlier.acquire.index, later.acquire.index),
                        events,
                    )
                )
                continue
            notes.append(
                f"key {key}: duplicate side effect excused -- lease {earlier_t} of "
                f"{earlier.acquire.process} {reason}; token {later_t} acquired by "
                f"{later.acquire.process} (op #{later.acquire.index}); "
                f"{_stale_fate(history, earlier)}"
            )
    return result_of(
        "no_duplicate_side_effect",
        "one side effect per key unless a lease was violated (then fencing shows it)",
        violations,
        notes,
    )


def _lease_end_reason(history: History, earlier: Lease, later: Lease) -> str | None:
    if later.start_lo > earlier.expires_hi:
        return f"expired (locked until about {fmt(earlier.expires_hi)}, store clock)"
    if earlier.ended_before(later.acquire) and not _released_after_effect(earlier):
        assert earlier.end is not None
        return (
            f"was given up by its holder ({earlier.end.op.value} op #{earlier.end.index}, "
            f"{earlier.end.outcome.value if earlier.end.outcome else 'pending'})"
        )
    if later.start_lo > earlier.expires_lo:
        return f"may have expired (locked until {fmt(earlier.expires_lo)} at the earliest)"
    timeline = Ordering.of(history)
    sweep = next(
        (
            s
            for s in sweeps_resetting(history, earlier.key)
            if timeline.between(earlier.acquire, s, later.acquire)
        ),
        None,
    )
    if sweep is not None:
        # Whether that sweep was entitled to is sweep_only_expired's question.
        return f"was reset by the sweep (op #{sweep.index})"
    return None


def effect_ledger(history: History) -> dict[tuple[str, str], list[Event]]:
    """The business oracle: every side effect, by (item key, node)."""
    ledger: dict[tuple[str, str], list[Event]] = {}
    for ev in history.events:
        if ev.kind is EventKind.SIDE_EFFECT and ev.key:
            ledger.setdefault((ev.key, ev.node), []).append(ev)
    return ledger


def duplicate_effects(history: History) -> int:
    """Effects beyond the first per (item key, node), excused or not."""
    return sum(len(effects) - 1 for effects in effect_ledger(history).values())


def _window_closed(
    history: History, earlier: Lease, later: Lease, semantics: SemanticsProfile = DSM
) -> str | None:
    """A retention sweep expired the key after ``earlier`` ended and before ``later`` began.

    An Expired item is no longer done: processing it again is what retention
    means.  Under a profile whose retention is a TTL, the record vanishing
    at the end of it closes the window the same way.
    """
    end = earlier.end
    if end is None or not end.maybe:
        return None
    if ttl_gap(history, earlier.key, end, later.acquire.earliest, semantics):
        return "its record's TTL ran out (the library drops it at the end of retention)"
    timeline = Ordering.of(history)
    sweep = next(
        (
            s
            for s in history.ops
            if s.op is OpName.EXPIRE_PAST_RETENTION
            and s.maybe
            and earlier.key in s.keys
            and timeline.between(end, s, later.acquire)
        ),
        None,
    )
    return None if sweep is None else f"the retention sweep expired it (op #{sweep.index})"


def _released_after_effect(lease: Lease) -> bool:
    """A lease whose holder released it as Failed after its side effect happened.

    That hands a completed effect to the next delivery: the second effect is
    the node giving up work it had done, not a lease the store ended, so it is
    not excused.
    """
    return lease.end is not None and lease.end.op is OpName.RELEASE_LOCK_AS_FAILED


def _stale_fate(history: History, lease: Lease) -> str:
    writes = [
        op
        for op in history.ops_for(lease.key)
        if op.op in HOLDER_WRITES
        and op.token == lease.token
        and op.execution == lease.acquire.execution
    ]
    rejected = [op for op in writes if op.error == "StaleLockError"]
    if rejected:
        return f"fencing rejected the stale {rejected[0].op.value} (op #{rejected[0].index})"
    crashes = [
        ev
        for ev in history.events
        if ev.kind is EventKind.CRASH and ev.execution == lease.acquire.execution
    ]
    if crashes:
        return f"its holder crashed (event #{crashes[0].index}) before writing"
    if writes:
        return f"its holder's last write was op #{writes[-1].index} ({writes[-1].outcome})"
    return "its holder never wrote"


# --- sweeps ----------------------------------------------------------------------------------


def sweep_only_expired(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """The sweep resets only expired locks: never a lease that is still live."""
    violations = []
    timeline = Ordering.of(history)
    for key in history.item_keys():
        leases = leases_for(history, key, semantics)
        for sweep in sweeps_resetting(history, key):
            before = [lease for lease in leases if timeline.before(lease.acquire, sweep)]
            if not before:
                continue
            held = before[-1]
            if sweep.latest <= held.expires_lo and not held.ended_before(sweep):
                violations.append(
                    Violation(
                        f"key {key}: sweep op #{sweep.index} reset the lock of token "
                        f"{held.token} ({held.acquire.process}) at store "
                        f"{fmt(sweep.latest)}, while it was live until at least "
                        f"{fmt(held.expires_lo)}",
                        key,
                        (held.acquire.index, sweep.index),
                    )
                )
    return property_result("sweep_only_expired", violations)


def errors_agree_with_model(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """A holder is never fenced off (StaleLockError) while its lease lives and nobody took it.

    The spec accepts that write, so refusing it is an error the spec does not
    name: the lock was reset or lost while live.  This is the part of the
    kit's property a history shows without reading records; the model judge
    (:mod:`dsm_sim.checker.model_judge`) judges every other refusal.
    """
    violations = []
    timeline = Ordering.of(history)
    for key in history.item_keys():
        leases = leases_for(history, key, semantics)
        for lease in leases:
            violations.extend(_fenced_while_live(history, lease, leases, timeline))
    return property_result("errors_agree_with_model", violations)


def _fenced_while_live(
    history: History, lease: Lease, leases: Sequence[Lease], timeline: Ordering
) -> list[Violation]:
    ops = sorted(history.ops_for(lease.key), key=order)
    mine = [
        op
        for op in ops
        if op.op in HOLDER_WRITES
        and op.token == lease.token
        and op.execution == lease.acquire.execution
        and order(op) > order(lease.acquire)
    ]
    for i, write in enumerate(mine):
        if write.error != "StaleLockError" or write.latest > lease.expires_lo:
            continue
        if any(prev.maybe for prev in mine[:i]):
            continue  # its own earlier write may have ended the lease
        if any(timeline.between(lease.acquire, o.acquire, write) for o in leases):
            continue  # taken over; at_most_one_live_lock judges that
        if any(
            timeline.between(lease.acquire, sweep, write)
            for sweep in sweeps_resetting(history, lease.key)
        ):
            continue  # a recorded sweep reset it; the check above judged that sweep
        return [
            Violation(
                f"key {lease.key}: {write.process}'s {write.op.value} under token {lease.token} "
                f"(op #{write.index}) was fenced off at store {fmt(write.latest)} although its "
                f"lease was live until at least {fmt(lease.expires_lo)} and nobody took it over: "
                "the lock was reset or lost while live",
                lease.key,
                (lease.acquire.index, write.index),
            )
        ]
    return []
