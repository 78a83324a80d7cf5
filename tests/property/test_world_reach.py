"""The conformance world reaches what handlers get wrong, and its reproductions still run.

Each kind of bug the kit is meant to catch needs its world to vary one thing:
near keys across character classes, identifiers at their maximum length,
sub-second and day-long locks, retention past 2038, source apps per worker,
empty and 100-digit values, blank error details.  These tests find each of
them with a derandomised search, so a strategy change that loses one fails
here rather than as a bug that silently passes.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dsm_sim.conformance.execute.lifecycle import MARK, scramble
from dsm_sim.conformance.generate.payloads import DATA, ERRORS, OBJECTS
from dsm_sim.conformance.generate.worlds import (
    NEAR_CHARACTERS,
    PLAIN_APPS,
    WORLDS,
    Role,
    World,
    _spelling,
)
from dsm_sim.model import WORLD_CONFIGS, WORLD_START, ItemRef
from reference_engine.config import HandlerConfig
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.record import MAX_INT_DIGITS
from reference_engine.scope import Scope

pytestmark = pytest.mark.property

SAMPLE = settings(
    database=None,
    derandomize=True,
    max_examples=600,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _sample(strategy: st.SearchStrategy[Any]) -> list[Any]:
    """What a deterministic search of the strategy draws (no shrinking: it only collects)."""
    drawn: list[Any] = []

    @SAMPLE
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return drawn


@functools.cache
def _drawn(name: str) -> list[Any]:
    strategies = {
        "worlds": WORLDS,
        "spellings": _spelling("INV-1"),
        "data": DATA,
        "errors": ERRORS,
        "objects": st.lists(OBJECTS, min_size=2, max_size=2),
    }
    return _sample(strategies[name])


def _found(name: str, condition: Callable[[Any], bool]) -> Any:
    for value in _drawn(name):
        if condition(value):
            return value
    raise AssertionError(f"no {name} drawn meets {condition}")


def _pair(world: World) -> tuple[ItemRef, ItemRef]:
    return world[Role.HOT], world[Role.VARIANT]


def _one_apart(one: str, other: str) -> bool:
    return len(one) == len(other) and sum(a != b for a, b in zip(one, other, strict=True)) == 1


@pytest.mark.parametrize("chars", NEAR_CHARACTERS, ids=[a + b for a, b in NEAR_CHARACTERS])
def test_near_spellings_differ_in_one_character_of_each_class(chars: tuple[str, str]) -> None:
    pairs = _drawn("spellings")
    assert any(
        _one_apart(one, other)
        and {one.replace(chars[0], ""), other.replace(chars[1], "")} == {"INV-1"}
        for one, other in pairs
    )


def test_worlds_hold_near_keys_one_character_apart() -> None:
    def near(world: World) -> bool:
        hot, variant = _pair(world)
        # Equal once a Latin-1 column has replaced what it cannot hold with '?'.
        lossy = {ref.item.encode("latin-1", "replace") for ref in (hot, variant)}
        return _one_apart(hot.item, variant.item) and len(lossy) == 1

    _found("worlds", near)


@pytest.mark.parametrize("field", ["entity_key", "entity", "tenant"])
def test_every_identifier_reaches_the_maximum_length_beside_a_near_twin(field: str) -> None:
    def long_twins(world: World) -> bool:
        values = [getattr(ref, field) for ref in world]
        return any(
            len(one) == MAX_KEY_LENGTH and _one_apart(one, other)
            for one in values
            for other in values
        )

    _found("worlds", long_twins)


def test_source_apps_and_execution_ids_vary_up_to_the_maximum_length() -> None:
    _found("worlds", lambda world: len(set(world.apps)) == 3)
    _found("worlds", lambda world: MAX_KEY_LENGTH in map(len, world.apps))
    world = _found("worlds", lambda world: len(world.executions) > 200)
    assert len(world.execution("run-3.123")) <= MAX_KEY_LENGTH


@pytest.mark.parametrize("name", ["subsecond", "longest", "fractional"])
def test_node_options_reach_sub_second_and_the_documented_maxima(name: str) -> None:
    _found("worlds", lambda world: any(ref.config == WORLD_CONFIGS[name] for ref in world))


def test_the_longest_retention_ends_past_2038() -> None:
    retention = WORLD_CONFIGS["longest"].retention
    assert retention is not None
    assert WORLD_START + retention > dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=dt.UTC)
    assert WORLD_CONFIGS["longest"].lock_duration.seconds == 0  # what a `.seconds` slip reads
    assert int(WORLD_CONFIGS["subsecond"].lock_duration.total_seconds()) == 0


def test_worlds_print_as_python_that_builds_them_again() -> None:
    namespace = {"World": World, "ItemRef": ItemRef, "Scope": Scope, "datetime": dt}
    namespace["HandlerConfig"] = HandlerConfig
    world = _found("worlds", lambda world: world.apps != PLAIN_APPS and bool(world.executions))
    assert eval(repr(world), namespace) == world  # as the printed reproduction does


def _values(data: object) -> list[object]:
    if isinstance(data, dict):
        return [data, *(v for item in data.values() for v in _values(item))]
    if isinstance(data, list):
        return [data, *(v for item in data for v in _values(item))]
    return [data]


def test_payloads_reach_empty_values_and_100_digit_integers() -> None:
    assert _found("data", lambda data: data == {}) == {}
    _found("data", lambda data: data is not None and [] in _values(data))
    _found(
        "data",
        lambda data: any(
            type(v) is int and v < 0 and len(str(-v)) == MAX_INT_DIGITS for v in _values(data)
        ),
    )


def test_error_details_reach_blank_and_padded_text() -> None:
    for detail in ("", " ", "\t\n \r", " card declined "):
        _found("errors", functools.partial(operator.eq, detail))


def test_payload_draws_are_fresh_objects() -> None:
    # A handler that keeps the caller's dict, and a caller that changes it,
    # must never change what Hypothesis replays.
    first, second = _found("objects", lambda pair: pair == [{}, {}])
    assert first is not second


def test_scramble_changes_every_mutable_part_and_leaves_immutable_ones() -> None:
    data: dict[str, Any] = {"a": 1, "nested": {"b": [1, {"c": "x"}]}, "empty": []}
    scramble(data)
    assert data["a"] == MARK and data[MARK] == 1
    assert data["nested"][MARK] == 1 and data["nested"]["b"][-1] == MARK
    assert data["nested"]["b"][1]["c"] == MARK and data["empty"] == [MARK]
    frozen = types.MappingProxyType({"a": 1})
    scramble(frozen)
    assert dict(frozen) == {"a": 1}


def test_clock_jumps_from_the_far_end_of_time_stay_in_the_calendar() -> None:
    # A world may start at FAR_END with a century's retention: a second jump
    # past it would pass year 9999, and must leave the clock where it is
    # rather than stop the run with an OverflowError.
    from dsm_sim.conformance.execute.machine import build_machine
    from dsm_sim.conformance.generate.domains import FAR_END
    from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD
    from reference_engine.config import MAX_RETENTION
    from reference_engine.handlers.memory import in_memory_handler

    longest = HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=MAX_RETENTION)
    hot = ItemRef("t1", Scope.ELEMENT, "INV-1", config=longest)
    world = World((hot, *DEFAULT_WORLD.refs[1:]), start=FAR_END)
    state = build_machine(in_memory_handler)()
    try:
        state.setup(world=world)
        state.clock_jumps_past_retention(item=Role.HOT)
        moved = state.clock.now()
        assert moved == FAR_END + MAX_RETENTION + dt.timedelta(seconds=1)
        state.clock_jumps_past_retention(item=Role.HOT)
        assert state.clock.now() == moved
        assert "past year 9999" in state.steps[-1].outcome
        state.try_acquire_lock(worker=1, item=Role.HOT)  # the world still runs there
    finally:
        state.teardown()
