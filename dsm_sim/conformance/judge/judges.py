"""The judges: given the handler's and the model's answers, which property broke?

Every check the state machine makes compares the handler's answer with the
reference model's answer for the same call at the same instant.  When they
differ, a judge names the property the difference violates and says so in
one sentence a handler author can act on ("worker 2 acquired INV-1 while
worker 1's lock was still live until 09:30:00").  The order of the checks in
each judge is the diagnosis: the most specific explanation wins.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from dsm_sim.conformance.generate.payloads import data_difference
from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile, truncate
from dsm_sim.conformance.properties import ISOLATION, Finding
from dsm_sim.conformance.reading import at, offset
from dsm_sim.model import (
    ItemRef,
    ModelRecord,
    Outcome,
    describe_config,
    effective_status,
    joined_alike,
)
from reference_engine.context import RecordKey
from reference_engine.errors import DsmError, ForbiddenTransitionError, LockError, StaleLockError
from reference_engine.record import StateRecord
from reference_engine.status import COMPLETED, TRANSITIONS, IdempotencyStatus, is_allowed

__all__ = [
    "isolation_siblings",
    "judge_acquire",
    "judge_exists",
    "judge_isolation",
    "judge_race",
    "judge_record",
    "judge_retention_sweep",
    "judge_sweep",
    "judge_transition",
    "record_checks",
    "short_data",
]

S = IdempotencyStatus


def short_data(value: object) -> str:
    """A payload or error detail as a story shows it: escapes visible, long ones cut."""
    text = ascii(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text)} characters)"


def _length(text: str | None) -> str:
    return "" if text is None or len(text) < 60 else f" ({len(text)} characters)"


def _early(locked_until: dt.datetime | None, now: dt.datetime) -> str:
    """How early a take-over came: the size of the deviation, not only its sign."""
    if locked_until is None:
        return ""
    early = locked_until - now
    if early == dt.timedelta(0):
        return " (taken over on the expiry instant itself, where the lock is still live)"
    return f" (taken over {offset(early).lstrip('+')} early)"


def _who(worker: int | None) -> str:
    return "another worker" if worker is None else f"worker {worker}"


def judge_exists(
    ref: ItemRef,
    worker: int,
    got: Outcome,
    want: Outcome,
    record: ModelRecord | None,
    now: dt.datetime,
) -> Finding | None:
    if got.agrees_with(want):
        return None
    status = effective_status(record, now).label
    if got.error is not None:
        return Finding(
            "errors_agree_with_model",
            f"worker {worker}'s exists({ref.label}) raised {got.describe()}; the item is "
            f"{status} and exists must answer {want.value}",
        )
    return Finding(
        "exists_agrees_with_model",
        f"worker {worker}'s exists({ref.label}) answered {got.value} at {at(now)}, but the item "
        f"is {status}: exists is True only for Processed and Skipped",
    )


def judge_acquire(
    ref: ItemRef,
    worker: int,
    got: Outcome,
    want: Outcome,
    record: ModelRecord | None,
    holder: int | None,
    now: dt.datetime,
    *,
    tokens: str = "attempts",
) -> Finding | None:
    """``record`` is the model's record before the call; ``holder`` its lock holder.

    ``tokens`` is the rule the tokens are judged by (``dsm verify --tokens``): a
    grant larger than the attempt number it should be is, under ``attempts``,
    what a store that fences with its own sequence answers, and the finding
    says which option verifies such a store.
    """
    if got.agrees_with(want):
        return None
    source = effective_status(record, now)
    if got.error is not None:
        expected = want.describe_grant()
        if tokens != "attempts" and isinstance(want.value, int):
            expected = f"a token above the item's earlier ones (its attempt {want.value})"
        return Finding(
            "errors_agree_with_model",
            f"worker {worker}'s try_acquire_lock({ref.label}) raised {got.describe()}: "
            f"{got.error}; it must return {expected} (item is {source.label})",
        )
    if got.value is not None and want.value is None:
        if _live(record, now):
            assert record is not None
            return Finding(
                "at_most_one_live_lock",
                f"worker {worker} acquired {ref.name} at {at(now)} while {_who(holder)}'s "
                f"lock was still live until {at(record.locked_until)}"
                f"{_early(record.locked_until, now)}",
            )
        if source in COMPLETED or source is S.SUPERSEDED:
            return Finding(
                "allowed_transitions_only",
                f"worker {worker} acquired {ref.label} at {at(now)} although it is "
                f"{source.label}: {source.label} -> Processing is not an allowed transition, "
                "and the finished work would run again",
            )
    if got.value is None and want.value is not None:
        return Finding(
            "acquire_agrees_with_model",
            f"worker {worker}'s try_acquire_lock({ref.label}) was refused at {at(now)}, but the "
            f"item is {source.label}, which may be acquired (expected token {want.value})",
        )
    return Finding(
        "acquire_agrees_with_model",
        f"worker {worker}'s try_acquire_lock({ref.label}) returned {got.describe_grant()} at "
        f"{at(now)}; expected {want.describe_grant()} (a new record gets token 1, a retry the "
        f"previous attempt + 1){_sequence_hint(got, want, tokens)}",
    )


def _sequence_hint(got: Outcome, want: Outcome, tokens: str) -> str:
    """For a grant above the attempt number: the option that judges a store's own sequence."""
    if tokens != "attempts" or not isinstance(got.value, int) or not isinstance(want.value, int):
        return ""
    if isinstance(got.value, bool) or got.value <= want.value:
        return ""
    return (
        ". A store that fences with a value of its own that grows with every grant of an "
        "item (a sequence, a rowversion, a timestamp) is verified with --tokens ordered, "
        "which judges the tokens by their order per item"
    )


