"""Records reduced to what the checker compares: store-clock seconds and a data digest.

The digest is taken over the canonical JSON the engine itself writes, so two
payloads that read back equal as JSON documents (same keys, same numbers,
same strings, NUL included) have one digest and any change has another.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dsm_sim.history import RecordView, key_of
from reference_engine.record import StateRecord, encode_data

__all__ = ["DATA_WIDTH", "data_text", "digest", "view_of"]

#: Pages that play a few calls (the demo, a counterexample) show a payload,
#: not its digest; this many characters of it keep a cell readable.
DATA_WIDTH = 160


def digest(data: Mapping[str, Any] | None) -> str | None:
    """A short, stable fingerprint of a payload (``None`` for no payload)."""
    if data is None:
        return None
    try:
        text = json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError):
        text = "not-json:" + repr(data)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def data_text(data: object) -> str | None:
    """A payload as the canonical JSON the engine writes, cut to :data:`DATA_WIDTH`."""
    if not isinstance(data, Mapping):
        return None
    text = encode_data(data)
    if text is None:
        return None
    return text if len(text) <= DATA_WIDTH else text[: DATA_WIDTH - 3] + "..."


_UTC = dt.UTC
_ZERO = dt.timedelta(0)


def _aware_utc(instant: dt.datetime | None) -> bool:
    if instant is None:
        return True
    zone = instant.tzinfo
    return zone is _UTC or (zone is not None and instant.utcoffset() == _ZERO)


def _seconds(instant: dt.datetime | None, epoch: dt.datetime) -> float | None:
    if instant is None:
        return None
    if instant.tzinfo is None:  # a naive instant is read as UTC wall time; utc=False flags it
        instant = instant.replace(tzinfo=dt.UTC)
    return round((instant - epoch).total_seconds(), 6)


def view_of(record: StateRecord | None, epoch: dt.datetime) -> RecordView | None:
    """The checker's view of ``record``; instants as seconds since ``epoch``."""
    if record is None:
        return None
    stamps = (record.locked_until, record.created_at, record.updated_at, record.retain_until)
    created = _seconds(record.created_at, epoch)
    updated = _seconds(record.updated_at, epoch)
    return RecordView(
        key=key_of(record.key),
        status=record.status.value,
        attempt=record.attempt,
        locked_until=_seconds(record.locked_until, epoch),
        created_at=0.0 if created is None else created,
        updated_at=0.0 if updated is None else updated,
        retain_until=_seconds(record.retain_until, epoch),
        data=digest(record.data),
        utc=_aware_utc(stamps[0])
        and _aware_utc(stamps[1])
        and _aware_utc(stamps[2])
        and _aware_utc(stamps[3]),
        audit=(record.error_detail, record.source_app_id, record.entity_execution_id),
    )
