"""A Redis handler: the worked example of writing your own store for the DataStateMachine.

Layout, under one namespace ``{prefix}`` (a Redis Cluster hash tag, so every
key of one handler lives in one slot):

* ``{prefix}:rec:<key>``: a hash per current record; ``<key>`` is the record
  key's five components, each length-prefixed so no byte in a key can make
  two records collide;
* ``{prefix}:hist:<n>``: a hash per superseded record, listed in ``{prefix}:history``;
* ``{prefix}:locks``: a sorted set of Processing records scored by
  ``locked_until``, which the expired-lock sweep reads from the left;
* ``{prefix}:retention``: a sorted set of records scored by ``retain_until``;
* ``{prefix}:audit-cursor``: where the sweeps' audit of the two indexes
  resumes (:mod:`reference_engine.handlers.redis_scripts`);
* ``{prefix}:store-id``: the store identity marker, written by the first
  ``open`` and checked by every script, so a flushed or replaced Redis raises
  :class:`~reference_engine.errors.StoreLostError` instead of charging again.

Timestamps are stored as epoch microseconds.  Every write is one Lua script
(:mod:`reference_engine.handlers.redis_scripts`) given "now" from the injected
clock; reads are single commands.  Refusals come back as reply codes and are
turned into exactly the exceptions the reference model raises, built from the
same transition table, so the conformance kit can compare the two call by call.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from reference_engine.begin import Acquired, BeginResult, Completed, Locked
from reference_engine.clock import UTC, Clock, ensure_utc, read_now
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    ConfigurationError,
    EvictingStoreError,
    InvalidItemError,
    LockHeldError,
    LockNotHeldError,
    StaleLockError,
    StoreError,
    StoreLostError,
)
from reference_engine.handlers.redis_pipeline import (
    DEFAULT_TIMEOUT_S,
    PipelinedConnection,
    pipelinable,
)
from reference_engine.handlers.redis_scripts import AUDIT_SLICE, RegisteredScripts
from reference_engine.model import NEEDS_LOCK, SWEEP_ERROR_DETAIL, write_landed
from reference_engine.record import StateRecord, check_settable, encode_data, is_lock_live
from reference_engine.status import (
    ACQUIRABLE,
    COMPLETED,
    TRANSITIONS,
    IdempotencyStatus,
    check_path,
    check_transition,
    is_allowed,
)

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_PREFIX",
    "MAX_COMMAND_TIMEOUT_S",
    "RedisKeyspace",
    "RedisStateHandler",
    "check_redis_url",
]

S = IdempotencyStatus
T = TypeVar("T")

DEFAULT_PREFIX = "dsm"
#: The ``maxmemory-policy`` values under which Redis may evict a key that has no TTL
#: (``allkeys-lru``, ``allkeys-lfu``, ``allkeys-random``): a store that loses records.
EVICTING_POLICY_PREFIX = "allkeys-"
#: Seconds any Redis reply (or connect) may take before the call raises StoreError.
DEFAULT_COMMAND_TIMEOUT_S = DEFAULT_TIMEOUT_S
#: The longest command timeout accepted: past an hour a silent server is down, not slow.
MAX_COMMAND_TIMEOUT_S = 3600.0
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


def _checked_timeout(seconds: object) -> float:
    """A command timeout: finite seconds above 0 and at most :data:`MAX_COMMAND_TIMEOUT_S`."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_COMMAND_TIMEOUT_S
    ):
        raise ConfigurationError(
            f"command_timeout must be a finite number of seconds above 0 and at most "
            f"{MAX_COMMAND_TIMEOUT_S:g}, got {seconds!r} (default {DEFAULT_COMMAND_TIMEOUT_S:g})"
        )
    return float(seconds)


def _to_micros(instant: dt.datetime) -> int:
    return (ensure_utc(instant) - _EPOCH) // _MICROSECOND


def _from_micros(value: str | int | None) -> dt.datetime | None:
    return None if value is None or value == "" else _EPOCH + int(value) * _MICROSECOND


