"""The race matrix's deeper pass branches from the first pass's runs instead of running them again.

Iterative deepening runs every cell in sequence and at its first preemption
point, then every cell at all its points.  The deeper pass needs the first
pass's runs only for what they did (their choice points); run again, they
cost a prepare and a race each and show nothing new.  Kept, the deeper pass
must reach exactly the points it reached when it ran them again, and book
each interleaving once.
"""

from __future__ import annotations

import asyncio

import pytest

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.generate.steps import MATRIX_OPS, RaceOp, StartState
from dsm_sim.conformance.properties import PROPERTIES
from dsm_sim.conformance.racing import (
    BUDGETS,
    FIRST_PASS,
    ChunkResult,
    ChunkWork,
    Runs,
    cells,
    run_chunk,
)
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

OPS = (RaceOp.ACQUIRE, RaceOp.COMPLETE, RaceOp.SWEEP)
LISTED = tuple(
    cell
    for cell in cells(tuple(op for op in MATRIX_OPS if op in OPS))
    if cell.applies() and cell.state in (StartState.NONE, StartState.LIVE, StartState.EXPIRED)
)


class _Awaiting(InMemoryStateHandler):
    """A correct handler with an await before and after each atomic write: points to preempt at."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.sleep(0)
        token = await super().try_acquire_lock(ctx)
        await asyncio.sleep(0)
        return token

    async def reset_expired_locks(self) -> int:
        await asyncio.sleep(0)
        reset = await super().reset_expired_locks()
        await asyncio.sleep(0)
        return reset


def _pass(*, deeper: bool, before: tuple[Runs, ...] = ()) -> ChunkResult:
    work = ChunkWork(
        0,
        0,
        LISTED,
        BUDGETS["ci"],
        True,
        frozenset(),
        frozenset(),
        len(PROPERTIES),
        False,
        limit=None if deeper else FIRST_PASS,
        deeper=deeper,
        counts_points=deeper,
        before=before,
    )
    return run_chunk(build_machine(_Awaiting, stats=RunStats()), work)


def test_the_deeper_pass_reaches_the_same_points_from_the_first_pass_runs() -> None:
    first = _pass(deeper=False)
    assert sorted(first.kept) == list(range(len(LISTED)))  # every cell ran to its end
    reused = _pass(deeper=True, before=tuple(first.kept[i] for i in range(len(LISTED))))
    again = _pass(deeper=True)  # without them, as before: the first runs run again

    assert not first.findings and not reused.findings and not again.findings
    assert reused.exercised == again.exercised == len(LISTED)
    assert reused.points_seen == again.points_seen > 0
    assert reused.points_explored == again.points_explored > 0
    # Each interleaving is booked once: the runs made again are not booked twice,
    # and the kept ones are not run at all.
    assert reused.schedules == again.schedules > 0
    assert len(LISTED) < first.schedules <= len(LISTED) * FIRST_PASS
    assert first.schedules + reused.schedules <= len(LISTED) * BUDGETS["ci"].per_cell
    # The runs not made show in the checks: the kept pass judged fewer calls.
    assert sum(reused.stats.checks.values()) < sum(again.stats.checks.values())
