"""A store that lost its data under a running handler: every write fails closed.

Redis flushed mid-run and a SQLite file deleted (or swapped) under open
connections used to go unnoticed: the next delivery found "no record" and
charged again, or the writes went into a deleted inode nobody would read.
Each handler must now raise ``StoreLostError`` on the next write and write
nothing.

The Redis cases flush a database of their own (not the one ``DSM_TEST_REDIS_URL``
names), so other test runs sharing the server keep their keys.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import EvictingStoreError, StoreError, StoreLostError
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
CONFIG = HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=dt.timedelta(days=2))
#: The Redis database these tests flush; never the one the test URL names.
FLUSHED_DB = 14
#: They flush it in turn: one xdist worker runs them all (``--dist loadgroup``).
ONE_AT_A_TIME = pytest.mark.xdist_group(f"redis database {FLUSHED_DB}")


def ctx(item: str, token: int | None = None) -> StateHandlerContext:
    base = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="invoice-dispatch",
        entity_execution_id="run-1",
        tenant_id="tenant-1",
        source_app_id="app-1",
        handler_config=CONFIG,
    )
    return base.for_item(item, lock_token=token)


async def _writes(handler: RedisStateHandler | SqlStateHandler, held: int) -> list[str]:
    """Try every write a node or the catch-up worker makes; those that did not raise."""
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "try_acquire_lock": lambda: handler.try_acquire_lock(ctx("inv-new")),
        "set(Processed)": lambda: handler.set(ctx("inv-held", held), S.PROCESSED, {"n": 1}),
        "set(Skipped)": lambda: handler.set(ctx("inv-new"), S.SKIPPED),
        "release_lock_as_failed": lambda: handler.release_lock_as_failed(
            ctx("inv-held", held), "refused"
        ),
        "upsert": lambda: handler.upsert(ctx("inv-done"), {"n": 2}),
        "reset_expired_locks": handler.reset_expired_locks,
        "expire_past_retention": handler.expire_past_retention,
    }
    accepted = []
    for name, attempt in attempts.items():
        try:
            await attempt()
        except StoreLostError:
            pass
        else:
            accepted.append(name)
    return accepted


async def _prepare(handler: RedisStateHandler | SqlStateHandler) -> int:
    """One finished item and one held lock, as a handler mid-run has."""
    done = await handler.try_acquire_lock(ctx("inv-done"))
    assert done is not None
    await handler.set(ctx("inv-done", done), S.PROCESSED, {"charged": True})
    held = await handler.try_acquire_lock(ctx("inv-held"))
    assert held is not None
    return held


# --- Redis -----------------------------------------------------------------------------------


def test_a_lost_store_is_a_store_error() -> None:
    """Node code that stops on ``StoreError`` (never releasing after a charge) stops on it too."""
    assert issubclass(StoreLostError, StoreError)


def _other_db(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{FLUSHED_DB}"))


@asynccontextmanager
async def _flushable(redis_url: str) -> AsyncIterator[tuple[str, Redis]]:
    url = _other_db(redis_url)
    admin = Redis.from_url(url, decode_responses=True)
    try:
        await admin.ping()
    except RedisError as exc:
        await admin.aclose()
        pytest.skip(f"Redis database {FLUSHED_DB} is not available: {exc}")
    try:
        yield url, admin
    finally:
        await admin.flushdb()
        await admin.aclose()


def _redis(url: str, clock: ManualClock, prefix: str) -> RedisStateHandler:
    return RedisStateHandler(url, clock, prefix=prefix, delete_on_close=True)


@pytest.mark.redis
@ONE_AT_A_TIME
def test_flushdb_mid_run_fails_every_write_closed_and_writes_nothing(redis_url: str) -> None:
    async def scenario() -> None:
        async with _flushable(redis_url) as (url, admin):
            handler = _redis(url, ManualClock(START), f"lost-{uuid.uuid4().hex}")
            await handler.open()
            held = await _prepare(handler)
            await admin.flushdb()
            assert await _writes(handler, held) == []
            assert await admin.dbsize() == 0, "a write landed in the flushed store"
            with pytest.raises(StoreLostError, match=r"marker .* is missing") as info:
                await handler.try_acquire_lock(ctx("inv-done"))
            assert info.value.store == f"Redis namespace {handler.keys.namespace}"
            await handler.close()

    asyncio.run(scenario())


@pytest.mark.redis
@ONE_AT_A_TIME
def test_a_store_reopened_by_another_handler_after_a_flush_is_refused(redis_url: str) -> None:
    async def scenario() -> None:
        async with _flushable(redis_url) as (url, admin):
            clock = ManualClock(START)
            prefix = f"lost-{uuid.uuid4().hex}"
            old = _redis(url, clock, prefix)
            await old.open()
            held = await _prepare(old)
            await admin.flushdb()
            restarted = _redis(url, clock, prefix)
            await restarted.open()  # a process started after the loss: an empty store to it
            assert await restarted.try_acquire_lock(ctx("inv-other")) == 1
            with pytest.raises(StoreLostError, match="names another store"):
                await old.set(ctx("inv-held", held), S.PROCESSED)
            with pytest.raises(StoreLostError):
                await old.open()
            assert await restarted.get(ctx("inv-held")) is None
            await restarted.close()

    asyncio.run(scenario())


@pytest.mark.redis
@ONE_AT_A_TIME
def test_handlers_sharing_a_namespace_share_its_identity(redis_url: str) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        prefix = f"shared-{uuid.uuid4().hex}"
        one = RedisStateHandler(redis_url, clock, prefix=prefix)
        two = RedisStateHandler(redis_url, clock, prefix=prefix, delete_on_close=True)
        await one.open()
        await two.open()
        token = await one.try_acquire_lock(ctx("inv-1"))
        assert token == 1
        await two.set(ctx("inv-1", token), S.PROCESSED)
        assert await one.exists(ctx("inv-1"))
        await one.close()
        await two.close()

    asyncio.run(scenario())


@pytest.mark.redis
@ONE_AT_A_TIME
def test_a_handler_never_opened_claims_the_identity_on_its_first_write(redis_url: str) -> None:
    async def scenario() -> None:
        async with _flushable(redis_url) as (url, admin):
            handler = _redis(url, ManualClock(START), f"lazy-{uuid.uuid4().hex}")
            assert await handler.try_acquire_lock(ctx("inv-1")) == 1
            await admin.flushdb()
            with pytest.raises(StoreLostError):
                await handler.try_acquire_lock(ctx("inv-2"))
            await handler.close()

    asyncio.run(scenario())


# --- SQLite ----------------------------------------------------------------------------------


@asynccontextmanager
async def _sqlite(directory: Path) -> AsyncIterator[SqlStateHandler]:
    engine = create_engine_for(f"sqlite+aiosqlite:///{directory / 'dsm.db'}")
    handler = SqlStateHandler(engine, ManualClock(START))
    await handler.open()
    try:
        yield handler
    finally:
        await handler.close()


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM process_state_logs").fetchone()[0])


def test_deleting_the_sqlite_file_fails_every_write_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _sqlite(tmp_path) as handler:
            held = await _prepare(handler)
            for name in os.listdir(tmp_path):  # the file and its -wal / -shm companions
                os.remove(tmp_path / name)
            assert await _writes(handler, held) == []
            with pytest.raises(StoreLostError, match="deleted") as info:
                await handler.exists(ctx("inv-done"))
            assert str(tmp_path / "dsm.db") in info.value.store

    asyncio.run(scenario())


def test_a_sqlite_file_replaced_by_another_is_refused(tmp_path: Path) -> None:
    """A restore from a copy (or a fresh file created by a restart) is not the file opened."""

    async def scenario() -> None:
        async with _sqlite(tmp_path) as handler:
            held = await _prepare(handler)
            path = tmp_path / "dsm.db"
            copy = tmp_path / "copy.db"
            with sqlite3.connect(path) as source, sqlite3.connect(copy) as target:
                source.backup(target)
            before = _rows(copy)
            os.replace(copy, path)
            assert await _writes(handler, held) == []
            assert _rows(path) == before, "a write reached the replacing file"
            with pytest.raises(StoreLostError, match="another file"):
                await handler.get(ctx("inv-done"))

    asyncio.run(scenario())


def test_an_intact_sqlite_file_is_not_mistaken_for_a_lost_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _sqlite(tmp_path) as handler:
            held = await _prepare(handler)
            await handler.set(ctx("inv-held", held), S.PROCESSED)
            assert await handler.exists(ctx("inv-held"))
            assert await handler.reset_expired_locks() == 0

    asyncio.run(scenario())


#: The calls a node bases its side effect on: each must not answer from a file deleted under it.
DECIDING_CALLS: dict[str, Callable[[SqlStateHandler], Awaitable[object]]] = {
    "exists": lambda h: h.exists(ctx("inv-done")),
    "get": lambda h: h.get(ctx("inv-done")),
    "try_acquire_lock": lambda h: h.try_acquire_lock(ctx("inv-new")),
    "begin": lambda h: h.begin(ctx("inv-new")),
}


@pytest.mark.parametrize("call", list(DECIDING_CALLS))
def test_a_sqlite_file_deleted_while_a_deciding_call_runs_fails_it_closed(
    tmp_path: Path, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion lands between the check before the statement and its answer."""

    async def scenario() -> None:
        async with _sqlite(tmp_path) as handler:
            await _prepare(handler)
            statement = getattr(handler.repository, call)

            async def deleted_meanwhile(*args: object) -> object:
                answer = await statement(*args)
                for name in os.listdir(tmp_path):
                    os.remove(tmp_path / name)
                return answer

            monkeypatch.setattr(handler.repository, call, deleted_meanwhile)
            with pytest.raises(StoreLostError, match="deleted"):
                await DECIDING_CALLS[call](handler)

    asyncio.run(scenario())


