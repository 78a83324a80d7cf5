"""Broken handlers that a world of tidy names, plain text and short histories never shows.

Each stores what it was given in a way real stores do, and is right for
payloads like ``{"amount": 3}``, error details like ``card declined``, keys
like ``INV-1`` and items retried a few times.  They go wrong on the rest of
the domain: a payload field named like a record field, text that looks like
another JSON type, a CRLF in an error detail, the tenth take-over of one
item, two keys whose hashes are equal.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Mapping
from typing import Any

from dsm_sim.broken.handlers import _KeyCollapsingHandler
from reference_engine.clock import read_now
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = [
    "ErrorDetailCrlfToLf",
    "HashPlacedKeys",
    "ParsesJsonLookingText",
    "PayloadMergedIntoRecord",
    "TokenComparedAsText",
]

S = IdempotencyStatus


def _instant(value: object) -> object:
    return value.isoformat() if hasattr(value, "isoformat") else value


class PayloadMergedIntoRecord(InMemoryStateHandler):
    """The record is one document with the payload's fields at its top level, so a field named like the record's (status, attempt, _id) reads back as the record's."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = self.model.get(ctx)
        if record is None or record.data is None:
            return record
        key = record.key
        document: dict[str, object] = {
            "_id": f"{key.tenant_id}/{key.scope_id}/{key.entity_id}/"
            f"{key.item_entity_key}/{key.item_key}",
            **{field.name: getattr(key, field.name) for field in dataclasses.fields(RecordKey)},
            **{
                field.name: _instant(getattr(record, field.name))
                for field in dataclasses.fields(StateRecord)
                if field.name not in ("key", "data")
            },
            "status": record.status.label,
        }
        data = {name: document.get(name, value) for name, value in record.data.items()}
        return dataclasses.replace(record, data=data)


def _decoded(value: Any) -> Any:
    """Every text that parses as JSON, parsed (``"1"`` is 1, ``"null"`` is null)."""
    if isinstance(value, Mapping):
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_decoded(item) for item in value]
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class ParsesJsonLookingText(InMemoryStateHandler):
    """Text values are decoded as JSON when they parse, as a store that guesses types does: "1" reads back as 1, "true" as true."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = self.model.get(ctx)
        if record is None or record.data is None:
            return record
        return dataclasses.replace(record, data=_decoded(record.data))


class ErrorDetailCrlfToLf(InMemoryStateHandler):
    """The error detail passes a text layer that turns CRLF line endings into LF (autocrlf, a text-mode file)."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(
            ctx, error_detail.replace("\r\n", "\n"), read_now(self.clock)
        )


class TokenComparedAsText(InMemoryStateHandler):
    """Fencing refuses a token older than the stored one, comparing both as text, so after ten take-overs token 9 is not older than 10."""

    def _fenced(self, ctx: StateHandlerContext) -> StateHandlerContext:
        token = ctx.lock_token
        record = self.model.current.get(ctx.record_key)
        if token is None or record is None or record.status is not S.PROCESSING:
            return ctx
        if str(token) < str(record.attempt):
            return ctx  # older: refused, as it should be
        # "Not older": the write goes through as the holder's.
        return dataclasses.replace(ctx, lock_token=record.attempt)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(self._fenced(ctx), status, data, read_now(self.clock))

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(self._fenced(ctx), error_detail, read_now(self.clock))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        self.model.upsert(self._fenced(ctx), data, read_now(self.clock))


class HashPlacedKeys(_KeyCollapsingHandler):
    """Records are placed by the CRC-32 of the joined key, and two keys with one hash are taken for one item."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        # The parts joined unambiguously (a JSON array): only the hash confuses keys.
        joined = json.dumps(
            [key.tenant_id, key.scope_id, key.entity_id, key.item_entity_key, key.item_key],
            ensure_ascii=False,
        )
        placed = f"{zlib.crc32(joined.encode('utf-8')):08x}"
        return RecordKey(
            tenant_id="", scope_id=0, entity_id="", item_entity_key="", item_key=placed
        )
