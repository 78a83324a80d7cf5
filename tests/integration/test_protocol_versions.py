"""Protocol versions: each handler is judged by the text of the version it answered ``open`` with.

A handler frozen at version 1 (``frozen_version_handler.py``) answers an
instant past year 9999 with ``internal``, the only answer version 1's text
left it: under version 1 that agrees with the model's
``InstantOutOfRangeError``; the same answers from a handler that says 2 are
a finding naming the change and what to do; a version-2 handler answers
``instant_out_of_range`` and agrees.  A version the harness does not speak
is a named error that lists the versions it does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dsm_sim.model import Outcome
from dsm_sim.protocol import versions, wire
from dsm_sim.protocol.client import ExecHandler, exec_factory, preflight
from dsm_sim.protocol.errors import HandlerInternalError, VersionMismatchError
from dsm_sim.protocol.replay import ReplayEntry, Replays, replay_times
from dsm_sim.protocol.server import Server
from reference_engine.clock import ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import InstantOutOfRangeError
from reference_engine.handlers.memory import in_memory_handler
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
#: 15 minutes before the last instant a record can hold: a 30-minute lock and a 30-day
#: retention both end past it.
NEAR_THE_END = dt.datetime(9999, 12, 31, 23, 45, tzinfo=dt.UTC)
LOCK = dt.timedelta(minutes=30)
KEPT = StateHandlerContext(
    scope_id=4,
    scope_code="Element",
    entity_id="invoice-dispatch",
    entity_execution_id="run-1",
    tenant_id="t1",
    source_app_id="billing",
    handler_config=HandlerConfig(LOCK, dt.timedelta(days=30)),
).for_item("INV-1")
FOREVER = dataclasses.replace(KEPT, handler_config=HandlerConfig(LOCK, None))
S = IdempotencyStatus

Call = Callable[[Any], Awaitable[Any]]
#: Calls near the end of year 9999: the model refuses some with InstantOutOfRangeError
#: (the lock's end first, then the retention), others for a reason of their own, and
#: lets a write kept forever land.
CALLS: list[tuple[str, Call]] = [
    ("acquire", lambda h: h.try_acquire_lock(KEPT)),
    ("set(Processed)", lambda h: h.set(KEPT, S.PROCESSED, {"a": 1})),
    ("set(Processing), refused first", lambda h: h.set(KEPT, S.PROCESSING)),
    ("release without a token", lambda h: h.release_lock_as_failed(KEPT, "boom")),
    ("upsert", lambda h: h.upsert(KEPT, {"a": 1})),
    ("acquire, kept forever", lambda h: h.try_acquire_lock(FOREVER)),
    ("set(Skipped), kept forever", lambda h: h.set(FOREVER, S.SKIPPED)),
    ("get", lambda h: h.get(FOREVER)),
]


def _frozen(version: int, overflow: str, *crash: str) -> list[str]:
    return [sys.executable, str(HERE / "frozen_version_handler.py"), str(version), overflow, *crash]


async def _outcomes(handler: Any) -> list[Outcome]:
    seen = []
    for _name, call in CALLS:
        try:
            seen.append(Outcome(value=await call(handler)))
        except Exception as exc:
            seen.append(Outcome(error=exc))
    return seen


def _model() -> list[Outcome]:
    return asyncio.run(_outcomes(in_memory_handler(ManualClock(NEAR_THE_END))))


def _through(command: list[str]) -> tuple[int, list[Outcome]]:
    """The version a handler process answered open with, and the outcome of every call."""

    async def run() -> tuple[int, list[Outcome]]:
        handler = ExecHandler(command, ManualClock(NEAR_THE_END))
        await handler.open()
        try:
            return handler.protocol, await _outcomes(handler)
        finally:
            await handler.close()

    return asyncio.run(run())


def _disagreements(got: list[Outcome], want: list[Outcome]) -> list[str]:
    """The calls whose outcome the kit's judges would call a disagreement (errors by class)."""
    return [
        f"{name}: {g.describe()} where the model gives {w.describe()}"
        for (name, _call), g, w in zip(CALLS, got, want, strict=True)
        if not g.agrees_with(w)
    ]


def test_the_calls_reach_the_year_9999_limit_in_the_model() -> None:
    refused = [type(o.error).__name__ for o in _model() if o.error is not None]
    assert refused.count("InstantOutOfRangeError") == 4, refused
    assert len(refused) > 3, "other refusals come first on some calls"


def test_a_version_1_handler_answering_internal_past_year_9999_agrees_with_the_model() -> None:
    version, got = _through(_frozen(1, "internal"))
    assert version == 1
    assert _disagreements(got, _model()) == []


