"""Broken handlers that get a duration, a boundary or the time zone wrong.

Each passes a world where every node locks for the default 30 minutes and
the process runs in UTC: they ignore the node's own options, measure expiry
from the wrong column, or compute instants in the machine's local time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.config import DEFAULT_LOCK_DURATION, HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import SWEEP_ERROR_DETAIL, effective_status
from reference_engine.status import ACQUIRABLE, IdempotencyStatus

__all__ = [
    "AcquireRereadsClock",
    "FirstNodeOptionsForAll",
    "IgnoresConfiguredLockDuration",
    "LockRoundedToSeconds",
    "NaiveLocalExpiry",
    "RetentionAsInt32Seconds",
    "RetentionFromCreatedAt",
    "SweepsOnUpdatedAt",
]

S = IdempotencyStatus


def _with_lock(ctx: StateHandlerContext, lock: dt.timedelta) -> StateHandlerContext:
    config = dataclasses.replace(ctx.handler_config, lock_duration=lock)
    return dataclasses.replace(ctx, handler_config=config)


class IgnoresConfiguredLockDuration(InMemoryStateHandler):
    """Every lock lasts the default 30 minutes, whatever the node's ``lockDuration`` says."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return self.model.try_acquire_lock(_with_lock(ctx, DEFAULT_LOCK_DURATION), self.clock.now())


class FirstNodeOptionsForAll(InMemoryStateHandler):
    """The handler keeps the options of the first context it sees and applies them to every node."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._config: HandlerConfig | None = None

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        if self._config is None:
            self._config = ctx.handler_config
        return self.model.try_acquire_lock(
            dataclasses.replace(ctx, handler_config=self._config), self.clock.now()
        )


class SweepsOnUpdatedAt(InMemoryStateHandler):
    """The sweep resets Processing records last updated over 30 minutes ago, ignoring ``locked_until``."""

    async def reset_expired_locks(self) -> int:
        now = self.clock.now()
        count = 0
        for record in self.model.current.values():
            if record.status is S.PROCESSING and record.updated_at + DEFAULT_LOCK_DURATION < now:
                record.status = S.FAILED
                record.locked_until = None
                record.error_detail = SWEEP_ERROR_DETAIL
                record.updated_at = now
                count += 1
        return count


class RetentionFromCreatedAt(InMemoryStateHandler):
    """``retain_until`` is set when the record is created and never moved by later writes."""

    def _pin(self, ctx: StateHandlerContext, created: dt.datetime | None) -> None:
        record = self.model.current.get(ctx.record_key)
        retention = ctx.handler_config.retention
        if record is not None and retention is not None and created is not None:
            record.retain_until = created + retention

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = await super().try_acquire_lock(ctx)
        record = self.model.current.get(ctx.record_key)
        self._pin(ctx, None if record is None else record.created_at)
        return token

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await super().set(ctx, status, data)
        record = self.model.current.get(ctx.record_key)
        self._pin(ctx, None if record is None else record.created_at)


class NaiveLocalExpiry(InMemoryStateHandler):
    """``locked_until`` is computed in naive local time and then labelled UTC."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        token = self.model.try_acquire_lock(ctx, now)
        record = self.model.current.get(ctx.record_key)
        if token is not None and record is not None:
            local = dt.datetime.fromtimestamp(now.timestamp())  # naive, the machine's zone
            record.locked_until = (local + ctx.handler_config.lock_duration).replace(tzinfo=dt.UTC)
        return token


class AcquireRereadsClock(InMemoryStateHandler):
    """Acquire stamps ``locked_until`` from one reading of the clock and checks expiry with a later one."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        stamped = self.clock.now()
        await asyncio.sleep(0)  # the round trip between reading the row and deciding
        now = self.clock.now()
        record = self.model.current.get(ctx.record_key)
        if effective_status(record, now) not in ACQUIRABLE:
            return None
        token = self.model.try_acquire_lock(ctx, now)
        record = self.model.current.get(ctx.record_key)
        if token is not None and record is not None:
            record.locked_until = stamped + ctx.handler_config.lock_duration
        return token


class LockRoundedToSeconds(InMemoryStateHandler):
    """Lock durations are rounded to whole seconds, so a 500 ms lock lasts 0 s and a 1.5 s one 2 s."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        lock = dt.timedelta(seconds=round(ctx.handler_config.lock_duration.total_seconds()))
        return self.model.try_acquire_lock(_with_lock(ctx, lock), self.clock.now())


def _int32_seconds(retention: dt.timedelta | None) -> dt.timedelta | None:
    """``retention`` as a signed 32-bit count of whole seconds, wrapping as C's ``int`` does."""
    if retention is None:
        return None
    seconds = int(retention.total_seconds())
    return dt.timedelta(seconds=(seconds + 2**31) % 2**32 - 2**31)


class RetentionAsInt32Seconds(InMemoryStateHandler):
    """Retention is passed on as a signed 32-bit number of seconds: 36500 days wraps to a past instant."""

    def _wrapped(self, ctx: StateHandlerContext) -> StateHandlerContext:
        config = dataclasses.replace(
            ctx.handler_config, retention=_int32_seconds(ctx.handler_config.retention)
        )
        return dataclasses.replace(ctx, handler_config=config)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return self.model.try_acquire_lock(self._wrapped(ctx), self.clock.now())

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(self._wrapped(ctx), status, data, self.clock.now())

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(self._wrapped(ctx), error_detail, self.clock.now())

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        self.model.upsert(self._wrapped(ctx), data, self.clock.now())