def _live(record: ModelRecord | None, now: dt.datetime) -> bool:
    return (
        record is not None
        and record.status is S.PROCESSING
        and record.locked_until is not None
        and now <= record.locked_until
    )


def judge_race(
    ref: ItemRef,
    winners: Mapping[int, Outcome],
    want: Outcome,
    record: ModelRecord | None,
    holder: int | None,
    now: dt.datetime,
    *,
    tokens: str = "attempts",
) -> Finding | None:
    """Several workers acquired concurrently: at most one may win, and one must if it can."""
    granted = {w: o.value for w, o in winners.items() if o.error is None and o.value is not None}
    if len(granted) > 1:
        who = " and ".join(f"worker {w} (token {t})" for w, t in sorted(granted.items()))
        return Finding(
            "at_most_one_live_lock",
            f"{who} all acquired {ref.label} concurrently at {at(now)}; only one may hold the lock",
        )
    for worker, outcome in sorted(winners.items()):
        if outcome.error is not None:
            return judge_acquire(ref, worker, outcome, want, record, holder, now, tokens=tokens)
    if granted:
        worker, token = next(iter(granted.items()))
        return judge_acquire(ref, worker, Outcome(token), want, record, holder, now, tokens=tokens)
    if want.value is not None:
        return Finding(
            "acquire_agrees_with_model",
            f"workers {', '.join(str(w) for w in sorted(winners))} raced for {ref.label} at "
            f"{at(now)} and none acquired it, although it is "
            f"{effective_status(record, now).label}; exactly one must win",
        )
    return None


