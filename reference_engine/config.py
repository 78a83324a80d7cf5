"""Parsing a node's ``dataStateMachine`` settings block into validated values.

Validation happens here, once, when the node is initialised: a wrong key, type
or value fails the node before any record is written.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reference_engine.errors import InvalidOptionError, InvalidSettingsError
from reference_engine.scope import Scope, resolve_scope

__all__ = [
    "DEFAULT_HANDLER",
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_RETENTION",
    "OPTION_NAMES",
    "SETTINGS_KEY",
    "DataStateMachineConfig",
    "HandlerConfig",
    "parse_duration",
    "parse_node_settings",
]

SETTINGS_KEY = "dataStateMachine"
DEFAULT_HANDLER = "built-in"
DEFAULT_LOCK_DURATION = dt.timedelta(minutes=30)
DEFAULT_RETENTION = dt.timedelta(days=30)
MAX_LOCK_DURATION = dt.timedelta(days=1)
#: Far enough for any idempotency window, near enough that now + retention stays a date.
MAX_RETENTION = dt.timedelta(days=36500)
OPTION_NAMES = ("lockDuration", "retention")
BLOCK_FIELDS = ("handler", "scope", "options")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class HandlerConfig:
    """The options a handler needs per call: how long a lock lives, how long a record is kept.

    ``retention`` of ``None`` keeps records forever.
    """

    lock_duration: dt.timedelta = DEFAULT_LOCK_DURATION
    retention: dt.timedelta | None = DEFAULT_RETENTION


@dataclass(frozen=True, slots=True)
class DataStateMachineConfig:
    """A parsed ``dataStateMachine`` block."""

    handler: str = DEFAULT_HANDLER
    scope: Scope = Scope.ELEMENT
    handler_config: HandlerConfig = field(default_factory=HandlerConfig)


def parse_duration(option: str, value: object) -> dt.timedelta:
    """Accept seconds (int/float) or ``"<n><unit>"`` with unit ms, s, m, h or d."""
    if isinstance(value, bool):
        raise InvalidOptionError(option, f"expected a duration, got boolean {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise InvalidOptionError(
            option,
            f"expected seconds as a number or a string like '30m', '90s', '2h', '7d'; got {value!r}",
        )
    if not math.isfinite(seconds):
        raise InvalidOptionError(option, f"must be a finite duration, got {value!r}")
    if seconds > MAX_RETENTION.total_seconds():
        raise InvalidOptionError(
            option, f"must be at most {MAX_RETENTION.days} days, got {value!r}"
        )
    duration = dt.timedelta(seconds=seconds)
    if duration <= dt.timedelta(0):
        raise InvalidOptionError(
            option, f"must be positive (at least one microsecond), got {value!r}"
        )
    return duration


def _parse_options(raw: object) -> HandlerConfig:
    if raw is None:
        return HandlerConfig()
    if not isinstance(raw, Mapping):
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}.options' must be an object, got {type(raw).__name__}",
            field="options",
        )
    for name in raw:
        if name not in OPTION_NAMES:
            raise InvalidOptionError(str(name), "unknown option", OPTION_NAMES)
    lock = DEFAULT_LOCK_DURATION
    if "lockDuration" in raw:
        lock = parse_duration("lockDuration", raw["lockDuration"])
        if lock > MAX_LOCK_DURATION:
            raise InvalidOptionError("lockDuration", f"must be at most 1 day, got {lock}")
    retention: dt.timedelta | None = DEFAULT_RETENTION
    if "retention" in raw:
        retention = (
            None if raw["retention"] is None else parse_duration("retention", raw["retention"])
        )
    if retention is not None and retention <= lock:
        raise InvalidOptionError(
            "retention", f"must be longer than lockDuration ({lock}), got {retention}"
        )
    return HandlerConfig(lock_duration=lock, retention=retention)


def parse_block(block: object) -> DataStateMachineConfig:
    """Parse the value of a ``dataStateMachine`` key."""
    if not isinstance(block, Mapping):
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}' must be an object with fields {', '.join(BLOCK_FIELDS)}; "
            f"got {type(block).__name__}",
            field=SETTINGS_KEY,
        )
    for name in block:
        if name not in BLOCK_FIELDS:
            raise InvalidSettingsError(
                f"unknown field {name!r} in '{SETTINGS_KEY}'; allowed fields: "
                f"{', '.join(BLOCK_FIELDS)}",
                field=str(name),
            )
    handler = block.get("handler", DEFAULT_HANDLER)
    if not isinstance(handler, str) or not handler.strip():
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}.handler' must be a non-empty string, got {handler!r}", field="handler"
        )
    scope_name = block.get("scope", Scope.ELEMENT.code)
    if not isinstance(scope_name, str):
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}.scope' must be a string, got {scope_name!r}", field="scope"
        )
    return DataStateMachineConfig(
        handler=handler.strip(),
        scope=resolve_scope(scope_name),
        handler_config=_parse_options(block.get("options")),
    )


def parse_node_settings(settings: str | bytes | Mapping[str, Any]) -> DataStateMachineConfig | None:
    """Parse a node's settings (JSON text or an already-decoded object).

    Returns ``None`` when the node has no ``dataStateMachine`` block, which the
    factory turns into the null machine.
    """
    decoded: object
    if isinstance(settings, str | bytes):
        try:
            decoded = json.loads(settings)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidSettingsError(f"node settings are not valid JSON: {exc}") from exc
    else:
        decoded = settings
    if not isinstance(decoded, Mapping):
        raise InvalidSettingsError(
            f"node settings must be a JSON object, got {type(decoded).__name__}"
        )
    if SETTINGS_KEY not in decoded or decoded[SETTINGS_KEY] is None:
        return None
    return parse_block(decoded[SETTINGS_KEY])
