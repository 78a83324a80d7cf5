"""What the model judge needs to judge a call under a semantics profile.

The judge replays each call from the record the store held right before it
(:mod:`dsm_sim.checker.model_judge`).  Under the spec that record is all the
reference model needs; a :class:`~dsm_sim.conformance.judge.semantics.ProfiledModel`
also needs a little of the key's past, which the calls before it show: the
last token handed out (a library that deletes records keeps counting across
the delete), a take-over guard still up, and when the record was last
written (a library that stores ``retain_until`` coarser than its TTL applies
it keeps the exact end only in its store).  Under :data:`~dsm_sim.conformance.
semantics.DSM` none of this is computed and the judge is unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from dsm_sim.conformance.judge.semantics import ProfiledModel, SemanticsProfile, truncate
from dsm_sim.history import History, KeyInfo, OpName, RecordView
from dsm_sim.micros import MICROSECOND, Micros, micros_of, micros_since
from reference_engine.context import StateHandlerContext
from reference_engine.model import ModelRecord, ReferenceModel, effective_status
from reference_engine.status import IdempotencyStatus

__all__ = ["Past", "at_resolution", "exact_retention", "model_for", "pasts", "status_at"]

S = IdempotencyStatus


@dataclass(frozen=True, slots=True)
class Past:
    """What a profiled model must know of a key's past before a call.

    The last token handed out, a take-over guard still up, and when the
    record was last written: a library that stores the end of retention
    coarser than it applies it (a TTL) keeps the exact end only in its store.
    """

    last_token: int | None = None
    guard_until: dt.datetime | None = None
    written: Micros | None = None


def pasts(history: History, semantics: SemanticsProfile) -> dict[int, Past]:
    """Per call (by index), the key's past a profiled model needs, read from the calls before.

    The last token is the highest the store showed or granted on the key so
    far; a take-over guard goes up when an acquisition took an expired lock
    over (the record was Processing before and carries a new attempt after).
    """
    last: dict[str, int] = {}
    guards: dict[str, dt.datetime] = {}
    written: dict[str, Micros] = {}
    found: dict[int, Past] = {}
    guard = semantics.takeover_guard
    ordered = sorted((op for op in history.ops if op.seq is not None), key=lambda o: o.seq or 0)
    for op in ordered:
        if op.op.is_sweep or not op.key:
            continue
        key = op.key
        found[op.index] = Past(last.get(key), guards.get(key), written.get(key))
        if (
            op.op.is_write
            and op.probed
            and op.store_time is not None
            and op.after is not None
            and op.after != op.before
        ):
            written[key] = op.store_time
        seen = [v.attempt for v in (op.before, op.after) if v is not None and v.key == key]
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.ok and type(op.result) is int:
            seen.append(op.result)
        if seen:
            last[key] = max([*seen, last.get(key, 0)])
        before, after = op.before, op.after
        if (
            guard is not None
            and op.op is OpName.TRY_ACQUIRE_LOCK
            and op.store_time is not None
            and before is not None
            and after is not None
            and before.status == after.status == S.PROCESSING.value
            and before.attempt != after.attempt
        ):
            taken = truncate(history.instant(op.store_time), semantics.retention_resolution)
            guards[key] = taken + guard
    return found


def exact_retention(
    history: History,
    info: KeyInfo,
    record: ModelRecord,
    semantics: SemanticsProfile,
    past: Past | None,
) -> ModelRecord:
    """``record`` (read from the store) with the exact end of retention its last write set.

    A library storing ``retain_until`` coarser than its TTL applies it shows
    only the cut value; the write instant plus the retention (in the
    library's unit) is the exact one, when it cuts to the stored value.
    """
    if past is None or past.written is None or record.retain_until is None:
        return record
    if info.retention is None:
        return record
    retention = dt.timedelta(microseconds=micros_of(info.retention))
    unit = semantics.retention_unit
    if unit > MICROSECOND:
        retention -= retention % unit
    exact = history.instant(past.written) + retention
    if truncate(exact, semantics.stored_retention_resolution) != record.retain_until:
        return record
    return dataclasses.replace(record, retain_until=exact)


def model_for(
    semantics: SemanticsProfile, ctx: StateHandlerContext, past: Past | None
) -> ReferenceModel:
    """The model a call is judged by: the spec's, or the profile's with the key's past."""
    if semantics.strict:
        return ReferenceModel()
    model = ProfiledModel(semantics)
    if past is not None:
        if past.last_token is not None:
            model.last_token[ctx.record_key] = past.last_token
        if past.guard_until is not None:
            model.guard_until[ctx.record_key] = past.guard_until
    return model


def status_at(stored: ModelRecord | None, now: dt.datetime, semantics: SemanticsProfile) -> S:
    """The status the record had at ``now``, an ended lock as Failed, by the profile's rule."""
    if stored is None:
        return S.NONE
    if semantics.strict or stored.status is not S.PROCESSING:
        return effective_status(stored, now)
    return S.PROCESSING if semantics.lock_live(stored.locked_until, now) else S.FAILED


def at_resolution(
    view: RecordView | None, history: History, semantics: SemanticsProfile
) -> RecordView | None:
    """``view`` with its lock end and end of retention cut to the resolutions the library stores."""
    if view is None:
        return None

    def cut(micros: Micros | None, resolution: dt.timedelta) -> Micros | None:
        if micros is None:
            return None
        return micros_since(truncate(history.instant(micros), resolution), history.epoch)

    return dataclasses.replace(
        view,
        locked_until=cut(view.locked_until, semantics.lock_resolution),
        retain_until=cut(view.retain_until, semantics.stored_retention_resolution),
    )
