"""Python values to protocol JSON and back: contexts, instants, records, errors.

Shared by the client (:mod:`dsm_sim.protocol.client`) and the server
(:mod:`dsm_sim.protocol.server`), so both sides of the wire are written
once and a round trip through ``dsm serve`` tests exactly this code.

Instants travel as ISO-8601 text in UTC with microseconds, durations as
integer microseconds: the kit judges retention 1 µs either side of a
record's end, which neither a float of seconds nor a JavaScript ``Date``
keeps.  Payloads travel as their canonical JSON text, which a handler in
any language stores and returns as is: a store that parses them into its
own numbers would lose ``1.0`` versus ``1`` or integers past 2**53, and the
kit must see that in the handler, not in the harness.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from reference_engine.config import HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    DsmError,
    ForbiddenTransitionError,
    InstantOutOfRangeError,
    InvalidItemError,
    LockHeldError,
    LockNotHeldError,
    PayloadTooLargeError,
    StaleLockError,
    StoreError,
    UnsupportedStatusError,
)
from reference_engine.record import StateRecord, check_settable, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = [
    "ERROR_KINDS",
    "decode_context",
    "decode_error",
    "decode_instant",
    "decode_record",
    "encode_context",
    "encode_error",
    "encode_instant",
    "encode_line",
    "encode_record",
    "short",
    "wire_data",
]

UTC = dt.UTC
_MICRO = dt.timedelta(microseconds=1)

#: error kind -> the Python error it stands for (the order matters when encoding:
#: a subclass before its base).
ERROR_KINDS: dict[str, type[DsmError]] = {
    "lock_held": LockHeldError,
    "lock_not_held": LockNotHeldError,
    "stale_lock": StaleLockError,
    "forbidden_transition": ForbiddenTransitionError,
    "unsupported_status": UnsupportedStatusError,
    "payload_too_large": PayloadTooLargeError,
    "invalid_item": InvalidItemError,
    "store_error": StoreError,
    "instant_out_of_range": InstantOutOfRangeError,
}


def encode_line(message: Mapping[str, Any]) -> bytes:
    """One message as one line of ASCII: every non-ASCII or lone surrogate is escaped.

    ASCII lines cannot be split inside a character by any reader, and a lone
    surrogate (legal in a Python or JavaScript string) survives as ``\\udc80``.
    """
    return (json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def short(message: object, limit: int = 160) -> str:
    """A message as a log line shows it: its JSON, cut to ``limit`` characters."""
    try:
        text = json.dumps(message, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(message)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def encode_instant(instant: dt.datetime) -> str:
    """``2026-03-02T09:00:00.000000Z``: always six fractional digits, always a four-digit year."""
    return instant.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def decode_instant(text: str) -> dt.datetime:
    """An instant of the wire as an aware UTC datetime (the schema checked its shape)."""
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def _micros(delta: dt.timedelta) -> int:
    return delta // _MICRO


def encode_context(ctx: StateHandlerContext) -> dict[str, Any]:
    config = ctx.handler_config
    return {
        "tenant_id": ctx.tenant_id,
        "source_app_id": ctx.source_app_id,
        "scope_id": ctx.scope_id,
        "scope_code": ctx.scope_code,
        "entity_id": ctx.entity_id,
        "entity_execution_id": ctx.entity_execution_id,
        "item_entity_key": ctx.item_entity_key,
        "item_key": ctx.item_key,
        "lock_duration_us": _micros(config.lock_duration),
        "retention_us": None if config.retention is None else _micros(config.retention),
        "lock_token": ctx.lock_token,
    }


def decode_context(raw: Mapping[str, Any]) -> StateHandlerContext:
    retention = raw["retention_us"]
    config = HandlerConfig(
        lock_duration=dt.timedelta(microseconds=raw["lock_duration_us"]),
        retention=None if retention is None else dt.timedelta(microseconds=retention),
    )
    return StateHandlerContext(
        scope_id=raw["scope_id"],
        scope_code=raw["scope_code"],
        entity_id=raw["entity_id"],
        entity_execution_id=raw["entity_execution_id"],
        tenant_id=raw["tenant_id"],
        source_app_id=raw["source_app_id"],
        handler_config=config,
        item_key=raw["item_key"],
        item_entity_key=raw["item_entity_key"],
        lock_token=raw["lock_token"],
    )


def wire_data(data: Mapping[str, Any] | None, status: object = None) -> str | None:
    """The payload as the canonical JSON text a handler stores, or a refusal raised here.

    What cannot be put on the wire at all (not JSON, non-string keys) is refused
    here, with the error the model raises; the size limit is left to the
    handler, which must answer ``payload_too_large`` itself.  For ``set`` the
    model refuses an unsupported status before it looks at the data, and so
    does this.
    """
    try:
        return encode_data(data)
    except PayloadTooLargeError:
        return json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except InvalidItemError:
        if status is not None:
            check_settable(status)
        raise


def encode_record(record: StateRecord) -> dict[str, Any]:
    key = record.key
    return {
        "key": {
            "tenant_id": key.tenant_id,
            "scope_id": key.scope_id,
            "entity_id": key.entity_id,
            "item_entity_key": key.item_entity_key,
            "item_key": key.item_key,
        },
        "status": record.status.value,
        "attempt": record.attempt,
        "locked_until": None
        if record.locked_until is None
        else encode_instant(record.locked_until),
        "data_json": None
        if record.data is None
        else json.dumps(
            record.data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ),
        "error_detail": record.error_detail,
        "entity_execution_id": record.entity_execution_id,
        "source_app_id": record.source_app_id,
        "created_at": encode_instant(record.created_at),
        "updated_at": encode_instant(record.updated_at),
        "retain_until": None
        if record.retain_until is None
        else encode_instant(record.retain_until),
    }


def decode_record(raw: Mapping[str, Any]) -> StateRecord:
    """A record of the wire (schema-checked) as the :class:`StateRecord` the kit compares."""
    key = raw["key"]
    data_json = raw["data_json"]
    locked_until, retain_until = raw["locked_until"], raw["retain_until"]
    return StateRecord(
        key=RecordKey(
            tenant_id=key["tenant_id"],
            scope_id=key["scope_id"],
            entity_id=key["entity_id"],
            item_entity_key=key["item_entity_key"],
            item_key=key["item_key"],
        ),
        status=IdempotencyStatus(raw["status"]),
        attempt=raw["attempt"],
        locked_until=None if locked_until is None else decode_instant(locked_until),
        data=None if data_json is None else json.loads(data_json),
        error_detail=raw["error_detail"],
        entity_execution_id=raw["entity_execution_id"],
        source_app_id=raw["source_app_id"],
        created_at=decode_instant(raw["created_at"]),
        updated_at=decode_instant(raw["updated_at"]),
        retain_until=None if retain_until is None else decode_instant(retain_until),
    )


def encode_error(error: BaseException) -> dict[str, Any]:
    """A raised error as the ``error`` member of an answer; unknown errors are ``internal``."""
    kind = next((k for k, cls in ERROR_KINDS.items() if isinstance(error, cls)), None)
    if kind is None:
        return {"kind": "internal", "message": str(error), "type": type(error).__name__}
    body: dict[str, Any] = {"kind": kind, "message": str(error)}
    for name in _FIELDS[kind]:
        if hasattr(error, name):
            value = getattr(error, name)
            body[name] = list(value) if isinstance(value, tuple) else value
    return body


#: The fields each kind may carry (all optional on the wire), as the Python errors name them.
_FIELDS: dict[str, tuple[str, ...]] = {
    "lock_held": ("item_key", "locked_until"),
    "lock_not_held": ("item_key", "operation"),
    "stale_lock": ("item_key", "token", "current_token", "status"),
    "forbidden_transition": ("source", "target", "allowed", "item_key"),
    "unsupported_status": ("status", "use"),
    "payload_too_large": ("size", "limit"),
    "invalid_item": ("field",),
    "store_error": (),
    "instant_out_of_range": ("option", "now", "duration"),
}


def decode_error(body: Mapping[str, Any], ctx: StateHandlerContext | None) -> DsmError:
    """The Python error an ``error`` answer stands for, with its fields and the handler's message.

    Fields a handler leaves out are taken from the request (its item key and
    token), so a terse handler still raises a complete error; the message is
    always the handler's own, since that is what its users will read.
    """
    kind = body["kind"]
    cls = ERROR_KINDS[kind]
    item_key = body.get("item_key", ctx.item_key if ctx is not None else "")
    error: DsmError
    if cls is LockHeldError:
        error = LockHeldError(item_key=item_key, locked_until=body.get("locked_until", "?"))
    elif cls is LockNotHeldError:
        error = LockNotHeldError(item_key=item_key, operation=body.get("operation", "?"))
    elif cls is StaleLockError:
        token = body.get("token", ctx.lock_token if ctx is not None else None)
        error = StaleLockError(
            item_key=item_key,
            token=token if isinstance(token, int) else 0,
            current_token=body.get("current_token"),
            status=body.get("status", "?"),
        )
    elif cls is ForbiddenTransitionError:
        error = ForbiddenTransitionError(
            source=body.get("source", "?"),
            target=body.get("target", "?"),
            allowed=tuple(body.get("allowed", ())),
            item_key=item_key,
        )
    elif cls is UnsupportedStatusError:
        error = UnsupportedStatusError(status=body.get("status", "?"), use=body.get("use", "?"))
    elif cls is PayloadTooLargeError:
        error = PayloadTooLargeError(size=body.get("size", -1), limit=body.get("limit", -1))
    elif cls is InvalidItemError:
        error = InvalidItemError(body["message"], field=body.get("field", ""))
    elif cls is InstantOutOfRangeError:
        error = InstantOutOfRangeError(
            option=body.get("option", "?"),
            now=body.get("now", "?"),
            duration=body.get("duration", "?"),
        )
    else:
        error = StoreError(body["message"])
    error.args = (body["message"],)
    return error
