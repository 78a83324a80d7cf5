"""The shipped handler keys resolve to working handlers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError, UnknownHandlerError
from reference_engine.handlers.defaults import default_registry
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.handlers.redis_handler import RedisStateHandler
from reference_engine.handlers.sql.handler import SqlStateHandler

pytestmark = pytest.mark.integration


def test_built_in_is_sqlite_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSM_DATABASE_URL", raising=False)
    monkeypatch.delenv("DSM_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    registry = default_registry(ManualClock())
    assert registry.keys == ("built-in", "in-memory")

    async def resolve() -> None:
        built_in = await registry.resolve("built-in")
        assert isinstance(built_in, SqlStateHandler)
        assert isinstance(await registry.resolve("in-memory"), InMemoryStateHandler)
        with pytest.raises(UnknownHandlerError) as info:
            await registry.resolve("redis")
        assert info.value.registered == ("built-in", "in-memory")
        await registry.close()

    asyncio.run(resolve())
    assert (tmp_path / "dsm.db").exists()


@pytest.mark.redis
def test_redis_key_when_a_url_is_given(redis_url: str) -> None:
    registry = default_registry(
        ManualClock(), database="sqlite+aiosqlite:///:memory:", redis_url=redis_url
    )

    async def resolve() -> None:
        assert isinstance(await registry.resolve("redis"), RedisStateHandler)
        await registry.close()

    asyncio.run(resolve())


def test_bad_database_url_fails_at_registration() -> None:
    with pytest.raises(ConfigurationError):
        default_registry(ManualClock(), database="oracle://nope")
