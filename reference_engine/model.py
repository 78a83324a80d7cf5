"""The reference model: the semantics of ``docs/semantics.md`` as pure, synchronous code.

No I/O and no clock of its own: every operation is given ``now``.  The
in-memory handler wraps it, the conformance kit runs it beside a handler under
test, and the simulator's checker replays histories against it.  When the
document and this module disagree, this module is the bug report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    LockHeldError,
    LockNotHeldError,
    StaleLockError,
)
from reference_engine.record import SETTABLE, StateRecord, check_settable, encode_data, is_lock_live
from reference_engine.status import (
    ACQUIRABLE,
    COMPLETED,
    IdempotencyStatus,
    check_path,
    check_transition,
)

__all__ = [
    "SETTABLE",
    "SWEEP_ERROR_DETAIL",
    "ModelRecord",
    "ReferenceModel",
    "effective_status",
    "require_holder",
    "write_landed",
]

S = IdempotencyStatus

#: Targets that only the lock holder may write.
NEEDS_LOCK = frozenset({S.PROCESSED, S.FAILED})
#: Error detail the expired-lock sweep writes, so an operator can tell a swept
#: lock from a failure the node reported.
SWEEP_ERROR_DETAIL = "lock expired; reset by the catch-up sweep"


@dataclass(slots=True)
class ModelRecord:
    """One stored record (current or superseded) in the model."""

    key: RecordKey
    status: IdempotencyStatus
    attempt: int
    locked_until: dt.datetime | None
    data: str | None
    error_detail: str | None
    entity_execution_id: str
    source_app_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    retain_until: dt.datetime | None

    def to_state_record(self) -> StateRecord:
        decoded: Mapping[str, Any] | None = None if self.data is None else json.loads(self.data)
        return StateRecord(
            key=self.key,
            status=self.status,
            attempt=self.attempt,
            locked_until=self.locked_until,
            data=decoded,
            error_detail=self.error_detail,
            entity_execution_id=self.entity_execution_id,
            source_app_id=self.source_app_id,
            created_at=self.created_at,
            updated_at=self.updated_at,
            retain_until=self.retain_until,
        )


def effective_status(
    record: ModelRecord | StateRecord | None, now: dt.datetime
) -> IdempotencyStatus:
    """The status an operation acts on: an expired, unswept lock counts as Failed."""
    if record is None:
        return S.NONE
    if record.status is S.PROCESSING and not is_lock_live(record.status, record.locked_until, now):
        return S.FAILED
    return record.status


class Fenced(Protocol):
    """What fencing looks at in a stored record, whatever the store."""

    @property
    def status(self) -> IdempotencyStatus: ...

    @property
    def attempt(self) -> int: ...


FencedRecord = TypeVar("FencedRecord", bound=Fenced)


def require_holder(ctx: StateHandlerContext, record: FencedRecord | None) -> FencedRecord:
    """Fencing: a write is the holder's only if the record still carries its token.

    Shared by the model and the stores that decide fencing in Python (the SQL
    handler's error path), so the rule and its error are written once.
    """
    token = ctx.lock_token
    assert token is not None
    if record is None or record.status is not S.PROCESSING or record.attempt != token:
        raise StaleLockError(
            item_key=ctx.item_key,
            token=token,
            current_token=None if record is None else record.attempt,
            status=S.NONE.label if record is None else record.status.label,
        )
    return record


def write_landed(
    record: ModelRecord | StateRecord | None,
    token: int,
    status: IdempotencyStatus,
    *,
    data: str | None = None,
    error_detail: str | None = None,
) -> bool:
    """Whether a fenced write finds its own outcome already stored under its token.

    A worker whose reply was lost retries the write it made; the first one
    landed and ended the lock.  When the record shows exactly what the retry
    asks for (this token, this status, no lock, the same data or none given,
    the same error detail), the write has happened and the retry succeeds
    without changing anything: refusing it would tell the caller a lie (its
    lock was not swept) and repeating it would move ``updated_at``.  Anything
    else (a sweep's Failed, a take-over, a different payload, a release after
    a completion) is still refused by fencing.

    ``data`` is the retry's canonical JSON text; a stored record's data is
    compared in the same canonical form, whatever the store gave back.
    """
    if (
        record is None
        or record.attempt != token
        or record.status is not status
        or record.locked_until is not None
        or record.error_detail != error_detail
    ):
        return False
    if data is None:
        return True
    stored = record.data
    return (stored if stored is None or isinstance(stored, str) else encode_data(stored)) == data


def _retain_until(ctx: StateHandlerContext, now: dt.datetime) -> dt.datetime | None:
    return ctx.handler_config.retain_until(now)


class ReferenceModel:
    """Current records per :class:`RecordKey`, plus the superseded history."""

    def __init__(self) -> None:
        self.current: dict[RecordKey, ModelRecord] = {}
        self.superseded: list[ModelRecord] = []

    # --- reads -------------------------------------------------------------------------------

    def records(self) -> Iterator[ModelRecord]:
        """Every stored record, current first."""
        yield from self.current.values()
        yield from self.superseded

    def get(self, ctx: StateHandlerContext, now: dt.datetime | None = None) -> StateRecord | None:
        """The stored record as it is; reading it needs no clock (``now`` is not used)."""
        record = self.current.get(ctx.record_key)
        return None if record is None else record.to_state_record()

    def exists(self, ctx: StateHandlerContext, now: dt.datetime) -> bool:
        return effective_status(self.current.get(ctx.record_key), now) in COMPLETED

    # --- writes ------------------------------------------------------------------------------

    def try_acquire_lock(self, ctx: StateHandlerContext, now: dt.datetime) -> int | None:
        locked_until = ctx.handler_config.locked_until(now)
        _retain_until(ctx, now)  # an instant past year 9999 is refused before anything else
        key = ctx.record_key
        record = self.current.get(key)
        source = effective_status(record, now)
        if source not in ACQUIRABLE:
            return None
        check_transition(source, S.PROCESSING, item_key=ctx.item_key)
        token = 1 if record is None else record.attempt + 1
        self._write(
            ctx,
            now,
            record,
            status=S.PROCESSING,
            attempt=token,
            locked_until=locked_until,
            error_detail=None,
        )
        return token

    def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None,
        now: dt.datetime,
    ) -> None:
        check_settable(status)
        encoded = encode_data(data)
        _retain_until(ctx, now)
        record = self.current.get(ctx.record_key)
        if ctx.lock_token is not None:
            if write_landed(record, ctx.lock_token, status, data=encoded):
                return
            held = require_holder(ctx, record)
            check_transition(S.PROCESSING, status, item_key=ctx.item_key)
            self._write(ctx, now, held, status=status, data=encoded, locked_until=None)
            return
        self._refuse_live_lock(ctx, record, now)
        if status in NEEDS_LOCK:
            raise LockNotHeldError(item_key=ctx.item_key, operation=f"set({status.label})")
        check_transition(effective_status(record, now), status, item_key=ctx.item_key)
        self._write(
            ctx,
            now,
            record,
            status=status,
            data=encoded,
            locked_until=None,
            attempt=0 if record is None else record.attempt,
        )

    def release_lock_as_failed(
        self, ctx: StateHandlerContext, error_detail: str, now: dt.datetime
    ) -> None:
        if ctx.lock_token is None:
            raise LockNotHeldError(item_key=ctx.item_key, operation="release_lock_as_failed")
        _retain_until(ctx, now)
        record = self.current.get(ctx.record_key)
        if write_landed(record, ctx.lock_token, S.FAILED, error_detail=error_detail):
            return
        held = require_holder(ctx, record)
        check_transition(S.PROCESSING, S.FAILED, item_key=ctx.item_key)
        self._write(ctx, now, held, status=S.FAILED, locked_until=None, error_detail=error_detail)

    def upsert(
        self, ctx: StateHandlerContext, data: Mapping[str, Any] | None, now: dt.datetime
    ) -> None:
        encoded = encode_data(data)
        _retain_until(ctx, now)
        key = ctx.record_key
        record = self.current.get(key)
        if ctx.lock_token is not None:
            if write_landed(record, ctx.lock_token, S.PROCESSED, data=encoded):
                return
            held = require_holder(ctx, record)
            check_transition(S.PROCESSING, S.PROCESSED, item_key=ctx.item_key)
            self._write(ctx, now, held, status=S.PROCESSED, data=encoded, locked_until=None)
            return
        self._refuse_live_lock(ctx, record, now)
        source = effective_status(record, now)
        if source is S.NONE or source in ACQUIRABLE:
            # The happy path compressed: acquire and complete in one step.
            check_path([source, S.PROCESSING, S.PROCESSED], item_key=ctx.item_key)
            self._write(
                ctx,
                now,
                record,
                status=S.PROCESSED,
                data=encoded,
                locked_until=None,
                attempt=1 if record is None else record.attempt + 1,
                error_detail=None,
            )
            return
        check_transition(source, S.SUPERSEDED, item_key=ctx.item_key)
        assert record is not None
        record.status = S.SUPERSEDED
        record.updated_at = now
        self.superseded.append(record)
        del self.current[key]
        self._write(
            ctx,
            now,
            None,
            status=S.PROCESSED,
            data=encoded,
            locked_until=None,
            attempt=record.attempt,
        )

    # --- sweeps ------------------------------------------------------------------------------

    def reset_expired_locks(self, now: dt.datetime) -> int:
        count = 0
        for record in self.current.values():
            if (
                record.status is S.PROCESSING
                and record.locked_until is not None
                and record.locked_until < now
            ):
                record.status = S.FAILED
                record.locked_until = None
                record.error_detail = SWEEP_ERROR_DETAIL
                record.updated_at = now
                count += 1
        return count

    def expire_past_retention(self, now: dt.datetime) -> int:
        return self.expire_where(
            now, lambda record: record.retain_until is not None and record.retain_until < now
        )

    def expire_where(self, now: dt.datetime, past: Callable[[ModelRecord], bool]) -> int:
        """Expire every record ``past`` selects, except Expired ones and live locks.

        The retention sweep is this with ``retain_until < now``; the catalogue
        of broken handlers passes its own wrong selections.
        """
        count = 0
        for record in self.records():
            if (
                past(record)
                and record.status is not S.EXPIRED
                and not is_lock_live(record.status, record.locked_until, now)
            ):
                record.status = S.EXPIRED
                record.locked_until = None
                record.updated_at = now
                count += 1
        return count

    # --- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _refuse_live_lock(
        ctx: StateHandlerContext, record: ModelRecord | None, now: dt.datetime
    ) -> None:
        if record is not None and is_lock_live(record.status, record.locked_until, now):
            raise LockHeldError(item_key=ctx.item_key, locked_until=str(record.locked_until))

    def _write(
        self,
        ctx: StateHandlerContext,
        now: dt.datetime,
        record: ModelRecord | None,
        *,
        status: IdempotencyStatus,
        locked_until: dt.datetime | None,
        data: str | None = None,
        attempt: int | None = None,
        error_detail: str | object | None = ...,
    ) -> None:
        """Insert or update the current record; ``data=None`` keeps the stored data."""
        key = ctx.record_key
        if record is None:
            record = ModelRecord(
                key=key,
                status=status,
                attempt=attempt or 0,
                locked_until=locked_until,
                data=data,
                error_detail=None,
                entity_execution_id=ctx.entity_execution_id,
                source_app_id=ctx.source_app_id,
                created_at=now,
                updated_at=now,
                retain_until=_retain_until(ctx, now),
            )
            if isinstance(error_detail, str):
                record.error_detail = error_detail
            self.current[key] = record
            return
        record.status = status
        record.locked_until = locked_until
        if attempt is not None:
            record.attempt = attempt
        if data is not None:
            record.data = data
        if error_detail is not ...:
            record.error_detail = error_detail if isinstance(error_detail, str) else None
        record.entity_execution_id = ctx.entity_execution_id
        record.source_app_id = ctx.source_app_id
        record.updated_at = now
        record.retain_until = _retain_until(ctx, now)


def replace_record(record: ModelRecord, **changes: Any) -> ModelRecord:
    """A copy with fields changed, for tests and the catalogue of broken handlers."""
    return dataclasses.replace(record, **changes)
