"""What a handler returns when asked for an item's record, and payload rules."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reference_engine.context import RecordKey
from reference_engine.errors import InvalidItemError, PayloadTooLargeError, UnsupportedStatusError
from reference_engine.status import IdempotencyStatus

__all__ = [
    "MAX_DATA_BYTES",
    "MAX_ERROR_DETAIL",
    "SETTABLE",
    "StateRecord",
    "check_settable",
    "clean_error_detail",
    "encode_data",
    "is_lock_live",
]

#: Results larger than this belong in a blob store, with a reference here.
MAX_DATA_BYTES = 256 * 1024
#: Error details are for people reading a record, not for stack dumps.
MAX_ERROR_DETAIL = 4000
#: Statuses ``set`` may write; Processing is written by acquire, Superseded by upsert.
SETTABLE = frozenset(
    {
        IdempotencyStatus.PROCESSED,
        IdempotencyStatus.FAILED,
        IdempotencyStatus.SKIPPED,
        IdempotencyStatus.EXPIRED,
    }
)


def check_settable(status: object) -> IdempotencyStatus:
    """Refuse any ``set`` target but the four statuses it may write, naming them."""
    if isinstance(status, IdempotencyStatus) and status in SETTABLE:
        return status
    allowed = ", ".join(s.label for s in IdempotencyStatus if s in SETTABLE)
    if isinstance(status, IdempotencyStatus):
        use = "upsert()" if status is IdempotencyStatus.SUPERSEDED else "try_acquire_lock()"
        raise UnsupportedStatusError(status=status.label, use=use)
    raise UnsupportedStatusError(
        status=repr(status),
        use=f"an IdempotencyStatus; set() writes one of {allowed}",
    )


def clean_error_detail(detail: object) -> str:
    """Make an error detail storable anywhere: text, valid UTF-8, bounded.

    A failure must always be recordable, so undecodable characters and NUL
    (which PostgreSQL text cannot hold) are replaced rather than refused:
    refusing would leave the lock held.
    """
    text = str(detail).encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    return text[:MAX_ERROR_DETAIL]


def encode_data(data: Mapping[str, Any] | None) -> str | None:
    """Serialise a payload to canonical JSON, or raise before anything is written."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidItemError(
            f"data must be a JSON object, got {type(data).__name__}", field="data"
        )
    _check_keys(data)
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


def _check_keys(value: object) -> None:
    """JSON objects have string keys; anything else would not read back as written."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidItemError(
                    "data is not JSON-serialisable as given: object keys must be strings, "
                    f"got {type(key).__name__} key {key!r}",
                    field="data",
                )
            _check_keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item)


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
