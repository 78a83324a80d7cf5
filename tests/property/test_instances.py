"""Workers race through their own handler instances when the handler can make them.

A handler whose safety lives in the instance (an ``asyncio.Lock`` around
check-then-write) is correct with one instance and wrong with two on one
store; only racing through separate instances shows it.  ``peer()`` makes
those instances, and must share the store and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dsm_sim.broken.handlers import EntityMissingFromKey
from dsm_sim.broken.instances import InstanceLockedAcquire
from dsm_sim.conformance import verify
from dsm_sim.conformance.execute.instances import HandlerInstances
from dsm_sim.model import WORLD_START, ItemRef
from reference_engine.clock import ManualClock
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.handlers.redis_factory import redis_test_handler
from reference_engine.handlers.sql.factory import (
    postgres_test_handler,
    sqlite_file_handler,
    sqlite_memory_handler,
)
from reference_engine.instances import peer_of
from reference_engine.scope import Scope

pytestmark = pytest.mark.property

REF = ItemRef("t1", Scope.ELEMENT, "INV-1")


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _shares_the_store(owner: StateHandler) -> None:
    """A lock taken through the owner is live for the peer; closing the peer keeps the store."""
    await owner.open()
    peer = peer_of(owner)
    assert peer is not None and peer is not owner
    await peer.open()
    try:
        assert await owner.try_acquire_lock(REF.context(1)) == 1
        assert await peer.try_acquire_lock(REF.context(2)) is None
        record = await peer.get(REF.context(2))
        assert record is not None and record.attempt == 1
    finally:
        await peer.close()
    assert await owner.exists(REF.context(1)) is False  # Processing is not done
    assert (await owner.get(REF.context(1))) is not None
    await owner.close()


def _handler(factory: Callable[[ManualClock], StateHandler]) -> StateHandler:
    return factory(ManualClock(WORLD_START))


def test_in_memory_peers_share_the_records() -> None:
    _run(_shares_the_store(_handler(InMemoryStateHandler)))


def test_a_subclass_with_its_own_constructor_has_no_in_memory_peer() -> None:
    """Its constructor may keep part of the store beside the model (here, a routing table)."""
    assert peer_of(_handler(EntityMissingFromKey)) is None
    assert isinstance(peer_of(_handler(InstanceLockedAcquire)), InstanceLockedAcquire)


def test_sqlite_file_peers_share_the_file() -> None:
    _run(_shares_the_store(_handler(sqlite_file_handler)))


def test_a_private_in_memory_database_has_no_peer() -> None:
    assert peer_of(_handler(sqlite_memory_handler)) is None


def test_postgres_peers_share_the_schema(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)
    _run(_shares_the_store(_handler(postgres_test_handler)))


def test_redis_peers_share_the_namespace(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_REDIS_URL", redis_url)
    _run(_shares_the_store(_handler(redis_test_handler)))


def test_a_lock_held_by_the_instance_is_caught_through_peers() -> None:
    report = verify(InstanceLockedAcquire, "dev", seed=0, stop_on_first=True)
    assert [v.found_as for v in report.violations] == ["at_most_one_live_lock"]


def test_through_one_instance_the_same_search_passes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the peers add: with every worker on the factory's instance the bug hides."""
    monkeypatch.setattr(HandlerInstances, "of", lambda self, worker: self.owner)
    report = verify(InstanceLockedAcquire, "dev", seed=0, stop_on_first=True)
    assert report.passed, [v.render() for v in report.violations]
