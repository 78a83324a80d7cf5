"""A finding whose replays break it only sometimes is shrunk by repetition and told with its rate.

``EveryOtherTakeOver`` stands in for a race the kit cannot schedule (two
processes meeting inside a check-then-write window): its acquire takes a live
lock over every second time it is asked to, counted across every instance,
so the same steps break ``at_most_one_live_lock`` in one replay and not in
the next.  The count makes it certain rather than lucky: any program with
one such acquire fails in exactly one of every two replays, whatever the
machine's speed.
"""

from __future__ import annotations

import itertools

from dsm_sim.conformance import verify
from dsm_sim.conformance.report import ResultStatus
from dsm_sim.conformance.tell.repeat import RATE_REPLAYS
from dsm_sim.conformance.tell.shrink_budget import SHORT_STORY
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.status import IdempotencyStatus


class _TakesOverSometimes(InMemoryStateHandler):
    def __init__(self, clock: Clock, turns: itertools.count[int]) -> None:
        super().__init__(clock)
        self.turns = turns

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        token = self.model.try_acquire_lock(ctx, self.clock.now())
        if token is None:
            current = self.model.get(ctx)
            live = current is not None and current.status is IdempotencyStatus.PROCESSING
            if live and current is not None and next(self.turns) % 2 == 0:
                # Both saw the item free: the second is told it holds the first's token.
                return current.attempt
        return token


class EveryOtherTakeOver:
    """A factory whose handlers share one count of the acquires that met a live lock."""

    __qualname__ = "EveryOtherTakeOver"

    def __init__(self) -> None:
        self.turns = itertools.count()

    def __call__(self, clock: Clock) -> InMemoryStateHandler:
        return _TakesOverSometimes(clock, self.turns)


def test_a_race_that_breaks_in_some_replays_is_shrunk_by_repetition_and_gives_its_rate() -> None:
    report = verify(
        EveryOtherTakeOver(),
        "dev",
        seed=5,
        stop_on_first=True,
        probes=False,
        matrix=False,
        volume=False,
        time_zone="UTC0",
    )
    (result,) = report.violations
    assert result.status is ResultStatus.FLAKY
    assert result.program is not None and result.reproduction
    assert result.story_steps <= SHORT_STORY, result.story
    assert len(result.program.body) <= SHORT_STORY + 1
    assert result.confirmed is not None
    hits, tried = result.confirmed
    assert tried == RATE_REPLAYS and 0 < hits < tried
    told = result.render()
    assert f"(failed {hits} of {tried} replays of these steps)" in told
    assert "shrunk by repetition" in told
