"""Semantics profiles as data: the model under a profile, their lookup, and a user's own layer.

The Powertools adapter is exercised here on a layer of the test's own (a dict
store, as a user's ``BasePersistenceLayer`` subclass would be), so its clock
binding and flow are checked without a service; the Redis layer runs in
``tests/integration/test_powertools_peer.py``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import pickle
import sys
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence import base as powertools_base
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from dsm_sim.conformance.judge.semantics import (
    DSM,
    POWERTOOLS,
    ProfiledModel,
    UnknownSemanticsError,
    resolve_semantics,
)
from dsm_sim.model import WORLD_ITEMS, WORLD_START, ItemRef
from dsm_sim.peers.powertools import bind_clock, layer_handler
from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError, StaleLockError
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit

S = IdempotencyStatus
REF = WORLD_ITEMS[0]
LOCK = REF.config.lock_duration
MS = dt.timedelta(milliseconds=1)


# --- the model under the powertools profile --------------------------------------------------


def test_a_failure_deletes_and_the_next_token_continues() -> None:
    model = ProfiledModel(POWERTOOLS)
    first = model.try_acquire_lock(REF.context(1), WORLD_START)
    assert first == 1
    model.release_lock_as_failed(REF.context(1, lock_token=1), "declined", WORLD_START)
    assert REF.record_key not in model.current
    # A fresh record, but never token 1 again: the old holder must not pass for the new one.
    assert model.try_acquire_lock(REF.context(2), WORLD_START) == 2
    with pytest.raises(StaleLockError):
        model.set(REF.context(1, lock_token=1), S.PROCESSED, None, WORLD_START)


def test_the_lock_has_ended_at_its_expiry_instant_and_the_guard_refuses_a_second_take_over() -> (
    None
):
    model = ProfiledModel(POWERTOOLS)
    model.try_acquire_lock(REF.context(1), WORLD_START)
    assert model.try_acquire_lock(REF.context(2), WORLD_START + LOCK - MS) is None
    assert model.try_acquire_lock(REF.context(2), WORLD_START + LOCK) == 2  # the spec: refused
    # The take-over at T set a 10 s guard; the new lock (5 s) cannot be taken before it ends.
    short = ItemRef(REF.tenant, REF.scope, "G", config=ItemRef.CONFIGS["short"])  # lock 5 s
    at = WORLD_START
    model.try_acquire_lock(short.context(1), at)
    assert model.try_acquire_lock(short.context(2), at + dt.timedelta(seconds=5)) == 2
    assert model.try_acquire_lock(short.context(3), at + dt.timedelta(seconds=10)) is None
    assert model.try_acquire_lock(short.context(3), at + dt.timedelta(seconds=15, milliseconds=1))


def test_a_ttl_drops_the_record_a_millisecond_after_its_end() -> None:
    model = ProfiledModel(POWERTOOLS)
    token = model.try_acquire_lock(REF.context(1), WORLD_START)
    model.set(REF.context(1, lock_token=token), S.PROCESSED, {"a": 1}, WORLD_START)
    end = model.current[REF.record_key].retain_until
    assert end is not None
    model.settle(end + dt.timedelta(microseconds=1))  # the same millisecond: still there
    assert REF.record_key in model.current
    model.settle(end + MS)
    assert REF.record_key not in model.current
    assert model.expire_past_retention(end + MS) == 0  # no sweep to count


def test_a_holder_whose_record_expired_untaken_may_still_complete() -> None:
    model = ProfiledModel(POWERTOOLS)
    token = model.try_acquire_lock(REF.context(1), WORLD_START)
    assert REF.config.retention is not None
    late = WORLD_START + REF.config.retention + dt.timedelta(seconds=1)
    model.set(REF.context(1, lock_token=token), S.PROCESSED, {"a": 1}, late)
    assert model.current[REF.record_key].status is S.PROCESSED


def test_no_sweep_under_powertools_and_the_spec_unchanged_under_dsm() -> None:
    lenient, strict = ProfiledModel(POWERTOOLS), ProfiledModel(DSM)
    for model in (lenient, strict):
        model.try_acquire_lock(REF.context(1), WORLD_START)
    past = WORLD_START + LOCK + dt.timedelta(seconds=1)
    assert lenient.reset_expired_locks(past) == 0
    assert strict.reset_expired_locks(past) == 1
    assert strict.current[REF.record_key].status is S.FAILED


# --- naming a profile --------------------------------------------------------------------------


def _declared(clock: Any) -> Any:
    raise AssertionError("never built")


_declared.dsm_semantics = POWERTOOLS  # type: ignore[attr-defined]


def test_profiles_are_found_by_name_path_or_declaration() -> None:
    assert resolve_semantics("powertools") is POWERTOOLS
    assert resolve_semantics("dsm_sim.conformance.judge.semantics:POWERTOOLS") is POWERTOOLS
    assert resolve_semantics(None, _declared) is POWERTOOLS
    assert resolve_semantics(None, object()) is DSM
    assert DSM.strict and not POWERTOOLS.strict


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nonsense", "not a known profile"),
        ("no_such_module_xyz:P", "cannot import"),
        ("dsm_sim.conformance.judge.semantics:resolve_semantics", "it is a function"),
    ],
)
def test_an_unknown_profile_is_refused_by_name(spec: str, problem: str) -> None:
    with pytest.raises(UnknownSemanticsError, match=problem) as caught:
        resolve_semantics(spec)
    assert isinstance(caught.value, ConfigurationError)
    assert "powertools" in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))
    assert str(again) == str(caught.value)


# --- a user's own layer ------------------------------------------------------------------------


class DictLayer(BasePersistenceLayer):
    """A user's layer: a dict, with its own read of the clock in ``_put_record``."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, DataRecord] = {}

    def _get_record(self, idempotency_key: str) -> DataRecord:
        try:
            return self.items[idempotency_key]
        except KeyError:
            raise IdempotencyItemNotFoundError from None

    def _put_record(self, data_record: DataRecord) -> None:
        old = self.items.get(data_record.idempotency_key)
        # The user's own wall-clock read, which bind_clock must redirect.
        now_ms = int(dt.datetime.now().timestamp() * 1000)
        if old is not None and not old.is_expired:
            ended = old.in_progress_expiry_timestamp
            if old.status == "COMPLETED" or ended is None or ended > now_ms:
                raise IdempotencyItemAlreadyExistsError
        self.items[data_record.idempotency_key] = data_record

    def _update_record(self, data_record: DataRecord) -> None:
        self.items[data_record.idempotency_key] = data_record

    def _delete_record(self, data_record: DataRecord) -> None:
        self.items.pop(data_record.idempotency_key, None)