def _framed(statuses: Iterable[IdempotencyStatus]) -> str:
    """The comma-framed status list the scripts test membership in (",none,failed,")."""
    return "," + ",".join(sorted(s.value for s in statuses)) + ","


def _sources_of(target: IdempotencyStatus) -> str:
    return _framed(s for s in S if is_allowed(s, target))


def _path_allowed(source: IdempotencyStatus) -> bool:
    return is_allowed(source, S.PROCESSING) and is_allowed(S.PROCESSING, S.PROCESSED)


# Derived once from the transition table; the scripts only test membership.
_ACQUIRABLE = _framed(ACQUIRABLE)
_UPSERT_PATH_OK = _framed(
    [
        *(s for s in ACQUIRABLE if _path_allowed(s)),
        *([S.PROCESSING] if is_allowed(S.PROCESSING, S.PROCESSED) else []),
    ]
)
_SOURCES = {target: _sources_of(target) for target in TRANSITIONS}
_COMPLETED = _framed(COMPLETED)


def _text(value: bytes | str | None) -> str | None:
    """Replies are text (the client decodes them); bytes would only come from a misconfigured client."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _fields(reply: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {str(_text(k)): str(_text(v)) for k, v in reply.items()}


def check_redis_url(url: object) -> str:
    """Refuse what redis-py would only reject at the first command, long after start-up."""
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        # Only the scheme is echoed: the rest of a URL may carry a password.
        shown = url.partition("://")[0] + "://..." if isinstance(url, str) else type(url).__name__
        raise ConfigurationError(
            f"Redis URL must be a string starting with redis://, rediss:// or unix://, got {shown!r}"
        )
    return url


@dataclass(frozen=True, slots=True)
class RedisKeyspace:
    """Every key one handler touches, derived from its prefix."""

    prefix: str

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix or "}" in self.prefix:
            raise ConfigurationError(
                f"Redis key prefix must be a non-empty string without '}}', got {self.prefix!r}"
            )

    @property
    def namespace(self) -> str:
        return "{" + self.prefix + "}"

    @property
    def record_prefix(self) -> str:
        return f"{self.namespace}:rec:"

    def record(self, key: RecordKey) -> str:
        t, e, ek, k = key.tenant_id, key.entity_id, key.item_entity_key, key.item_key
        scope = str(key.scope_id)
        return (
            f"{self.record_prefix}{len(t)}:{t}/{len(scope)}:{scope}/{len(e)}:{e}/"
            f"{len(ek)}:{ek}/{len(k)}:{k}"
        )

    @property
    def locks(self) -> str:
        return f"{self.namespace}:locks"

    @property
    def retention(self) -> str:
        return f"{self.namespace}:retention"

    @property
    def marker(self) -> str:
        """The store identity marker: its loss is how a flushed namespace is noticed."""
        return f"{self.namespace}:store-id"

    @property
    def audit_cursor(self) -> str:
        """Where the sweeps' audit of the indexes resumes its ``SCAN``."""
        return f"{self.namespace}:audit-cursor"

    @property
    def history_seq(self) -> str:
        return f"{self.namespace}:history-seq"

    @property
    def history(self) -> str:
        return f"{self.namespace}:history"

    @property
    def history_prefix(self) -> str:
        return f"{self.namespace}:hist:"

    @property
    def pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every key of this namespace."""
        escaped = "".join("\\" + c if c in "*?[]\\" else c for c in self.namespace)
        return escaped + ":*"


def _decode(fields: Mapping[str, str]) -> StateRecord:
    """A stored hash as the record ``get`` returns; the key comes from the hash itself."""
    data = fields.get("data")
    created, updated = _from_micros(fields["created_at"]), _from_micros(fields["updated_at"])
    assert created is not None and updated is not None
    return StateRecord(
        key=RecordKey(
            tenant_id=fields["tenant_id"],
            scope_id=int(fields["scope_id"]),
            entity_id=fields["entity_id"],
            item_entity_key=fields["item_entity_key"],
            item_key=fields["item_key"],
        ),
        status=S(fields["status"]),
        attempt=int(fields["attempt"]),
        locked_until=_from_micros(fields.get("locked_until")),
        data=None if data is None else json.loads(data),
        error_detail=fields.get("error_detail"),
        entity_execution_id=fields["entity_execution_id"],
        source_app_id=fields["source_app_id"],
        created_at=created,
        updated_at=updated,
        retain_until=_from_micros(fields.get("retain_until")),
    )


class RedisStateHandler:
    """A :class:`~reference_engine.handler.StateHandler` on Redis (redis-py asyncio).

    The client is created by :meth:`open` (or the first call), on the running
    event loop, because asyncio connections belong to the loop that made them.
    ``delete_on_close`` removes every key of the namespace on :meth:`close`;
    the test factory uses it so parallel test runs leave nothing behind.
    ``single_connection`` sends every command over one connection, in the
    order the event loop issues them, so a seeded run replays the same
    interleaving; commands of concurrent callers still interleave, one
    command at a time, so a handler that checked and wrote in two commands
    would still be caught.  Otherwise the per-item write scripts (``begin``,
    the acquire and the completions) share one pipelined connection
    (:mod:`reference_engine.handlers.redis_pipeline`): concurrent callers'
    scripts leave in one write per event-loop turn; reads and sweeps use the pool.
    """

    def __init__(
        self,
        url: str,
        clock: Clock,
        *,
        prefix: str = DEFAULT_PREFIX,
        delete_on_close: bool = False,
        single_connection: bool = False,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
    ) -> None:
        self.url = check_redis_url(url)
        #: Seconds any reply (and a connect) may take: the client's own bound, since a frozen
        #: server enforces nothing.  A call past it raises StoreError.
        self.command_timeout = _checked_timeout(command_timeout)
        self.clock = clock
        self.keys = RedisKeyspace(prefix)
        self.delete_on_close = delete_on_close
        self.single_connection = single_connection
        self._client: Redis | None = None
        self._scripts: RegisteredScripts | None = None
        self._pipe: PipelinedConnection | None = None
        #: The namespace's identity as first seen; kept across close() so a reopen notices a loss.
        self._store_id: str | None = None

    def __repr__(self) -> str:
        return f"RedisStateHandler(prefix={self.keys.prefix!r})"

    def peer(self) -> RedisStateHandler | None:
        """Another handler on this namespace, with its own connection; its close deletes nothing."""
        try:
            return type(self)(
                self.url,
                self.clock,
                prefix=self.keys.prefix,
                single_connection=self.single_connection,
                command_timeout=self.command_timeout,
            )
        except TypeError:
            return None

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, and claim or adopt the namespace's identity marker (one round trip).

        Scripts are loaded on first use.
        """
        await self._claim()

    async def close(self) -> None:
        client, self._client, self._scripts = self._client, None, None
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()
        if client is None:
            return
        try:
            if self.delete_on_close:
                await self._call(self._delete_namespace(client))
        finally:
            await client.aclose()

    # --- reads -------------------------------------------------------------------------------

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        name = self.keys.record(ctx.record_key)
        fields = _fields(await self._call(self._connect().hgetall(name)))
        return _decode(fields) if fields else None

    async def exists(self, ctx: StateHandlerContext) -> bool:
        name = self.keys.record(ctx.record_key)
        now = read_now(self.clock)  # read first: a bad clock fails whatever is stored
        status, locked_until = await self._call(
            self._connect().hmget(name, ["status", "locked_until"])
        )
        if status is None:
            return False
        current = S(_text(status))
        if current is S.PROCESSING and not is_lock_live(
            current, _from_micros(_text(locked_until)), now
        ):
            current = S.FAILED  # the effective status of an expired, unswept lock
        return current in COMPLETED

    async def records(self) -> list[StateRecord]:
        """Ground truth for tests: every stored record, current first, then superseded ones."""
        client = self._connect()
        current: list[StateRecord] = []
        history: list[StateRecord] = []
        async for name in client.scan_iter(match=self.keys.pattern, count=500):
            if name.startswith((f"{self.keys.namespace}:rec:", self.keys.history_prefix)):
                fields = _fields(await self._call(client.hgetall(name)))
                if fields:
                    target = history if name.startswith(self.keys.history_prefix) else current
                    target.append(_decode(fields))
        return current + history

    # --- writes ------------------------------------------------------------------------------

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        key = ctx.record_key
        now = read_now(self.clock)
        until = ctx.handler_config.locked_until(now)
        args: list[str | int] = [_to_micros(until), _ACQUIRABLE, _SOURCES[S.PROCESSING]]
        reply = await self._write(self._registered().acquire, ctx, key, now, args)
        if reply[0] == "forbidden":
            check_transition(S(reply[1]), S.PROCESSING, item_key=ctx.item_key)
            self._unexplained(reply)
        return None if reply[0] == "busy" else int(reply[1])

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        """``exists`` then ``try_acquire_lock`` in one script (see :mod:`reference_engine.begin`)."""
        key = ctx.record_key
        now = read_now(self.clock)
        until = ctx.handler_config.locked_until(now)
        args: list[str | int] = [
            _to_micros(until),
            _ACQUIRABLE,
            _SOURCES[S.PROCESSING],
            _COMPLETED,
        ]
        reply = await self._write(self._registered().begin, ctx, key, now, args)
        code = reply[0]
        if code == "ok":
            return Acquired(int(reply[1]))
        if code == "done":
            flat = [str(_text(v)) for v in reply[1]]
            return Completed(_decode(dict(zip(flat[::2], flat[1::2], strict=True))))
        if code == "busy":
            return Locked(_from_micros(_text(reply[1])))
        if code == "forbidden":
            check_transition(S(reply[1]), S.PROCESSING, item_key=ctx.item_key)
        self._unexplained(reply)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        check_settable(status)
        encoded = encode_data(data)
        key = ctx.record_key
        args: list[str | int] = [
            status.value,
            encoded or "",
            "0" if encoded is None else "1",
            _SOURCES[status],
            "1" if status in NEEDS_LOCK else "0",
        ]
        reply = await self._write(
            self._registered().set,
            ctx,
            key,
            read_now(self.clock),
            args,
            landed=_landed(ctx, status, data=encoded),
        )
        if reply[0] == "notheld":
            raise LockNotHeldError(item_key=ctx.item_key, operation=f"set({status.label})")
        if reply[0] == "forbidden":
            check_transition(S(reply[1]), status, item_key=ctx.item_key)
            self._unexplained(reply)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        if ctx.lock_token is None:
            raise LockNotHeldError(item_key=ctx.item_key, operation="release_lock_as_failed")
        key = ctx.record_key
        args: list[str | int] = [error_detail, _SOURCES[S.FAILED]]
        reply = await self._write(
            self._registered().release_as_failed,
            ctx,
            key,
            read_now(self.clock),
            args,
            landed=_landed(ctx, S.FAILED, error_detail=error_detail),
        )
        if reply[0] == "forbidden":
            check_transition(S.PROCESSING, S.FAILED, item_key=ctx.item_key)
            self._unexplained(reply)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        encoded = encode_data(data)
        key = ctx.record_key
        args: list[str | int] = [
            encoded or "",
            "0" if encoded is None else "1",
            _ACQUIRABLE,
            _UPSERT_PATH_OK,
            _SOURCES[S.SUPERSEDED],
            self.keys.history_prefix,
        ]
        extra = [self.keys.history_seq, self.keys.history]
        reply = await self._write(
            self._registered().upsert,
            ctx,
            key,
            read_now(self.clock),
            args,
            extra,
            landed=_landed(ctx, S.PROCESSED, data=encoded),
        )
        if reply[0] == "forbidden":
            source = S(reply[1])
            if ctx.lock_token is not None:
                check_transition(S.PROCESSING, S.PROCESSED, item_key=ctx.item_key)
            elif source in ACQUIRABLE:
                check_path([source, S.PROCESSING, S.PROCESSED], item_key=ctx.item_key)
            check_transition(source, S.SUPERSEDED, item_key=ctx.item_key)
            self._unexplained(reply)

    # --- sweeps ------------------------------------------------------------------------------

    async def reset_expired_locks(self) -> int:
        """Expired locks -> Failed, after auditing a slice of the lock index (see the scripts)."""
        return await self._sweep(self._registered().reset_expired_locks, SWEEP_ERROR_DETAIL)

    async def expire_past_retention(self) -> int:
        """Past retention -> Expired, after auditing a slice of the indexes (see the scripts)."""
        return await self._sweep(self._registered().expire_past_retention)

    async def _sweep(self, script: AsyncScript, *extra: str) -> int:
        now = _to_micros(read_now(self.clock))
        store_id = await self._identity()
        keys = [self.keys.locks, self.keys.retention, self.keys.audit_cursor, self.keys.marker]
        args: list[str | int] = [
            now,
            self.keys.pattern,
            self.keys.record_prefix,
            self.keys.history_prefix,
            AUDIT_SLICE,
            *extra,
            store_id,
        ]
        count = await self._call(script(keys=keys, args=args))
        self._check_lost(count)
        return int(count)

    # --- helpers -----------------------------------------------------------------------------

    def _connect(self) -> Redis:
        if self._client is None:
            self._client = Redis.from_url(
                self.url,
                decode_responses=True,
                single_connection_client=self.single_connection,
                socket_timeout=self.command_timeout,
                socket_connect_timeout=self.command_timeout,
            )
            self._scripts = RegisteredScripts.register(self._client)
            if not self.single_connection and pipelinable(self.url):
                self._pipe = PipelinedConnection(self.url, timeout=self.command_timeout)
        return self._client

    async def _claim(self) -> str:
        """Write the marker into an empty namespace, or adopt the one there (shared by handlers).

        A handler that saw an identity before (it was opened, closed and opened
        again) refuses a namespace whose marker is gone or different.  A server
        that may evict keys is refused first, before the marker is trusted.
        """
        await self._refuse_eviction()
        script = self._registered().store_claim
        reply: list[Any] = await self._call(
            script(keys=[self.keys.marker], args=[uuid.uuid4().hex, self._store_id or ""])
        )
        self._check_lost(reply)
        self._store_id = str(reply[1])
        return self._store_id

    async def _refuse_eviction(self) -> None:
        """Refuse a server whose ``maxmemory-policy`` may evict the handler's keys.

        The marker cannot see an eviction: Redis drops records one by one and
        the marker may stay, so a finished item would read as never done.  The
        handler's keys carry no TTL, so only the ``allkeys-*`` policies can evict
        them; ``noeviction`` and the ``volatile-*`` policies cannot (a full
        Redis then refuses writes, which is a ``StoreError``, not a loss).
        """
        info = await self._call(self._connect().info("memory"))
        policy = str(info.get("maxmemory_policy", "noeviction"))
        if policy.startswith(EVICTING_POLICY_PREFIX):
            raise EvictingStoreError(
                store=f"Redis server behind namespace {self.keys.namespace}",
                setting="maxmemory-policy",
                value=policy,
                fix="maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and "
                "the same line in redis.conf so a restart keeps it). The handler's keys carry "
                "no TTL, so a volatile-* policy never evicts them and is accepted too",
            )

    async def _identity(self) -> str:
        """The identity the scripts check; claimed on first use by a handler never opened."""
        return self._store_id if self._store_id is not None else await self._claim()

    def _check_lost(self, reply: object) -> None:
        if not (isinstance(reply, list) and reply and reply[0] == "lost"):
            return
        found = _text(reply[1]) if len(reply) > 1 else ""
        marker = self.keys.marker
        reason = (
            f"its identity marker {marker!r} is missing (the database was flushed, or the "
            "namespace's keys deleted or evicted)"
            if not found
            else f"its identity marker {marker!r} names another store ({found}): it was "
            "flushed and then opened afresh by another handler"
        )
        raise StoreLostError(store=f"Redis namespace {self.keys.namespace}", reason=reason)

    def _registered(self) -> RegisteredScripts:
        self._connect()
        assert self._scripts is not None
        return self._scripts

    async def _write(
        self,
        script: AsyncScript,
        ctx: StateHandlerContext,
        key: RecordKey,
        now: dt.datetime,
        args: list[str | int],
        extra_keys: list[str] | None = None,
        *,
        landed: Callable[[StateRecord | None], bool] | None = None,
    ) -> list[Any]:
        """Run one write script; raise the model's exception for the refusals all writes share.

        A fenced write the script refuses as stale may be a retry of one that
        landed; ``landed`` judges the record read back (only on that path),
        and then the reply is ``["landed"]``: the retry succeeds unwritten.
        """
        retain_until = ctx.handler_config.retain_until(now)
        common: list[str | int] = [
            _to_micros(now),
            "" if retain_until is None else _to_micros(retain_until),
            ctx.entity_execution_id,
            ctx.source_app_id,
            key.tenant_id,
            key.scope_id,
            key.entity_id,
            key.item_entity_key,
            key.item_key,
            "" if ctx.lock_token is None else ctx.lock_token,
        ]
        store_id = self._store_id if self._store_id is not None else await self._claim()
        keys = [
            self.keys.record(key),
            self.keys.locks,
            self.keys.retention,
            *(extra_keys or []),
            self.keys.marker,
        ]
        argv = [*common, *args, store_id]
        pipe = self._pipe
        if pipe is None:
            reply: list[Any] = await self._call(script(keys=keys, args=argv))
        else:
            source = script.script
            text = source if isinstance(source, str | bytes) else bytes(source)
            reply = await self._call(pipe.evalsha(script.sha, text, keys, argv))
        if reply[0] == "lost":
            self._check_lost(reply)
        code = reply[0]
        if code == "stale":
            assert ctx.lock_token is not None
            if landed is not None and landed(await self.get(ctx)):
                return ["landed"]
            raise StaleLockError(
                item_key=ctx.item_key,
                token=ctx.lock_token,
                current_token=None if reply[1] == "" else int(reply[1]),
                status=S(reply[2]).label,
            )
        if code == "held":
            raise LockHeldError(item_key=ctx.item_key, locked_until=str(_from_micros(reply[1])))
        return reply

    @staticmethod
    def _unexplained(reply: list[Any]) -> NoReturn:
        raise StoreError(
            f"the Redis script refused a transition the table allows ({reply!r}); "
            "the scripts and reference_engine.status.TRANSITIONS disagree"
        )

    async def _call(self, operation: Awaitable[T]) -> T:
        """Await a Redis command; store failures become :class:`StoreError`."""
        try:
            return await operation
        except RedisError as exc:
            raise StoreError(f"Redis command failed: {type(exc).__name__}: {exc}") from exc
        except UnicodeEncodeError as exc:
            raise InvalidItemError(
                f"a key or context field is not valid Unicode text (cannot be encoded as "
                f"UTF-8): {exc.reason}; use text without lone surrogates",
                field="context",
            ) from exc

    async def _delete_namespace(self, client: Redis) -> None:
        batch: list[str] = []
        async for name in client.scan_iter(match=self.keys.pattern, count=500):
            batch.append(name)
            if len(batch) >= 500:
                await client.unlink(*batch)
                batch = []
        if batch:
            await client.unlink(*batch)


def _landed(
    ctx: StateHandlerContext,
    status: IdempotencyStatus,
    *,
    data: str | None = None,
    error_detail: str | None = None,
) -> Callable[[StateRecord | None], bool] | None:
    """The already-landed test for a fenced write, or None for a write without a token."""
    token = ctx.lock_token
    if token is None:
        return None
    return lambda record: write_landed(record, token, status, data=data, error_detail=error_detail)
