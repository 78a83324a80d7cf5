"""The checker's view of a record, and the judge's copy of one, keep every field in its place.

Both are built positionally on the simulator's and the checker's paths (one
view per read, one copy per judged call), so each field gets a value of its
own here and a field landing in its neighbour's place shows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from zoneinfo import ZoneInfo

from dsm_sim.history import RecordView
from dsm_sim.model import record_copy
from dsm_sim.simulator.views import Viewer, _canonical_c, digest, view_of
from reference_engine.context import RecordKey
from reference_engine.model import ModelRecord
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

EPOCH = dt.datetime(2026, 1, 1, 9, 0, tzinfo=dt.UTC)
KEY = RecordKey("t", 3, "e", "ek", "k")


def _at(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def test_a_view_has_every_field_of_the_record_in_its_place() -> None:
    record = StateRecord(
        key=KEY,
        status=IdempotencyStatus.PROCESSING,
        attempt=4,
        locked_until=_at(90.5),
        data={"b": 1, "a": "é"},
        error_detail="why",
        entity_execution_id="w1-x004",
        source_app_id="billing",
        created_at=_at(1.25),
        updated_at=_at(30.0),
        retain_until=_at(3600.0),
    )
    assert view_of(record, EPOCH) == RecordView(
        key="t/3/e/ek/k",
        status="processing",
        attempt=4,
        locked_until=90_500_000,
        created_at=1_250_000,
        updated_at=30_000_000,
        retain_until=3_600_000_000,
        data=digest({"a": "é", "b": 1}),
        utc=True,
        audit=("why", "billing", "w1-x004"),
    )


def test_a_view_flags_an_instant_not_in_utc() -> None:
    record = StateRecord(
        key=KEY,
        status=IdempotencyStatus.PROCESSED,
        attempt=1,
        locked_until=None,
        data=None,
        error_detail=None,
        entity_execution_id="w1-x001",
        source_app_id="billing",
        created_at=_at(0.0),
        updated_at=_at(5.0).replace(tzinfo=None),
        retain_until=None,
    )
    view = view_of(record, EPOCH)
    assert view is not None
    assert (view.updated_at, view.utc, view.data, view.locked_until) == (
        5_000_000,
        False,
        None,
        None,
    )


def test_the_digest_is_of_the_canonical_json() -> None:
    data = {"z": [1, 2.5, None], "a": {"y": True, "x": "\x00é"}}
    text = json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert digest(data) == hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    assert digest({"nan": float("nan")}) == digest({"nan": float("nan")})  # not JSON: by repr


def test_a_model_record_copy_has_every_field() -> None:
    values = {field.name: f"value of {field.name}" for field in dataclasses.fields(ModelRecord)}
    record = ModelRecord(**values)  # type: ignore[arg-type]
    copied = record_copy(record)
    assert copied == record
    assert copied is not record


def test_remembered_instants_give_the_seconds_converted_afresh() -> None:
    paris = ZoneInfo("Europe/Paris")
    # The last Sunday of October 2026, 02:30 in Paris happens twice: fold 0 then fold 1.
    first = dt.datetime(2026, 10, 25, 2, 30, tzinfo=paris)
    second = first.replace(fold=1)
    assert first == second  # one zone: compared by wall time
    instants: dict[dt.datetime, float] = {}
    for stamp in (first, second, _at(7.5), _at(7.5), _at(7.5).replace(tzinfo=None)):
        record = StateRecord(
            key=KEY,
            status=IdempotencyStatus.PROCESSED,
            attempt=1,
            locked_until=None,
            data=None,
            error_detail=None,
            entity_execution_id="w1-x001",
            source_app_id="billing",
            created_at=stamp,
            updated_at=stamp,
            retain_until=stamp,
        )
        assert view_of(record, EPOCH, instants) == view_of(record, EPOCH)


def test_the_direct_encoder_writes_and_refuses_what_json_dumps_does() -> None:
    circular: dict[str, object] = {"a": 1}
    circular["self"] = circular
    payloads: list[dict[object, object]] = [
        {"z": 1, "a": [1.5, None, True, "\x00é\ud800"], "m": {"k": {}}},
        {1: "int key", 2.5: "float key", None: "null key", False: "bool key"},
        {"nan": float("nan")},
        {"obj": object()},
        {"b": 1, 2: "mixed keys cannot be sorted"},
        circular,  # type: ignore[list-item]
    ]
    for data in payloads:
        try:
            expected: object = json.dumps(
                data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except (TypeError, ValueError) as exc:
            expected = type(exc)
        try:
            got: object = _canonical_c(data)
        except (TypeError, ValueError) as exc:
            got = type(exc)
        assert got == expected, data


#: A stored record's fields, the very same objects in every read (as an in-process store's).
STORED: dict[str, object] = {
    "key": KEY,
    "status": IdempotencyStatus.PROCESSING,
    "attempt": 2,
    "locked_until": _at(60.0),
    "data": {"amount": 1},
    "error_detail": None,
    "entity_execution_id": "w1-x002",
    "source_app_id": "billing",
    "created_at": _at(0.0),
    "updated_at": _at(1.0),
    "retain_until": None,
}


def _stored(**changes: object) -> StateRecord:
    return StateRecord(**{**STORED, **changes})  # type: ignore[arg-type]


def test_a_record_read_again_keeps_its_view_only_while_every_field_is_the_same() -> None:
    first = _stored()
    other = {
        "key": RecordKey("t", 3, "e", "ek", "k"),  # equal, another object: viewed afresh
        "status": IdempotencyStatus.PROCESSED,
        "attempt": 2.0,  # equal to 2, written differently
        "locked_until": _at(60.0).replace(tzinfo=ZoneInfo("UTC")),  # equal, not dt.UTC
        "data": {"amount": 1.0},  # equal to {"amount": 1}, another digest
        "error_detail": "why",
        "entity_execution_id": "w2-x001",
        "source_app_id": "other",
        "created_at": _at(0.5),
        "updated_at": _at(1.0).replace(tzinfo=None),
        "retain_until": _at(9.0),
    }
    assert set(other) == {field.name for field in dataclasses.fields(StateRecord)}
    for name, value in other.items():
        viewer = Viewer(EPOCH)
        kept = viewer.view("k", first)
        assert viewer.view("k", _stored(data={"amount": 1})) is kept  # payload decoded afresh
        changed = _stored(**{name: value})
        seen = viewer.view("k", changed)
        assert seen == view_of(changed, EPOCH), name
        assert seen is not kept, name
    assert Viewer(EPOCH).view("k", None) is None
