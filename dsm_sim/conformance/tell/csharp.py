"""A counterexample as a C# NUnit test: the steps a C# team pastes into its own test project.

``dsm verify --exec`` keeps the request lines the handler process received
while the shrunk counterexample ran (the replay file).  For a handler written
in C# (the host says ``"language": "csharp"`` on ``open``, or the command runs
``mono``, ``dotnet`` or an ``.exe``), :func:`nunit_test` turns those lines into
an NUnit test: each request becomes a call through the contract
(``Dsm.DataStateMachine.Testing.ProtocolSteps``) at its instant of a
``ManualClock``, asserting the answer the reference handler gives to the same
line, records compared as the protocol's JSON.  The first assertion that
fails is the breaking step.

The test is the program's own steps.  The reads the kit makes after each
step to compare the store with its model (``get`` as the observer, execution
``run-0``) are left out, but for the one that showed the failure: given the
handler's answers, the first read whose answer is not the reference's;
without them, the reads after the last step, where the run stopped.

A counterexample found under ``--tokens ordered`` carries the handler's own
tokens: the test keeps each grant's token in a variable and asserts its
order, not its value (:mod:`dsm_sim.conformance.tell.csharp_tokens`).

The test sends the lines one after the other: a violation that needs two
requests to overlap (a race) may pass there, as a sequential ``dsm replay``
may.  Requests sent to peer processes are not in the file.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

from dsm_sim.conformance.generate.draws import OBSERVER
from dsm_sim.conformance.tell.csharp_tokens import Grant, OrderedGrants
from dsm_sim.model import execution_id
from reference_engine.errors import ConfigurationError
from reference_engine.handlers.memory import in_memory_handler

__all__ = ["expected_answers", "failing_read_backs", "is_csharp", "is_read_back", "nunit_test"]

_WORDS = re.compile(r"[A-Za-z0-9]+")


def is_csharp(command: str, language: str | None) -> bool:
    """Whether the handler is written in C#: the host said so, or the command runs .NET."""
    if language is not None:
        return language.lower() in ("csharp", "c#", "cs")
    words = command.lower().replace('"', " ").replace("'", " ").split()
    return any(
        w in ("mono", "dotnet") or w.endswith((".exe", ".dll", "/mono", "/dotnet")) for w in words
    )


def expected_answers(lines: Sequence[bytes], grants: OrderedGrants | None = None) -> dict[int, Any]:
    """What the reference in-memory handler answers to each request line, by request id.

    With ``grants`` (``--tokens ordered``) each line goes with the reference's
    own token in place of the handler's, and each grant is paired as it comes.
    The ``open`` goes with today's offer of protocol versions, as the harness sends it.
    """
    from dsm_sim.protocol import versions
    from dsm_sim.protocol.server import Server

    answers: dict[int, Any] = {}

    def send(line: bytes) -> None:
        message = json.loads(line)
        answers[message["id"]] = message

    async def settled(server: Server) -> None:
        while server.tasks:
            await asyncio.gather(*list(server.tasks))

    async def run() -> None:
        server = Server(in_memory_handler, send)
        for line in lines:
            request = json.loads(line)
            if isinstance(request, dict) and request.get("op") == "open":
                request = versions.with_offer(request)
                line = json.dumps(request).encode() + b"\n"
            if grants is None:
                server.receive(line)
                await settled(server)
                continue
            server.receive(json.dumps(grants.for_reference(request)).encode() + b"\n")
            await settled(server)
            grants.answered(request, answers.get(request.get("id")))

    asyncio.run(run())
    return answers


