"""The controlled scheduler owns every task a racing call creates, and preempts at every await.

A race whose body runs in a task the handler starts itself (``create_task``,
``gather``, ``shield``, ``wait_for``) is a race the kit must interleave: each
test here runs a check-then-write body two calls race on, and shows that a
schedule exists that makes both calls win, that the empty schedule runs the
calls one after the other, and that the same schedule gives the same result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dsm_sim.conformance.execute.scheduler import ControlledLoop, Interleaving, Schedule
from dsm_sim.conformance.racing import BUDGETS, _points, _schedules

pytestmark = pytest.mark.unit

Wrap = Callable[[Callable[[], Awaitable[bool]]], Awaitable[bool]]


async def _plain(body: Callable[[], Awaitable[bool]]) -> bool:
    return await body()


async def _task(body: Callable[[], Awaitable[bool]]) -> bool:
    return await asyncio.create_task(body())


async def _gather(body: Callable[[], Awaitable[bool]]) -> bool:
    return (await asyncio.gather(body()))[0]


async def _shield(body: Callable[[], Awaitable[bool]]) -> bool:
    return await asyncio.shield(body())


async def _wait_for(body: Callable[[], Awaitable[bool]]) -> bool:
    return await asyncio.wait_for(body(), 30)


async def _nested(body: Callable[[], Awaitable[bool]]) -> bool:
    async def inner() -> bool:
        return await asyncio.create_task(body())

    return await asyncio.create_task(inner())


WRAPS: dict[str, Wrap] = {
    "plain": _plain,
    "create_task": _task,
    "gather": _gather,
    "shield": _shield,
    "wait_for": _wait_for,
    "a task's own child": _nested,
}


def _race(loop: ControlledLoop, wrap: Wrap, schedule: Schedule) -> tuple[list[Any], Interleaving]:
    store: dict[str, str] = {}

    def call(name: str) -> Callable[[], Awaitable[bool]]:
        async def body() -> bool:
            await asyncio.sleep(0)  # BEGIN
            seen = store.get("k")
            await asyncio.sleep(0)  # the SELECT's round trip: the window is here, not at BEGIN
            if seen is None:
                store["k"] = name
                return True
            return False

        return lambda: wrap(body)

    return loop.run_until_complete(loop.interleave([call("a"), call("b")], schedule))


def _explore(loop: ControlledLoop, wrap: Wrap, budget: str) -> list[list[Any]]:
    """The race matrix's exploration of one cell, by its budget: every result seen."""
    pending: list[Schedule] = [()]
    tried: set[Schedule] = set()
    results = []
    while pending and len(tried) < BUDGETS[budget].per_cell:
        schedule = pending.pop(0)
        if schedule in tried:
            continue
        tried.add(schedule)
        got, happened = _race(loop, wrap, schedule)
        results.append(got)
        pending += _schedules(happened, schedule, BUDGETS[budget])
    return results


@pytest.fixture
def loop() -> Any:
    loop = ControlledLoop()
    yield loop
    loop.close()


@pytest.mark.parametrize("wrap", list(WRAPS.values()), ids=list(WRAPS))
def test_the_empty_schedule_runs_the_calls_one_after_the_other(
    loop: ControlledLoop, wrap: Wrap
) -> None:
    results, happened = _race(loop, wrap, ())
    assert results == [True, False]
    assert happened.log == (("start", 0), ("end", 0), ("start", 1), ("end", 1))
    assert not any(point.preempts for point in happened.choices)


@pytest.mark.parametrize("wrap", list(WRAPS.values()), ids=list(WRAPS))
def test_one_preemption_at_every_await_finds_the_race_in_every_task(
    loop: ControlledLoop, wrap: Wrap
) -> None:
    explored = _explore(loop, wrap, "ci")
    assert [True, True] in explored, explored


@pytest.mark.parametrize("wrap", list(WRAPS.values()), ids=list(WRAPS))
def test_a_schedule_replays_the_same_interleaving(loop: ControlledLoop, wrap: Wrap) -> None:
    explored: list[tuple[Schedule, list[Any], Interleaving]] = []
    pending: list[Schedule] = [()]
    while pending and len(explored) < 16:
        schedule = pending.pop(0)
        got, happened = _race(loop, wrap, schedule)
        explored.append((schedule, got, happened))
        pending += _schedules(happened, schedule, BUDGETS["ci"])
    for schedule, got, happened in explored:
        again, replayed = _race(loop, wrap, schedule)
        assert again == got
        assert replayed.choices == happened.choices
        assert replayed.calls == happened.calls


def test_tasks_a_call_creates_belong_to_that_call(loop: ControlledLoop) -> None:
    _, happened = _race(loop, _nested, ())
    # Two racing calls, each with a child and a grandchild, numbered as they were created.
    assert len(happened.calls) == 6
    assert sorted(happened.calls) == [0, 0, 0, 1, 1, 1]
    assert happened.calls[:2] == (0, 1)


def test_the_first_await_alone_misses_a_window_deeper_in() -> None:
    """What the budget reaches: preempting only at the first point leaves the race unfound."""
    loop = ControlledLoop()
    try:
        _, happened = _race(loop, _plain, ())
        points = [index for index, _ in _points(happened, BUDGETS["ci"])]
        assert len(points) >= 2  # BEGIN and the SELECT: each a point of its own
        first_only = [
            got
            for got, _ in (
                _race(loop, _plain, schedule)
                for schedule in _schedules(happened, (), BUDGETS["ci"])
                if len(schedule) == points[0] + 1
            )
        ]
        assert [True, True] not in first_only
    finally:
        loop.close()


def test_work_handed_to_a_thread_is_counted_as_uncontrolled(loop: ControlledLoop) -> None:
    def blocking() -> int:
        return 1

    async def threaded() -> int:
        return await asyncio.get_running_loop().run_in_executor(None, blocking)

    async def plain() -> int:
        return 1

    _, happened = loop.run_until_complete(loop.interleave([threaded, plain], ()))
    assert happened.threaded == 1
    _, happened = loop.run_until_complete(loop.interleave([plain, plain], ()))
    assert happened.threaded == 0


def test_a_child_left_running_after_its_call_ends_is_let_go(loop: ControlledLoop) -> None:
    finished: list[str] = []

    async def forgets() -> bool:
        async def later() -> None:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            finished.append("later")

        background.append(asyncio.create_task(later()))
        return True

    background: list[asyncio.Task[None]] = []

    async def other() -> bool:
        return True

    results, _ = loop.run_until_complete(loop.interleave([forgets, other], ()))
    assert results == [True, True]
    loop.run_until_complete(asyncio.wait_for(asyncio.gather(*background), 10))
    assert finished == ["later"]
