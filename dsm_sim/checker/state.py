"""Invariants about record states: allowed transitions, truthful reads, liveness, nothing lost.

Each replays a key's definite writes in timeline order and compares what the
store said or ended with against the status those writes imply.

Under a semantics profile (:mod:`dsm_sim.conformance.judge.semantics`) the replay
follows the library's rules: a lock ends by the profile's boundary and
resolution, a holder's failure may delete the record, a record may vanish
once its TTL has run out (the status is then unknown until the next write,
as after an ``info`` write), and without a lock sweep an expired lock simply
stays until the next acquisition takes it over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dsm_sim.checker.leases import (
    DONE,
    InvariantResult,
    Violation,
    acquired,
    fmt,
    lock_end,
    order,
    property_result,
    result_of,
    retention_sweeps,
    sweeps_resetting,
    ttl_gap,
    vanish_from,
    wrote,
)
from dsm_sim.checker.orders import Ordering, Search, is_wall_clock, settle
from dsm_sim.conformance.judge.semantics import DSM, Failure, SemanticsProfile
from dsm_sim.history import History, Op, OpName, Outcome
from dsm_sim.micros import micros_of
from reference_engine.status import COMPLETED, IdempotencyStatus, is_allowed

__all__ = [
    "allowed_transitions_only",
    "exists_agrees_with_model",
    "no_record_lost",
    "terminal_within_deadline",
]

S = IdempotencyStatus


@dataclass(frozen=True, slots=True)
class _Rules:
    """A key's lock and retention rules under a semantics profile, on the store clock (µs)."""

    history: History
    key: str
    semantics: SemanticsProfile = DSM

    @property
    def deletes(self) -> bool:
        return self.semantics.failure is Failure.DELETE

    def lock_end(self, start: float, acquire: Op) -> float:
        """The last instant a lock ``acquire`` took at ``start`` is live (with its own options)."""
        return lock_end(self.history, start, self.history.lock_duration_of(acquire), self.semantics)

    def vanish(self, op: Op) -> float:
        """From when the record ``op`` wrote may be gone by a TTL (``inf``: never)."""
        return vanish_from(self.history, self.key, op.earliest, self.semantics, op)

    def written(self, op: Op) -> bool:
        """``op`` surely wrote the record (and so restarted its retention)."""
        return wrote(op)

    def failure(self, op: Op) -> bool:
        """``op`` is a holder's failure, which the profile may turn into a delete."""
        return op.token is not None and (
            op.op is OpName.RELEASE_LOCK_AS_FAILED
            or (op.op is OpName.SET and op.status == S.FAILED.value)
        )


# --- transitions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Replayed:
    """Where a transition replay stands: ``current`` None means unknown (after an ``info``).

    ``last`` only names the write a message blames, so it is left out of
    equality: two orders that reach the same status are the same state.
    """

    current: S | None = S.NONE
    lock_until: float = -math.inf
    last: int = field(default=-1, compare=False)
    #: From when a TTL may have dropped the record (``inf``: never).
    vanish: float = math.inf


