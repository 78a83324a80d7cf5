"""A store server that stops answering fails every call with a named StoreError, in bounded time.

A server frozen by ``SIGSTOP`` (or a network path that swallows packets)
keeps its connections open and answers nothing, so the server-side limits
(PostgreSQL's ``statement_timeout``, MariaDB's ``max_statement_time``)
never fire: only a bound on the client does.  Each store is frozen here in
a way that touches no shared server: PostgreSQL and Redis are servers of the
test's own, stopped with ``SIGSTOP``; MariaDB is reached through a proxy
that stops forwarding (the shared server itself runs on).  Each call is
awaited for at most ``WAIT_S``, far above its bound: a call that does not
fail by then fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
from private_servers import PrivateServer

from dsm_sim.netfaults import FaultProxy
from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handler import StateHandler
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.mariadb import drop_database
from reference_engine.scope import Scope

pytestmark = pytest.mark.integration

#: How long a call on a frozen store is awaited before the test calls it hung.
WAIT_S = 30.0
#: The statement timeout the SQL handlers get: their client-side bound is 2 s more.
STATEMENT_TIMEOUT_S = 1.0
CTX = StateHandlerContext(
    scope_id=int(Scope.ELEMENT),
    scope_code=Scope.ELEMENT.code,
    entity_id="frozen-store",
    entity_execution_id="exec-1",
    tenant_id="tenant-frozen",
    source_app_id="dsm-tests",
    handler_config=HandlerConfig(),
).for_item("INV-1")


async def _fails_by_name(handler: StateHandler, freeze: object, thaw: object) -> list[str]:
    """Open, freeze, then every call must raise StoreError; the messages, in call order."""
    assert callable(freeze) and callable(thaw)
    await handler.open()
    assert await handler.exists(CTX) is False  # the store works before it is frozen
    freeze()
    messages = []
    try:
        for call in (handler.exists, handler.try_acquire_lock):
            with pytest.raises(StoreError) as raised:
                await asyncio.wait_for(call(CTX), WAIT_S)
            messages.append(str(raised.value))
    finally:
        thaw()
        await asyncio.wait_for(handler.close(), WAIT_S)
    return messages


def test_a_frozen_postgresql_fails_each_call_with_a_store_error(
    private_postgres: PrivateServer,
) -> None:
    handler = sql_handler(
        private_postgres.url, SystemClock(), statement_timeout=STATEMENT_TIMEOUT_S
    )
    messages = asyncio.run(_fails_by_name(handler, private_postgres.freeze, private_postgres.thaw))
    assert (
        "exists failed on the postgresql store: the server did not answer within 3 s"
        in (messages[0])
    )
    assert all("frozen, overloaded or unreachable" in m for m in messages), messages


def test_a_mariadb_that_stops_answering_fails_each_call_with_a_store_error(
    mariadb_url: str,
) -> None:
    async def run() -> list[str]:
        host, port = _host_port(mariadb_url, 3306)
        schema = f"dsm_frozen_{uuid.uuid4().hex[:10]}"
        async with FaultProxy(host, port) as proxy:
            url = mariadb_url.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}")
            handler = sql_handler(
                url, SystemClock(), schema=schema, statement_timeout=STATEMENT_TIMEOUT_S
            )
            try:
                return await _fails_by_name(handler, proxy.stall, proxy.resume)
            finally:
                engine = create_engine_for(mariadb_url)
                await drop_database(engine, schema)
                await engine.dispose()

    messages = asyncio.run(run())
    assert "the server did not answer within 3 s" in messages[0], messages
    assert all("frozen, overloaded or unreachable" in m for m in messages), messages


def test_a_frozen_redis_fails_each_call_with_a_store_error(private_redis: str) -> None:
    url, pid = private_redis.rsplit("#", 1)
    handler = RedisStateHandler(url, SystemClock(), prefix=f"dsm-frozen-{uuid.uuid4().hex[:8]}")

    def freeze() -> None:
        os.kill(int(pid), signal.SIGSTOP)

    def thaw() -> None:
        os.kill(int(pid), signal.SIGCONT)

    messages = asyncio.run(_fails_by_name(handler, freeze, thaw))
    # try_acquire_lock goes through the handler's own pipelined connection.
    assert "Redis did not answer within 5s (the handler's command timeout)" in messages[1]


def _host_port(url: str, default: int) -> tuple[str, int]:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return str(parsed.host or "127.0.0.1"), int(parsed.port or default)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def private_redis() -> Iterator[str]:
    """A Redis server of this test's own on a free port: ``URL#PID``; killed afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("needs redis-server (CI=true: a missing service is a failure)")
        pytest.skip("needs redis-server")
    port = _free_port()
    directory = tempfile.mkdtemp(prefix="dsm-private-redis-")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until = time.monotonic() + 30
        while time.monotonic() < until:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0#{server.pid}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)