def _cs(text: str | None) -> str:
    """A C# string literal for ``text`` (``null`` for None), every non-ASCII unit escaped."""
    if text is None:
        return "null"
    out = []
    for unit in text:
        code = ord(unit)
        if unit in '"\\':
            out.append("\\" + unit)
        elif 0x20 <= code < 0x7F:
            out.append(unit)
        elif code > 0xFFFF:
            high, low = divmod(code - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}")
        else:
            out.append(f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def _long(value: int | None) -> str:
    return "null" if value is None else f"{value}L"


def _context(ctx: dict[str, Any], token: str | None = None) -> str:
    """``Ctx(...)`` for ``ctx``; ``token`` is a C# expression for its token, if not the literal."""
    return (
        f"Ctx({_cs(ctx['tenant_id'])}, {_cs(ctx['source_app_id'])}, {ctx['scope_id']}, "
        f"{_cs(ctx['scope_code'])}, {_cs(ctx['entity_id'])}, {_cs(ctx['entity_execution_id'])}, "
        f"{_cs(ctx['item_entity_key'])}, {_cs(ctx['item_key'])}, {_long(ctx['lock_duration_us'])}, "
        f"{_long(ctx['retention_us'])}, {token or _long(ctx['lock_token'])})"
    )


def _call(request: dict[str, Any], grants: OrderedGrants | None = None) -> str | None:
    op = request["op"]
    ctx: dict[str, Any] = request.get("context") or {}
    if ctx:
        ctx_text = _context(ctx, None if grants is None else grants.token_expression(request))
        return _item_call(request, op, ctx_text)
    if op == "reset_expired_locks":
        return "steps.ResetExpiredLocks()"
    if op == "expire_past_retention":
        return "steps.ExpirePastRetention()"
    return None


def _item_call(request: dict[str, Any], op: str, ctx: str) -> str | None:
    if op == "exists":
        return f"steps.Exists({ctx})"
    if op == "get":
        return f"steps.Get({ctx})"
    if op == "try_acquire_lock":
        return f"steps.TryAcquireLock({ctx})"
    if op == "set":
        return f"steps.Set({ctx}, {_cs(request['status'])}, {_cs(request['data_json'])})"
    if op == "release_lock_as_failed":
        return f"steps.ReleaseLockAsFailed({ctx}, {_cs(request['error_detail'])})"
    if op == "upsert":
        return f"steps.Upsert({ctx}, {_cs(request['data_json'])})"
    return None


def _expected(answer: dict[str, Any] | None) -> str | None:
    """The answer as ``ProtocolSteps`` gives it: the result's JSON, or the error's kind."""
    if answer is None:
        return None
    if "error" in answer:
        return json.dumps({"error": answer["error"]["kind"]}, separators=(",", ":"))
    return json.dumps(answer["result"], separators=(",", ":"), ensure_ascii=True)


def _observed(answer: dict[str, Any] | None, ordered: bool = False) -> object:
    """What an answer says, key order aside: the result, or the error's kind.

    ``ordered``: a grant's token says only that it is a grant (its order is
    the test's to assert; its value is the store's own).
    """
    if answer is None:
        return None
    if "error" in answer:
        error = answer["error"]
        return ("error", error.get("kind") if isinstance(error, dict) else error)
    result = answer.get("result")
    if ordered and isinstance(result, int) and not isinstance(result, bool):
        return ("grant",)
    return ("result", result)


def is_read_back(request: dict[str, Any]) -> bool:
    """A ``get`` the kit made to compare the store with its model, not a step of the program."""
    ctx = request.get("context") or {}
    return request.get("op") == "get" and ctx.get("entity_execution_id") == execution_id(OBSERVER)


def failing_read_backs(
    requests: Sequence[dict[str, Any]],
    expected: dict[int, Any],
    answers: dict[int, dict[str, Any]] | None,
    *,
    ordered: bool = False,
) -> set[int]:
    """The ids of the kit's reads the printed test keeps: those that show the failure.

    With the handler's ``answers``, the first call whose answer is not the
    reference's is the breaking step; it is kept if it is a read (a step of the
    program is kept anyway).  Without them, the reads after the program's last
    step: the run stops at its first finding, so one of them showed it, unless
    the step's own answer did.
    """
    calls = [r for r in requests if _call(r) is not None]
    if answers is not None:
        for request in calls:
            got = answers.get(request["id"])
            want = expected.get(request["id"])
            grant = ordered and request["op"] == "try_acquire_lock"
            if got is not None and _observed(got, grant) != _observed(want, grant):
                return {request["id"]} if is_read_back(request) else set()
        return set()
    kept: dict[str, int] = {}
    for request in reversed(calls):
        if not is_read_back(request):
            break
        kept[json.dumps(request.get("context"), sort_keys=True)] = request["id"]
    return set(kept.values())


def _describe(request: dict[str, Any]) -> str:
    ctx = request.get("context") or {}
    item = f" {ctx['item_key']!r}" if ctx else ""
    token = f" token {ctx['lock_token']}" if ctx.get("lock_token") is not None else ""
    return f"request {request['id']}: {request['op']}{item}{token} at {request['now']}"


def _ordered_grant(grant: Grant, call: str, described: str) -> list[str]:
    """A grant under ordered tokens: its token kept, asserted a number above the item's last."""
    pad = " " * 16
    lines = [
        f"{pad}var {grant.variable} = {call};",
        f'{pad}StringAssert.IsMatch("^[0-9]+$", {grant.variable}, {_cs(described + ": a grant")});',
    ]
    if grant.previous is not None:
        above = described + f": a token above the item's earlier ones ({grant.previous})"
        lines.append(
            f"{pad}Assert.Greater(long.Parse({grant.variable}), long.Parse({grant.previous}), "
            f"{_cs(above)});"
        )
    return lines


def nunit_test(
    property_name: str,
    seed: int,
    lines: Sequence[bytes],
    message: str = "",
    answers: dict[int, dict[str, Any]] | None = None,
    tokens: str = "attempts",
) -> str:
    """An NUnit test (C# 7.2) that replays ``lines`` through the contract and fails where they part.

    ``answers`` are the handler's own answers by request id, when known: they
    say which of the kit's reads showed the failure (:func:`failing_read_backs`).
    ``tokens`` is the rule the counterexample was found under; ``ordered``
    needs ``answers``, which hold the handler's tokens.
    """
    grants: OrderedGrants | None = None
    if tokens != "attempts":
        if answers is None:
            raise ConfigurationError(
                "a counterexample found under --tokens ordered is printed as an NUnit test "
                "from the handler's own answers (its tokens), and none were kept"
            )
        grants = OrderedGrants(answers)
    requests = [json.loads(line) for line in lines]
    expected = expected_answers(lines, grants)
    kept = failing_read_backs(requests, expected, answers, ordered=grants is not None)
    name = "".join(w.capitalize() for w in _WORDS.findall(property_name)) or "Counterexample"
    body: list[str] = []
    for request in requests:
        call = _call(request, grants)
        if call is None or (is_read_back(request) and request["id"] not in kept):
            continue
        want = _expected(expected.get(request["id"]))
        body.append(f"                steps.At({_cs(request['now'])});")
        grant = None if grants is None else grants.grants.get(request["id"])
        if grant is not None:
            body += _ordered_grant(grant, call, _describe(request))
            continue
        if want is None:
            body.append(f"                {call};")
            continue
        body.append(
            f"                Assert.AreEqual({_cs(want)}, {call}, {_cs(_describe(request))});"
        )
    said = " ".join(message.split())[:300]
    return "\n".join(
        [
            f"// dsm verify: {property_name} (seed {seed}) as an NUnit test.",
            f"// {said}" if said else "//",
            "// Paste into your test project (references: nunit.framework, Dsm.DataStateMachine),",
            "// build your handler in CreateHandler, and run it: the first assertion that fails is",
            "// the breaking step. Each answer is compared as the protocol's JSON (a record as `get`",
            "// answers it, an error as its kind) with what the reference handler answers.",
            "// These are the program's own steps; of the reads the verifier made after each step",
            "// to compare the store with its model, only the one that showed the failure is kept.",
            "// The calls run one after the other: a race may need the kit to show it again.",
            "using Dsm.DataStateMachine;",
            "using Dsm.DataStateMachine.Testing;",
            "using NUnit.Framework;",
            "",
            "[TestFixture]",
            f"public class Dsm{name}Seed{seed}",
            "{",
            "    private static object CreateHandler(IClock clock)",
            "    {",
            "        return new YourHandler(clock); // <- your handler, built on this clock",
            "    }",
            "",
            "    private static StateHandlerContext Ctx(string tenantId, string sourceAppId, "
            "int scopeId, string scopeCode, string entityId, string executionId, "
            "string itemEntityKey, string itemKey, long lockUs, long? retentionUs, long? token)",
            "    {",
            "        return ProtocolSteps.Context(tenantId, sourceAppId, scopeId, scopeCode, "
            "entityId, executionId, itemEntityKey, itemKey, lockUs, retentionUs, token);",
            "    }",
            "",
            "    [Test]",
            f"    public void {name}()",
            "    {",
            "        var clock = new ManualClock(new System.DateTime(2000, 1, 1, 0, 0, 0, "
            "System.DateTimeKind.Utc));",
            "        var steps = new ProtocolSteps(CreateHandler(clock), clock);",
            "        steps.Open();",
            "        try",
            "        {",
            "            {",
            *body,
            "            }",
            "        }",
            "        finally",
            "        {",
            "            steps.Close();",
            "        }",
            "    }",
            "}",
            "",
        ]
    )
