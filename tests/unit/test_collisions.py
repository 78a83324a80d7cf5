"""The kit's constructed hash collisions collide, and its text tables hold what they promise."""

from __future__ import annotations

import json
import zlib

import pytest

from dsm_sim.conformance.generate.collisions import (
    FNV_PAIR,
    HASHES,
    crc16,
    crc32,
    fnv1a32,
    fnv_collision,
    hash_pairs,
    java_hash,
    linear_collision,
    murmur3_32,
)
from dsm_sim.conformance.generate.payloads import data_difference
from dsm_sim.conformance.generate.texts import FIELD_NAMES, LINE_FORMS, lookalike_pairs
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.record import encode_data

pytestmark = pytest.mark.unit


def test_the_hashes_are_the_ones_stores_use() -> None:
    """Published test vectors of each hash."""
    assert crc32(b"123456789") == 0xCBF43926 == zlib.crc32(b"123456789")
    assert crc16(b"123456789") == 0x31C3  # CRC-16/XMODEM, Redis Cluster's slots
    assert java_hash("hello") == 99162322
    assert java_hash("Aa") == java_hash("BB")
    assert fnv1a32(b"") == 0x811C9DC5 and fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723


def test_the_kept_fnv_pair_is_what_the_search_finds() -> None:
    """The pair the kit uses without searching is the search's own result, and collides."""
    assert fnv_collision() == FNV_PAIR
    one, other = FNV_PAIR
    assert one != other and fnv1a32(one.encode()) == fnv1a32(other.encode())


@pytest.mark.parametrize("text", ["INV-1", "", "t2", "x" * 300, "\u8acb\u6c42\u66f8"])
def test_each_pair_collides_and_is_distinct_printable_and_within_limits(text: str) -> None:
    pairs = hash_pairs(text, MAX_KEY_LENGTH)
    assert {name for name, _, _ in pairs} == set(HASHES)
    for name, one, other in pairs:
        hashed = HASHES[name]
        assert one != other and len(one) == len(other) <= MAX_KEY_LENGTH
        assert hashed(one) == hashed(other), name
        # Any common suffix keeps them colliding: the key part's own hash.
        assert hashed(one + "-tail") == hashed(other + "-tail"), name


@pytest.mark.parametrize("name", ["crc32", "crc16", "java"])
def test_crc_and_hashcode_pairs_collide_inside_any_joined_key(name: str) -> None:
    hashed = HASHES[name]
    for _, one, other in (p for p in hash_pairs("INV-7", MAX_KEY_LENGTH) if p[0] == name):
        for joiner in ("", ":", "\x1f", "/"):
            head = joiner.join(("tenant", "4", "flow-1", "line-2", ""))
            assert hashed(head + one) == hashed(head + other)
            joined = json.dumps(["t1", 4, "flow-1", "", one])
            assert hashed(joined) == hashed(json.dumps(["t1", 4, "flow-1", "", other]))


def test_linear_collisions_are_solved_for_any_start() -> None:
    for start in ("@@@@@@@", "ABCDEFG", "_______", "DSM@KEY@@"):
        other = linear_collision(crc32, 32, start)
        assert other != start and all("@" <= c <= "_" for c in other)
        assert crc32(start.encode()) == crc32(other.encode())
    with pytest.raises(ValueError, match="no free bits"):
        linear_collision(crc32, 32, "ABCDEF")


def test_field_names_include_the_records_own_and_twins() -> None:
    for name in ("status", "attempt", "locked_until", "lockedUntil", "data", "_id", "$set"):
        assert name in FIELD_NAMES
    assert {"status", "Status", "status "} <= set(FIELD_NAMES)
    assert "caf\u00e9" in FIELD_NAMES and "cafe\u0301" in FIELD_NAMES
    assert len(set(FIELD_NAMES)) == len(FIELD_NAMES)


def test_lookalike_pairs_are_text_beside_another_type() -> None:
    pairs = lookalike_pairs(1)
    found = {(text, json.dumps(value)) for text, value in pairs}
    for expected in (
        ("1", "1"),
        ("true", "true"),
        ("null", "null"),
        ("1.0", "1.0"),
        ("[1]", "[1]"),
    ):
        assert expected in found, expected
    for text, value in pairs:
        assert isinstance(text, str) and not (isinstance(value, str) and value == text)
        encode_data({"text": text, "value": value})  # every pair is a payload the contract accepts
    assert any(text == "10" for text, _ in lookalike_pairs(10))


def test_line_forms_carry_every_line_ending() -> None:
    joined = "".join(LINE_FORMS)
    for ending in ("\r\n", "\r", "\n", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\t"):
        assert ending in joined
    assert any(form.endswith(" ") for form in LINE_FORMS)
    assert "\x00" not in joined


def test_a_payload_read_back_differs_by_type_order_and_every_character() -> None:
    assert data_difference({"a": "1"}, {"a": 1}) == "data['a'] is 1 (int); written '1' (str)"
    assert data_difference({"a": [1, "1"]}, {"a": ["1", 1]}) is not None  # list order
    assert data_difference({"a": "x\r\ny"}, {"a": "x\ny"}) is not None
    assert data_difference({"caf\u00e9": 1}, {"cafe\u0301": 1}) is not None
    # Keys a store hands back as other types are named, not a crash of the comparison.
    assert "extra [1]" in (data_difference({"a": 1, "1": 2}, {"a": 1, 1: 2}) or "")
    assert data_difference({"b": 1, "a": 2}, {"a": 2, "b": 1}) is None  # member order is not data
