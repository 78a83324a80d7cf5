"""Every call the store executed, judged against the reference model from the record it started on.

The simulator reads a key right before and right after the store runs a
call, at the same instant (:attr:`dsm_sim.history.Op.probed`).  That makes
each call a self-contained test case: put the *before* record into a fresh
:class:`~reference_engine.model.ReferenceModel`, run the same call at the
same store instant with the key's own options, and compare what the model
answers and leaves behind with what the store answered and left behind.
Any difference is a bug of the store, named after the conformance kit's
property it breaks.  Nothing here is tuned to a particular bug: a handler
that differs from the model on a call the nodes make is caught on that call.

Sweeps are judged from the keys they changed against the keys that were due
(an expired lock, a record past retention) when they ran.

Between two calls on a key the record must stay as the first call left it,
unless a sweep that reports the key changed runs in between, and then it
must be what the model's sweep makes of it.  This is what catches a store
whose record changes behind the callers' backs: a sweep that also bumps the
attempt, a payload kept by reference and changed by the caller afterwards.

Under a semantics profile the model is a :class:`~dsm_sim.conformance.
semantics.ProfiledModel` (:mod:`dsm_sim.checker.profiled`): it deletes where
the library deletes, lets a TTL drop records, ends locks by the library's
rule, and keeps counting tokens across a delete.  Instants are compared at
the profile's resolutions and the audit fields only when the library stores
them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dsm_sim.checker.leases import InvariantResult, Violation, fmt, property_result
from dsm_sim.checker.profiled import (
    Past,
    at_resolution,
    exact_retention,
    model_for,
    pasts,
    status_at,
)
from dsm_sim.conformance.judge.semantics import DSM, ProfiledModel, SemanticsProfile
from dsm_sim.history import (
    CallOptions,
    History,
    KeyInfo,
    Op,
    OpName,
    Outcome,
    RecordView,
)
from dsm_sim.micros import Micros, instant_at, micros_since
from dsm_sim.model import record_copy
from reference_engine.config import HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import DsmError
from reference_engine.model import ModelRecord, ReferenceModel
from reference_engine.record import encode_data
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus, is_allowed

__all__ = ["JUDGED", "model_agreement"]

S = IdempotencyStatus

#: The conformance kit properties this judge reports, in report order.
JUDGED: tuple[str, ...] = (
    "at_most_one_live_lock",
    "acquire_agrees_with_model",
    "exists_agrees_with_model",
    "stale_write_rejected",
    "spent_token_rejected",
    "errors_agree_with_model",
    "allowed_transitions_only",
    "completion_releases_lock",
    "lock_duration_honoured",
    "data_round_trip",
    "upsert_keeps_history",
    "timestamps_in_utc",
    "record_agrees_with_model",
    "sweep_only_expired",
    "sweep_resets_expired",
    "retention_sweep_agrees_with_model",
    "tenant_isolation",
    "scope_isolation",
    "entity_isolation",
    "key_identity",
)

#: The model holds a payload as the canonical JSON of ``{_MARK: digest}``, so
#: that a retry's data compares with the stored data digest to digest.
_MARK = "digest:"
_FENCED_WRITES = (OpName.SET, OpName.RELEASE_LOCK_AS_FAILED, OpName.UPSERT)
_NODE_OPS = (
    OpName.EXISTS,
    OpName.TRY_ACQUIRE_LOCK,
    OpName.SET,
    OpName.RELEASE_LOCK_AS_FAILED,
    OpName.UPSERT,
)
_COMPLETED_RECORD = frozenset({"processed", "skipped", "superseded", "expired"})
#: Status by value, looked up once per judged call (calling the enum costs several times more).
_STATUSES: dict[str, IdempotencyStatus] = {status.value: status for status in IdempotencyStatus}


@dataclass(frozen=True, slots=True)
class _Finding:
    prop: str
    message: str
    op: int


def model_agreement(history: History, semantics: SemanticsProfile = DSM) -> list[InvariantResult]:
    """One result per judged property; empty when no call was read around (no probes).

    ``semantics``: the profile the store is judged by (the spec's by default).
    """
    if not any(op.probed for op in history.ops):
        return []
    past = {} if semantics.strict else pasts(history, semantics)
    findings: list[_Finding] = []
    memo = _Memo()
    for op in history.ops:
        if op.op in _NODE_OPS and op.probed and op.store_time is not None:
            info = history.keys.get(op.key)
            if info is not None:
                try:
                    findings.extend(_judge(history, op, info, semantics, past.get(op.index), memo))
                except OverflowError:
                    findings.append(_out_of_range(op))
        elif op.op.is_sweep and op.ok:
            findings.extend(_judge_sweep(op))
    findings.extend(_between_calls(history, semantics, past))
    results = []
    for name in JUDGED:
        mine = [f for f in findings if f.prop == name]
        violations = [Violation(f.message, "", (f.op,)) for f in mine]
        results.append(property_result(name, violations))
    return results


def _out_of_range(op: Op) -> _Finding:
    """The finding on a call around which the store showed an instant no ``datetime`` holds.

    Every instant read is exact, so this is only a stamp whose offset moves it
    past 9999-12-31 23:59:59.999999 UTC (or before year 1): the model cannot
    hold the record, and the call is judged no further.
    """
    utc = all(view.utc for view in (op.before, op.after) if view is not None)
    return _Finding(
        "record_agrees_with_model" if utc else "timestamps_in_utc",
        f"key {op.key}: {op.op.value} op #{op.index} by {op.process} at store "
        f"{fmt(op.store_time or 0)}: the store showed an instant outside 0001-01-01 to "
        "9999-12-31 23:59:59.999999 UTC, which no record can hold",
        op.index,
    )


# --- calls -----------------------------------------------------------------------------------


class _Memo:
    """What judging one history's calls works out again and again, worked out once.

    ``records``: the model's record of each *before* view, by (key, id of the
    view), with the view (kept, so the id stays its own).  The simulator
    hands out one view object for every read that found a key unchanged, so
    calls on a key often start from the same one.  ``record_keys``: each
    key's record key.  ``micros``: the microseconds since the epoch of each UTC
    instant of the model's records (copies share their instants).
    """

    __slots__ = ("micros", "record_keys", "records")

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], tuple[RecordView, ModelRecord]] = {}
        self.record_keys: dict[str, RecordKey] = {}
        self.micros: dict[dt.datetime, Micros] = {}


def _judge(
    history: History,
    op: Op,
    info: KeyInfo,
    semantics: SemanticsProfile = DSM,
    past: Past | None = None,
    memo: _Memo | None = None,
) -> list[_Finding]:
    """The findings on one call read around, replayed on the model from its *before* record.

    ``memo``: what was worked out for earlier calls (see :class:`_Memo`); the
    record made from the *before* view is only read, its copy goes into the model.
    """
    assert op.store_time is not None
    found: list[_Finding] = []

    def say(prop: str, text: str) -> None:
        found.append(
            _Finding(
                prop,
                f"key {op.key}: {op.op.value} op #{op.index} by {op.process} "
                f"at store {fmt(op.store_time or 0)}: {text}",
                op.index,
            )
        )

    for label, view in (("before", op.before), ("after", op.after)):
        if view is not None and view.key != op.key:
            prop = _isolation(history, info, view.key)
            say(prop, f"the store returned the record of key {view.key} ({label} the call)")
            return found
    now = instant_at(history.epoch, op.store_time)
    ctx = _context(info, op)
    record_key = None if memo is None else memo.record_keys.get(op.key)
    if record_key is None:
        record_key = ctx.record_key
        if memo is not None:
            memo.record_keys[op.key] = record_key
    strict = semantics.strict
    model = model_for(semantics, ctx, past)
    stored = None
    if op.before is not None:
        seen = None if memo is None else memo.records.get((op.key, id(op.before)))
        if seen is not None and seen[0] is op.before:
            stored = seen[1]
        else:
            stored = _record(ctx, op.before, history.epoch, record_key)
            if memo is not None:
                memo.records[(op.key, id(op.before))] = (op.before, stored)
    if stored is not None and not strict:
        stored = exact_retention(history, info, stored, semantics, past)
    if stored is not None:
        model.current[record_key] = record_copy(stored)
    expected_value: object = None
    expected_error: str | None = None
    try:
        expected_value = _run(model, op, ctx, now)
    except DsmError as exc:
        expected_error = type(exc).__name__
    before = op.before
    source = status_at(stored, now, semantics)
    unknown = op.outcome is Outcome.INFO and op.error in ("StoreError", "Crash")
    if not unknown:
        actual_error = None if op.ok else op.error
        if op.ok and op.op is OpName.EXISTS and op.result is not expected_value:
            say(
                "exists_agrees_with_model",
                f"returned {op.result} for a record {_label(before)}; the spec says "
                f"{expected_value}",
            )
            return found
        if op.ok and op.op is OpName.TRY_ACQUIRE_LOCK:
            got = op.result if isinstance(op.result, int) else None
            if got != expected_value:
                live = source is S.PROCESSING and got is not None
                say(
                    "at_most_one_live_lock" if live else "acquire_agrees_with_model",
                    f"returned token {got} for a record {_label(before)}; the spec says "
                    + (f"token {expected_value}" if expected_value is not None else "no lock"),
                )
                return found
        if actual_error != expected_error:
            if expected_error == "StaleLockError" and actual_error is None:
                say(
                    _stale_property(before, op.token),
                    f"accepted token {op.token} on a record {_label(before)}; the spec says "
                    "StaleLockError",
                )
            else:
                say(
                    "errors_agree_with_model",
                    ("succeeded" if actual_error is None else f"raised {actual_error}")
                    + f" on a record {_label(before)}; the spec says "
                    + ("it succeeds" if expected_error is None else expected_error),
                )
            return found
    if expected_error is not None:
        if op.after != op.before:
            prop = (
                _stale_property(before, op.token)
                if expected_error == "StaleLockError"
                else "errors_agree_with_model"
            )
            say(
                prop,
                f"changed a record {_label(before)} into {_label(op.after)} although the spec "
                f"refuses the call ({expected_error})",
            )
        return found
    landed = (
        stored is not None
        and op.token is not None
        and op.op in _FENCED_WRITES
        and model.current.get(record_key) == stored
    )
    if landed and op.after is not None and (change := _difference(op.after, op.before)):
        say(
            "spent_token_rejected",
            f"retried a write that had landed under token {op.token} (the record "
            f"{_label(before)} already shows it) and changed it: {change}; the retry must "
            "succeed and change nothing",
        )
        return found
    expected = _expected_view(
        model.current.get(record_key),
        op,
        history.epoch,
        expected_error,
        None if memo is None else memo.micros,
    )
    after = op.after
    if not strict:
        expected = at_resolution(expected, history, semantics)
        after = at_resolution(after, history, semantics)
    if expected == after:
        return found  # the usual case: field for field what the spec leaves, nothing to say
    found.extend(_compare(op, before, expected, after, say_prefix=say, semantics=semantics))
    return found


def _run(model: ReferenceModel, op: Op, ctx: StateHandlerContext, now: dt.datetime) -> object:
    match op.op:
        case OpName.EXISTS:
            return model.exists(_tokenless(ctx), now)
        case OpName.TRY_ACQUIRE_LOCK:
            return model.try_acquire_lock(_tokenless(ctx), now)
        case OpName.SET:
            model.set(ctx, S(op.status or "none"), _marked(op.data), now)
        case OpName.RELEASE_LOCK_AS_FAILED:
            detail = "released" if op.detail is None else op.detail
            model.release_lock_as_failed(ctx, detail, now)
        case OpName.UPSERT:
            model.upsert(ctx, _marked(op.data), now)
        case _:
            raise AssertionError(op.op)
    return None


def _tokenless(ctx: StateHandlerContext) -> StateHandlerContext:
    return ctx if ctx.lock_token is None else dataclasses.replace(ctx, lock_token=None)


def _expected_view(
    record: ModelRecord | None,
    op: Op,
    epoch: dt.datetime,
    error: str | None,
    micros: dict[dt.datetime, Micros] | None = None,
) -> RecordView | None:
    """The view of the model's ``record`` after ``op``, as the store's read would give it.

    ``micros``: instants already converted (see :class:`_Memo`).
    """
    if record is None:
        return None
    data = record.data
    kept = _digest(data)
    if error is None and op.op in (OpName.SET, OpName.UPSERT) and op.data is not None:
        kept = op.data
    # In RecordView's field order, not by keyword (a third cheaper): one per judged call.
    return RecordView(
        op.key,
        record.status.value,
        record.attempt,
        micros_since(record.locked_until, epoch, micros),
        micros_since(record.created_at, epoch, micros) or 0,
        micros_since(record.updated_at, epoch, micros) or 0,
        micros_since(record.retain_until, epoch, micros),
        kept,
        True,  # utc: the model's instants are
        _audit_of(record) if op.after is not None and op.after.audit is not None else None,
    )


def _audit_of(record: ModelRecord) -> tuple[str | None, str, str]:
    return (record.error_detail, record.source_app_id, record.entity_execution_id)


#: The audit fields in :attr:`RecordView.audit` order, as a message names them.
AUDIT_FIELDS = ("error_detail", "source_app_id", "entity_execution_id")


def audit_difference(
    actual: tuple[str | None, str, str] | None, expected: tuple[str | None, str, str] | None
) -> str | None:
    """The first audit field that differs, worded for a message; ``None`` when they agree.

    Either side unrecorded (``None``) agrees: an older history did not read them.
    """
    if actual is None or expected is None:
        return None
    for name, got, want in zip(AUDIT_FIELDS, actual, expected, strict=True):
        if got != want:
            return f"left {name} {_text(got)}; the spec says {_text(want)}"
    return None


def _text(value: str | None) -> str:
    return "NULL" if value is None else repr(value)


def _compare(
    op: Op,
    before: RecordView | None,
    expected: RecordView | None,
    actual: RecordView | None,
    *,
    say_prefix: Callable[[str, str], None],
    semantics: SemanticsProfile = DSM,
) -> list[_Finding]:
    say = say_prefix
    audited = semantics.audit_fields
    if expected is None or actual is None:
        if expected != actual:
            say(
                "record_agrees_with_model",
                f"left {_label(actual)}; the spec leaves {_label(expected)}",
            )
        return []
    if actual.status != expected.status:
        src = S.NONE if before is None else S(before.status)
        moved = actual.status != src.value
        forbidden = moved and not is_allowed(src, S(actual.status))
        say(
            "allowed_transitions_only" if forbidden else "record_agrees_with_model",
            f"left the record {actual.status} (from {src.value}); the spec leaves it "
            f"{expected.status}",
        )
        return []
    if actual.attempt != expected.attempt:
        say(
            "acquire_agrees_with_model"
            if op.op is OpName.TRY_ACQUIRE_LOCK
            else "record_agrees_with_model",
            f"left attempt (token) {actual.attempt}; the spec says {expected.attempt}",
        )
    if not actual.utc or (audited and not _same(actual.updated_at, expected.updated_at)):
        say(
            "timestamps_in_utc",
            f"stamped updated_at {fmt(actual.updated_at)}"
            + ("" if actual.utc else " (not aware UTC)")
            + f"; the store clock read {fmt(expected.updated_at)}",
        )
        return []
    if not _same(actual.locked_until, expected.locked_until):
        if expected.locked_until is None:
            prop = "completion_releases_lock"
        elif op.op is OpName.TRY_ACQUIRE_LOCK:
            prop = "lock_duration_honoured"
        else:
            prop = "record_agrees_with_model"
        say(
            prop,
            f"left locked_until {_instant(actual.locked_until)}; the spec says "
            f"{_instant(expected.locked_until)}",
        )
    if actual.data != expected.data:
        say(
            "data_round_trip",
            f"reads back data {actual.data} where {expected.data} was written or kept "
            "(digests of the canonical JSON)",
        )
    if audited and not _same(actual.created_at, expected.created_at):
        superseding = op.op is OpName.UPSERT and before is not None and before.status == "processed"
        say(
            "upsert_keeps_history" if superseding else "record_agrees_with_model",
            f"left created_at {fmt(actual.created_at)}; the spec says "
            f"{fmt(expected.created_at)}"
            + (" (a superseding upsert inserts a new record)" if superseding else ""),
        )
    if not _same(actual.retain_until, expected.retain_until):
        say(
            "record_agrees_with_model",
            f"left retain_until {_instant(actual.retain_until)}; the spec says "
            f"{_instant(expected.retain_until)} (write instant + the node's retention)",
        )
    audit = audit_difference(actual.audit, expected.audit) if audited else None
    if audit is not None:
        say("record_agrees_with_model", audit)
    return []


# --- sweeps ----------------------------------------------------------------------------------


def _judge_sweep(op: Op) -> list[_Finding]:
    changed, due = set(op.keys), set(op.candidates)
    at = fmt(op.store_time or 0)
    found = []
    if op.op is OpName.RESET_EXPIRED_LOCKS:
        for key in sorted(changed - due):
            found.append(
                _Finding(
                    "sweep_only_expired",
                    f"key {key}: the lock sweep op #{op.index} at store {at} changed a record "
                    "that was not an expired lock",
                    op.index,
                )
            )
        for key in sorted(due - changed):
            found.append(
                _Finding(
                    "sweep_resets_expired",
                    f"key {key}: the lock sweep op #{op.index} at store {at} left an expired "
                    "lock Processing",
                    op.index,
                )
            )
        return found
    for key in sorted(changed - due):
        found.append(
            _Finding(
                "retention_sweep_agrees_with_model",
                f"key {key}: the retention sweep op #{op.index} at store {at} changed a record "
                "not past its retain_until (or a live lock)",
                op.index,
            )
        )
    for key in sorted(due - changed):
        found.append(
            _Finding(
                "retention_sweep_agrees_with_model",
                f"key {key}: the retention sweep op #{op.index} at store {at} kept a record "
                "past its retain_until",
                op.index,
            )
        )
    return found


# --- between calls ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Left:
    """What the last call read around on a key left there, and the sweeps since."""

    op: Op
    view: RecordView | None
    sweeps: list[Op]


def _between_calls(
    history: History,
    semantics: SemanticsProfile = DSM,
    past: Mapping[int, Past] | None = None,
) -> list[_Finding]:
    """Each call's *before* against what the previous call on its key left (store order).

    Only calls read around in one step are links of the chain; any other
    call on the key (not read around, or its result unknown) breaks it, as
    does a sweep whose outcome is unknown.  A GET changes nothing.
    """
    ordered = sorted((op for op in history.ops if op.seq is not None), key=lambda o: o.seq or 0)
    past = past or {}
    left: dict[str, _Left] = {}
    found: list[_Finding] = []
    for op in ordered:
        if op.op.is_sweep:
            if not op.ok:
                left.clear()
                continue
            for key in op.keys:
                if key in left:
                    left[key].sweeps.append(op)
            continue
        if op.op is OpName.GET:
            continue
        before, after = op.before, op.after
        if (
            not op.probed
            or (before is not None and before.key != op.key)
            or (after is not None and after.key != op.key)
        ):
            left.pop(op.key, None)
            continue
        previous = left.get(op.key)
        info = history.keys.get(op.key)
        if previous is not None and info is not None:
            try:
                finding = _still(history, info, previous, op, semantics, past.get(op.index))
            except OverflowError:
                finding = _out_of_range(op)
            if finding is not None:
                found.append(finding)
        left[op.key] = _Left(op, op.after, [])
    return found


def _still(
    history: History,
    info: KeyInfo,
    previous: _Left,
    op: Op,
    semantics: SemanticsProfile = DSM,
    past: Past | None = None,
) -> _Finding | None:
    """A finding when ``op`` found the record other than the model says it was left.

    Under a profile whose retention is a TTL, a record past it is expected gone.
    """
    expected = previous.view
    sweeps = []
    for sweep in previous.sweeps:
        if expected is None or sweep.store_time is None:
            break
        ctx = _context(info, op)
        model = model_for(semantics, ctx, None)
        model.current[ctx.record_key] = _record(ctx, expected, history.epoch)
        now = instant_at(history.epoch, sweep.store_time)
        if sweep.op is OpName.RESET_EXPIRED_LOCKS:
            changed = model.reset_expired_locks(now)
        else:
            changed = model.expire_past_retention(now)
        if not changed:
            return None  # the sweep changed what the spec keeps: judged with the sweep
        record = model.current[ctx.record_key]
        expected = _view_of_model(record, op.key, history.epoch, expected.audit is not None)
        sweeps.append(sweep)
    if expected is not None and not semantics.strict and op.store_time is not None:
        ctx = _context(info, op)
        profiled = ProfiledModel(semantics)
        kept = _record(ctx, expected, history.epoch)
        profiled.current[ctx.record_key] = exact_retention(history, info, kept, semantics, past)
        profiled.settle(history.instant(op.store_time), ctx.record_key)
        if ctx.record_key not in profiled.current:
            expected = None  # its TTL ran out
    difference = _difference(op.before, expected)
    if difference is None:
        return None
    prev = previous.op
    via = "".join(
        f", then the {'lock' if s.op is OpName.RESET_EXPIRED_LOCKS else 'retention'} sweep "
        f"op #{s.index} at store {fmt(s.store_time or 0)}"
        for s in sweeps
    )
    if sweeps:
        last = sweeps[-1].op
        prop = (
            "sweep_resets_expired"
            if last is OpName.RESET_EXPIRED_LOCKS
            else "retention_sweep_agrees_with_model"
        )
    else:
        prop = "data_round_trip" if difference.startswith("data") else "record_agrees_with_model"
    return _Finding(
        prop,
        f"key {op.key}: {op.op.value} op #{op.index} by {op.process} at store "
        f"{fmt(op.store_time or 0)} found the record changed since {prev.op.value} op "
        f"#{prev.index} by {prev.process} at store {fmt(prev.store_time or 0)} left it{via}: "
        f"{difference} (nothing in between may change it so)",
        op.index,
    )


def _view_of_model(
    record: ModelRecord, key: str, epoch: dt.datetime, with_audit: bool
) -> RecordView:
    data = record.data
    return RecordView(
        key=key,
        status=record.status.value,
        attempt=record.attempt,
        locked_until=micros_since(record.locked_until, epoch),
        created_at=micros_since(record.created_at, epoch) or 0,
        updated_at=micros_since(record.updated_at, epoch) or 0,
        retain_until=micros_since(record.retain_until, epoch),
        data=_digest(data),
        audit=_audit_of(record) if with_audit else None,
    )


def _difference(actual: RecordView | None, expected: RecordView | None) -> str | None:
    """The first field in which ``actual`` differs from ``expected``, worded; ``None`` if none."""
    if actual is None or expected is None:
        return None if actual is expected else f"it is {_label(actual)}, not {_label(expected)}"
    if actual == expected:
        return None  # the usual case, and the fields below would all agree
    if actual.data != expected.data:
        return f"data {actual.data}, not {expected.data} (digests of the canonical JSON)"
    if actual.status != expected.status or actual.attempt != expected.attempt:
        return f"it is {_label(actual)}, not {_label(expected)}"
    for name in ("locked_until", "created_at", "updated_at", "retain_until"):
        got, want = getattr(actual, name), getattr(expected, name)
        if not _same(got, want):
            return f"{name} {_instant(got)}, not {_instant(want)}"
    audit = audit_difference(actual.audit, expected.audit)
    return None if audit is None else audit.replace("left ", "", 1)


# --- helpers ---------------------------------------------------------------------------------


def _stale_property(before: RecordView | None, token: int | None) -> str:
    """A spent token is its own class: the record its own write completed (a lost reply's retry).

    A token on a record another holder completed is a stale holder's, as in the kit.
    """
    spent = before is not None and before.status in _COMPLETED_RECORD and before.attempt == token
    return "spent_token_rejected" if spent else "stale_write_rejected"


def _isolation(history: History, info: KeyInfo, other: str) -> str:
    """Which part of the key the store lost, reading the returned key part by part."""
    theirs = history.keys.get(other)
    if theirs is not None:
        if theirs.tenant != info.tenant:
            return "tenant_isolation"
        if theirs.scope != info.scope:
            return "scope_isolation"
        if theirs.entity != info.entity or theirs.item_entity_key != info.item_entity_key:
            return "entity_isolation"
        return "key_identity"
    # A key no caller used: compare it with ours from the left, component by component.
    prefixes = (
        ("tenant_isolation", f"{info.tenant}/"),
        ("scope_isolation", f"{info.tenant}/{info.scope}/"),
        ("entity_isolation", f"{info.tenant}/{info.scope}/{info.entity}/{info.item_entity_key}/"),
    )
    for prop, prefix in prefixes:
        if not other.startswith(prefix):
            return prop
    return "key_identity"


def _context(info: KeyInfo, op: Op) -> StateHandlerContext:
    token = op.token if op.op.is_write and op.op is not OpName.TRY_ACQUIRE_LOCK else None
    return _context_of(info, op.execution, "" if op.app is None else op.app, token, op.options)


@functools.lru_cache(maxsize=4096)
def _context_of(
    info: KeyInfo, execution: str, app: str, token: int | None, options: CallOptions | None
) -> StateHandlerContext:
    """The context a call was made with; a history repeats a few of them many times.

    ``options``: the call's own node options (a redeployed node), else the key's.
    """
    lock = info.lock_duration if options is None else options.lock_duration
    kept = info.retention if options is None else options.retention
    retention = None if kept is None else dt.timedelta(seconds=kept)
    config = HandlerConfig(lock_duration=dt.timedelta(seconds=lock), retention=retention)
    return StateHandlerContext(
        scope_id=info.scope,
        scope_code=Scope(info.scope).code,
        entity_id=info.entity,
        entity_execution_id=execution,
        tenant_id=info.tenant,
        source_app_id=app,
        handler_config=config,
        item_key=info.item,
        item_entity_key=info.item_entity_key,
        lock_token=token,
    )


def _record(
    ctx: StateHandlerContext,
    view: RecordView,
    epoch: dt.datetime,
    record_key: RecordKey | None = None,
) -> ModelRecord:
    """The model's record for a read ``view``; ``record_key``: ``ctx``'s, when already built."""

    def at(micros: Micros | None) -> dt.datetime | None:
        return None if micros is None else instant_at(epoch, micros)

    return ModelRecord(
        key=ctx.record_key if record_key is None else record_key,
        status=_STATUSES.get(view.status) or S(view.status),
        attempt=view.attempt,
        locked_until=at(view.locked_until),
        data=None if view.data is None else _encoded(view.data),
        error_detail=None if view.audit is None else view.audit[0],
        entity_execution_id="" if view.audit is None else view.audit[2],
        source_app_id="" if view.audit is None else view.audit[1],
        created_at=instant_at(epoch, view.created_at),
        updated_at=instant_at(epoch, view.updated_at),
        retain_until=at(view.retain_until),
    )


@functools.lru_cache(maxsize=4096)
def _encoded(digest: str) -> str | None:
    """The model's stored form of a payload known by its digest (the same few, over and over)."""
    return encode_data(_marked(digest))


def _marked(digest: str | None) -> dict[str, str] | None:
    """A payload the model can store and compare in place of the one its digest stands for."""
    return None if digest is None else {_MARK: digest}


def _digest(data: str | None) -> str | None:
    """The digest a model payload stands for (the inverse of :func:`_marked`)."""
    return None if data is None else _digest_of(data)


@functools.lru_cache(maxsize=4096)
def _digest_of(data: str) -> str | None:
    decoded = json.loads(data)
    if isinstance(decoded, dict) and set(decoded) == {_MARK}:
        return str(decoded[_MARK])
    return data


def _same(a: Micros | None, b: Micros | None) -> bool:
    """Two instants are the same only to the microsecond (they are exact)."""
    return a == b


def _instant(value: Micros | None) -> str:
    return "none" if value is None else fmt(value)


def _label(view: RecordView | None) -> str:
    if view is None:
        return "that did not exist"
    lock = "" if view.locked_until is None else f", locked until {fmt(view.locked_until)}"
    return f"{view.status} (attempt {view.attempt}{lock})"
