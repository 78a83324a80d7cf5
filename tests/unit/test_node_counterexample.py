"""A counterexample's protocol steps, and their printing as a ``node:test`` file.

The steps layer is shared by every language's printer: what each request
calls, what the reference answers (the seed profile's reference for a
handler of the seed's interface), and which requests were on the wire at
once.  ``tests/integration/test_node_seed_handler.py`` runs a printed file
under ``node --test``.
"""

from __future__ import annotations

import json

import pytest

from dsm_sim.conformance.tell.languages import PRINTERS, printer_for
from dsm_sim.conformance.tell.node import is_node, node_test
from dsm_sim.conformance.tell.steps import Finding, expected_answers, protocol_steps, together

pytestmark = pytest.mark.unit

CTX = {
    "tenant_id": "t1", "source_app_id": "app-1", "scope_id": 4, "scope_code": "Element",
    "entity_id": "flow-1", "entity_execution_id": "run-1", "item_entity_key": "",
    "item_key": "INV-\u5b9f", "lock_duration_us": 1_800_000_000, "retention_us": None,
    "lock_token": None,
}  # fmt: skip


def _line(request_id: int, op: str, now: str = "09:00:00", **fields: object) -> bytes:
    at = f"2026-03-02T{now}.000000Z"
    return json.dumps({"id": request_id, "op": op, "now": at, **fields}).encode() + b"\n"


def _stale_write() -> list[bytes]:
    """Worker 1 acquires, its lock is taken over after expiry, then it completes late."""
    return [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "try_acquire_lock", "09:31:00", context={**CTX, "entity_execution_id": "run-2"}),
        _line(4, "set", "09:32:00", context={**CTX, "lock_token": 1}, status="processed",
              data_json='{"n":1}'),
        _line(5, "close", "09:32:00"),
    ]  # fmt: skip


def test_a_node_handler_is_known_by_what_its_host_says_or_by_its_command() -> None:
    assert is_node("anything", "node") and is_node("anything", "javascript")
    assert not is_node("node host.js", "csharp")
    assert is_node("node handlers/node/seed-memory.js", None)
    assert is_node("/usr/bin/node --enable-source-maps h.js", None)
    assert not is_node("mono Host.exe", None)
    printer = printer_for("node h.js", "node")
    assert printer is not None and printer.suffix == ".test.js"
    csharp = printer_for("mono Host.exe", None)
    assert csharp is not None and csharp.suffix == ".cs"
    assert printer_for("python -m dsm_sim.protocol.server", "python") is None


def test_the_steps_expect_the_spec_of_a_contract_and_the_seed_profile_of_a_seed_handler() -> None:
    contract = protocol_steps(Finding("x", 0, _stale_write()))
    assert [s.op for s in contract] == ["try_acquire_lock", "try_acquire_lock", "set"]
    assert [s.expected.as_json() for s in contract if s.expected] == [
        "1",
        "2",
        '{"error":"stale_lock"}',
    ]
    # The seed's interface cannot refuse the late write: its reference lets it land.
    seed = protocol_steps(Finding("x", 0, _stale_write(), shape="seed"))
    assert seed[2].expected is not None and seed[2].expected.as_json() == "null"


def test_requests_on_the_wire_at_once_are_grouped_and_a_peers_requests_left_out() -> None:
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "try_acquire_lock", context={**CTX, "entity_execution_id": "run-2"}),
        _line(4, "get", context=CTX),
    ]
    in_flight = [(), (), (1,), ()]
    runs = together(protocol_steps(Finding("x", 0, lines, in_flight=in_flight)))
    assert [[s.request["id"] for s in run] for run in runs] == [[2, 3], [4]]
    # Tagged lines (a race through peers): only the first process's requests are steps.
    tagged = [
        json.dumps({"process": p, "in_flight": f, "request": json.loads(line)}).encode() + b"\n"
        for p, f, line in [(1, [], lines[0]), (1, [], lines[1]), (2, [2], lines[2])]
    ]
    assert [s.request["id"] for s in protocol_steps(Finding("x", 0, tagged))] == [2]


