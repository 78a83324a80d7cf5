"""A counterexample as a C# NUnit test: the steps a C# team pastes into its own test project.

For a handler written in C# (the host says ``"language": "csharp"`` on
``open``, or the command runs ``mono``, ``dotnet`` or an ``.exe``),
:func:`nunit_test` spells the counterexample's steps
(:mod:`~dsm_sim.conformance.tell.steps`) as an NUnit test: each request
becomes a call through the contract
(``Dsm.DataStateMachine.Testing.ProtocolSteps``) at its instant of a
``ManualClock``, asserting the answer the reference handler gives to the same
line, records compared as the protocol's JSON.  The first assertion that
fails is the breaking step.

The steps layer has already left out the kit's read-backs but the one that
showed the failure.  A counterexample found under ``--tokens ordered``
carries the handler's own tokens: the test keeps each grant's token in a
variable (:attr:`~dsm_sim.conformance.tell.steps.ProtocolStep.grant`),
asserts its order, not its value, and passes it to the writes made under it.

The test sends the lines one after the other: a violation that needs two
requests to overlap (a race) may pass there, as a sequential ``dsm replay``
may.  Requests sent to peer processes are not in the file.
"""

from __future__ import annotations

from dsm_sim.conformance.tell.grants import Grant
from dsm_sim.conformance.tell.steps import (
    READ_BACKS_NOTE,
    Finding,
    ProtocolStep,
    comment,
    protocol_steps,
    summary,
    test_name,
    utf16_literal,
)

__all__ = ["is_csharp", "nunit_test"]


def is_csharp(command: str, language: str | None) -> bool:
    """Whether the handler is written in C#: the host said so, or the command runs .NET."""
    if language is not None:
        return language.lower() in ("csharp", "c#", "cs")
    words = command.lower().replace('"', " ").replace("'", " ").split()
    return any(
        w in ("mono", "dotnet") or w.endswith((".exe", ".dll", "/mono", "/dotnet")) for w in words
    )


def _cs(text: str | None) -> str:
    """A C# string literal for ``text`` (``null`` for None), every non-ASCII unit escaped."""
    return utf16_literal(text)


def _long(value: int | None) -> str:
    return "null" if value is None else f"{value}L"


def _context(step: ProtocolStep) -> str:
    """``Ctx(...)`` for the step's context; its token the grant's variable, when it has one."""
    ctx = step.context
    token = _long(ctx["lock_token"]) if step.token is None else f"long.Parse({step.token})"
    return (
        f"Ctx({_cs(ctx['tenant_id'])}, {_cs(ctx['source_app_id'])}, {ctx['scope_id']}, "
        f"{_cs(ctx['scope_code'])}, {_cs(ctx['entity_id'])}, {_cs(ctx['entity_execution_id'])}, "
        f"{_cs(ctx['item_entity_key'])}, {_cs(ctx['item_key'])}, {_long(ctx['lock_duration_us'])}, "
        f"{_long(ctx['retention_us'])}, {token})"
    )


def _call(step: ProtocolStep) -> str:
    request, op = step.request, step.op
    if op == "exists":
        return f"steps.Exists({_context(step)})"
    if op == "get":
        return f"steps.Get({_context(step)})"
    if op == "try_acquire_lock":
        return f"steps.TryAcquireLock({_context(step)})"
    if op == "set":
        return f"steps.Set({_context(step)}, {_cs(request['status'])}, {_cs(request['data_json'])})"
    if op == "release_lock_as_failed":
        return f"steps.ReleaseLockAsFailed({_context(step)}, {_cs(request['error_detail'])})"
    if op == "upsert":
        return f"steps.Upsert({_context(step)}, {_cs(request['data_json'])})"
    if op == "reset_expired_locks":
        return "steps.ResetExpiredLocks()"
    return "steps.ExpirePastRetention()"


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


def _body(steps: list[ProtocolStep]) -> list[str]:
    pad = " " * 16
    body: list[str] = []
    for step in steps:
        call = _call(step)
        body.append(f"{pad}steps.At({_cs(step.now)});")
        if step.grant is not None:
            body += _ordered_grant(step.grant, call, step.describe())
        elif step.expected is None:
            body.append(f"{pad}{call};")
        else:
            want = _cs(step.expected.as_json())
            body.append(f"{pad}Assert.AreEqual({want}, {call}, {_cs(step.describe())});")
    return body


def nunit_test(finding: Finding) -> str:
    """An NUnit test (C# 7.2) that replays the finding through the contract and fails where they part.

    Under ``--tokens ordered`` it needs the handler's answers, which hold its
    tokens (:class:`~reference_engine.errors.ConfigurationError` without them).
    """
    body = _body(protocol_steps(finding))
    name = test_name(finding.property_name)
    property_name, seed = finding.property_name, finding.seed
    said = summary(finding.message)
    return "\n".join(
        [
            f"// dsm verify: {property_name} (seed {seed}) as an NUnit test.",
            f"// {said}" if said else "//",
            "// Paste into your test project (references: nunit.framework, Dsm.DataStateMachine),",
            "// build your handler in CreateHandler, and run it: the first assertion that fails is",
            "// the breaking step. Each answer is compared as the protocol's JSON (a record as `get`",
            "// answers it, an error as its kind) with what the reference handler answers.",
            *comment(READ_BACKS_NOTE),
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
