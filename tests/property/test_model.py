"""Properties of the reference model itself: the yardstick must be straight.

Random operation sequences (any worker, item, status, clock move) are applied
to :class:`ReferenceModel`, and what the kit relies on is checked directly:
one record per key, tokens that only grow, refusals that change nothing,
transitions from the table, sweeps that touch only what they should.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsm_sim.model import (
    SWEEP_ERROR_DETAIL,
    WORLD_CONFIG,
    WORLD_ITEMS,
    WORLD_START,
    ItemRef,
    ModelRecord,
    Outcome,
    ReferenceModel,
    effective_status,
    outcome_of,
)
from reference_engine.status import IdempotencyStatus, is_allowed

pytestmark = pytest.mark.property

S = IdempotencyStatus
ITEMS = st.sampled_from(WORLD_ITEMS)
DATA = st.none() | st.fixed_dictionaries({"amount": st.integers(0, 9)})
STATUSES = st.sampled_from([s for s in S if s is not S.NONE])

OPERATION = st.one_of(
    st.tuples(st.just("acquire"), st.integers(1, 3), ITEMS),
    st.tuples(st.just("set"), st.integers(1, 3), ITEMS, STATUSES, DATA),
    st.tuples(st.just("release"), st.integers(1, 3), ITEMS),
    st.tuples(st.just("upsert"), st.integers(1, 3), ITEMS, DATA),
    st.tuples(st.just("tick"), st.integers(-3600, 3 * 86400)),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("retention")),
)


class World:
    """The model plus each worker's tokens, as the state machine keeps them."""

    def __init__(self) -> None:
        self.model = ReferenceModel()
        self.now = WORLD_START
        self.tokens: dict[tuple[int, ItemRef], int] = {}
        self.issued: dict[ItemRef, list[int]] = {}

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "tick":
            self.now += dt.timedelta(seconds=op[1])
            return
        if kind == "sweep":
            self.model.reset_expired_locks(self.now)
            return
        if kind == "retention":
            self.model.expire_past_retention(self.now)
            return
        worker, ref = op[1], op[2]
        ctx = ref.context(worker, lock_token=self.tokens.get((worker, ref)))
        if kind == "acquire":
            token = self.model.try_acquire_lock(ctx, self.now)
            if token is not None:
                self.tokens[(worker, ref)] = token
                self.issued.setdefault(ref, []).append(token)
            return
        self.write(op)

    def write(self, op: tuple[Any, ...]) -> Outcome:
        """A set/release/upsert under the worker's token, if it holds one."""
        kind, worker, ref = op[0], op[1], op[2]
        ctx = ref.context(worker, lock_token=self.tokens.get((worker, ref)))
        if kind == "set":
            call = functools.partial(self.model.set, ctx, op[3], op[4], self.now)
        elif kind == "release":
            call = functools.partial(self.model.release_lock_as_failed, ctx, "boom", self.now)
        else:
            call = functools.partial(self.model.upsert, ctx, op[3], self.now)
        outcome = outcome_of(call)
        if outcome.error is None or ctx.lock_token is not None:
            self.tokens.pop((worker, ref), None)
        return outcome


def _snapshot(model: ReferenceModel) -> list[ModelRecord]:
    return copy.deepcopy(list(model.records()))


