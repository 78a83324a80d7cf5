"""Records reduced to what the checker compares: store-clock microseconds and a data digest.

The digest is taken over the canonical JSON the engine itself writes, so two
payloads that read back equal as JSON documents (same keys, same numbers,
same strings, NUL included) have one digest and any change has another.
"""

from __future__ import annotations

import _json
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

from dsm_sim.history import RecordView, key_of
from dsm_sim.micros import Micros, micros_since
from reference_engine.record import StateRecord, encode_data

__all__ = ["DATA_WIDTH", "data_text", "digest", "view_of"]

#: Pages that play a few calls (the demo, a counterexample) show a payload,
#: not its digest; this many characters of it keep a cell readable.
DATA_WIDTH = 160


#: The canonical JSON encoder, built once: ``json.dumps`` with these options builds
#: a new encoder on every call, and the simulator digests every record it reads.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _canonical_c(data: object) -> str:
    """``_CANONICAL.encode(data)`` for a mapping, calling C's encoder as ``encode`` itself does.

    ``encode`` goes through two Python frames to build the same encoder (a
    fresh ``markers`` dict for the circular-reference check, every option
    as in :data:`_CANONICAL`); calling it directly saves a quarter of a digest.
    """
    encoder = _json.make_encoder(
        {}, _CANONICAL.default, encode_basestring, None, ":", ",", True, False, False
    )
    return "".join(encoder(data, 0))


def digest(data: Mapping[str, Any] | None) -> str | None:
    """A short, stable fingerprint of a payload (``None`` for no payload)."""
    if data is None:
        return None
    try:
        text = _canonical_c(data) if type(data) is dict else _CANONICAL.encode(data)
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


def view_of(
    record: StateRecord | None,
    epoch: dt.datetime,
    instants: dict[dt.datetime, Micros] | None = None,
) -> RecordView | None:
    """The checker's view of ``record``; instants as microseconds since ``epoch``.

    The simulator takes two of these around every call, so the view is built
    with its fields in ``RecordView``'s order rather than by keyword, which
    costs a third less, and ``instants`` (one per epoch) remembers the microseconds
    of its naive and UTC instants (:func:`~dsm_sim.micros.micros_since`): a
    record is read many times with the same stamps.
    """
    if record is None:
        return None
    locked, created_at, updated_at, retain = (
        record.locked_until,
        record.created_at,
        record.updated_at,
        record.retain_until,
    )
    created = micros_since(created_at, epoch, instants)
    updated = micros_since(updated_at, epoch, instants)
    return RecordView(
        key_of(record.key),
        record.status.value,
        record.attempt,
        micros_since(locked, epoch, instants),
        0 if created is None else created,
        0 if updated is None else updated,
        micros_since(retain, epoch, instants),
        digest(record.data),
        _aware_utc(locked)
        and _aware_utc(created_at)
        and _aware_utc(updated_at)
        and _aware_utc(retain),
        (record.error_detail, record.source_app_id, record.entity_execution_id),
    )


class Viewer:
    """:func:`view_of` for one run, which reads every key around every call.

    A key read again is mostly found as it was: the same stored stamps,
    which an in-process store hands out as the very same objects, and only
    a payload decoded afresh.  When every field but the payload is the same
    object as in the key's last record and the payload has the same digest,
    the last view is the view, built field for field from the same values;
    anything else (an equal value that is another object included) is
    viewed afresh.
    """

    def __init__(self, epoch: dt.datetime) -> None:
        self.epoch = epoch
        #: Microseconds since the epoch of each stamp converted (see :func:`view_of`).
        self.instants: dict[dt.datetime, Micros] = {}
        #: key -> the last record viewed and its view.
        self._last: dict[str, tuple[StateRecord, RecordView]] = {}

    def view(self, key: str, record: StateRecord | None) -> RecordView | None:
        """The view of ``record``, just read for ``key``."""
        if record is None:
            return None
        last = self._last.get(key)
        if last is not None:
            seen, view = last
            if (
                record.key is seen.key
                and record.status is seen.status
                and record.attempt is seen.attempt
                and record.locked_until is seen.locked_until
                and record.error_detail is seen.error_detail
                and record.entity_execution_id is seen.entity_execution_id
                and record.source_app_id is seen.source_app_id
                and record.created_at is seen.created_at
                and record.updated_at is seen.updated_at
                and record.retain_until is seen.retain_until
                and digest(record.data) == view.data
            ):
                return view
        made = view_of(record, self.epoch, self.instants)
        assert made is not None
        self._last[key] = (record, made)
        return made
