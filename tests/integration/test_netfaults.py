"""Real network faults between a worker and its store, through :class:`FaultProxy`.

The handlers talk to the real PostgreSQL and Redis over real sockets; only
the proxy in between delays, stalls, partitions or resets the connection.
Lock time is a :class:`ManualClock`'s, so a 30 s lock expires at once while
each test stays a second or two of real time.

The crucial case is a worker whose lock expires during a partition, whose
item is taken over by another worker, and whose late ``set`` arrives after
the partition heals: fencing must reject it, on PostgreSQL and on MariaDB.  The same sequence run with a
handler that ignores the token must show the stale write landing, or the
check below would pass whatever the handler does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from dsm_sim.broken.sql import UnfencedSqlHandler
from dsm_sim.netfaults import (
    Direction,
    FaultKind,
    FaultProxy,
    FaultWindow,
    InvalidFaultError,
    ProxyStateError,
    history_events,
)
from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import StaleLockError, StoreError
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.engine import (
    create_engine_for,
    create_pg_schema,
    drop_pg_schema,
    normalize_url,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.mariadb import create_database, drop_database
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
T = process_state_logs
START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
LOCK = dt.timedelta(seconds=30)
CONFIG = HandlerConfig(lock_duration=LOCK, retention=dt.timedelta(days=2))
#: asyncpg's per-statement timeout for the timeout case: the partition outlasts it, and every
#: other statement of worker A must not (on a loaded machine one can take a second).
COMMAND_TIMEOUT_S = 2.0


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


#: The SQL servers the late-write case runs on, by the fixture that gives each one's URL.
SQL_SERVERS = [
    pytest.param("postgres_url", marks=pytest.mark.postgres, id="postgresql"),
    pytest.param("mariadb_url", marks=pytest.mark.mariadb, id="mariadb"),
]


def _upstream(url: str) -> tuple[str, int]:
    parsed = make_url(url)
    default = 3306 if parsed.get_backend_name() == "mariadb" else 5432
    return parsed.host or "127.0.0.1", parsed.port or default


def _through(url: str, port: int) -> str:
    """``url`` pointed at the proxy: same database, user and driver, another port."""
    return normalize_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def _engine(url: str, schema: str, connect_args: dict[str, Any] | None = None) -> AsyncEngine:
    """One pooled connection, so "A's connection" is one socket the proxy can fault.

    ``connect_args`` is passed to asyncpg: the SQL handler's factories expose no
    statement timeout, so the timeout case sets asyncpg's ``command_timeout`` here.
    """
    if connect_args is None:
        return create_engine_for(url, schema=schema, pool_size=1, max_overflow=0)
    engine = create_async_engine(
        normalize_url(url), pool_size=1, max_overflow=0, connect_args=connect_args
    )
    return engine.execution_options(schema_translate_map={None: schema})


@asynccontextmanager
async def _workers(
    postgres_url: str,
    proxy: FaultProxy,
    clock: ManualClock,
    *,
    a_class: type[SqlStateHandler] = SqlStateHandler,
    connect_args: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[SqlStateHandler, SqlStateHandler]]:
    """Worker A through the proxy and worker B direct, both on one fresh schema, dropped after.

    On MariaDB the schema is a database of its own, as the isolated handler makes it.
    """
    schema = f"dsm_net_{uuid.uuid4().hex[:12]}"
    mariadb = make_url(postgres_url).get_backend_name() == "mariadb"

    async def create(engine: AsyncEngine) -> None:
        await (create_database if mariadb else create_pg_schema)(engine, schema)

    b = SqlStateHandler(_engine(postgres_url, schema), clock, on_open=create)
    a = a_class(_engine(_through(postgres_url, proxy.port), schema, connect_args), clock)
    try:
        await b.open()
        await a.open()
        yield a, b
    finally:
        await a.close()
        await b.close()
        cleanup = create_engine_for(postgres_url)
        try:
            await (drop_database if mariadb else drop_pg_schema)(cleanup, schema)
        finally:
            await cleanup.dispose()


# --- 1. the late write after a partition ------------------------------------------------------


def fencing_violations(
    late_write: BaseException | None, record: StateRecord | None, takeover_token: int
) -> list[str]:
    """What went wrong if the partitioned worker's late write was not fenced off."""
    problems = []
    if not isinstance(late_write, StaleLockError):
        problems.append(f"the late set(Processed) was not rejected: {late_write!r}")
    if record is None:
        return [*problems, "the record is gone"]
    if record.data != {"by": "B"} or record.attempt != takeover_token:
        problems.append(
            f"the take-over's record was overwritten: data={record.data}, attempt={record.attempt}"
        )
    if record.status is not S.PROCESSED:
        problems.append(f"the record is {record.status.label}, not Processed")
    return problems


