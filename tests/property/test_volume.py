"""The volume stage: many ids of realistic shapes, each checked; a collision is told as a probe."""

from __future__ import annotations

import binascii
import dataclasses
import re

import pytest

from dsm_sim.broken.handlers import _KeyCollapsingHandler
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.probing import probe_findings
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.conformance.volume import (
    PROBE_NAME,
    VOLUME,
    check_volume,
    volume_ids,
    volume_probe,
)
from reference_engine.context import RecordKey
from reference_engine.handlers.memory import in_memory_handler

pytestmark = pytest.mark.property


class Crc16Placed(_KeyCollapsingHandler):
    """Records are placed by the CRC-16 of the item key (a slot), equal slots taken for one item."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        slot = binascii.crc_hqx(key.item_key.encode("utf-8"), 0)
        return dataclasses.replace(key, item_key=str(slot))


def test_ids_are_distinct_deterministic_and_of_every_shape() -> None:
    ids = volume_ids(7, 5000)
    assert len(set(ids)) == 5000 and ids == volume_ids(7, 5000) and ids != volume_ids(8, 5000)
    shapes = (
        r"ord_[0-9a-f]{24}",
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        r"[0-9A-HJKMNP-TV-Z]{26}",
        r"INV-2026-\d{7}",
        r"cus_[A-Za-z0-9]{14}",
    )
    for shape in shapes:
        assert sum(bool(re.fullmatch(shape, item)) for item in ids) == 1000, shape
    assert VOLUME == {"thorough": 100_000}  # ci and dev stay fast


def test_a_correct_handler_keeps_every_id_apart() -> None:
    assert check_volume(in_memory_handler, 0, 5000) is None


def test_a_store_placing_by_a_short_hash_is_caught_and_replayed_as_two_ids() -> None:
    found = check_volume(Crc16Placed, 0, 5000)
    assert found is not None
    item, other = found
    assert other is not None and item != other
    assert binascii.crc_hqx(item.encode(), 0) == binascii.crc_hqx(other.encode(), 0)
    probe = volume_probe(item, other)
    machine = build_machine(Crc16Placed, stats=RunStats())
    findings = list(probe_findings(machine, found=frozenset, probes=(probe,)))
    assert findings and findings[0].violation.property == "key_identity"
    assert item in findings[0].violation.story


def test_verify_books_a_volume_finding_as_found_by_the_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(VOLUME, "dev", 3000)
    report = verify(Crc16Placed, "dev", seed=0, probes=False, matrix=False, stop_on_first=True)
    first = report.violations[0]
    assert first.found_by == PROBE_NAME and first.name == "key_identity"
    assert first.status is ResultStatus.FAILED and report.test_cases == 0
    assert "state.setup(world=" in first.reproduction
