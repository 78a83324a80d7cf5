"""A C# handler's counterexample: recognised as C#, printed as an NUnit test, its page opening
at the breaking step."""

from __future__ import annotations

import json

import pytest

from dsm_sim.conformance.tell.csharp import is_csharp, nunit_test
from dsm_sim.conformance.tell.outputs import breaking_step
from dsm_sim.conformance.tell.read_backs import is_read_back
from dsm_sim.conformance.tell.steps import Finding, expected_answers
from reference_engine.errors import ConfigurationError


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
    test = nunit_test(Finding("stale_write_rejected", 3, lines, "a message"))
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


_CTX = {
    "tenant_id": "t1", "source_app_id": "app-1", "scope_id": 4, "scope_code": "Element",
    "entity_id": "flow-1", "entity_execution_id": "run-1", "item_entity_key": "",
    "item_key": "INV-1", "lock_duration_us": 1800000000, "retention_us": None,
    "lock_token": None,
}  # fmt: skip
#: The kit's read of INV-1 and of INV-2, made as the observer (execution run-0).
_READ_1 = {**_CTX, "entity_execution_id": "run-0"}
_READ_2 = {**_READ_1, "item_key": "INV-2"}


def _program_with_reads() -> list[bytes]:
    """Two steps of worker 1, each followed by the kit's reads of both items, and a read of its own."""
    return [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=_CTX),
        _line(3, "get", context=_READ_1),
        _line(4, "get", context=_READ_2),
        _line(5, "set", context={**_CTX, "lock_token": 1}, status="processed", data_json="{}"),
        _line(6, "get", context=_READ_1),
        _line(7, "get", context=_READ_2),
        _line(8, "get", context=_CTX),
        _line(9, "close"),
    ]


def _asserted(test: str) -> list[str]:
    return [line.strip() for line in test.splitlines() if "Assert.AreEqual" in line]


def test_the_kits_reads_are_left_out_but_the_one_that_showed_the_failure() -> None:
    lines = _program_with_reads()
    answers = expected_answers(lines)
    # The handler answers every call as the reference does, but shows INV-1 still Processing
    # after the set: the kit's read of INV-1 at request 6 is the failing observation.
    handler = {**answers, 6: {**answers[3]}}
    assert handler[6] != answers[6]
    test = nunit_test(Finding("completion_releases_lock", 0, lines, answers=handler))
    calls = _asserted(test)
    assert len(calls) == 4, calls  # acquire, set, the failing read, the program's own get
    assert "steps.TryAcquireLock(" in calls[0] and "steps.Set(" in calls[1]
    assert '"run-0"' in calls[2] and '"INV-1"' in calls[2] and "request 6:" in calls[2]
    assert '"run-1"' in calls[3] and "steps.Get(" in calls[3]
    assert '"INV-2"' not in test


def test_a_failing_step_of_the_program_keeps_none_of_the_kits_reads() -> None:
    lines = _program_with_reads()
    answers = expected_answers(lines)
    handler = {**answers, 5: {"id": 5, "error": {"kind": "stale_lock", "message": "no"}}}
    test = nunit_test(Finding("errors_agree_with_model", 0, lines, answers=handler))
    assert '"run-0"' not in test
    assert len(_asserted(test)) == 3


def test_without_the_handlers_answers_the_reads_after_the_last_step_are_kept() -> None:
    assert is_read_back(json.loads(_line(0, "get", context=_READ_2)))
    assert not is_read_back(json.loads(_line(0, "get", context=_CTX)))
    lines = _program_with_reads()
    lines.insert(-1, _line(10, "get", context=_READ_1))  # after the program's last step (8)
    lines.insert(-1, _line(11, "get", context=_READ_2))
    test = nunit_test(Finding("record_agrees_with_model", 0, lines))
    kept = [line for line in _asserted(test) if '"run-0"' in line]
    assert len(kept) == 2 and "request 10:" in kept[0] and "request 11:" in kept[1], kept


def test_under_ordered_tokens_the_test_keeps_the_handlers_tokens_and_asserts_their_order() -> None:
    """A store sequence shared by two items: INV-1 gets 500 and 502, INV-2 gets 501."""
    other = {**_CTX, "item_key": "INV-2"}
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=_CTX),
        _line(3, "try_acquire_lock", context=other),
        _line(4, "release_lock_as_failed", context={**_CTX, "lock_token": 500}, error_detail="x"),
        _line(5, "try_acquire_lock", context=_CTX),
        _line(6, "set", context={**_CTX, "lock_token": 500}, status="processed", data_json="{}"),
        _line(7, "close"),
    ]
    handler = {
        2: {"id": 2, "result": 500},
        3: {"id": 3, "result": 501},
        4: {"id": 4, "result": None},
        5: {"id": 5, "result": 502},
        6: {"id": 6, "result": None},  # the stale holder's write landed: the failure
    }
    test = nunit_test(Finding("stale_write_rejected", 0, lines, answers=handler, tokens="ordered"))
    assert "var token2 = steps.TryAcquireLock(" in test
    assert "var token5 = steps.TryAcquireLock(" in test
    assert "Assert.Greater(long.Parse(token5), long.Parse(token2)" in test
    assert "long.Parse(token3)" not in test.split("var token3", 1)[1]  # INV-2's first grant
    release, stale = (line for line in test.splitlines() if "long.Parse(token2))" in line)
    assert 'Assert.AreEqual("null", steps.ReleaseLockAsFailed(' in release
    assert '"{\\"error\\":\\"stale_lock\\"}", steps.Set(' in stale
    # Judged as attempt numbers, the reference refuses the holder's own release.
    by_value = nunit_test(Finding("stale_write_rejected", 0, lines, answers=handler))
    assert '"{\\"error\\":\\"stale_lock\\"}", steps.ReleaseLockAsFailed(' in by_value


def test_ordered_tokens_without_the_handlers_answers_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="--tokens ordered"):
        nunit_test(Finding("stale_write_rejected", 0, _program_with_reads(), tokens="ordered"))