# --- a Redis that evicts keys ----------------------------------------------------------------


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this module's own on a free port, so its policy can be changed."""
    import socket
    import subprocess
    import time

    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("redis-server is not installed (CI=true: a failure, not a skip)")
        pytest.skip("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            *(server, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(directory), "--maxmemory", "64mb"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the private redis-server on port {port} did not start")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _answers(url: str) -> bool:
    async def ping() -> bool:
        client = Redis.from_url(url)
        try:
            return bool(await client.ping())
        except RedisError:
            return False
        finally:
            await client.aclose()

    return asyncio.run(ping())


async def _with_policy(url: str, policy: str) -> None:
    admin = Redis.from_url(url, decode_responses=True)
    try:
        await admin.config_set("maxmemory-policy", policy)
    finally:
        await admin.aclose()


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_redis_that_evicts_keys_is_refused_before_any_record_is_trusted(
    private_redis: str, policy: str
) -> None:
    async def scenario() -> None:
        await _with_policy(private_redis, policy)
        opened = _redis(private_redis, ManualClock(START), f"evict-{uuid.uuid4().hex}")
        with pytest.raises(EvictingStoreError) as info:
            await opened.open()
        message = str(info.value)
        assert f"maxmemory-policy {policy}" in message
        assert "Set maxmemory-policy noeviction" in message
        assert (info.value.setting, info.value.value) == ("maxmemory-policy", policy)
        await opened.close()
        # A handler used without open() refuses its first acquire the same way.
        lazy = _redis(private_redis, ManualClock(START), f"evict-{uuid.uuid4().hex}")
        with pytest.raises(EvictingStoreError):
            await lazy.try_acquire_lock(ctx("inv-1"))
        await lazy.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_a_redis_that_cannot_evict_the_handlers_keys_is_accepted(
    private_redis: str, policy: str
) -> None:
    """The handler's keys carry no TTL, so the volatile-* policies never evict them."""

    async def scenario() -> None:
        await _with_policy(private_redis, policy)
        handler = _redis(private_redis, ManualClock(START), f"keep-{uuid.uuid4().hex}")
        await handler.open()
        assert await handler.try_acquire_lock(ctx("inv-1")) == 1
        client = Redis.from_url(private_redis, decode_responses=True)
        try:
            names = [n async for n in client.scan_iter(match=handler.keys.pattern)]
            assert names and all([await client.ttl(n) == -1 for n in names])  # no TTL on any key
        finally:
            await client.aclose()
        await handler.close()

    asyncio.run(scenario())
