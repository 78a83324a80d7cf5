"""The full happy path against the most used peer: Powertools idempotency on Redis.

One "key" is the whole path a new item takes: check whether it is done,
take the lock, do the (empty) work, record the result.  Each side handles
the same number of distinct, never-seen keys per round, with 1 and 8
concurrent workers, in alternating rounds so a change in machine load hits
every side alike:

* ``powertools @idempotent`` (the baseline): a function decorated with
  Powertools' ``@idempotent`` over its unmodified ``RedisCachePersistenceLayer``;
  ``save_inprogress`` (``SET NX``) before the work, ``save_success`` after;
* ``powertools layer``: the same layer's two calls made directly, without the
  decorator's own work (hashing stays: it is how the layer names the key);
* ``dsm redis``: the Redis handler through the node-facing machine,
  ``begin`` (one script) then ``set(Processed, data)`` (one script), fenced,
  keeping the full record;
* ``dsm redis on uvloop``: the same, with the application's event loop
  being uvloop (``pip install -e '.[fast]'``) instead of asyncio's own: the
  engine is a library and runs on the loop its application runs; the column
  is ``-`` when uvloop is not installed;
* ``dsm postgresql`` and ``dsm sqlite file``: the built-in SQL handler,
  the same two calls.

Powertools is synchronous, so its workers are threads; dsm's are asyncio
tasks on one event loop.  Both are each library's own way of running eight
callers in one process.  Connections are warmed before timing; every key
is fresh, so no side is answered from a cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from common import POSTGRES_ENV, BenchSkipped, Table, timed

from reference_engine.begin import Acquired
from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.handler import StateHandler
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.engine import drop_pg_schema
from reference_engine.handlers.sql.factory import sql_handler, sqlite_file_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.machine import ContextualDataStateMachine
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

__all__ = ["TITLE", "run"]

TITLE = "Full happy path per second (check, acquire, complete): dsm vs Powertools idempotency"
REDIS_ENV = "DSM_TEST_REDIS_URL"
SIDES = ("decorator", "layer", "redis", "redis_uvloop", "postgresql", "sqlite")
RATIOS = SIDES[1:]
HEADERS = (
    "workers",
    "powertools @idempotent keys/s",
    "powertools layer keys/s",
    "dsm redis keys/s",
    "dsm redis on uvloop keys/s",
    "dsm postgresql keys/s",
    "dsm sqlite file keys/s",
    "layer/decorator",
    "redis/decorator",
    "redis uvloop/decorator",
    "postgresql/decorator",
    "sqlite/decorator",
)
ROUNDS = 8
LEVELS = (1, 8)

#: One side's round: the keys of each worker -> seconds it took.
Side = Callable[[list[list[str]]], float]


def _base() -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=int(Scope.ELEMENT),
        scope_code=Scope.ELEMENT.code,
        entity_id="bench-peers",
        entity_execution_id="bench-run",
        tenant_id="bench",
        source_app_id="bench",
        handler_config=HandlerConfig(lock_duration=dt.timedelta(minutes=30)),
    )


class _Powertools:
    """Powertools' Redis layer, decorated and direct, on threads."""

    def __init__(self, url: str, workers: int) -> None:
        try:
            from aws_lambda_powertools.utilities.idempotency import (
                IdempotencyConfig,
                idempotent,
            )
            from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
                RedisCachePersistenceLayer,
            )
        except ImportError as exc:
            raise BenchSkipped(
                f"Powertools is not installed ({exc}): pip install -e '.[peers]'"
            ) from exc
        self.prefix = f"bench-peers-{uuid.uuid4().hex[:10]}"
        config = IdempotencyConfig(expires_after_seconds=600)
        self.decorated_layer = RedisCachePersistenceLayer(url=url)
        self.direct_layer = RedisCachePersistenceLayer(url=url)
        self.direct_layer.configure(config, key_prefix=f"{self.prefix}-direct")

        @idempotent(persistence_store=self.decorated_layer, config=config, key_prefix=self.prefix)
        def charge(event: dict[str, Any], context: object) -> dict[str, Any]:
            return {"charged": event["id"]}

        self.charge = charge
        self.pool = ThreadPoolExecutor(max_workers=workers)

    def decorator(self, keys: list[list[str]]) -> float:
        def row(mine: list[str]) -> None:
            for key in mine:
                self.charge({"id": key}, None)

        return self._threads(row, keys)

    def layer(self, keys: list[list[str]]) -> float:
        store = self.direct_layer

        def row(mine: list[str]) -> None:
            for key in mine:
                event = {"id": key}
                store.save_inprogress(data=event)
                store.save_success(data=event, result={"charged": key})

        return self._threads(row, keys)

    def _threads(self, row: Callable[[list[str]], None], keys: list[list[str]]) -> float:
        started = timed()
        list(self.pool.map(row, keys))
        return timed() - started

    def close(self) -> None:
        self.pool.shutdown()
        client: Any = self.direct_layer.client
        for pattern in (f"{self.prefix}#*", f"{self.prefix}-direct#*"):
            names = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(names), 500):
                client.unlink(*names[start : start + 500])