def allowed_transitions_only(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """Replay each key's definite writes and check every step against the transition table.

    After an ``info`` write the status is unknown until the next ``ok`` one.
    On a wall-clock history a key fails only if no order of its overlapping
    writes replays cleanly (see :mod:`dsm_sim.checker.orders`).  Under a
    profile whose failure deletes, a holder's failure is judged as the move
    to Failed and leaves no record; a record whose TTL may have run out
    leaves the status unknown.
    """
    violations: list[Violation] = []
    notes: list[str] = []
    wall = is_wall_clock(history)
    for key in history.item_keys():
        steps = [
            op
            for op in history.ops_for(key)
            if op.op.is_write
            and op.maybe
            and (op.op is not OpName.TRY_ACQUIRE_LOCK or not op.ok or acquired(op))
        ]
        steps += sweeps_resetting(history, key)
        steps += [
            op
            for op in history.sweeps_listing(key)
            if op.op is OpName.EXPIRE_PAST_RETENTION and op.maybe
        ]
        step = _transition_step(_Rules(history, key, semantics))
        found = []
        state = _Replayed()
        for op in sorted(steps, key=order):
            state, violation = step(state, op)
            if violation is not None:
                found.append(violation)
        if not wall:
            violations.extend(found)
            continue
        kept, said = settle(key, found, Search(steps, _Replayed(), step))
        violations.extend(kept)
        notes.extend(said)
    return property_result("allowed_transitions_only", violations, notes)


def _transition_step(
    rules: _Rules,
) -> Callable[[_Replayed, Op], tuple[_Replayed, Violation | None]]:
    key = rules.key

    def step(state: _Replayed, op: Op) -> tuple[_Replayed, Violation | None]:
        if op.outcome is Outcome.INFO:
            return replace(state, current=None), None
        if state.vanish < math.inf and op.latest >= state.vanish:
            state = replace(state, current=None, vanish=math.inf)  # its TTL may have run out
        raw = state.current
        lock_until = state.lock_until
        effective = S.FAILED if raw is S.PROCESSING and op.earliest > lock_until else raw
        source = raw if op.token is not None else effective
        target: S
        if op.op is OpName.RESET_EXPIRED_LOCKS:
            target = S.FAILED
            source = raw
        elif op.op is OpName.EXPIRE_PAST_RETENTION:
            target = S.EXPIRED
            source = raw
        elif op.op is OpName.TRY_ACQUIRE_LOCK:
            target = S.PROCESSING
            source = effective
            lock_until = rules.lock_end(op.latest, op)
        elif op.op is OpName.RELEASE_LOCK_AS_FAILED:
            target = S.FAILED
        elif op.op is OpName.UPSERT:
            target = S.PROCESSED
            if source is S.PROCESSED or (
                source in (S.NONE, S.FAILED, S.EXPIRED) and op.token is None
            ):
                # Supersede, or acquire-and-complete in one step.
                return replace(state, current=S.PROCESSED), None
        else:
            target = _status(op.status)
        live_takeover = op.op is OpName.TRY_ACQUIRE_LOCK and source is S.PROCESSING
        violation = None
        if op.op is OpName.RESET_EXPIRED_LOCKS and source not in (None, S.PROCESSING):
            assert source is not None
            violation = Violation(
                f"key {key}: sweep op #{op.index} found the record Processing, but the "
                f"last acknowledged write (op #{state.last}) had left it {source.label}: that "
                "write did not do what it acknowledged",
                key,
                (state.last, op.index),
            )
        elif source is not None and not live_takeover and not is_allowed(source, target):
            violation = Violation(
                f"key {key}: {op.op.value} by {op.process} (op #{op.index}, token "
                f"{op.token}) moved the record {source.label} -> {target.label}, "
                "which the transition table forbids",
                key,
                (op.index,),
            )
        vanish = rules.vanish(op) if rules.written(op) else state.vanish
        if rules.deletes and rules.failure(op):
            target = S.NONE  # the library's failure deletes the record
        return _Replayed(target, lock_until, op.index, vanish), violation

    return step


def _status(name: str | None) -> S:
    try:
        return S(name or "none")
    except ValueError:
        return S.NONE


# --- reads ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Seen:
    """The status reads should see; ``lock_lo``/``lock_hi`` bound a Processing lock's expiry."""

    current: S | None = S.NONE
    lock_lo: float = -math.inf
    lock_hi: float = -math.inf
    #: From when a TTL may have dropped the record (``inf``: never).
    vanish: float = math.inf


def exists_agrees_with_model(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """``exists`` answers True exactly when the key's last definite status is Processed/Skipped.

    The status is replayed from the key's definite writes (an expired, unswept
    lock counts as Failed); a read is skipped while the status is unknown
    (after an ``info`` write or a retention sweep) or when a write may have
    landed at the same time.  On a wall-clock history a read is also skipped
    when a sweep may have, and a key fails only if no order of its
    overlapping writes explains every read.  Under a profile, a lock ends by
    its rule, and a read after the record's TTL may have run out is skipped.
    """
    violations: list[Violation] = []
    notes: list[str] = []
    retention = retention_sweeps(history)
    wall = is_wall_clock(history)
    for key in history.item_keys():
        rules = _Rules(history, key, semantics)
        own = history.ops_for(key)
        writes = [op for op in own if op.op.is_write and op.maybe]
        steps = sorted(own + sweeps_resetting(history, key) + retention, key=order)
        found = []
        state = _Seen()
        for op in steps:
            if op.op is OpName.EXISTS:
                if _judgeable(op, writes):
                    violation = _read_violation(key, op, state)
                    if violation is not None:
                        found.append(violation)
                continue
            state = _seen_after(state, op, rules)
        if not wall or not found:
            violations.extend(found)
            continue
        changes = [op for op in steps if op.op is not OpName.EXISTS and _changes(op)]
        reads = [
            op
            for op in steps
            if op.op is OpName.EXISTS
            and _judgeable(op, writes)
            and not any(_overlap(op, w) for w in changes)
        ]
        search = Search(changes, _Seen(), _seen_step(rules), reads, _read_check(key))
        kept, said = settle(key, found, search)
        violations.extend(kept)
        notes.extend(said)
    return property_result("exists_agrees_with_model", violations, notes)


def _overlap(a: Op, b: Op) -> bool:
    return a.effect_lo <= b.effect_hi and b.effect_lo <= a.effect_hi


def _judgeable(read: Op, writes: list[Op]) -> bool:
    """An ok boolean answer that no write of the key may have landed during."""
    return read.ok and isinstance(read.result, bool) and not any(_overlap(w, read) for w in writes)


def _read_violation(key: str, op: Op, state: _Seen) -> Violation | None:
    current = state.current
    if current is None or (state.vanish < math.inf and op.latest >= state.vanish):
        return None
    status = current
    if current is S.PROCESSING:
        if op.earliest > state.lock_hi:
            status = S.FAILED
        elif op.latest > state.lock_lo:
            return None  # the lock may or may not have expired at this read
    expected = status in COMPLETED
    if op.result is expected:
        return None
    return Violation(
        f"key {key}: exists returned {op.result} to {op.process} "
        f"(op #{op.index}) while the record was {status.label}; "
        f"expected {expected}",
        key,
        (op.index,),
    )


def _seen_step(rules: _Rules) -> Callable[[_Seen, Op], tuple[_Seen, None]]:
    def step(state: _Seen, op: Op) -> tuple[_Seen, None]:
        return _seen_after(state, op, rules), None

    return step


def _read_check(key: str) -> Callable[[_Seen, Op], bool]:
    def check(state: _Seen, read: Op) -> bool:
        return _read_violation(key, read, state) is None

    return check


def _changes(op: Op) -> bool:
    """Whether replaying ``op`` can change what reads should see."""
    if op.op is OpName.EXPIRE_PAST_RETENTION or op.outcome is Outcome.INFO:
        return op.op.is_write or op.op.is_sweep
    if not op.ok or not (op.op.is_write or op.op is OpName.RESET_EXPIRED_LOCKS):
        return False
    return op.op is not OpName.TRY_ACQUIRE_LOCK or acquired(op)


def _seen_after(state: _Seen, op: Op, rules: _Rules) -> _Seen:
    if not _changes(op):
        return state
    if op.op is OpName.EXPIRE_PAST_RETENTION or op.outcome is Outcome.INFO:
        return _Seen(None, state.lock_lo, state.lock_hi)
    # Built directly rather than by dataclasses.replace: this runs once per write of
    # every key, and replace introspects the fields each time.
    vanish = rules.vanish(op) if rules.written(op) else state.vanish
    if op.op is OpName.TRY_ACQUIRE_LOCK:
        return _Seen(
            S.PROCESSING, rules.lock_end(op.earliest, op), rules.lock_end(op.latest, op), vanish
        )
    if op.op is OpName.SET:
        current = _status(op.status)
    elif op.op is OpName.UPSERT:
        current = S.PROCESSED
    else:
        current = S.FAILED
    return _Seen(current, state.lock_lo, state.lock_hi, vanish)


# --- liveness --------------------------------------------------------------------------------


def terminal_within_deadline(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """Once faults stop, no record stays Processing beyond lock duration + sweep interval.

    Without a lock sweep (``semantics.lock_sweep`` False) nothing moves an
    expired lock: the record stays Processing, and the next acquisition takes
    it over, as an expired lock counts as Failed.  Such a record passes when
    every lock it may carry had ended by the time it was read.
    """
    if history.faults_stop is None:
        return result_of(
            "terminal_within_deadline",
            "no record stays Processing after faults stop",
            (),
            ("not checked: the history does not say when faults stopped",),
        )
    stop = history.faults_stop
    starts = [
        op.latest
        for op in history.ops
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.maybe and op.invoke <= stop
    ]
    finite = [t for t in starts if math.isfinite(t)]
    base = max(finite) if finite else stop
    deadline = base + micros_of(history.longest_lock) + micros_of(history.sweep_interval or 0.0)
    violations = []
    notes = [f"deadline at store {fmt(deadline)}"]
    for final in history.final:
        seen_at = final.store_time if final.store_time is not None else final.time
        if final.status != S.PROCESSING.value:
            continue
        if not semantics.lock_sweep:
            ended = _lock_ended(history, final.key, seen_at, semantics)
            if ended is not None:
                notes.append(
                    f"key {final.key}: still Processing at store {fmt(seen_at)}, but its lock "
                    f"ended at {fmt(ended)}; with no lock sweep the next acquisition takes it over"
                )
                continue
        if seen_at < deadline:
            violations.append(
                Violation(
                    f"key {final.key}: still Processing at store {fmt(seen_at)}; the run ended "
                    f"before the liveness deadline {fmt(deadline)}, so it cannot be checked",
                    final.key,
                )
            )
        else:
            violations.append(
                Violation(
                    f"key {final.key}: still Processing at store {fmt(seen_at)}, past the "
                    f"deadline {fmt(deadline)} (last faulty acquisition + lock duration + "
                    "sweep interval)",
                    final.key,
                )
            )
    return result_of(
        "terminal_within_deadline",
        "every item leaves Processing within lock duration + sweep interval after faults stop",
        violations,
        notes,
    )


def _lock_ended(history: History, key: str, at: float, semantics: SemanticsProfile) -> float | None:
    """The instant by which every lock the key may carry had ended, if that is before ``at``."""
    grants = [
        op
        for op in history.ops_for(key)
        if op.op is OpName.TRY_ACQUIRE_LOCK
        and op.maybe
        and (op.outcome is Outcome.INFO or acquired(op))
    ]
    if not grants:
        return None
    end = max(
        lock_end(history, op.latest, history.lock_duration_of(op), semantics) for op in grants
    )
    return end if end < at else None


# --- nothing lost ----------------------------------------------------------------------------


def no_record_lost(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """Every written key still has its record; a completed item never reads as not done.

    Under a profile whose records vanish, a record may be gone once its TTL
    has run out, or after its holder's failure deleted it; a record deleted
    by a holder whose lock had been taken over, or gone before its TTL ran
    out, is still lost.
    """
    violations = []
    timeline = Ordering.of(history)
    finals = {f.key: f for f in history.final}
    retention = retention_sweeps(history)
    for key in history.item_keys():
        rules = _Rules(history, key, semantics)
        ops = sorted(history.ops_for(key), key=order)
        written = [op for op in ops if op.op.is_write and op.ok]
        if not written:
            continue
        final = finals.get(key)
        final_at = None if final is None else _read_at(final.store_time, final.time)
        if final is not None and final.status == S.NONE.value:
            assert final_at is not None
            # None: the library's design explains the missing record.
            why = _gone(rules, ops, final_at) if semantics.records_vanish else ""
            if why is not None:
                violations.append(
                    Violation(
                        f"key {key}: written by op #{written[0].index} but no record at the end"
                        + why,
                        key,
                        (written[0].index,),
                    )
                )
        done = next(
            (
                op
                for op in written
                if op.op is OpName.UPSERT or (op.op is OpName.SET and op.status == "processed")
            ),
            None,
        )
        if done is None:
            continue
        expired = any(not timeline.before(s, done) for s in retention)
        if expired:
            continue
        for read in ops:
            if (
                read.op is OpName.EXISTS
                and read.ok
                and read.result is False
                and read.effect_lo > done.effect_hi
                and not ttl_gap(history, key, done, read.latest, semantics)
            ):
                violations.append(
                    Violation(
                        f"key {key}: exists returned False (op #{read.index}) after the item "
                        f"was recorded Processed (op #{done.index})",
                        key,
                        (done.index, read.index),
                    )
                )
                break
        if (
            final is not None
            and final.status not in DONE
            and not (final_at is not None and ttl_gap(history, key, done, final_at, semantics))
        ):
            violations.append(
                Violation(
                    f"key {key}: recorded Processed by op #{done.index} but ends {final.status}",
                    key,
                    (done.index,),
                )
            )
    return result_of(
        "no_record_lost", "no written record disappears or forgets it was done", violations
    )


def _read_at(store_time: float | None, time: float) -> float:
    return store_time if store_time is not None else time


def _gone(rules: _Rules, ops: list[Op], at: float) -> str | None:
    """Why a vanished record is lost under the profile; ``None`` when its design explains it."""
    landed = [op for op in ops if rules.written(op)]
    last = landed[-1] if landed else None
    if last is not None and at >= rules.vanish(last):
        return None  # its TTL ran out
    if rules.deletes:
        after = [op for op in ops if last is None or order(op) >= order(last)]
        for write in (op for op in after if op.maybe and rules.failure(op)):
            holder = _holder_before(ops, write)
            if holder is None or holder == write.token:
                return None  # its holder's failure deleted it
            return (
                f": op #{write.index}, a failure under token {write.token}, deleted it while "
                f"token {holder} held the item (a stale holder's delete)"
            )
    kept = (
        ""
        if last is None or rules.vanish(last) == math.inf
        else (f" (op #{last.index} kept it until {fmt(rules.vanish(last))})")
    )
    return f", and neither its TTL nor its holder's failure removed it{kept}"


def _holder_before(ops: list[Op], write: Op) -> int | None:
    """The token of the last grant before ``write``; ``None`` when a grant's token is unknown."""
    holder: int | None = None
    for op in ops:
        if order(op) >= order(write):
            break
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.outcome is Outcome.INFO:
            holder = None
        elif acquired(op):
            holder = op.token
    return holder
