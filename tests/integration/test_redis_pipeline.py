"""The Redis handler's pipelined script connection, against a real Redis.

Concurrent callers share one connection: their replies must come back to the
right caller, an unknown script must still run, and a connection lost
mid-call must surface as ``StoreError`` and be replaced on the next call.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest

from reference_engine.begin import Acquired, Completed
from reference_engine.clock import UTC, ManualClock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.redis_pipeline import PipelinedConnection, pipelinable
from reference_engine.status import IdempotencyStatus

pytestmark = [pytest.mark.integration, pytest.mark.redis]

S = IdempotencyStatus
START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BASE = StateHandlerContext(
    scope_id=4,
    scope_code="Element",
    entity_id="dispatch",
    entity_execution_id="run-1",
    tenant_id="tenant-1",
    source_app_id="app-1",
)


def _handler(url: str) -> RedisStateHandler:
    return RedisStateHandler(
        url, ManualClock(START), prefix=f"dsm-pipe-{uuid.uuid4().hex}", delete_on_close=True
    )


def test_concurrent_callers_get_their_own_replies(redis_url: str) -> None:
    async def flow() -> list[object]:
        pipe = PipelinedConnection(redis_url)
        try:
            script = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}"
            # An unknown SHA: NOSCRIPT, then the script itself is sent.
            sha = uuid.uuid4().hex[:40].ljust(40, "0")
            calls = [pipe.evalsha(sha, script, [f"k{i}"], [f"v{i}", i]) for i in range(8)]
            return list(await asyncio.gather(*calls))
        finally:
            pipe.close()

    assert asyncio.run(flow()) == [[f"k{i}", f"v{i}", 2 * i] for i in range(8)]
    assert pipelinable(redis_url) and not pipelinable("rediss://example:6380/0")


def test_the_happy_path_races_on_one_connection(redis_url: str) -> None:
    handler = _handler(redis_url)

    async def flow() -> tuple[list[object], object]:
        await handler.open()
        try:
            answers = await asyncio.gather(*(handler.begin(BASE.for_item("hot")) for _ in range(8)))
            token = next(a.token for a in answers if isinstance(a, Acquired))
            await handler.set(BASE.for_item("hot", lock_token=token), S.PROCESSED, {"n": 1})
            return [type(a).__name__ for a in answers], await handler.begin(BASE.for_item("hot"))
        finally:
            await handler.close()

    kinds, after = asyncio.run(flow())
    assert sorted(kinds) == ["Acquired"] + ["Locked"] * 7, "exactly one of eight takes the lock"
    assert isinstance(after, Completed) and after.record is not None
    assert after.record.data == {"n": 1}


def test_a_lost_connection_is_a_store_error_then_recovers(redis_url: str) -> None:
    handler = _handler(redis_url)

    async def flow() -> object:
        await handler.open()
        try:
            await handler.begin(BASE.for_item("a"))
            pipe = handler._pipe
            assert pipe is not None and pipe._transport is not None
            call = asyncio.ensure_future(handler.begin(BASE.for_item("b")))
            await asyncio.sleep(0)  # queued, not yet answered
            pipe._transport.abort()
            with pytest.raises(StoreError, match="Redis command failed"):
                await call
            return await handler.begin(BASE.for_item("c"))  # a fresh connection
        finally:
            await handler.close()

    assert asyncio.run(flow()) == Acquired(1)