async def _late_write_after_partition(
    postgres_url: str, a_class: type[SqlStateHandler]
) -> tuple[BaseException | None, StateRecord | None, int, tuple[FaultWindow, ...]]:
    clock = ManualClock(START)
    host, port = _upstream(postgres_url)
    async with (
        FaultProxy(host, port, clock=lambda: clock.now().timestamp()) as proxy,
        _workers(postgres_url, proxy, clock, a_class=a_class) as (a, b),
    ):
        token_a = await a.try_acquire_lock(ctx("INV-1"))
        assert token_a == 1
        proxy.begin_partition()
        late = asyncio.ensure_future(a.set(ctx("INV-1", token_a), S.PROCESSED, {"by": "A"}))
        await proxy.wait_queued(Direction.TO_SERVER)  # A's write is in flight, held by the network
        clock.advance(LOCK + dt.timedelta(seconds=1))
        assert await b.reset_expired_locks() == 1  # the catch-up sweep: A's lock expired
        token_b = await b.try_acquire_lock(ctx("INV-1"))
        assert token_b == 2
        await b.set(ctx("INV-1", token_b), S.PROCESSED, {"by": "B"})
        proxy.heal("resume")  # A's queued bytes now reach the server, after B's write
        outcome: BaseException | None = None
        try:
            await late
        except StaleLockError as exc:
            outcome = exc
        record = await b.get(ctx("INV-1"))
        return outcome, record, token_b, proxy.windows


