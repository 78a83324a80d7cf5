"""A race whose explanations differ only in a history row, told apart by a later retention sweep.

A handler that serialises its calls (one lock, one connection) reads the
clock for the second of two racing upserts after the clock moved, so the row
the first one superseded keeps the earlier end of retention.  The race judge
cannot see that row; the retention sweep that expires it must not be judged
against an explanation that put the first upsert after the move.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.generate.steps import ClockMove, Instant, RaceOp
from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD, Role
from dsm_sim.conformance.judge.doubt import HistoryDoubt
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.property


class SerialisedUpserts(InMemoryStateHandler):
    """Correct: every upsert runs alone, and holds its turn across an ``await`` on each side.

    The first ``await`` comes before the write reads the clock: an upsert that
    started before a clock move may write after it.
    """

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._turn = asyncio.Lock()

    def peer(self) -> None:
        return None  # one instance, like a handler on one connection: its calls queue

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        async with self._turn:
            await asyncio.sleep(0)  # the request travels to the store
            await super().upsert(ctx, data)
            await asyncio.sleep(0)  # the reply travels back while the next caller waits


class ExpiresNothing(SerialisedUpserts):
    """Broken: the retention sweep never expires anything."""

    async def expire_past_retention(self) -> int:
        return 0


def _race_then_sweep(factory: Any, *, past_both: bool = False) -> None:
    machine = build_machine(factory, name="RaceDoubt")()
    try:
        machine.setup(world=DEFAULT_WORLD)
        ref = machine._ref(Role.HOT)
        t0 = machine.clock.now()
        machine.race(
            item=Role.HOT,
            ops=[RaceOp.UPSERT, RaceOp.UPSERT],
            workers=[1, 2, 3],
            # The first upsert takes its turn and waits; the clock moves; then the second.
            schedule=(0, 2),
            instant=Instant.NOW,
            move=ClockMove.PAST_LOCK,
            data={"amount": 1},
        )
        retention = ref.config.retention
        assert retention is not None
        # Past the first row's end of retention if it was written before the move
        # (or, with ``past_both``, past it whenever it was written).
        moved = ClockMove.PAST_LOCK.delta(ref) if past_both else dt.timedelta(0)
        machine.clock.set(t0 + moved + retention + dt.timedelta(microseconds=1))
        machine.expire_past_retention()
    finally:
        machine.teardown()


def test_a_serialised_correct_handler_passes_the_sweep_that_tells_the_orders_apart() -> None:
    _race_then_sweep(SerialisedUpserts)


def test_without_the_doubt_the_same_steps_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: judged on the one order chosen, the sweep disagrees."""
    monkeypatch.setattr(HistoryDoubt, "settle", lambda *args, **kwargs: None)
    with pytest.raises(P.PropertyViolation, match="expire_past_retention"):
        _race_then_sweep(SerialisedUpserts)


def test_a_sweep_no_explanation_allows_is_still_reported() -> None:
    _race_then_sweep(ExpiresNothing)  # one explanation keeps the row: no word yet
    with pytest.raises(P.PropertyViolation, match="expire_past_retention"):
        _race_then_sweep(ExpiresNothing, past_both=True)