@given(st.lists(OPERATION, max_size=40))
def test_tokens_strictly_increase_per_item(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    for tokens in world.issued.values():
        assert tokens == sorted(set(tokens)), tokens


@given(st.lists(OPERATION, max_size=40), st.integers(1, 3), ITEMS)
def test_a_granted_lock_excludes_every_other_acquire_while_live(
    ops: list[tuple[Any, ...]], worker: int, ref: ItemRef
) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    ctx = ref.context(worker)
    if world.model.try_acquire_lock(ctx, world.now) is None:
        return
    assert not world.model.exists(ctx, world.now)
    for other in (1, 2, 3):
        for moment in (world.now, world.now + WORLD_CONFIG.lock_duration):
            assert world.model.try_acquire_lock(ref.context(other), moment) is None
    later = world.now + WORLD_CONFIG.lock_duration + dt.timedelta(microseconds=1)
    assert world.model.try_acquire_lock(ref.context(2), later) is not None


@given(st.lists(OPERATION, max_size=40), OPERATION)
def test_every_status_change_follows_the_transition_table(
    ops: list[tuple[Any, ...]], last: tuple[Any, ...]
) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    before = {key: copy.deepcopy(r) for key, r in world.model.current.items()}
    now = world.now
    world.apply(last)
    for key, after in world.model.current.items():
        old = before.get(key)
        if old is None or (old.status is after.status and old.attempt == after.attempt):
            continue
        source = effective_status(old, now)
        # upsert either supersedes a Processed record or compresses
        # acquire + complete, and each step of that path must be allowed.
        supersede_or_compressed = (
            after.status is S.PROCESSED
            and last[0] == "upsert"
            and (
                is_allowed(source, S.SUPERSEDED)
                or (is_allowed(source, S.PROCESSING) and is_allowed(S.PROCESSING, S.PROCESSED))
            )
        )
        assert (
            is_allowed(old.status, after.status)
            or is_allowed(source, after.status)
            or supersede_or_compressed
        ), (last, old.status, source, after.status)


@given(st.lists(OPERATION, max_size=40))
def test_refusals_leave_the_model_untouched(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for op in ops:
        if op[0] not in ("set", "release", "upsert"):
            world.apply(op)
            continue
        snapshot = _snapshot(world.model)
        if world.write(op).error is not None:
            assert _snapshot(world.model) == snapshot, op


@given(st.lists(OPERATION, max_size=40))
def test_lock_sweep_touches_only_expired_locks_and_is_idempotent(
    ops: list[tuple[Any, ...]],
) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    before = {key: copy.deepcopy(r) for key, r in world.model.current.items()}
    count = world.model.reset_expired_locks(world.now)
    changed = 0
    for key, after in world.model.current.items():
        old = before[key]
        if old == after:
            continue
        changed += 1
        assert old.status is S.PROCESSING and old.locked_until is not None
        assert old.locked_until < world.now
        assert after.status is S.FAILED and after.locked_until is None
        assert after.error_detail == SWEEP_ERROR_DETAIL
    assert changed == count
    assert world.model.reset_expired_locks(world.now) == 0


@given(st.lists(OPERATION, max_size=40))
def test_retention_sweep_spares_live_locks_and_is_idempotent(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    live = {
        key
        for key, r in world.model.current.items()
        if r.status is S.PROCESSING and r.locked_until is not None and world.now <= r.locked_until
    }
    world.model.expire_past_retention(world.now)
    for key in live:
        assert world.model.current[key].status is S.PROCESSING
    assert world.model.expire_past_retention(world.now) == 0


@given(st.lists(OPERATION, max_size=40), ITEMS)
def test_exists_is_true_exactly_for_completed_effective_status(
    ops: list[tuple[Any, ...]], ref: ItemRef
) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    record = world.model.current.get(ref.record_key)
    expected = EXISTS_BY_EFFECTIVE_STATUS[effective_status(record, world.now)]
    assert world.model.exists(ref.context(1), world.now) is expected


#: What exists answers, written out from docs/semantics.md rather than derived
#: from the COMPLETED set the model itself uses.
EXISTS_BY_EFFECTIVE_STATUS = {
    S.NONE: False,
    S.PROCESSING: False,
    S.PROCESSED: True,
    S.FAILED: False,
    S.SUPERSEDED: False,
    S.SKIPPED: True,
    S.EXPIRED: False,
}


@given(st.lists(OPERATION, max_size=40), ITEMS, DATA)
def test_upsert_over_processed_keeps_the_old_record_as_superseded(
    ops: list[tuple[Any, ...]], ref: ItemRef, data: dict[str, int] | None
) -> None:
    world = World()
    for op in ops:
        world.apply(op)
    record = world.model.current.get(ref.record_key)
    if record is None or effective_status(record, world.now) is not S.PROCESSED:
        return
    old_attempt, history = record.attempt, len(world.model.superseded)
    world.model.upsert(ref.context(1), data, world.now)
    assert len(world.model.superseded) == history + 1
    assert world.model.superseded[-1] is record and record.status is S.SUPERSEDED
    current = world.model.current[ref.record_key]
    assert current is not record
    assert current.status is S.PROCESSED and current.attempt == old_attempt