def test_the_same_answers_from_a_version_2_handler_are_a_finding_naming_the_change() -> None:
    version, got = _through(_frozen(2, "internal"))
    assert version == 2
    found = _disagreements(got, _model())
    assert found == [
        "acquire: HandlerInternalError where the model gives InstantOutOfRangeError",
        "set(Processed): HandlerInternalError where the model gives InstantOutOfRangeError",
        "upsert: HandlerInternalError where the model gives InstantOutOfRangeError",
        "acquire, kept forever: HandlerInternalError where the model gives InstantOutOfRangeError",
    ]
    message = str(got[0].error)
    assert "protocol version 2 changed this answer" in message
    assert "instant_out_of_range" in message
    assert "answer instant_out_of_range here, or answer open with protocol 1" in message


@pytest.mark.parametrize("version", [1, 2])
def test_a_handler_answering_instant_out_of_range_agrees_under_either_version(
    version: int,
) -> None:
    # Hosts that announced 1 answered instant_out_of_range from the day the kind was added.
    answered, got = _through(_frozen(version, "instant_out_of_range"))
    assert answered == version
    assert _disagreements(got, _model()) == []
    assert isinstance(got[0].error, InstantOutOfRangeError)


def test_under_version_1_internal_stands_only_for_the_instant_past_year_9999() -> None:
    # INV-1 crashes on every call: only the calls the model refuses for year 9999 agree.
    version, got = _through(_frozen(1, "instant_out_of_range", "INV-1"))
    assert version == 1
    found = _disagreements(got, _model())
    assert [line.split(":")[0] for line in found] == [
        "set(Processing), refused first",
        "release without a token",
        "set(Skipped), kept forever",
        "get",
    ]
    crashed = next(o.error for o in got if isinstance(o.error, HandlerInternalError))
    assert "protocol version" not in str(crashed)


def test_a_version_the_harness_does_not_speak_is_named_with_the_versions_it_speaks() -> None:
    with pytest.raises(VersionMismatchError) as caught:
        _through(_frozen(3, "instant_out_of_range"))
    assert caught.value.offered == (1, 2)
    assert caught.value.answered == 3
    assert "protocol version 3; this harness speaks versions 1, 2" in str(caught.value)
    # Said once before a run: a usage error, not a broken run per test case.
    reason = preflight(exec_factory(_frozen(3, "instant_out_of_range")))
    assert reason is not None and "speaks versions 1, 2" in reason


def test_the_version_a_handler_is_judged_by_is_known_before_the_run() -> None:
    factories = {version: exec_factory(_frozen(version, "internal")) for version in (1, 2)}
    assert [preflight(f) for f in factories.values()] == [None, None]
    assert factories[1].protocol == 1 and factories[2].protocol == 2
    said = versions.judged_by(factories[1].protocol)
    assert "protocol version 1" in said and "instant_out_of_range" in said
    assert versions.judged_by(factories[2].protocol) == ""


def test_open_offers_every_version_and_1_for_hosts_that_read_no_list() -> None:
    handler = ExecHandler(_frozen(2, "instant_out_of_range"), ManualClock(NEAR_THE_END))

    async def run() -> None:
        await handler.open()
        await handler.close()

    asyncio.run(run())
    opened = handler.transcript[0].decode()
    assert '"protocol":1,"protocols":[1,2]' in opened


def test_dsm_serve_speaks_version_2_and_refuses_an_open_that_does_not_offer_it() -> None:
    async def open_with(**offer: Any) -> Any:
        server = Server(in_memory_handler, lambda _line: None)
        return await server._perform({"op": "open", **offer})

    answer = asyncio.run(open_with(protocol=1, protocols=[1, 2]))
    assert answer["protocol"] == 2
    with pytest.raises(Exception, match="speaks protocol version 2; the open offered 1"):
        asyncio.run(open_with(protocol=1))


def test_agreement_by_version_is_the_table_of_changes() -> None:
    assert versions.agrees(1, "instant_out_of_range", "internal")
    assert not versions.agrees(2, "instant_out_of_range", "internal")
    assert versions.agrees(2, "instant_out_of_range", "instant_out_of_range")
    assert not versions.agrees(1, "lock_held", "internal")
    assert versions.OFFER == tuple(v.number for v in versions.VERSIONS) == (1, 2)


def _replayed(version: int) -> Replays:
    """A file recorded by a harness that offered only version 1, replayed and judged."""
    now = wire.encode_instant(NEAR_THE_END)
    lines = [
        {"id": 1, "op": "open", "now": now, "protocol": 1},
        {"id": 2, "op": "try_acquire_lock", "now": now, "context": wire.encode_context(KEPT)},
        {"id": 3, "op": "close", "now": now},
    ]
    entries = [ReplayEntry(line) for line in lines]
    return replay_times(entries, exec_factory(_frozen(version, "internal")), 1)


def test_a_replay_offers_todays_versions_and_is_judged_by_the_version_answered() -> None:
    under_1 = _replayed(1)
    assert under_1.broken is None and under_1.breaches == (None,)
    assert under_1.runs[0].pairs[0].answer == {
        "id": 1,
        "result": {"protocol": 1, "concurrent": False, "name": "frozen at 1"},
    }
    under_2 = _replayed(2)
    assert under_2.broken is None and under_2.broke == 1
    assert under_2.runs[0].pairs[0].answer["result"]["protocol"] == 2  # type: ignore[index]
