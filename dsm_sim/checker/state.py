"""Invariants about record states: allowed transitions, truthful reads, liveness, nothing lost.

Each replays a key's definite writes in timeline order and compares what the
store said or ended with against the status those writes imply.
"""

from __future__ import annotations

import math

from dsm_sim.checker.leases import (
    DONE,
    InvariantResult,
    Violation,
    acquired,
    fmt,
    order,
    result_of,
    retention_sweeps,
    sweeps_resetting,
)
from dsm_sim.history import History, OpName, Outcome
from reference_engine.status import COMPLETED, IdempotencyStatus, is_allowed

__all__ = [
    "exists_agrees_with_writes",
    "no_record_lost",
    "only_allowed_transitions",
    "terminal_within_deadline",
]

S = IdempotencyStatus

# --- transitions -----------------------------------------------------------------------------


def only_allowed_transitions(history: History) -> InvariantResult:
    """Replay each key's definite writes and check every step against the transition table.

    After an ``info`` write the status is unknown until the next ``ok`` one.
    """
    violations = []
    duration = history.lock_duration
    for key in history.item_keys():
        steps = [
            op
            for op in history.ops_for(key)
            if op.op.is_write
            and op.maybe
            and (op.op is not OpName.TRY_ACQUIRE_LOCK or not op.ok or acquired(op))
        ]
        steps += sweeps_resetting(history, key)
        current: S | None = S.NONE
        lock_until = -math.inf
        last = -1
        for op in sorted(steps, key=order):
            if op.outcome is Outcome.INFO:
                current = None
                continue
            raw = current
            effective = S.FAILED if raw is S.PROCESSING and op.earliest > lock_until else raw
            source = raw if op.token is not None else effective
            target: S
            if op.op is OpName.RESET_EXPIRED_LOCKS:
                target = S.FAILED
                source = raw
            elif op.op is OpName.TRY_ACQUIRE_LOCK:
                target = S.PROCESSING
                source = effective
                lock_until = op.latest + duration
            elif op.op is OpName.RELEASE_LOCK_AS_FAILED:
                target = S.FAILED
            elif op.op is OpName.UPSERT:
                target = S.PROCESSED
                if source is S.PROCESSED or (
                    source in (S.NONE, S.FAILED, S.EXPIRED) and op.token is None
                ):
                    current = S.PROCESSED
                    continue  # supersede, or acquire-and-complete in one step
            else:
                target = _status(op.status)
            live_takeover = op.op is OpName.TRY_ACQUIRE_LOCK and source is S.PROCESSING
            if op.op is OpName.RESET_EXPIRED_LOCKS and source not in (None, S.PROCESSING):
                assert source is not None
                violations.append(
                    Violation(
                        f"key {key}: sweep op #{op.index} found the record Processing, but the "
                        f"last acknowledged write (op #{last}) had left it {source.label}: that "
                        "write did not do what it acknowledged",
                        key,
                        (last, op.index),
                    )
                )
            elif source is not None and not live_takeover and not is_allowed(source, target):
                violations.append(
                    Violation(
                        f"key {key}: {op.op.value} by {op.process} (op #{op.index}, token "
                        f"{op.token}) moved the record {source.label} -> {target.label}, "
                        "which the transition table forbids",
                        key,
                        (op.index,),
                    )
                )
            current = target
            last = op.index
    return result_of(
        "only_allowed_transitions", "every status change is in the transition table", violations
    )


def _status(name: str | None) -> S:
    try:
        return S(name or "none")
    except ValueError:
        return S.NONE


# --- reads ----------------------------------------------------------------------------------


def exists_agrees_with_writes(history: History) -> InvariantResult:
    """``exists`` answers True exactly when the key's last definite status is Processed/Skipped.

    The status is replayed from the key's definite writes (an expired, unswept
    lock counts as Failed); a read is skipped while the status is unknown
    (after an ``info`` write or a retention sweep) or when a write may have
    landed at the same time.
    """
    violations = []
    duration = history.lock_duration
    retention = retention_sweeps(history)
    for key in history.item_keys():
        own = history.ops_for(key)
        writes = [op for op in own if op.op.is_write and op.maybe]
        steps = sorted(own + sweeps_resetting(history, key) + retention, key=order)
        current: S | None = S.NONE
        lock_lo = lock_hi = -math.inf
        for op in steps:
            if op.op is OpName.EXISTS:
                if not op.ok or current is None or not isinstance(op.result, bool):
                    continue
                if any(w.effect_lo <= op.effect_hi and op.effect_lo <= w.effect_hi for w in writes):
                    continue
                status = current
                if current is S.PROCESSING:
                    if op.earliest > lock_hi:
                        status = S.FAILED
                    elif op.latest > lock_lo:
                        continue  # the lock may or may not have expired at this read
                expected = status in COMPLETED
                if op.result is not expected:
                    violations.append(
                        Violation(
                            f"key {key}: exists returned {op.result} to {op.process} "
                            f"(op #{op.index}) while the record was {status.label}; "
                            f"expected {expected}",
                            key,
                            (op.index,),
                        )
                    )
                continue
            if op.op is OpName.EXPIRE_PAST_RETENTION or op.outcome is Outcome.INFO:
                if op.op.is_write or op.op.is_sweep:
                    current = None
                continue
            if not op.ok or not (op.op.is_write or op.op is OpName.RESET_EXPIRED_LOCKS):
                continue
            if op.op is OpName.TRY_ACQUIRE_LOCK:
                if not acquired(op):
                    continue
                current = S.PROCESSING
                lock_lo, lock_hi = op.earliest + duration, op.latest + duration
            elif op.op is OpName.SET:
                current = _status(op.status)
            elif op.op is OpName.UPSERT:
                current = S.PROCESSED
            else:
                current = S.FAILED
    return result_of(
        "exists_agrees_with_writes",
        "exists answers True exactly for Processed or Skipped items",
        violations,
    )


# --- liveness --------------------------------------------------------------------------------


def terminal_within_deadline(history: History) -> InvariantResult:
    """Once faults stop, no record stays Processing beyond lock duration + sweep interval."""
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
    deadline = base + history.lock_duration + (history.sweep_interval or 0.0)
    violations = []
    for final in history.final:
        seen_at = final.store_time if final.store_time is not None else final.time
        if final.status != S.PROCESSING.value:
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
        (f"deadline at store {fmt(deadline)}",),
    )


# --- nothing lost ----------------------------------------------------------------------------


def no_record_lost(history: History) -> InvariantResult:
    """Every written key still has its record; a completed item never reads as not done."""
    violations = []
    finals = {f.key: f for f in history.final}
    retention = retention_sweeps(history)
    for key in history.item_keys():
        ops = sorted(history.ops_for(key), key=order)
        written = [op for op in ops if op.op.is_write and op.ok]
        if not written:
            continue
        final = finals.get(key)
        if final is not None and final.status == S.NONE.value:
            violations.append(
                Violation(
                    f"key {key}: written by op #{written[0].index} but no record at the end",
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
        expired = any(order(s) > order(done) for s in retention)
        if expired:
            continue
        for read in ops:
            if (
                read.op is OpName.EXISTS
                and read.ok
                and read.result is False
                and read.effect_lo > done.effect_hi
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
        if final is not None and final.status not in DONE:
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