def test_a_users_layer_reads_the_harness_clock_and_shows_the_hazard() -> None:
    layers: list[DictLayer] = []

    def make(clock: Any) -> DictLayer:
        layers.append(DictLayer())
        return layers[-1]

    factory = layer_handler(make)
    assert getattr(factory, "dsm_semantics", None) is POWERTOOLS

    async def scenario() -> None:
        clock = ManualClock(WORLD_START)
        handler = factory(clock)
        first = await handler.try_acquire_lock(REF.context(1))
        record = await handler.get(REF.context(1))
        assert record is not None
        assert record.locked_until == WORLD_START + LOCK  # from the harness clock, not 1970 + now
        assert await handler.try_acquire_lock(REF.context(2)) is None
        clock.advance(LOCK)
        second = await handler.try_acquire_lock(REF.context(2))
        assert (first, second) == (1, 2)
        await handler.set(REF.context(1, lock_token=first), S.PROCESSED, {"charge": 1})
        done = await handler.get(REF.context(2))
        assert done is not None
        assert done.status is S.PROCESSED  # the stale holder's completion was accepted
        await handler.close()
        assert layers[0].items == {}  # close() deleted what it touched, through the layer

    asyncio.run(scenario())


def test_bind_clock_changes_one_instance_and_no_module() -> None:
    clock = ManualClock(WORLD_START)
    bound = bind_clock(DictLayer(), clock)
    plain = DictLayer()
    assert type(plain) is DictLayer
    assert type(bound) is not DictLayer and isinstance(bound, DictLayer)
    assert powertools_base.dt is dt
    assert sys.modules[__name__].dt is dt
    assert bound._get_expiry_timestamp() == int((WORLD_START + dt.timedelta(hours=1)).timestamp())
