"""A Java handler's counterexample: recognised as Java, printed as a class whose ``main`` throws.

``tests/integration/test_java_seed_handler.py`` compiles a printed class and
runs it against a broken and a fixed handler.
"""

from __future__ import annotations

import json

import pytest

from dsm_sim.conformance.tell.java import is_java, java_test
from dsm_sim.conformance.tell.languages import Finding, printer_for

pytestmark = pytest.mark.unit

CTX = {
    "tenant_id": "t1", "source_app_id": "app-1", "scope_id": 4, "scope_code": "Element",
    "entity_id": "flow-1", "entity_execution_id": "run-1", "item_entity_key": "",
    "item_key": 'INV-"\u5b9f"', "lock_duration_us": 1_800_000_000, "retention_us": None,
    "lock_token": None,
}  # fmt: skip


def _line(request_id: int, op: str, **fields: object) -> bytes:
    message = {"id": request_id, "op": op, "now": "2026-03-02T09:00:00.000000Z", **fields}
    return json.dumps(message).encode() + b"\n"


def test_a_java_handler_is_known_by_what_its_host_says_or_by_its_command() -> None:
    assert is_java("anything", "java") and not is_java("java -cp x H", "node")
    assert is_java("java -XX:TieredStopAtLevel=1 -cp /tmp/dsm-java SeedMemoryHandler", None)
    assert is_java("/usr/lib/jvm/bin/java -jar handler.jar", None)
    assert not is_java("node handlers/node/memory.js", None)
    printer = printer_for("java -cp /tmp/x MemoryHandler", "java")
    assert printer is not None and printer.suffix == ".java"


def test_the_java_main_expects_the_reference_answers_as_protocol_json() -> None:
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "set", context={**CTX, "lock_token": 7}, status="processed", data_json="{}"),
        _line(4, "reset_expired_locks"),
        _line(5, "close"),
    ]
    test = java_test(Finding("stale_write_rejected", 2, lines, "a message"))
    assert "final class DsmStaleWriteRejectedSeed2 {" in test
    assert "    static Object createHandler(SeedHost.Clock clock) {" in test
    assert 'ProtocolSteps.expect("1", steps.tryAcquireLock(ProtocolSteps.context(' in test
    # The context's JSON text in a Java literal, ASCII only: \u5b9f stays JSON's escape.
    assert '\\"INV-\\\\\\"\\\\u5b9f\\\\\\"\\"' in test
    assert 'ProtocolSteps.expect("{\\"error\\":\\"stale_lock\\"}", steps.set(' in test
    assert 'ProtocolSteps.expect("0", steps.resetExpiredLocks(), "request 4:' in test
    assert test.count("steps.at(") == 3
    seed = java_test(Finding("stale_write_rejected", 2, lines, shape="seed"))
    assert "static SeedHandler createHandler(SeedHost.Clock clock)" in seed
    # Under the seed's interface the late write lands: the reference says so.
    assert 'ProtocolSteps.expect("{\\"error\\":\\"stale_lock\\"}"' not in seed
