"""Handlers with one realistic bug each, written for these tests and unknown to the catalogue.

They prove the scenarios' reach: each bug must be caught end to end through
the real nodes and the checker.  Every class overrides as little as possible
of the in-memory handler, so the bug its docstring names is the only
difference from the reference.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

from dsm_sim.broken.handlers import KeyRoutingHandler
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import effective_status
from reference_engine.status import IdempotencyStatus

S = IdempotencyStatus
_TICK = dt.timedelta(microseconds=1)


class AlwaysThirtyMinuteLocks(InMemoryStateHandler):
    """Ignores the node's configured lock duration: every lock lasts the default 30 minutes."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        config = dataclasses.replace(ctx.handler_config, lock_duration=dt.timedelta(minutes=30))
        return self.model.try_acquire_lock(
            dataclasses.replace(ctx, handler_config=config), self.clock.now()
        )


class SweepsOnUpdatedAt(InMemoryStateHandler):
    """The lock sweep selects ``updated_at + 30 min < now`` instead of ``locked_until < now``."""

    async def reset_expired_locks(self) -> int:
        now = self.clock.now()
        kept = {}
        for key, record in self.model.current.items():
            if (
                record.status is S.PROCESSING
                and record.updated_at + dt.timedelta(minutes=30) >= now
            ):
                kept[key] = record.locked_until
                record.locked_until = now + dt.timedelta(days=1)
        count = self.model.reset_expired_locks(now)
        for key, until in kept.items():
            self.model.current[key].locked_until = until
        return count


class UpsertUpdatesInPlace(InMemoryStateHandler):
    """Upsert over Processed updates the row in place: the old result is not kept as Superseded."""

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        record = self.model.current.get(ctx.record_key)
        if ctx.lock_token is None and record is not None and record.status is S.PROCESSED:
            if data is not None:
                record.data = json.dumps(data, sort_keys=True, separators=(",", ":"))
            record.updated_at = self.clock.now()
            return
        self.model.upsert(ctx, data, self.clock.now())


class _Rekeyed(KeyRoutingHandler):
    """Stores every record under a rewritten key; the record says the key it was stored under."""

    def rekey(self, key: RecordKey) -> RecordKey:
        raise NotImplementedError

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        key = self.rekey(ctx.record_key)
        return dataclasses.replace(
            ctx,
            tenant_id=key.tenant_id,
            scope_id=key.scope_id,
            entity_id=key.entity_id,
            item_entity_key=key.item_entity_key,
            item_key=key.item_key,
        )


class StripsAndLowercasesKeys(_Rekeyed):
    """Item keys are trimmed and lower-cased on the way in (a case-insensitive collation)."""

    def rekey(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, item_key=key.item_key.strip().lower())


class KeysWithoutTenant(_Rekeyed):
    """The unique key is (scope, entity, item): tenants sharing an invoice number share a row."""

    def rekey(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, tenant_id="shared")


class KeysWithoutScope(_Rekeyed):
    """The unique key leaves out the scope: an Element and a Workflow record of one entity collide."""

    def rekey(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, scope_id=0)


class FencesOnAttemptOnly(InMemoryStateHandler):
    """Fencing compares the token with the attempt but not the status: a spent token still writes."""

    def _revive(self, ctx: StateHandlerContext) -> None:
        record = self.model.current.get(ctx.record_key)
        if ctx.lock_token is not None and record is not None and record.attempt == ctx.lock_token:
            record.status = S.PROCESSING
            record.locked_until = self.clock.now()

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self._revive(ctx)
        await super().set(ctx, status, data)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self._revive(ctx)
        await super().release_lock_as_failed(ctx, error_detail)


class _NaiveLocalClock:
    def __init__(self, handler: InMemoryStateHandler) -> None:
        self.base = handler.clock

    def now(self) -> dt.datetime:
        # "now in local time", naive, then stamped UTC as if it were
        return self.base.now().astimezone().replace(tzinfo=None).replace(tzinfo=dt.UTC)


class NaiveLocalExpiry(InMemoryStateHandler):
    """``locked_until`` is computed from naive local time and labelled UTC (right on UTC hosts only)."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = self.model.try_acquire_lock(ctx, self.clock.now())
        record = self.model.current.get(ctx.record_key)
        if token is not None and record is not None:
            record.locked_until = _NaiveLocalClock(self).now() + ctx.handler_config.lock_duration
        return token


class InclusiveExpiry(InMemoryStateHandler):
    """Acquire takes over a lock at ``locked_until <= now``: the boundary instant counts as expired."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if record is not None and record.status is S.PROCESSING and record.locked_until == now:
            record.locked_until = now - _TICK
        return self.model.try_acquire_lock(ctx, now)


class RetentionFromFirstWrite(InMemoryStateHandler):
    """``retain_until`` is set once, when the record is created, and never moved by later writes."""

    async def _keep(self, ctx: StateHandlerContext, write: Any) -> None:
        record = self.model.current.get(ctx.record_key)
        kept = None if record is None else record.retain_until
        await write
        after = self.model.current.get(ctx.record_key)
        if after is not None and kept is not None:
            after.retain_until = kept

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        record = self.model.current.get(ctx.record_key)
        kept = None if record is None else record.retain_until
        token = self.model.try_acquire_lock(ctx, self.clock.now())
        if token is not None and kept is not None:
            self.model.current[ctx.record_key].retain_until = kept
        return token

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await self._keep(ctx, super().set(ctx, status, data))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.12g}")
    if isinstance(value, Mapping):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


class StripsNulAndRoundsFloats(InMemoryStateHandler):
    """The JSON column drops NUL from strings and keeps floats to 12 significant digits."""

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await super().set(ctx, status, None if data is None else _scrub(data))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await super().upsert(ctx, None if data is None else _scrub(data))


class ExistsTrueForExpiredLock(InMemoryStateHandler):
    """Exists counts a Processing record as done until the sweep resets it, even once expired."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        record = self.model.current.get(ctx.record_key)
        now = self.clock.now()
        if record is not None and record.status is S.PROCESSING:
            return effective_status(record, now) is S.FAILED
        return await super().exists(ctx)


# --- sweeps whose answer cannot be trusted ----------------------------------------------------


class SweepRaises(InMemoryStateHandler):
    """The lock sweep fails every time (a query bug): expired locks are never reset."""

    async def reset_expired_locks(self) -> int:
        raise RuntimeError("column locked_until does not exist")


class SweepAnswersNothing(InMemoryStateHandler):
    """The lock sweep resets the expired locks and forgets to return the count (``None``)."""

    async def reset_expired_locks(self) -> int:
        self.model.reset_expired_locks(self.clock.now())
        return None  # type: ignore[return-value]


class SweepAnswersMinusOne(InMemoryStateHandler):
    """The lock sweep returns a driver's "rows unknown" marker, -1, instead of its count."""

    async def reset_expired_locks(self) -> int:
        self.model.reset_expired_locks(self.clock.now())
        return -1


class SweepCountsOneMore(InMemoryStateHandler):
    """The lock sweep counts the rows it looked at, one more than the rows it changed."""

    async def reset_expired_locks(self) -> int:
        return self.model.reset_expired_locks(self.clock.now()) + 1


class SweepAlwaysAnswersZero(InMemoryStateHandler):
    """The lock sweep resets expired locks and always answers 0 (the count of an old query)."""

    async def reset_expired_locks(self) -> int:
        self.model.reset_expired_locks(self.clock.now())
        return 0