async def _happy_paths(handler: StateHandler, keys: list[list[str]]) -> float:
    """Each worker: begin, then set(Processed) under the token begin took."""
    base = _base()

    async def worker(mine: list[str]) -> None:
        dsm = ContextualDataStateMachine(handler, base)
        for key in mine:
            started = await dsm.begin(key)
            if not isinstance(started, Acquired):
                raise RuntimeError(f"a fresh key was not acquired: {key!r} -> {started!r}")
            await dsm.set(key, IdempotencyStatus.PROCESSED, {"charged": key})

    began = timed()
    await asyncio.gather(*(worker(mine) for mine in keys))
    return timed() - began


def _keys(side: str, tag: str, workers: int, per_worker: int) -> list[list[str]]:
    return [[f"{side}-{tag}-{w}-{i}" for i in range(per_worker)] for w in range(workers)]


def _level(
    loop: asyncio.Runner,
    uv_loop: asyncio.Runner | None,
    redis_url: str,
    pg_url: str | None,
    workers: int,
    per_worker: int,
) -> tuple[object, ...]:
    peers = _Powertools(redis_url, workers)
    clock = SystemClock()
    redis = RedisStateHandler(
        redis_url, clock, prefix=f"bench-peers-{uuid.uuid4().hex[:10]}", delete_on_close=True
    )
    schema = f"dsm_bench_{uuid.uuid4().hex[:12]}"
    postgres: SqlStateHandler | None = None
    if pg_url is not None:
        postgres = sql_handler(pg_url, clock, schema=schema, pool_size=workers, max_overflow=0)
    sqlite = sqlite_file_handler(clock)
    stores: dict[str, StateHandler | None] = {
        "redis": redis,
        "postgresql": postgres,
        "sqlite": sqlite,
    }

    def on(handler: StateHandler) -> Side:
        return lambda keys: loop.run(_happy_paths(handler, keys))

    sides: dict[str, Side] = {"decorator": peers.decorator, "layer": peers.layer}
    for name, store in stores.items():
        if store is not None:
            loop.run(store.open())
            sides[name] = on(store)
    fast: tuple[asyncio.Runner, RedisStateHandler] | None = None
    if uv_loop is not None:
        fast_redis = RedisStateHandler(
            redis_url, clock, prefix=f"bench-peers-{uuid.uuid4().hex[:10]}", delete_on_close=True
        )
        uv_loop.run(fast_redis.open())
        fast = (uv_loop, fast_redis)
        sides["redis_uvloop"] = lambda keys: uv_loop.run(_happy_paths(fast_redis, keys))
    try:
        for name, side in sides.items():  # warm every connection and script
            side(_keys(name, f"warm{workers}", workers, max(2, per_worker // 4)))
        spent = dict.fromkeys(sides, 0.0)
        for r in range(ROUNDS):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                spent[name] += sides[name](_keys(name, f"c{workers}r{r}", workers, per_worker))
        done = workers * per_worker * ROUNDS
        rate = {name: done / spent[name] for name in sides}
        base = rate["decorator"]
        cells = [rate.get(name, "-") for name in SIDES]
        ratios = [rate[name] / base if name in rate else "-" for name in RATIOS]
        return (workers, *cells, *ratios)
    finally:
        peers.close()
        if fast is not None:
            fast[0].run(fast[1].close())
        for store in stores.values():
            if store is None:
                continue
            if store is postgres:
                loop.run(_drop(postgres, schema))
            loop.run(store.close())


@contextlib.contextmanager
def _uvloop_runner() -> Iterator[asyncio.Runner | None]:
    """A runner on a uvloop event loop, or None when uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        yield None
        return
    factory = cast(Callable[[], asyncio.AbstractEventLoop], uvloop.new_event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        yield runner


async def _drop(handler: SqlStateHandler, schema: str) -> None:
    await drop_pg_schema(handler.engine, schema)


def run(short: bool) -> list[Table]:
    redis_url = os.environ.get(REDIS_ENV, "").strip()
    if not redis_url:
        raise BenchSkipped(f"Redis not configured: set {REDIS_ENV}")
    pg_url = os.environ.get(POSTGRES_ENV, "").strip() or None
    per_key_total = 160 if short else 16000
    rows = []
    # Outside Lambda, Powertools warns on every call that it has no remaining time.
    with warnings.catch_warnings(), asyncio.Runner() as loop, _uvloop_runner() as uv_loop:
        warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
        for workers in LEVELS:
            per_worker = max(1, per_key_total // workers // ROUNDS)
            rows.append(_level(loop, uv_loop, redis_url, pg_url, workers, per_worker))
        uvloop_missing = uv_loop is None
    note = (
        f"about {per_key_total} fresh keys per side and level, in {ROUNDS} alternating rounds; "
        "Powertools on threads, dsm on asyncio tasks; dsm keeps the full record and fences "
        "the completion"
        + ("" if pg_url else f"; PostgreSQL not configured ({POSTGRES_ENV}), its column is '-'")
        + (
            "; uvloop not installed (pip install -e '.[fast]'), its column is '-'"
            if uvloop_missing
            else ""
        )
    )
    return [Table(TITLE, HEADERS, rows, note)]
