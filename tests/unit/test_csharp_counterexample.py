"""A C# handler's counterexample: recognised as C#, printed as an NUnit test, its page opening
at the breaking step."""

from __future__ import annotations

import json

from dsm_sim.conformance.tell.csharp import is_csharp, nunit_test
from dsm_sim.conformance.tell.outputs import breaking_step


def test_a_csharp_handler_is_known_by_what_its_host_says_or_by_its_command() -> None:
    assert is_csharp("anything", "csharp")
    assert not is_csharp("mono Host.exe", "javascript")
    assert is_csharp("mono /tmp/dsm-dotnet/MemoryHandler.exe", None)
    assert is_csharp("dotnet bin/Release/net8.0/Verify.dll", None)
    assert is_csharp("/opt/app/Host.exe --serial", None)
    assert not is_csharp("node handlers/node/memory.js", None)


def _line(request_id: int, op: str, **fields: object) -> bytes:
    return json.dumps(
        {"id": request_id, "op": op, "now": "2026-03-02T09:00:00.000000Z", **fields}
    ).encode()


def test_the_nunit_test_asserts_the_reference_answers_as_protocol_json() -> None:
    ctx = {
        "tenant_id": "t1", "source_app_id": "app-1", "scope_id": 4, "scope_code": "Element",
        "entity_id": "flow-1", "entity_execution_id": "\u5b9f\u884c", "item_entity_key": "",
        "item_key": 'INV-"1"', "lock_duration_us": 1800000000, "retention_us": None,
        "lock_token": None,
    }  # fmt: skip
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=ctx),
        _line(3, "set", context={**ctx, "lock_token": 7}, status="processed", data_json="{}"),
        _line(4, "get", context=ctx),
        _line(5, "close"),
    ]
    test = nunit_test("stale_write_rejected", 3, lines, "a message")
    assert "public class DsmStaleWriteRejectedSeed3" in test
    assert 'Assert.AreEqual("1", steps.TryAcquireLock(Ctx("t1"' in test
    assert '"\\u5b9f\\u884c"' in test and '"INV-\\"1\\""' in test
    assert 'Assert.AreEqual("{\\"error\\":\\"stale_lock\\"}", steps.Set(' in test
    assert '\\"status\\":\\"processing\\",\\"attempt\\":1' in test
    assert test.count("steps.At(") == 3


def test_the_story_is_split_at_its_breaking_step() -> None:
    story = (
        "  1. [09:00] worker 1: acquire -> token 1\n  2. [09:31] worker 2: set -> ok\n  => bad\n"
    )
    before, breaking, after = breaking_step(story)
    assert breaking.strip().startswith("2.")
    assert before.strip().startswith("1.") and after.strip() == "=> bad"
    assert breaking_step("no steps") == ("no steps", "", "")
