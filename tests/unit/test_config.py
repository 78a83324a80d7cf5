"""Parsing the dataStateMachine block: defaults, and a named error for every mistake."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from reference_engine.config import (
    DEFAULT_LOCK_DURATION,
    DEFAULT_RETENTION,
    parse_duration,
    parse_node_settings,
)
from reference_engine.errors import (
    InvalidOptionError,
    InvalidSettingsError,
    UnknownScopeError,
)
from reference_engine.scope import Scope, resolve_scope

pytestmark = pytest.mark.unit


def test_no_block_means_no_machine() -> None:
    assert parse_node_settings({"other": 1}) is None
    assert parse_node_settings('{"dataStateMachine": null}') is None


def test_defaults() -> None:
    config = parse_node_settings({"dataStateMachine": {}})
    assert config is not None
    assert config.handler == "built-in"
    assert config.scope is Scope.ELEMENT
    assert config.handler_config.lock_duration == DEFAULT_LOCK_DURATION == dt.timedelta(minutes=30)
    assert config.handler_config.retention == DEFAULT_RETENTION


def test_full_block_from_json_text() -> None:
    text = json.dumps(
        {
            "dataStateMachine": {
                "handler": "redis",
                "scope": "thread",
                "options": {"lockDuration": "90s", "retention": "2h"},
            }
        }
    )
    config = parse_node_settings(text)
    assert config is not None
    assert (config.handler, config.scope) == ("redis", Scope.THREAD)
    assert config.handler_config.lock_duration == dt.timedelta(seconds=90)
    assert config.handler_config.retention == dt.timedelta(hours=2)


def test_retention_none_keeps_forever() -> None:
    config = parse_node_settings({"dataStateMachine": {"options": {"retention": None}}})
    assert config is not None and config.handler_config.retention is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1800, 1800.0),
        (2.5, 2.5),
        ("30m", 1800.0),
        ("250ms", 0.25),
        ("1d", 86400.0),
        ("2 h", 7200.0),
    ],
)
def test_durations(value: object, expected: float) -> None:
    assert parse_duration("lockDuration", value).total_seconds() == expected


@pytest.mark.parametrize("value", [0, -5, "soon", "30 minutes", True, None, [], "5y"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_duration("lockDuration", value)
    assert info.value.option == "lockDuration"


@pytest.mark.parametrize(
    ("settings", "error", "needle"),
    [
        ("{not json", InvalidSettingsError, "not valid JSON"),
        (b"\xff\xfe{", InvalidSettingsError, "not valid JSON"),
        ("[1, 2]", InvalidSettingsError, "JSON object"),
        ({"dataStateMachine": "built-in"}, InvalidSettingsError, "must be an object"),
        ({"dataStateMachine": {"handler": 7}}, InvalidSettingsError, "handler"),
        ({"dataStateMachine": {"handler": "  "}}, InvalidSettingsError, "handler"),
        ({"dataStateMachine": {"scope": 4}}, InvalidSettingsError, "scope"),
        ({"dataStateMachine": {"scope": "Galaxy"}}, UnknownScopeError, "Element"),
        ({"dataStateMachine": {"handlr": "x"}}, InvalidSettingsError, "allowed fields"),
        ({"dataStateMachine": {"options": []}}, InvalidSettingsError, "options"),
        ({"dataStateMachine": {"options": {"lockTime": 5}}}, InvalidOptionError, "lockDuration"),
        ({"dataStateMachine": {"options": {"lockDuration": "2d"}}}, InvalidOptionError, "at most"),
        (
            {"dataStateMachine": {"options": {"lockDuration": "2h", "retention": "1h"}}},
            InvalidOptionError,
            "longer than lockDuration",
        ),
    ],
)
def test_bad_settings_raise_named_errors(
    settings: object, error: type[Exception], needle: str
) -> None:
    with pytest.raises(error) as info:
        parse_node_settings(settings)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_scope_table() -> None:
    assert {s.code: int(s) for s in Scope} == {
        "Tenant": 1,
        "Application": 2,
        "Workflow": 3,
        "Element": 4,
        "Thread": 5,
    }
    assert resolve_scope("Element") is Scope.ELEMENT
    assert resolve_scope(" element ") is Scope.ELEMENT


def test_unknown_scope_lists_allowed() -> None:
    with pytest.raises(UnknownScopeError) as info:
        resolve_scope("Node")
    assert info.value.allowed == ("Tenant", "Application", "Workflow", "Element", "Thread")
    assert "'Node'" in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "DataStateMachine",
        "dataStatemachine",
        "dataStateMachine ",
        " dataStateMachine",
        "DATASTATEMACHINE",
        "data_state_machine",
        "dataStateMachin",
        "dataStateMachines",
        "dataSateMachine",
    ],
)
def test_a_key_close_to_the_settings_key_is_refused_naming_the_spelling(key: str) -> None:
    """Ignoring it would give the node the null machine: no guard, no lock, no word."""
    settings = {key: {"handler": "built-in", "scope": "Element"}}
    with pytest.raises(InvalidSettingsError) as info:
        parse_node_settings(settings)
    text = str(info.value)
    assert "'dataStateMachine' was expected" in text
    assert repr(key) in text
    with pytest.raises(InvalidSettingsError):
        parse_node_settings(json.dumps(settings))


@pytest.mark.parametrize("key", ["stateMachine", "handler", "retries", "dataStore", "timeout"])
def test_unrelated_settings_keys_are_left_to_the_node(key: str) -> None:
    assert parse_node_settings({key: {"x": 1}}) is None


def test_a_long_misspelled_key_is_echoed_in_part() -> None:
    key = "DataStateMachine" + " " * 2
    settings = {key: {}, "x" * 1_000_000: 1}
    with pytest.raises(InvalidSettingsError) as info:
        parse_node_settings(settings)
    assert len(str(info.value)) < 500