def judge_write(
    operation: str,
    ref: ItemRef,
    worker: int,
    token: int | None,
    got: Outcome,
    want: Outcome,
    record: ModelRecord | None,
    now: dt.datetime,
    *,
    spent_by: str | None = None,
    fenced: bool = True,
) -> Finding | None:
    """A set/release/upsert: the handler must accept or refuse it exactly as the model does.

    ``spent_by`` names the caller's own earlier write that landed with this
    token while its reply was lost: the token is spent, not stale.
    ``fenced=False``: the interface's writes carry no token (the seed's), so a
    write the spec refuses for want of the lock that lands is reported under
    ``stale_write_rejected`` (the profile's hazard), and one refused with
    another lock or transition error is a refusal all the same.
    """
    if got.agrees_with(want):
        return None
    if not fenced and isinstance(want.error, LockError):
        if got.error is None:
            now_holds = (
                "there is no record"
                if record is None
                else f"the record is {effective_status(record, now).label} with token "
                f"{record.attempt}"
            )
            return Finding(
                "stale_write_rejected",
                f"worker {worker}'s {operation} on {ref.name} at {at(now)} "
                f"({'token ' + str(token) if token is not None else 'no token'}) landed, but "
                f"{now_holds}: the spec refuses it with {want.describe()}, and the store, "
                "given no token, cannot tell this caller from the holder",
            )
        if isinstance(got.error, LockError | ForbiddenTransitionError):
            return None  # refused, as the spec refuses it; the records read back say nothing landed
    if (
        spent_by is not None
        and isinstance(want.error, StaleLockError)
        and not isinstance(got.error, StaleLockError)
    ):
        fate = "accepted" if got.error is None else f"refused with {got.describe()}"
        status = "gone" if record is None else record.status.label
        harm = (
            ": Processed -> Failed hands finished work to the next delivery, a second charge"
            if record is not None and record.status is S.PROCESSED and "release" in operation
            else ""
        )
        return Finding(
            "spent_token_rejected",
            f"worker {worker}'s {operation} on {ref.name} at {at(now)} with token {token} was "
            f"{fate}, but its own {spent_by} with that token had already landed (the reply "
            f"was lost) and the record is {status}: a spent token asking for another outcome "
            f"must raise StaleLockError and change nothing{harm}",
        )
    if spent_by is not None and want.error is None and got.error is not None:
        return Finding(
            "spent_token_rejected",
            f"worker {worker}'s {operation} on {ref.name} at {at(now)} with token {token} was "
            f"refused with {got.describe()}, but the record already shows the outcome it asks "
            f"for, written by its own {spent_by} with that token (the reply was lost): a retry "
            "that finds its own outcome stored must succeed and change nothing",
        )
    if isinstance(want.error, StaleLockError) and not isinstance(got.error, StaleLockError):
        fate = "accepted" if got.error is None else f"refused with {got.describe()}"
        now_holds = (
            "the record is gone"
            if record is None
            else f"the record is now {record.status.label} with token {record.attempt}"
        )
        how = (
            "the retention sweep expired it"
            if record is not None and record.status is S.EXPIRED
            else "its lock was swept or taken over"
        )
        return Finding(
            "stale_write_rejected",
            f"worker {worker}'s {operation} on {ref.name} at {at(now)} with token {token} was "
            f"{fate}, but {now_holds} ({how}): the write must raise StaleLockError",
        )
    detail = (
        f": {got.error}" if got.error is not None and not isinstance(got.error, DsmError) else ""
    )
    return Finding(
        "errors_agree_with_model",
        f"worker {worker}'s {operation} on {ref.label} at {at(now)} "
        f"({'token ' + str(token) if token is not None else 'no token'}) came to "
        f"{got.describe()}{detail}; the spec says {want.describe()} (item is "
        f"{effective_status(record, now).label})",
    )


def _local_offset(
    instant: dt.datetime, moved: dt.timedelta = dt.timedelta(0)
) -> dt.timedelta | None:
    """The process zone's offset at ``instant + moved``; None past either end of time."""
    try:
        return (instant + moved).astimezone().utcoffset()
    except (OverflowError, ValueError, OSError):
        return None


def _zone_shift(
    delta: dt.timedelta,
    at_instant: dt.datetime | None = None,
    written: dt.timedelta | None = None,
) -> bool:
    """Is ``delta`` what local wall time labelled UTC is off by?

    The process zone's own offset at that instant (or at the instant the
    value was written, ``delta`` earlier), or the size of its daylight-saving
    change between the two; or whole hours (a server in another zone) when
    the record's ``updated_at`` is off by the same (``written``): a zone
    shifts every instant it stamps alike.  Whole hours in one field alone
    are no zone: a lock taken over an hour early is off by an hour in UTC too.
    """
    if at_instant is None or delta == dt.timedelta(0):
        return False
    seconds = delta.total_seconds()
    if seconds % 3600 == 0 and abs(seconds) <= 14 * 3600 and written == delta:
        return True
    offsets = {_local_offset(at_instant), _local_offset(at_instant, -delta)} - {
        None,
        dt.timedelta(0),
    }
    if any(abs(delta) == abs(local) for local in offsets if local is not None):
        return True
    if len(offsets) == 2:
        first, second = sorted(o for o in offsets if o is not None)
        return abs(delta) == second - first
    return False


def _shift_cause(delta: dt.timedelta, expected: dt.datetime, written: dt.datetime) -> str:
    """Why an instant is off by a zone shift: which kind of local-time arithmetic does that.

    When the process zone's offset changed between the write and the instant
    (a daylight-saving change in between) and the error is that change, the
    end was computed as naive local now plus the duration; else local wall
    time was written as if it were UTC.
    """
    start, end = _local_offset(written), _local_offset(expected)
    if start is not None and end is not None and start != end and abs(delta) == abs(end - start):
        return (
            "naive local time plus the duration, across the zone's daylight-saving change "
            f"({offset(start)} to {offset(end)})"
        )
    return "local wall time stored as UTC"


