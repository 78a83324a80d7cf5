"""The controlled loop holds back only the racing tasks' own resumptions.

A handler may schedule other callbacks while it races: a done callback that
is a bound method of a set (``tasks.discard``), a sweep of idle connections.
Those run as on any loop; before, the loop looked them up among its tasks and
raised ``TypeError: unhashable type`` in every such callback.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsm_sim.conformance.execute.loop import LoopDriver

pytestmark = pytest.mark.unit


def test_a_set_method_as_a_callback_runs_while_calls_race() -> None:
    driver = LoopDriver()
    pending: set[asyncio.Task[Any]] = set()
    swept: list[str] = []

    async def call(name: str) -> str:
        helper = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        pending.add(helper)
        helper.add_done_callback(pending.discard)  # called as set.discard
        asyncio.get_running_loop().call_soon(swept.append, name)  # a list's method
        await helper
        await asyncio.sleep(0)
        return name

    try:
        outcomes, happened = driver.interleave([lambda: call("a"), lambda: call("b")], (0, 1))
    finally:
        driver.close()
    assert [o.value for o in outcomes] == ["a", "b"]
    assert sorted(swept) == ["a", "b"] and not pending
    assert {index for kind, index in happened.log if kind == "end"} == {0, 1}
