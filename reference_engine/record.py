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
    "MAX_DATA_DEPTH",
    "MAX_ERROR_DETAIL",
    "MAX_INT_DIGITS",
    "SETTABLE",
    "StateRecord",
    "check_settable",
    "clean_error_detail",
    "encode_data",
    "is_lock_live",
]

#: Results larger than this belong in a blob store, with a reference here.
MAX_DATA_BYTES = 256 * 1024
#: How deeply objects and lists may nest in a payload.  Every store's JSON
#: reader handles far more; the margin keeps a stored payload always readable.
MAX_DATA_DEPTH = 64
#: Digits an integer in a payload may have; larger numbers belong in strings.
MAX_INT_DIGITS = 100
_INT_BOUND = 10**MAX_INT_DIGITS
#: Exact types the payload walk passes over at once: most of a payload, and
#: neither a container nor an integer to bound.  Subclasses take the full checks.
_SCALARS = frozenset({str, float, bool, type(None)})
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
    (which PostgreSQL text cannot hold) are replaced rather than refused, and
    a detail whose ``str()`` raises is recorded by its type: refusing would
    leave the lock held.
    """
    try:
        text = str(detail)
    except Exception as exc:  # any failure of a user's __str__: the failure is still recorded
        text = f"<{type(detail).__name__} error detail; str() raised {type(exc).__name__}>"
    if not isinstance(text, str):
        text = f"<{type(detail).__name__} error detail>"
    text = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    return text[:MAX_ERROR_DETAIL]


def encode_data(data: Mapping[str, Any] | None) -> str | None:
    """Serialise a payload to canonical JSON, or raise before anything is written."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidItemError(
            f"data must be a JSON object, got {type(data).__name__}", field="data"
        )
    _check_structure(data)
    try:
        text = json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as exc:
        raise InvalidItemError(f"data is not JSON-serialisable: {exc}", field="data") from exc
    if size > MAX_DATA_BYTES:
        raise PayloadTooLargeError(size=size, limit=MAX_DATA_BYTES)
    return text


def _check_structure(data: Mapping[str, Any]) -> None:
    """String keys, bounded depth and bounded integers, checked without recursion.

    JSON objects have string keys, or the payload would not read back as
    written.  The walk is iterative so no payload, however deep or circular,
    can exhaust the interpreter's stack: nesting past :data:`MAX_DATA_DEPTH`
    (which a cycle always reaches) is refused by name.
    """
    pending: list[tuple[object, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        kind = type(value)
        if kind in _SCALARS:
            continue
        if kind is int:
            if not -_INT_BOUND < value < _INT_BOUND:
                raise _too_many_digits()
            continue
        if isinstance(value, Mapping | list | tuple):
            if depth > MAX_DATA_DEPTH:
                raise InvalidItemError(
                    f"data nests objects and lists deeper than {MAX_DATA_DEPTH} levels "
                    "(or refers to itself); flatten it or store a reference",
                    field="data",
                )
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise InvalidItemError(
                            "data is not JSON-serialisable as given: object keys must be "
                            f"strings, got {type(key).__name__} key {_short_repr(key)}",
                            field="data",
                        )
                    pending.append((item, depth + 1))
            else:
                pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, int) and not -_INT_BOUND < value < _INT_BOUND:
            raise _too_many_digits()


def _too_many_digits() -> InvalidItemError:
    return InvalidItemError(
        f"data holds an integer of more than {MAX_INT_DIGITS} digits; "
        "store such a number as a string",
        field="data",
    )


def _short_repr(value: object, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a user's __repr__ must not hide the real problem
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


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
