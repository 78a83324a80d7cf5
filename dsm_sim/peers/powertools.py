"""Powertools for AWS Lambda (Python) idempotency, as a handler the harness can verify.

Powertools' ``IdempotencyHandler`` drives a persistence layer (any
``BasePersistenceLayer`` subclass) in a fixed order: ``save_inprogress``
before the work, ``save_success`` after it, ``delete_record`` when the work
raises, and ``get_record`` when ``save_inprogress`` raises
``IdempotencyItemAlreadyExistsError``.  :class:`PowertoolsHandler` calls the
layer in exactly that order, one handler operation per step of that flow:

============================  =================================================
handler operation             Powertools call
============================  =================================================
``try_acquire_lock``          ``save_inprogress(payload, remaining_time_in_millis
                              = lock duration)``; on ``ItemAlreadyExists``,
                              ``get_record`` and the same retries
                              (``MAX_RETRIES``) the handler makes on an
                              inconsistent state; not acquired when they run out
``set(Processed, data)``      ``save_success(payload, result=data)``
``release_lock_as_failed``,   ``delete_record(payload, exception)``
``set(Failed)``
``exists`` / ``get``          ``get_record(payload)``
``reset_expired_locks``,      nothing: Powertools has no sweeps (0)
``expire_past_retention``
============================  =================================================

``remaining_time_in_millis`` is what a Lambda context registered with
``IdempotencyConfig.register_lambda_context`` supplies; here it is the node's
lock duration, so the in-progress record expires as it would in a Lambda
whose remaining time is that long.  The node's retention becomes the layer's
``expires_after_seconds`` (a record kept forever: a century).

**Time.** Powertools reads the wall clock inside the layer and its records.
Nothing is patched: :func:`bind_clock` gives the layer instance a subclass
whose methods are Powertools' own code, run with module globals in which the
``datetime`` and ``time`` modules (and the ``DataRecord`` class, whose
``is_expired`` reads the clock) answer from the harness clock.  The Redis
layer's TTLs are the store's clock; :class:`HarnessTimeRedis` is a Redis
client that keeps each key's expiry as an instant of the harness clock, with
Redis' rule (a key is gone once ``now`` in milliseconds is past it), so clock
jumps reach TTLs too.

**What is not stored.** A Powertools record holds a status, its expiries and
the response; no fencing token, no writer, no write times.  The handler
numbers the grants it sees per item (one handler per test case) so the kit
can tell holders apart; nothing is fenced by that number, since
``save_success`` and ``delete_record`` take none.  ``get`` reports
``entity_execution_id`` and ``source_app_id`` as ``""`` and ``created_at``
and ``updated_at`` as the Unix epoch.  The differences of design are the
``powertools`` semantics profile (:data:`dsm_sim.conformance.judge.semantics.
POWERTOOLS`), which the factories here declare.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import time
import types
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import redis
from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer, IdempotencyConfig
from aws_lambda_powertools.utilities.idempotency.base import MAX_RETRIES
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import (
    STATUS_CONSTANTS,
    DataRecord,
)

from dsm_sim.conformance.judge.semantics import POWERTOOLS, UnsupportedOperationError
from reference_engine.clock import Clock
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    ConfigurationError,
    LockNotHeldError,
    UnsupportedStatusError,
)
from reference_engine.handler import HandlerFactory
from reference_engine.record import StateRecord, check_settable, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = [
    "PEER_REDIS_ENV",
    "HarnessTimeRedis",
    "PowertoolsHandler",
    "UnsupportedOperationError",
    "bind_clock",
    "layer_handler",
    "redis_layer",
]

S = IdempotencyStatus
Layer = TypeVar("Layer", bound=BasePersistenceLayer)

#: Where :func:`redis_layer` finds its Redis; ``DSM_TEST_REDIS_URL`` is the fallback.
PEER_REDIS_ENV = "DSM_POWERTOOLS_REDIS_URL"
_TEST_REDIS_ENV = "DSM_TEST_REDIS_URL"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)
#: ``expires_after_seconds`` for a node that keeps its records forever.
FOREVER_SECONDS = 100 * 365 * 86400
#: Every key :class:`HarnessTimeRedis` writes also expires in real time after
#: this long, so a run that never reached ``close()`` leaves nothing for good.
SAFETY_TTL_SECONDS = 86400
#: One id per process: handler prefixes of parallel runs never meet.
_RUN = uuid.uuid4().hex[:12]
_HANDLERS = itertools.count(1)


# --- the harness clock inside Powertools ------------------------------------------------------


def _clocked_datetime(clock: Clock) -> type[dt.datetime]:
    """A ``datetime`` class whose "now" is ``clock``'s, naive local as the real one gives."""

    class ClockedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            instant = clock.now()
            return (
                instant.astimezone(tz)
                if tz is not None
                else instant.astimezone().replace(tzinfo=None)
            )

        @classmethod
        def utcnow(cls) -> dt.datetime:  # type: ignore[override]
            return clock.now().astimezone(dt.UTC).replace(tzinfo=None)

        @classmethod
        def today(cls) -> dt.datetime:  # type: ignore[override]
            return cls.now()

    ClockedDatetime.__name__ = ClockedDatetime.__qualname__ = "datetime"
    return ClockedDatetime