def _naive_or_shifted(record: StateRecord) -> str | None:
    for name in ("locked_until", "created_at", "updated_at", "retain_until"):
        value = getattr(record, name)
        if value is None:
            continue
        if not isinstance(value, dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
            return f"{name} is {value!r}, a naive value"
        if value.utcoffset() != dt.timedelta(0):
            return f"{name} is {value.isoformat()}, not in UTC"
    return None


#: The type each field of a record must have, and whether it may be None.
_FIELD_TYPES: tuple[tuple[str, type | tuple[type, ...], bool], ...] = (
    ("key", RecordKey, False),
    ("status", IdempotencyStatus, False),
    ("attempt", int, False),
    ("locked_until", dt.datetime, True),
    ("data", Mapping, True),
    ("error_detail", str, True),
    ("entity_execution_id", str, False),
    ("source_app_id", str, False),
    ("created_at", dt.datetime, False),
    ("updated_at", dt.datetime, False),
    ("retain_until", dt.datetime, True),
)


def malformed(record: object) -> str | None:
    """What is wrong with the shape of a record a handler returned, or None.

    A record whose key is a text, or whose attempt is a text, cannot be
    compared field by field: it is a finding of its own, never a crash.
    """
    for name, kind, optional in _FIELD_TYPES:
        value = getattr(record, name, _MISSING)
        if value is _MISSING:
            return f"{name} is missing"
        if value is None and optional:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{name} is {type(value).__name__} {value!r:.80}"
    return None


_MISSING = object()


def malformed_finding(ref: ItemRef, record: object) -> Finding | None:
    """A record ``get`` returned with a field of the wrong type, as a finding (or None)."""
    wrong = malformed(record)
    if wrong is None:
        return None
    return Finding(
        "record_agrees_with_model",
        f"get({ref.label}) returned a record whose {wrong}; each field of a StateRecord "
        "has the contract's type (a store that keeps the record and its payload in one "
        "document must not let a payload field stand for a record field)",
    )


def judge_record(
    ref: ItemRef,
    got: StateRecord | None,
    want: ModelRecord | None,
    now: dt.datetime,
    *,
    has_history: bool,
    semantics: SemanticsProfile = DSM,
    tokens: str = "attempts",
) -> Finding | None:
    """Compare ``get`` with the model's current record, field by field, most telling first.

    Instants are compared at the resolutions ``semantics`` stores them in, and
    the audit fields only when it stores them.  The record's ``attempt``
    counts the item's acquisitions under either ``tokens`` rule; under
    ``ordered`` it is not the fencing token, and a finding on it says so.
    """
    if got is None and want is None:
        return None
    if got is not None and (shape := malformed_finding(ref, got)) is not None:
        return shape
    if got is not None and want is not None and not semantics.strict:
        got = _at_resolution(got, semantics)
        want = _model_at_resolution(want, semantics)
    if got is None or want is None:
        what = "no record" if got is None else f"a {got.status.label} record"
        expected = "none" if want is None else f"{want.status.label} (token {want.attempt})"
        return Finding(
            "record_agrees_with_model",
            f"get({ref.label}) returned {what} at {at(now)}; expected {expected}",
        )
    if (problem := _naive_or_shifted(got)) is not None:
        return Finding("timestamps_in_utc", f"get({ref.label}): {problem}; store aware UTC")
    if got.key != want.key:
        if got.key.tenant_id != want.key.tenant_id:
            kind = "tenant"
        elif got.key.scope_id != want.key.scope_id:
            kind = "scope"
        elif got.key.item_key != want.key.item_key or _split_differently(got, want):
            kind = "key"
        else:
            kind = "entity"
        return Finding(
            ISOLATION[kind],
            f"get({ref.label}) returned the record keyed {got.key}; the key must carry "
            "tenant, scope, entity, item entity key and item key, each exactly as given",
        )
    if got.status is not want.status:
        if want.status in (S.PROCESSED, S.FAILED) and got.status is S.PROCESSING:
            return Finding(
                "completion_releases_lock",
                f"{ref.label} is still Processing (locked until {at(got.locked_until)}) after "
                f"it was completed as {want.status.label}; the item stays locked",
            )
        return Finding(
            "record_agrees_with_model",
            f"{ref.label} is {got.status.label} at {at(now)}; expected {want.status.label}",
        )
    if got.locked_until != want.locked_until:
        if want.locked_until is None:
            return Finding(
                "completion_releases_lock",
                f"{ref.label} is {got.status.label} but still carries locked_until "
                f"{at(got.locked_until)}; completing or releasing must clear the lock",
            )
        if got.locked_until is None:
            return Finding(
                "record_agrees_with_model",
                f"{ref.label} is Processing without locked_until; expected {at(want.locked_until)}",
            )
        delta = got.locked_until - want.locked_until
        if _zone_shift(delta, want.locked_until, got.updated_at - want.updated_at):
            return Finding(
                "timestamps_in_utc",
                f"{ref.label} is locked until {at(got.locked_until)}, {offset(delta)} off the "
                f"expected {at(want.locked_until)}: "
                + _shift_cause(delta, want.locked_until, want.updated_at),
            )
        return Finding(
            "lock_duration_honoured",
            f"{ref.label} is locked until {at(got.locked_until)}, {offset(delta)} off: the "
            f"lock taken at {at(want.updated_at)} must last the node's lock duration "
            f"({describe_config(ref.config)}), until {at(want.locked_until)}",
        )
    if got.attempt != want.attempt:
        if tokens != "attempts":
            return Finding(
                "record_agrees_with_model",
                f"{ref.label} carries attempt {got.attempt}; expected {want.attempt}: under "
                "--tokens ordered the record's attempt still counts the item's acquisitions "
                "(1 for a new record, the previous attempt + 1 for each acquisition after it, "
                "0 for a skip, kept by an upsert), and the fencing token the store grants is "
                "kept apart from it, not written into attempt",
            )
        return Finding(
            "record_agrees_with_model",
            f"{ref.label} carries attempt (fencing token) {got.attempt}; expected {want.attempt}",
        )
    want_data = want.to_state_record().data
    if (got.data is None) != (want_data is None):
        return Finding(
            "data_round_trip",
            f"get({ref.label}) returned {'no data' if got.data is None else 'data'}; "
            f"{'no data was written' if want_data is None else 'data was written'}",
        )
    if got.data is not None and (diff := data_difference(want_data, got.data)) is not None:
        return Finding(
            "data_round_trip",
            f"get({ref.label}) does not return the data written: {diff}",
        )
    if got.error_detail != want.error_detail:
        return Finding(
            "record_agrees_with_model",
            f"{ref.label} has error_detail {short_data(got.error_detail)}"
            f"{_length(got.error_detail)}; expected {short_data(want.error_detail)}"
            f"{_length(want.error_detail)}",
        )
    for name in ("retain_until", "created_at", "updated_at")[: 3 if semantics.audit_fields else 1]:
        have, expect = getattr(got, name), getattr(want, name)
        if have == expect:
            continue
        if name == "created_at" and has_history and have is not None and expect is not None:
            return Finding(
                "upsert_keeps_history",
                f"{ref.label}'s current record was created at {at(have)}, but an upsert at "
                f"{at(expect)} must have superseded it and inserted a new record",
            )
        if (
            have is not None
            and expect is not None
            and _zone_shift(have - expect, expect, got.updated_at - want.updated_at)
        ):
            return Finding(
                "timestamps_in_utc",
                f"{ref.label}'s {name} is {at(have)}, {offset(have - expect)} off the expected "
                f"{at(expect)}: " + _shift_cause(have - expect, expect, want.updated_at),
            )
        off = f" ({offset(have - expect)} off)" if have is not None and expect is not None else ""
        return Finding(
            "record_agrees_with_model",
            f"{ref.label}'s {name} is {at(have)}; expected {at(expect)}{off}",
        )
    if semantics.audit_fields and (
        got.entity_execution_id != want.entity_execution_id
        or got.source_app_id != want.source_app_id
    ):
        return Finding(
            "record_agrees_with_model",
            f"{ref.label} was last written by {got.entity_execution_id}/{got.source_app_id}; "
            f"expected {want.entity_execution_id}/{want.source_app_id}",
        )
    return None


def _cut(instant: dt.datetime | None, resolution: dt.timedelta) -> dt.datetime | None:
    return None if instant is None else truncate(instant, resolution)


def _at_resolution(record: StateRecord, semantics: SemanticsProfile) -> StateRecord:
    return dataclasses.replace(
        record,
        locked_until=_cut(record.locked_until, semantics.lock_resolution),
        retain_until=_cut(record.retain_until, semantics.stored_retention_resolution),
    )


def _model_at_resolution(record: ModelRecord, semantics: SemanticsProfile) -> ModelRecord:
    return dataclasses.replace(
        record,
        locked_until=_cut(record.locked_until, semantics.lock_resolution),
        retain_until=_cut(record.retain_until, semantics.stored_retention_resolution),
    )


def _split_differently(got: StateRecord, want: ModelRecord) -> bool:
    """The same text, cut elsewhere between the item entity key and the item key."""
    return (
        got.key.item_entity_key + got.key.item_key == want.key.item_entity_key + want.key.item_key
    )


def _looks_like(got: StateRecord, want: ModelRecord | None) -> bool:
    """Is ``got`` the record ``want`` stands for?  Its creation instant tells two items'
    records apart when everything else about them is alike (items that went through
    the same steps at different times)."""
    return (
        want is not None
        and got.status is want.status
        and got.attempt == want.attempt
        and got.entity_execution_id == want.entity_execution_id
        and got.locked_until == want.locked_until
        and (got.created_at == want.created_at or _naive_or_shifted(got) is not None)
    )


def judge_isolation(
    ref: ItemRef,
    handler_view: Mapping[ItemRef, StateRecord | None],
    model_view: Mapping[ItemRef, ModelRecord | None],
) -> Finding | None:
    """Does ``ref``'s record look like a sibling's (same item, other tenant, scope or entity)?"""
    got = handler_view.get(ref)
    if got is None:
        return None
    own = model_view.get(ref)
    if _looks_like(got, own) and got.key == ref.record_key:
        return None
    for other, want in model_view.items():
        kind = ref.sibling_of(other)
        if kind is None or want is None:
            continue
        borrowed = got.key == other.record_key or (
            _looks_like(got, want) and not _looks_like(got, own)
        )
        if borrowed:
            if kind == "split":
                joiner = joined_alike(ref, other)
                what = (
                    f"the key's parts read the same joined with {joiner!r}; a store must keep "
                    "tenant, entity, item entity key and item key apart (or escape the joiner)"
                )
            elif kind == "key":
                what = "distinct keys must never share a record"
            else:
                what = f"the {kind} must be part of the key"
            return Finding(
                ISOLATION[kind],
                f"{ref.label} shows {other.label}'s record ({want.status.label}, token "
                f"{want.attempt}, written by {want.entity_execution_id}): {what}",
            )
    return None


def judge_transition(
    ref: ItemRef,
    before: StateRecord | None,
    after: StateRecord | None,
    now: dt.datetime,
    operation: str,
    steps: int = 1,
    *,
    may_vanish: bool = False,
    kept: ModelRecord | None = None,
) -> Finding | None:
    """A record the step changed must have moved along the transition table.

    A step that raced ``steps`` calls may move a record that many transitions.
    ``may_vanish``: the semantics delete records and the model has none now
    either, so a record that disappeared is no transition to judge.  ``kept``:
    under such semantics, the record the model still holds (a lost record).
    """
    # A rewrite that keeps the status is no transition; the record judge weighs its fields.
    if before is None or (after is not None and after.status is before.status):
        return None
    if after is None and may_vanish:
        return None
    if after is None and kept is not None:
        return Finding(
            "allowed_transitions_only",
            f"{operation} made {ref.label}'s {before.status.label} record disappear at "
            f"{at(now)}, but it is still {kept.status.label} with token {kept.attempt} "
            f"(written by {kept.entity_execution_id}): the record of the worker that holds the "
            "item was lost, so the next caller starts the work again",
        )
    if after is None:
        return Finding(
            "allowed_transitions_only",
            f"{operation} made {ref.label}'s {before.status.label} record disappear",
        )
    source = effective_status(before, now)
    target = after.status
    if _reachable(before.status, target, steps) or _reachable(source, target, steps):
        return None
    if target is S.PROCESSED and operation == "upsert" and is_allowed(source, S.PROCESSING):
        return None  # the compressed acquire-and-complete
    return Finding(
        "allowed_transitions_only",
        f"{operation} moved {ref.label} from {source.label} to {target.label} at {at(now)}; "
        "the transition table does not allow it",
    )


def _reachable(source: IdempotencyStatus, target: IdempotencyStatus, steps: int) -> bool:
    frontier = {source}
    for _ in range(max(steps, 1)):
        frontier = {nxt for status in frontier for nxt in TRANSITIONS[status]}
        if target in frontier:
            return True
    return False


def judge_sweep(
    swept: Mapping[ItemRef, tuple[StateRecord | None, StateRecord | None]],
    got: Outcome,
    want: Outcome,
    now: dt.datetime,
) -> Finding | None:
    """``swept`` maps each item to the handler's record before and after the sweep."""
    for ref, (before, after) in swept.items():
        if before is None or after is None:
            continue
        changed = after.status is not before.status or after.locked_until != before.locked_until
        expired = (
            before.status is S.PROCESSING
            and before.locked_until is not None
            and before.locked_until < now
        )
        if changed and not expired:
            why = (
                f"its lock was live until {at(before.locked_until)}"
                if before.status is S.PROCESSING
                else f"it was {before.status.label}"
            )
            return Finding(
                "sweep_only_expired",
                f"the lock sweep at {at(now)} changed {ref.label} to {after.status.label} "
                f"although {why}",
            )
        if expired and (after.status is not S.FAILED or after.locked_until is not None):
            return Finding(
                "sweep_resets_expired",
                f"the lock sweep at {at(now)} left {ref.label} {after.status.label} (locked "
                f"until {at(after.locked_until)}); its lock expired at {at(before.locked_until)}",
            )
    if got.agrees_with(want):
        return None
    if got.error is not None or not isinstance(got.value, int) or not isinstance(want.value, int):
        return Finding(
            "errors_agree_with_model",
            f"reset_expired_locks() at {at(now)} came to {got.describe()}; expected {want.value}",
        )
    name = "sweep_only_expired" if got.value > want.value else "sweep_resets_expired"
    return Finding(
        name,
        f"reset_expired_locks() at {at(now)} reported {got.value} resets; expected {want.value}",
    )


def judge_retention_sweep(
    got: Outcome, want: Outcome, history_expired: int, now: dt.datetime
) -> Finding | None:
    """Counts must agree; superseded history rows count too.

    A wrong count is the sweep's own finding, whatever the rows it left out:
    the upserts that wrote the history rows were judged when they ran.
    """
    if got.agrees_with(want):
        return None
    if got.error is not None or not isinstance(got.value, int) or not isinstance(want.value, int):
        return Finding(
            "errors_agree_with_model",
            f"expire_past_retention() at {at(now)} came to {got.describe()}; expected {want.value}",
        )
    rows = f" ({history_expired} of them superseded history rows)" if history_expired else ""
    return Finding(
        "retention_sweep_agrees_with_model",
        f"expire_past_retention() at {at(now)} expired {got.value} records; expected "
        f"{want.value}{rows}",
    )


def isolation_siblings(ref: ItemRef, world: Iterable[ItemRef]) -> dict[ItemRef, str]:
    """The items of ``world`` a store could mix ``ref`` up with, and the property each tests."""
    found: dict[ItemRef, str] = {}
    for other in world:
        kind = ref.sibling_of(other)
        if kind is not None:
            found[other] = ISOLATION[kind]
    return found


def record_checks(
    ref: ItemRef,
    model_view: Mapping[ItemRef, ModelRecord | None],
    siblings: Mapping[ItemRef, str] | None = None,
) -> list[str]:
    """The properties one comparison of ``ref``'s record can decide, for check counts.

    ``siblings`` is :func:`isolation_siblings` of ``ref`` in the world of
    ``model_view``, when the caller keeps it: a machine compares every item
    after every step, and the world changes far less often.
    """
    want = model_view[ref]
    names = ["record_agrees_with_model"]
    if want is None:
        return names
    names += ["timestamps_in_utc"]
    if want.data is not None:
        names.append("data_round_trip")
    if want.status is S.PROCESSING:
        names.append("lock_duration_honoured")
    if want.status in (S.PROCESSED, S.FAILED) and want.attempt > 0:
        names.append("completion_releases_lock")
    if siblings is None:
        siblings = isolation_siblings(ref, model_view)
    for other, name in siblings.items():
        if model_view.get(other) is not None:
            names.append(name)
    return names
