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

from reference_engine.errors import (
    InstantOutOfRangeError,
    InvalidOptionError,
    InvalidSettingsError,
    echo,
)
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

_DURATION = re.compile(r"^\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*(ms|s|m|h|d)\s*$", re.ASCII)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class HandlerConfig:
    """The options a handler needs per call: how long a lock lives, how long a record is kept.

    ``retention`` of ``None`` keeps records forever.
    """

    lock_duration: dt.timedelta = DEFAULT_LOCK_DURATION
    retention: dt.timedelta | None = DEFAULT_RETENTION

    def locked_until(self, now: dt.datetime) -> dt.datetime:
        """When a lock taken at ``now`` expires; past year 9999 is a named error, not a crash."""
        return _after(now, self.lock_duration, "lockDuration")

    def retain_until(self, now: dt.datetime) -> dt.datetime | None:
        """Until when a record written at ``now`` is kept (``None``: forever)."""
        return None if self.retention is None else _after(now, self.retention, "retention")


def _after(now: dt.datetime, duration: dt.timedelta, option: str) -> dt.datetime:
    try:
        return now + duration
    except OverflowError:
        raise InstantOutOfRangeError(
            option=option, now=now.isoformat(), duration=str(duration)
        ) from None


@dataclass(frozen=True, slots=True)
class DataStateMachineConfig:
    """A parsed ``dataStateMachine`` block."""

    handler: str = DEFAULT_HANDLER
    scope: Scope = Scope.ELEMENT
    handler_config: HandlerConfig = field(default_factory=HandlerConfig)


def parse_duration(option: str, value: object) -> dt.timedelta:
    """Accept seconds (int/float) or ``"<n><unit>"`` with unit ms, s, m, h or d.

    The number in a string is ASCII digits (at most 12, with up to 9
    decimals): other scripts' digits would be accepted by ``\\d`` and read by
    ``float`` in ways no one reviewing a config expects.
    """
    if isinstance(value, bool):
        raise InvalidOptionError(option, f"expected a duration, got boolean {value!r}")
    number: int | float
    if isinstance(value, int | float):
        number = value
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        number = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise InvalidOptionError(
            option,
            f"expected seconds as a number or a string like '30m', '90s', '2h', '7d'; "
            f"got {echo(value)}",
        )
    if isinstance(number, float) and not math.isfinite(number):
        raise InvalidOptionError(option, f"must be a finite duration, got {echo(value)}")
    # Compared before any conversion: an int of hundreds of digits has no float.
    if number > MAX_RETENTION.total_seconds():
        raise InvalidOptionError(
            option, f"must be at most {MAX_RETENTION.days} days, got {echo(value)}"
        )
    if number <= 0:
        raise InvalidOptionError(
            option, f"must be positive (at least one microsecond), got {echo(value)}"
        )
    duration = dt.timedelta(seconds=float(number))
    if duration <= dt.timedelta(0):
        raise InvalidOptionError(
            option, f"must be positive (at least one microsecond), got {echo(value)}"
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
                f"unknown field {echo(name)} in '{SETTINGS_KEY}'; allowed fields: "
                f"{', '.join(BLOCK_FIELDS)}",
                field=str(name),
            )
    handler = block.get("handler", DEFAULT_HANDLER)
    if not isinstance(handler, str) or not handler.strip():
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}.handler' must be a non-empty string, got {echo(handler)}",
            field="handler",
        )
    scope_name = block.get("scope", Scope.ELEMENT.code)
    if not isinstance(scope_name, str):
        raise InvalidSettingsError(
            f"'{SETTINGS_KEY}.scope' must be a string, got {echo(scope_name)}", field="scope"
        )
    return DataStateMachineConfig(
        handler=handler.strip(),
        scope=resolve_scope(scope_name),
        handler_config=_parse_options(block.get("options")),
    )


#: How many single-character edits away from :data:`SETTINGS_KEY` a key counts as a misspelling.
MAX_KEY_TYPOS = 2


def _edit_distance(a: str, b: str, *, limit: int) -> int:
    """Levenshtein distance, giving up (``limit + 1``) once it exceeds ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


def _looks_like_settings_key(name: object) -> bool:
    """A key meant as ``dataStateMachine``: other case, stray spaces or separators, a typo.

    Such a key would otherwise leave the node on the null machine (no guard,
    no lock) without a word, so it is refused instead of ignored.
    """
    if not isinstance(name, str) or name == SETTINGS_KEY or len(name) > 4 * len(SETTINGS_KEY):
        return False
    folded = re.sub(r"[\s_\-.]", "", name).casefold()
    target = SETTINGS_KEY.casefold()
    return _edit_distance(folded, target, limit=MAX_KEY_TYPOS) <= MAX_KEY_TYPOS


def _refuse_misspelled_key(decoded: Mapping[Any, Any]) -> None:
    for name in decoded:
        if _looks_like_settings_key(name):
            raise InvalidSettingsError(
                f"node settings have a key {echo(name)} where {SETTINGS_KEY!r} was expected "
                f"(exact spelling and case, no spaces); as given, the node would run without "
                "its idempotency guard and lock",
                field=str(name)[:80],
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
        except RecursionError as exc:
            raise InvalidSettingsError(
                "node settings are not valid JSON here: nested too deeply to read"
            ) from exc
        except ValueError as exc:  # e.g. an integer past Python's digit limit
            raise InvalidSettingsError(f"node settings are not valid JSON here: {exc}") from exc
    else:
        decoded = settings
    if not isinstance(decoded, Mapping):
        raise InvalidSettingsError(
            f"node settings must be a JSON object, got {type(decoded).__name__}"
        )
    _refuse_misspelled_key(decoded)
    if SETTINGS_KEY not in decoded or decoded[SETTINGS_KEY] is None:
        return None
    return parse_block(decoded[SETTINGS_KEY])