def _clocked_modules(clock: Clock) -> dict[int, Any]:
    """Stand-ins for the time sources a module may hold, by ``id`` of the real object."""
    clocked = _clocked_datetime(clock)
    datetime_module = types.ModuleType("datetime")
    datetime_module.__dict__.update(vars(dt))
    datetime_module.__dict__["datetime"] = clocked
    time_module = types.ModuleType("time")
    time_module.__dict__.update(vars(time))
    time_module.__dict__["time"] = lambda: clock.now().timestamp()
    time_module.__dict__["time_ns"] = lambda: (
        (clock.now() - _EPOCH) // dt.timedelta(microseconds=1) * 1000
    )
    return {id(dt): datetime_module, id(dt.datetime): clocked, id(time): time_module}


class _Rebinder:
    """Copies functions so that the time sources among their globals are the clocked ones."""

    def __init__(self, shims: dict[int, Any]) -> None:
        self.shims = shims
        self._globals: dict[int, dict[str, Any] | None] = {}

    def globals_for(self, original: dict[str, Any]) -> dict[str, Any] | None:
        key = id(original)
        if key not in self._globals:
            swapped = {n: self.shims[id(v)] for n, v in original.items() if id(v) in self.shims}
            self._globals[key] = {**original, **swapped} if swapped else None
        return self._globals[key]

    def function(self, fn: types.FunctionType) -> types.FunctionType | None:
        new_globals = self.globals_for(fn.__globals__)
        if new_globals is None:
            return None
        copy = types.FunctionType(
            fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        copy.__doc__ = fn.__doc__
        return copy

    def member(self, value: object) -> object | None:
        """The member with its time sources clocked, or None when it reads none."""
        if isinstance(value, types.FunctionType):
            return self.function(value)
        if isinstance(value, staticmethod | classmethod) and isinstance(
            value.__func__, types.FunctionType
        ):
            inner = self.function(value.__func__)
            return None if inner is None else type(value)(inner)
        if isinstance(value, property):
            parts = [
                None
                if f is None
                else (self.function(f) if isinstance(f, types.FunctionType) else f)
                for f in (value.fget, value.fset, value.fdel)
            ]
            originals = (value.fget, value.fset, value.fdel)
            if all(p is None or p is o for p, o in zip(parts, originals, strict=True)):
                return None
            fget, fset, fdel = (
                cast(Any, p if p is not None else o) for p, o in zip(parts, originals, strict=True)
            )
            return property(fget, fset, fdel, value.__doc__)
        return None

    def subclass(self, cls: type[Any], name: str) -> type[Any]:
        """``cls`` with every member (own or inherited) that reads time rebound."""
        namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        seen: set[str] = set()
        for klass in cls.__mro__:
            if klass is object:
                continue
            for attr, value in vars(klass).items():
                if attr in seen or (attr.startswith("__") and attr.endswith("__")):
                    continue
                seen.add(attr)  # the most derived definition is the one that runs
                rebound = self.member(value)
                if rebound is not None:
                    namespace[attr] = rebound
        with warnings.catch_warnings():
            # A class marked deprecated (Powertools' Redis layer) warns on subclassing.
            warnings.simplefilter("ignore", DeprecationWarning)
            return type(name, (cls,), namespace)


def bind_clock(layer: Layer, clock: Clock) -> Layer:
    """Make ``layer`` read "now" from ``clock``, touching nothing outside it.

    The instance's class becomes a subclass whose methods (its own and every
    inherited one, Powertools' included) are the same code run with globals in
    which ``datetime``, ``datetime.datetime`` and ``time`` are clocked, and
    ``DataRecord`` is a subclass whose ``is_expired`` is clocked too.  Other
    layers, other instances and the modules themselves are unchanged.  A
    method that reaches a parent's method through ``super()`` runs the
    parent's unclocked code; override without ``super()`` where the parent
    reads time.
    """
    shims = _clocked_modules(clock)
    rebinder = _Rebinder(shims)
    shims[id(DataRecord)] = rebinder.subclass(DataRecord, "DataRecord")
    rebinder._globals.clear()  # rebuilt now that DataRecord has its stand-in
    layer.__class__ = rebinder.subclass(type(layer), type(layer).__name__)
    return layer


# --- Redis with TTLs on the harness clock ------------------------------------------------------

_GET = """
local v = redis.call('GET', KEYS[1])
if not v then return false end
local sep = string.find(v, '|', 1, true)
local x = string.sub(v, 1, sep - 1)
if x ~= '' and tonumber(x) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
return string.sub(v, sep + 1)
"""

_SET = """
if ARGV[4] == '1' then
  local v = redis.call('GET', KEYS[1])
  if v then
    local sep = string.find(v, '|', 1, true)
    local x = string.sub(v, 1, sep - 1)
    if x == '' or tonumber(x) >= tonumber(ARGV[3]) then return false end
  end
end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[1], 'EX', ARGV[5])
return 1
"""


class HarnessTimeRedis:
    """The ``get``/``set``/``delete`` client Powertools' Redis layer takes, TTLs on ``clock``.

    Each value is stored with its expiry as a millisecond instant of the
    harness clock; a key is gone once the clock (in milliseconds) is past it,
    which is Redis' own rule, and a read of an expired key deletes it, as
    Redis does.  Every key also carries a real TTL of
    :data:`SAFETY_TTL_SECONDS`.
    """

    def __init__(self, client: redis.Redis, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        self._get = client.register_script(_GET)
        self._set = client.register_script(_SET)

    def _now_ms(self) -> int:
        return (self.clock.now() - _EPOCH) // _MS

    def get(self, name: str) -> str | None:
        value = self._get(keys=[name], args=[self._now_ms()])
        if value is None:
            return None
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    def set(
        self,
        name: str,
        value: str,
        ex: float | dt.timedelta | None = None,
        px: float | dt.timedelta | None = None,
        nx: bool = False,
    ) -> bool | None:
        now_ms = self._now_ms()
        if ex is not None:
            span_ms = int((ex if isinstance(ex, dt.timedelta) else dt.timedelta(seconds=ex)) / _MS)
        elif px is not None:
            span_ms = int(px / _MS) if isinstance(px, dt.timedelta) else int(px)
        else:
            span_ms = None
        expiry = "" if span_ms is None else str(now_ms + span_ms)
        stored = self._set(
            keys=[name], args=[value, expiry, now_ms, "1" if nx else "0", SAFETY_TTL_SECONDS]
        )
        return True if stored else None

    def delete(self, *names: str) -> int:
        return int(self.client.delete(*names)) if names else 0


# --- the handler -----------------------------------------------------------------------------


class _NodeFailure(Exception):
    """What ``delete_record`` is told the work raised: the node's error detail."""


class PowertoolsHandler:
    """A :class:`~reference_engine.handler.StateHandler` over a Powertools persistence layer.

    ``layer`` is configured here (``IdempotencyConfig()``, the whole payload
    as the idempotency key) under ``key_prefix``, which must be fresh per
    handler: every key is ``<key_prefix>#<hash>``.  ``cleanup`` runs in
    ``close()`` after the records this handler touched were deleted through
    the layer.
    """

    library = "Powertools idempotency"

    def __init__(
        self,
        layer: BasePersistenceLayer,
        clock: Clock,
        *,
        key_prefix: str,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.layer = bind_clock(layer, clock)
        self.key_prefix = key_prefix
        self._cleanup = cleanup
        self._now = _clocked_datetime(clock)
        self.layer.configure(IdempotencyConfig(), function_name="dsm", key_prefix=key_prefix)
        #: Grants per item: Powertools keeps no token, so the handler numbers them.
        self._grants: dict[RecordKey, int] = {}
        self._touched: dict[RecordKey, dict[str, Any]] = {}

    # --- plumbing ----------------------------------------------------------------------------

    def _payload(self, ctx: StateHandlerContext) -> dict[str, Any]:
        """The event Powertools hashes into the idempotency key: the whole record key."""
        key = ctx.record_key
        payload = {
            "tenant": key.tenant_id,
            "scope": key.scope_id,
            "entity": key.entity_id,
            "entity_key": key.item_entity_key,
            "item": key.item_key,
        }
        self._touched[key] = payload
        retention = ctx.handler_config.retention
        self.layer.expires_after_seconds = (
            FOREVER_SECONDS if retention is None else int(retention.total_seconds())
        )
        return payload

    def _read(self, ctx: StateHandlerContext) -> DataRecord | None:
        """The layer's record, or None when there is none (or it has expired)."""
        try:
            record = self.layer.get_record(data=self._payload(ctx))
        except IdempotencyItemNotFoundError:
            return None
        if record is None or record.status == STATUS_CONSTANTS["EXPIRED"]:
            return None
        return record

    def _now_ms(self) -> int:
        return int(self._now.now().timestamp() * 1000)

    def _need_token(self, ctx: StateHandlerContext, operation: str) -> None:
        if ctx.lock_token is None:
            # Powertools' flow only completes or deletes what it saved in progress.
            raise LockNotHeldError(item_key=ctx.item_key, operation=operation)

    # --- the Protocol ------------------------------------------------------------------------

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        try:
            for payload in self._touched.values():
                self.layer.delete_record(data=payload, exception=_NodeFailure("cleanup"))
        finally:
            self._touched.clear()
            if self._cleanup is not None:
                self._cleanup()

    async def exists(self, ctx: StateHandlerContext) -> bool:
        record = self._read(ctx)
        return record is not None and record.status == STATUS_CONSTANTS["COMPLETED"]

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = self._read(ctx)
        if record is None:
            return None
        in_progress = record.status == STATUS_CONSTANTS["INPROGRESS"]
        lock_ms = record.in_progress_expiry_timestamp
        response = record.response_json_as_dict()
        expiry = record.expiry_timestamp
        return StateRecord(
            key=ctx.record_key,
            status=S.PROCESSING if in_progress else S.PROCESSED,
            attempt=self._grants.get(ctx.record_key, 0),
            locked_until=(
                _EPOCH + int(lock_ms) * _MS if in_progress and lock_ms is not None else None
            ),
            data=None if response is None else cast(Mapping[str, Any], response),
            error_detail=None,
            entity_execution_id="",
            source_app_id="",
            created_at=_EPOCH,
            updated_at=_EPOCH,
            retain_until=(
                None
                if ctx.handler_config.retention is None or expiry is None
                else _EPOCH + dt.timedelta(seconds=int(expiry))
            ),
        )

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        payload = self._payload(ctx)
        remaining = int(ctx.handler_config.lock_duration / _MS)
        for _ in range(MAX_RETRIES + 1):
            try:
                self.layer.save_inprogress(data=payload, remaining_time_in_millis=remaining)
            except IdempotencyItemAlreadyExistsError as exc:
                record = exc.old_data_record or self._read(ctx)
                if record is None or record.status == STATUS_CONSTANTS["EXPIRED"]:
                    continue  # IdempotencyInconsistentStateError: the handler retries
                if record.status == STATUS_CONSTANTS["INPROGRESS"]:
                    expiry = record.in_progress_expiry_timestamp
                    if expiry is not None and expiry < self._now_ms():
                        continue  # timed out but not yet taken over: the handler retries
                return None  # completed (the stored response) or in progress elsewhere
            else:
                token = self._grants.get(ctx.record_key, 0) + 1
                self._grants[ctx.record_key] = token
                return token
        # The handler raises IdempotencyInconsistentStateError: nothing was started.
        return None

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        check_settable(status)
        encode_data(data)  # the project's payload rules, before anything is written
        if status in (S.SKIPPED, S.EXPIRED):
            raise UnsupportedStatusError(
                status=status.label,
                use="set(Processed) or release_lock_as_failed(): a Powertools record is only "
                "in progress or completed",
            )
        self._need_token(ctx, f"set({status.label})")
        if status is S.FAILED:
            self.layer.delete_record(data=self._payload(ctx), exception=_NodeFailure("failed"))
            return
        result = None if data is None else dict(data)
        self.layer.save_success(data=self._payload(ctx), result=cast(dict[str, Any], result))

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self._need_token(ctx, "release_lock_as_failed")
        self.layer.delete_record(data=self._payload(ctx), exception=_NodeFailure(error_detail))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        raise UnsupportedOperationError(
            library=self.library,
            operation="upsert",
            supported="exists, get, try_acquire_lock, set(Processed), set(Failed) and "
            "release_lock_as_failed",
        )

    async def reset_expired_locks(self) -> int:
        return 0  # none: the next save_inprogress takes an expired record over

    async def expire_past_retention(self) -> int:
        return 0  # none: the store's TTL drops records


# --- factories ---------------------------------------------------------------------------------


def _fresh_prefix() -> str:
    return f"dsm-powertools:{_RUN}:{next(_HANDLERS)}"


def peer_redis_url() -> str:
    """The Redis of :func:`redis_layer`: ``$DSM_POWERTOOLS_REDIS_URL``, else the test Redis."""
    for name in (PEER_REDIS_ENV, _TEST_REDIS_ENV):
        url = os.environ.get(name, "").strip()
        if url:
            return url
    raise ConfigurationError(
        f"no Redis for Powertools' layer: set {PEER_REDIS_ENV} (or {_TEST_REDIS_ENV}) to a "
        "Redis it may write to, e.g. redis://127.0.0.1:6379/0; each handler writes under its "
        "own key prefix and deletes it on close"
    )


def redis_layer(clock: Clock) -> PowertoolsHandler:
    """Powertools' unmodified ``RedisCachePersistenceLayer`` on the peer Redis, as a handler.

    Each handler gets its own key prefix, and ``close()`` deletes every key
    under it (the layer's ``<key>:lock`` keys too); nothing else is flushed.
    """
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    client = redis.Redis.from_url(peer_redis_url())
    prefix = _fresh_prefix()

    def cleanup() -> None:
        try:
            keys = list(client.scan_iter(match=f"{prefix}*", count=500))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the layer's v4 rename notice
        layer = RedisCachePersistenceLayer(client=HarnessTimeRedis(client, clock))  # type: ignore[arg-type]
    return PowertoolsHandler(layer, clock, key_prefix=prefix, cleanup=cleanup)


redis_layer.dsm_semantics = POWERTOOLS  # type: ignore[attr-defined]


def layer_handler(
    make_layer: Callable[[Clock], BasePersistenceLayer],
    *,
    cleanup: Callable[[BasePersistenceLayer], None] | None = None,
) -> HandlerFactory:
    """A factory for your own persistence layer: ``make_layer(clock)`` builds one per handler.

    The handler configures it under a fresh key prefix and binds its clock
    (:func:`bind_clock`); records it touched are deleted through the layer on
    ``close()``, then ``cleanup(layer)`` runs if given.  The factory declares
    the ``powertools`` semantics.  A store whose TTL runs on real time cannot
    follow clock jumps: give the layer a store client on the clock it is
    passed, as :func:`redis_layer` does.
    """

    def factory(clock: Clock) -> PowertoolsHandler:
        layer = make_layer(clock)
        done = None if cleanup is None else (lambda: cleanup(layer))
        return PowertoolsHandler(layer, clock, key_prefix=_fresh_prefix(), cleanup=done)

    factory.dsm_semantics = POWERTOOLS  # type: ignore[attr-defined]
    factory.__qualname__ = f"layer_handler({getattr(make_layer, '__qualname__', 'layer')})"
    return factory
