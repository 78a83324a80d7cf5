"""What a handler returns when asked for an item's record, and payload rules."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reference_engine.context import RecordKey
from reference_engine.errors import InvalidItemError, PayloadTooLargeError
from reference_engine.status import IdempotencyStatus

__all__ = ["MAX_DATA_BYTES", "StateRecord", "encode_data", "is_lock_live"]

#: Results larger than this belong in a blob store, with a reference here.
MAX_DATA_BYTES = 256 * 1024


def encode_data(data: Mapping[str, Any] | None) -> str | None:
    """Serialise a payload to canonical JSON, or raise before anything is written."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidItemError(
            f"data must be a JSON object, got {type(data).__name__}", field="data"
        )
    try:
        text = json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidItemError(f"data is not JSON-serialisable: {exc}", field="data") from exc
    if size > MAX_DATA_BYTES:
        raise PayloadTooLargeError(size=size, limit=MAX_DATA_BYTES)
    return text


def is_lock_live(
    status: IdempotencyStatus, locked_until: dt.datetime | None, now: dt.datetime
) -> bool:
    """A lock is live while ``now <= locked_until``; the sweep takes ``locked_until < now``."""
    return (
        status is IdempotencyStatus.PROCESSING and locked_until is not None and now <= locked_until
    )


@dataclass(frozen=True, slots=True)
class StateRecord:
    """The current record of one item, as stored.

    ``attempt`` is the fencing token of the latest acquisition (0 for records
    written without one, e.g. a Skipped decision on a fresh item).
    """

    key: RecordKey
    status: IdempotencyStatus
    attempt: int
    locked_until: dt.datetime | None
    data: Mapping[str, Any] | None
    error_detail: str | None
    entity_execution_id: str
    source_app_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    retain_until: dt.datetime | None

    def lock_live(self, now: dt.datetime) -> bool:
        return is_lock_live(self.status, self.locked_until, now)
