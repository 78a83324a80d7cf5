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

from reference_engine.handlers.memory import in_memory_handler

__all__ = ["expected_answers", "is_csharp", "nunit_test"]

_WORDS = re.compile(r"[A-Za-z0-9]+")


def is_csharp(command: str, language: str | None) -> bool:
    """Whether the handler is written in C#: the host said so, or the command runs .NET."""
    if language is not None:
        return language.lower() in ("csharp", "c#", "cs")
    words = command.lower().replace('"', " ").replace("'", " ").split()
    return any(
        w in ("mono", "dotnet") or w.endswith((".exe", ".dll", "/mono", "/dotnet")) for w in words
    )


def expected_answers(lines: Sequence[bytes]) -> dict[int, Any]:
    """What the reference in-memory handler answers to each request line, by request id."""
    from dsm_sim.protocol import versions
    from dsm_sim.protocol.server import Server

    answers: dict[int, Any] = {}

    def send(line: bytes) -> None:
        message = json.loads(line)
        answers[message["id"]] = message

    async def run() -> None:
        server = Server(in_memory_handler, send)
        for line in lines:
            message = json.loads(line)
            if isinstance(message, dict) and message.get("op") == "open":
                line = json.dumps(versions.with_offer(message)).encode()
            server.receive(line)
            while server.tasks:
                await asyncio.gather(*list(server.tasks))

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


def _context(ctx: dict[str, Any]) -> str:
    return (
        f"Ctx({_cs(ctx['tenant_id'])}, {_cs(ctx['source_app_id'])}, {ctx['scope_id']}, "
        f"{_cs(ctx['scope_code'])}, {_cs(ctx['entity_id'])}, {_cs(ctx['entity_execution_id'])}, "
        f"{_cs(ctx['item_entity_key'])}, {_cs(ctx['item_key'])}, {_long(ctx['lock_duration_us'])}, "
        f"{_long(ctx['retention_us'])}, {_long(ctx['lock_token'])})"
    )


def _call(request: dict[str, Any]) -> str | None:
    op = request["op"]
    ctx: dict[str, Any] = request.get("context") or {}
    if op == "exists":
        return f"steps.Exists({_context(ctx)})"
    if op == "get":
        return f"steps.Get({_context(ctx)})"
    if op == "try_acquire_lock":
        return f"steps.TryAcquireLock({_context(ctx)})"
    if op == "set":
        return f"steps.Set({_context(ctx)}, {_cs(request['status'])}, {_cs(request['data_json'])})"
    if op == "release_lock_as_failed":
        return f"steps.ReleaseLockAsFailed({_context(ctx)}, {_cs(request['error_detail'])})"
    if op == "upsert":
        return f"steps.Upsert({_context(ctx)}, {_cs(request['data_json'])})"
    if op == "reset_expired_locks":
        return "steps.ResetExpiredLocks()"
    if op == "expire_past_retention":
        return "steps.ExpirePastRetention()"
    return None


def _expected(answer: dict[str, Any] | None) -> str | None:
    """The answer as ``ProtocolSteps`` gives it: the result's JSON, or the error's kind."""
    if answer is None:
        return None
    if "error" in answer:
        return json.dumps({"error": answer["error"]["kind"]}, separators=(",", ":"))
    return json.dumps(answer["result"], separators=(",", ":"), ensure_ascii=True)


def _describe(request: dict[str, Any]) -> str:
    ctx = request.get("context") or {}
    item = f" {ctx['item_key']!r}" if ctx else ""
    token = f" token {ctx['lock_token']}" if ctx.get("lock_token") is not None else ""
    return f"request {request['id']}: {request['op']}{item}{token} at {request['now']}"


def nunit_test(property_name: str, seed: int, lines: Sequence[bytes], message: str = "") -> str:
    """An NUnit test (C# 7.2) that replays ``lines`` through the contract and fails where they part."""
    requests = [json.loads(line) for line in lines]
    answers = expected_answers(lines)
    name = "".join(w.capitalize() for w in _WORDS.findall(property_name)) or "Counterexample"
    body: list[str] = []
    for request in requests:
        call = _call(request)
        if call is None:
            continue
        want = _expected(answers.get(request["id"]))
        body.append(f"                steps.At({_cs(request['now'])});")
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