@pytest.mark.parametrize("server", SQL_SERVERS)
def test_late_write_after_partition_is_fenced_off(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    outcome, record, token_b, windows = asyncio.run(
        _late_write_after_partition(url, SqlStateHandler)
    )
    assert fencing_violations(outcome, record, token_b) == []
    assert isinstance(outcome, StaleLockError)
    # The log marks the partition over the instant A's lock expired.
    (partition,) = [w for w in windows if w.kind is FaultKind.PARTITION]
    assert partition.covers((START + LOCK).timestamp())
    assert partition.detail == "heal=resume"
    marks = history_events(windows)
    assert [e.detail for e in marks] == [
        "partition (heal=resume) begins",
        "partition (heal=resume) ends",
    ]


@pytest.mark.parametrize("server", SQL_SERVERS)
def test_unfenced_handler_lets_the_late_write_land(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    outcome, record, token_b, _ = asyncio.run(_late_write_after_partition(url, UnfencedSqlHandler))
    assert outcome is None
    assert record is not None and record.data == {"by": "A"}
    problems = fencing_violations(outcome, record, token_b)
    assert any("not rejected" in p for p in problems)
    assert any("overwritten" in p for p in problems)


# --- 2. a reset mid-statement -----------------------------------------------------------------


async def _reset_mid_statement(postgres_url: str) -> None:
    clock = ManualClock(START)
    host, port = _upstream(postgres_url)
    async with FaultProxy(host, port) as proxy, _workers(postgres_url, proxy, clock) as (a, b):
        assert await a.try_acquire_lock(ctx("INV-0")) == 1  # warm: statements prepared

        # The request is held in the network when the connection is reset: it never ran.
        proxy.stall()
        call = asyncio.ensure_future(a.try_acquire_lock(ctx("INV-2")))
        await proxy.wait_queued(Direction.TO_SERVER)
        assert proxy.reset_connections() == 1
        proxy.resume()
        with pytest.raises(StoreError, match="try_acquire_lock failed"):
            await call
        assert await b.get(ctx("INV-2")) is None
        assert await a.try_acquire_lock(ctx("INV-2")) == 1  # a fresh connection from the pool
        assert proxy.accepted == 2

        # The statement ran, its reply is lost: a whole row or none, never half of one.
        proxy.stall(Direction.TO_CLIENT)
        call = asyncio.ensure_future(a.try_acquire_lock(ctx("INV-3")))
        await proxy.wait_queued(Direction.TO_CLIENT)
        proxy.reset_connections()
        proxy.resume()
        with pytest.raises(StoreError):
            await call
        record = await b.get(ctx("INV-3"))
        if make_url(postgres_url).get_backend_name() == "mariadb":
            # Each statement runs in a transaction of its own: its COMMIT was
            # never sent, so the reset rolled the whole acquisition back.
            assert record is None
            assert await a.try_acquire_lock(ctx("INV-3")) == 1
        else:
            # The fast path runs in autocommit: the row committed with the statement.
            assert record is not None
            assert (record.status, record.attempt, record.locked_until) == (
                S.PROCESSING,
                1,
                START + LOCK,
            )
            # The caller's outcome was unknown; the store's is not: the lock is live.
            assert await a.try_acquire_lock(ctx("INV-3")) is None
        assert await a.exists(ctx("INV-0")) is False


@pytest.mark.parametrize("server", SQL_SERVERS)
def test_reset_mid_statement_is_a_store_error_and_the_pool_recovers(
    server: str, request: pytest.FixtureRequest
) -> None:
    asyncio.run(_reset_mid_statement(request.getfixturevalue(server)))


# --- 3. latency and a partition longer than the client's timeout -------------------------------


async def _sequence(handler: SqlStateHandler, item: str) -> list[object]:
    """A node's calls for one item, then a duplicate delivery; what each returned."""
    out: list[object] = [await handler.exists(ctx(item))]
    token = await handler.try_acquire_lock(ctx(item))
    out.append(token)
    await handler.set(ctx(item, token), S.PROCESSED, {"n": 1})
    out.append(await handler.exists(ctx(item)))
    out.append(await handler.try_acquire_lock(ctx(item)))
    record = await handler.get(ctx(item))
    out.append(None if record is None else (record.status, record.attempt, record.data))
    return out


async def _latency(postgres_url: str) -> tuple[list[object], list[object], tuple[FaultWindow, ...]]:
    clock = ManualClock(START)
    host, port = _upstream(postgres_url)
    async with FaultProxy(host, port) as proxy, _workers(postgres_url, proxy, clock) as (a, b):
        proxy.set_latency(to_server=0.02, to_client=0.03)
        slow = await _sequence(a, "INV-L1")
        proxy.set_latency()
        direct = await _sequence(b, "INV-L2")
        return slow, direct, proxy.windows


@pytest.mark.parametrize("server", SQL_SERVERS)
def test_latency_does_not_change_outcomes(server: str, request: pytest.FixtureRequest) -> None:
    slow, direct, windows = asyncio.run(_latency(request.getfixturevalue(server)))
    assert slow == direct == [False, 1, True, None, (S.PROCESSED, 1, {"n": 1})]
    assert [(w.kind, w.detail) for w in windows] == [
        (FaultKind.LATENCY, "to_server=0.02s to_client=0.03s")
    ]


async def _partition_past_timeout(postgres_url: str) -> None:
    clock = ManualClock(START)
    host, port = _upstream(postgres_url)
    async with (
        FaultProxy(host, port) as proxy,
        _workers(
            postgres_url, proxy, clock, connect_args={"command_timeout": COMMAND_TIMEOUT_S}
        ) as (a, _b),
    ):
        assert await a.try_acquire_lock(ctx("INV-T")) == 1
        proxy.begin_partition()
        with pytest.raises(StoreError, match="TimeoutError"):
            await a.exists(ctx("INV-T"))
        proxy.heal("reset")
        # The pool drops the timed-out connection: the next call opens a fresh one and works.
        record = await a.get(ctx("INV-T"))
        assert record is not None
        assert (record.status, record.attempt) == (S.PROCESSING, 1)


@pytest.mark.postgres
def test_partition_longer_than_the_statement_timeout_is_a_store_error(postgres_url: str) -> None:
    asyncio.run(_partition_past_timeout(postgres_url))


# --- 4. Redis ---------------------------------------------------------------------------------


def _redis_through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    where = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{where}" if len(netloc) == 2 else where))


async def _redis_reset(redis_url: str) -> None:
    clock = ManualClock(START)
    parts = urlsplit(redis_url)
    async with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
        handler = RedisStateHandler(
            _redis_through(redis_url, proxy.port),
            clock,
            prefix=f"dsm-net-{uuid.uuid4().hex}",
            delete_on_close=True,
            single_connection=True,
        )
        try:
            await handler.open()
            token = await handler.try_acquire_lock(ctx("INV-R"))
            assert token == 1

            # A reset idle connection: the next command fails as a StoreError (redis-py
            # does not retry it on a single-connection client), the one after reconnects.
            assert proxy.reset_connections() == 1
            with pytest.raises(StoreError, match="Redis command failed"):
                await handler.get(ctx("INV-R"))
            record = await handler.get(ctx("INV-R"))
            assert record is not None and record.attempt == 1
            assert proxy.accepted == 2

            # A reset mid-command: the write held in the network is lost with the connection.
            proxy.stall()
            call = asyncio.ensure_future(handler.set(ctx("INV-R", token), S.PROCESSED, {"n": 1}))
            await proxy.wait_queued(Direction.TO_SERVER)
            proxy.reset_connections()
            proxy.resume()
            with pytest.raises(StoreError, match="Redis command failed"):
                await call

            # While the server is unreachable (every connect reset) calls keep failing.
            proxy.refuse()
            with pytest.raises(StoreError, match="Redis command failed"):
                await handler.get(ctx("INV-R"))
            proxy.refuse(False)

            # Recovery: the lost write never ran, and the holder's retry lands.
            for _ in range(2):  # the connection the refusal reset may fail once more
                try:
                    record = await handler.get(ctx("INV-R"))
                    break
                except StoreError:
                    continue
            else:
                pytest.fail("the Redis handler did not recover once connections were accepted")
            assert record is not None and record.status is S.PROCESSING
            await handler.set(ctx("INV-R", token), S.PROCESSED, {"n": 1})
            record = await handler.get(ctx("INV-R"))
            assert record is not None and (record.status, record.data) == (S.PROCESSED, {"n": 1})
        finally:
            await handler.close()
        kinds = [w.kind for w in proxy.windows]
        assert kinds.count(FaultKind.RESET) == 2 and FaultKind.REFUSE in kinds


@pytest.mark.redis
def test_redis_reset_is_a_store_error_then_recovers(redis_url: str) -> None:
    asyncio.run(_redis_reset(redis_url))


# --- the proxy's own contract -----------------------------------------------------------------


async def _misuse() -> None:
    async with FaultProxy("127.0.0.1", 9) as proxy:
        proxy.begin_partition()
        with pytest.raises(InvalidFaultError, match="allowed: 'resume' or 'reset'"):
            proxy.heal("drop")  # type: ignore[arg-type]
        with pytest.raises(InvalidFaultError, match="to_server=-1"):
            proxy.set_latency(to_server=-1)


def test_misused_controls_are_named_errors() -> None:
    asyncio.run(_misuse())


async def _heal_modes() -> tuple[bytes, bytes, int]:
    """Both heals against an echo server: resume delivers the held bytes, reset loses them."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with FaultProxy("127.0.0.1", port) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            proxy.begin_partition()
            writer.write(b"late")
            await proxy.wait_queued(Direction.TO_SERVER, 4)
            proxy.heal("resume")
            resumed = await reader.readexactly(4)

            proxy.begin_partition()
            writer.write(b"lost")
            await proxy.wait_queued(Direction.TO_SERVER, 4)
            reset = proxy.heal("reset")
            try:
                after_reset = await reader.read(1024)
            except ConnectionResetError:
                after_reset = b""  # the RST itself, rather than an end of stream
            writer.close()
            return resumed, after_reset, reset
    finally:
        server.close()
        await server.wait_closed()


def test_resume_delivers_held_bytes_and_reset_loses_them() -> None:
    resumed, after_reset, reset = asyncio.run(_heal_modes())
    assert resumed == b"late"
    assert after_reset == b""
    assert reset == 1


async def _before_start() -> None:
    proxy = FaultProxy("127.0.0.1", 9)
    with pytest.raises(ProxyStateError, match="not started"):
        proxy.stall()


def test_controls_before_start_are_named_errors() -> None:
    asyncio.run(_before_start())
