"""Powertools' idempotency utility on a real Redis, verified by the kit under its own semantics.

The expected finding is pinned: a holder whose in-progress record expired and
was taken over still completes (or deletes) with ``save_success``
(``delete_record``) over the record of the worker that took over, because
neither call checks who owns the key.  A Powertools release that adds an
ownership check makes ``test_the_kit_reports_the_ownership_hazard`` fail, and
this file (and ``docs/peers.md``) must then be updated.  What Powertools does
by design (delete instead of Failed, no sweeps, TTL retention) must not be
reported.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from pathlib import Path

import pytest
import redis

from dsm_sim.conformance import cli
from dsm_sim.conformance.judge.semantics import POWERTOOLS
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.model import WORLD_ITEMS, WORLD_START
from dsm_sim.peers import powertools as peer
from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError, LockNotHeldError, UnsupportedStatusError
from reference_engine.status import IdempotencyStatus

pytestmark = [pytest.mark.integration, pytest.mark.redis]

S = IdempotencyStatus
#: A seed whose first failing test case is the ownership hazard (generation is fixed by it).
SEED = 1
#: Properties that are hazards in any design; the only ones the run may report.
OWNERSHIP = {"stale_write_rejected", "allowed_transitions_only", "at_most_one_live_lock"}


@pytest.fixture
def peer_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test Redis, as the peer factory reads it."""
    monkeypatch.delenv(peer.PEER_REDIS_ENV, raising=False)
    monkeypatch.setenv("DSM_TEST_REDIS_URL", redis_url)
    return redis_url


def _keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"{prefix}*"))
    finally:
        client.close()


def test_a_stale_holders_completion_overwrites_the_takers_record(peer_redis: str) -> None:
    """The hazard by hand, on the unmodified layer: the kit's finding is not an artefact."""

    async def scenario() -> None:
        clock = ManualClock(WORLD_START)
        handler = peer.redis_layer(clock)
        ref = WORLD_ITEMS[0]
        try:
            first = await handler.try_acquire_lock(ref.context(1))
            assert first is not None
            assert await handler.try_acquire_lock(ref.context(2)) is None  # the lock is live
            clock.advance(ref.config.lock_duration)  # its expiry instant: Powertools ends it
            second = await handler.try_acquire_lock(ref.context(2))
            assert second is not None
            # Worker 1 wakes and completes; nothing checks that it still owns the key.
            await handler.set(ref.context(1, lock_token=first), S.PROCESSED, {"charge": 1})
            record = await handler.get(ref.context(2))
            assert record is not None
            assert record.status is S.PROCESSED
            assert record.data == {"charge": 1}
        finally:
            prefix = handler.key_prefix
            await handler.close()
        assert _keys(peer_redis, prefix) == []

    asyncio.run(scenario())


def test_the_kit_reports_the_ownership_hazard(peer_redis: str) -> None:
    report = verify(peer.redis_layer, profile="dev", seed=SEED, time_zone="UTC", stop_on_first=True)
    assert report.semantics == "powertools"
    assert report.violations, "no violation: has Powertools started checking ownership?"
    found = report.violations[0]
    assert found.found_as == "stale_write_rejected", found.render()
    # Shrinking keeps any failure, so the shrunk program may end on the delete variant.
    assert found.name in OWNERSHIP, found.render()
    if found.name == "stale_write_rejected":
        assert "was accepted" in found.message, found.render()
        assert "taken over" in found.message, found.render()
    assert found.reproduction.count("build_machine(redis_layer") == 1
    # By-design differences are waived with their reason, never reported.
    for name, why in POWERTOOLS.waived.items():
        result = report.result(name)
        assert result.status is ResultStatus.WAIVED
        assert result.message == why


def test_dsm_verify_prints_the_finding_and_its_counterexample(
    peer_redis: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(
        [
            "dsm_sim.peers.powertools:redis_layer",
            *("--profile", "dev", "--seed", str(SEED), "--tz", "UTC"),
            *("--semantics", "powertools", "--stop-on-first", "--cache-dir", str(tmp_path)),
        ]
    )
    code = cli.main(args)
    out, err = capsys.readouterr()
    assert code == cli.EXIT_VIOLATION
    assert "semantics powertools" in out
    assert "violated:" in out
    assert "What happened:" in out
    assert "Minimal reproduction (paste and run):" in out
    assert "semantics='powertools'" in out
    assert "WAIVED" in out
    assert "by design: no lock sweep" in out
    assert "--semantics powertools" in err


def test_writes_outside_powertools_flow_are_refused_by_name(peer_redis: str) -> None:
    async def scenario() -> None:
        clock = ManualClock(dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC))
        handler = peer.redis_layer(clock)
        ref = WORLD_ITEMS[0]
        try:
            with pytest.raises(LockNotHeldError):
                await handler.set(ref.context(1), S.PROCESSED, None)
            with pytest.raises(UnsupportedStatusError, match="Skipped"):
                await handler.set(ref.context(1), S.SKIPPED, None)
            with pytest.raises(peer.UnsupportedOperationError, match="upsert"):
                await handler.upsert(ref.context(1), {"amount": 1})
            assert await handler.reset_expired_locks() == 0
        finally:
            await handler.close()

    asyncio.run(scenario())


def test_a_missing_redis_url_names_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(peer.PEER_REDIS_ENV, raising=False)
    monkeypatch.delenv("DSM_TEST_REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="DSM_POWERTOOLS_REDIS_URL"):
        peer.redis_layer(ManualClock())