def test_the_node_test_starts_a_race_together_and_asserts_the_reference_answers() -> None:
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "try_acquire_lock", context={**CTX, "entity_execution_id": "run-2"}),
        _line(4, "set", context={**CTX, "lock_token": 7}, status="processed", data_json="{}"),
        _line(5, "close"),
    ]
    in_flight = [(), (), (1,), (), ()]
    test = node_test(Finding("at_most_one_live_lock", 3, lines, "a\nmessage", in_flight))
    assert test.startswith("// dsm verify: at_most_one_live_lock (seed 3) as a node:test test.\n")
    assert "// a message\n" in test
    assert "requests 2, 3 were on the wire at once: started together" in test
    assert test.index("const answer1 = steps.tryAcquireLock(") < test.index(
        "assert.deepStrictEqual(await answer0, 1,"
    )
    assert "assert.deepStrictEqual(await answer1, null," in test
    assert '"INV-\\u5b9f"' in test  # every non-ASCII unit escaped
    assert 'assert.deepStrictEqual(await steps.set(ctx({"tenant_id": "t1"' in test
    assert '{"error":"stale_lock"}, "request 4: set' in test
    assert "new ProtocolSteps(createHandler(clock), clock);" in test
    seed = Finding("x", 0, lines, shape="seed")
    seeded = node_test(seed, steps_module="dsm-node-handlers/steps.js")
    assert 'new ProtocolSteps(createHandler(clock), clock, { shape: "seed" });' in seeded
    assert 'require("dsm-node-handlers/steps.js")' in seeded


def _program_with_read_backs() -> tuple[list[bytes], dict[int, dict[str, object]]]:
    """Acquire and set, each followed by the kit's read of the item (run-0); and the handler's
    answers, which show the item still Processing after the set (request 5)."""
    read = {**CTX, "entity_execution_id": "run-0"}
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "get", context=read),
        _line(4, "set", context={**CTX, "lock_token": 1}, status="processed", data_json="{}"),
        _line(5, "get", context=read),
        _line(6, "close"),
    ]
    reference = expected_answers(lines)
    return lines, {**reference, 5: {**reference[3], "id": 5}}


def test_every_printer_keeps_of_the_kits_reads_only_the_one_that_showed_the_failure() -> None:
    lines, handler = _program_with_read_backs()
    steps = protocol_steps(Finding("completion_releases_lock", 0, lines, answers=handler))
    assert [s.request["id"] for s in steps] == [2, 4, 5]
    finding = Finding("completion_releases_lock", 0, lines, answers=handler)
    for printer in PRINTERS:
        test = printer.render(finding)
        assert test.count('"run-0"') + test.count('\\"run-0\\"') == 1, printer.language
        assert "request 3:" not in test and "request 5:" in test, printer.language
        assert "only the one that showed the failure is kept" in test, printer.language


def test_under_ordered_tokens_the_steps_name_each_grant_and_node_and_java_say_they_assume_attempts() -> (
    None
):
    lines = [
        _line(1, "open", protocol=1),
        _line(2, "try_acquire_lock", context=CTX),
        _line(3, "set", context={**CTX, "lock_token": 900}, status="processed", data_json="{}"),
        _line(4, "close"),
    ]
    handler = {2: {"id": 2, "result": 900}, 3: {"id": 3, "result": None}}
    finding = Finding("x", 0, lines, answers=handler, tokens="ordered")
    grant, write = protocol_steps(finding)
    assert grant.grant is not None and grant.grant.variable == "token2" and grant.token is None
    assert write.token == "token2"
    # The reference was sent its own token: the write under the grant is the holder's.
    assert write.expected is not None and write.expected.as_json() == "null"
    for printer in PRINTERS:
        said = "assumes attempt tokens" in printer.render(finding)
        assert said is (printer.language != "C#"), printer.language
        assert "assumes attempt tokens" not in printer.render(
            Finding("x", 0, lines, answers=handler)
        )
