"""A counterexample as a Java class with a ``main``: the steps a Java team compiles and runs.

For a handler written in Java (the host says ``"language": "java"`` on
``open``, or the command runs ``java``), :func:`java_test` spells the
counterexample's steps (:mod:`~dsm_sim.conformance.tell.steps`) as a class
that needs the JDK alone: each request becomes a call through the contract
(``handlers/java/ProtocolSteps.java``) at its instant of a ``ManualClock``,
and ``ProtocolSteps.expect`` throws ``AssertionError`` at the first answer
that is not the reference handler's.  Compile it beside the host's sources
and run its ``main``; any test runner that runs a ``main`` (or a JUnit test
that calls it) reports the failure.

The calls run one after the other: a violation that needs two requests to
overlap (a race) may pass there, as a sequential ``dsm replay`` may.  The
tokens are the run's values: a finding made under ``--tokens ordered`` says
in its header that the test assumes attempt tokens (``literal_tokens_comment``).
"""

from __future__ import annotations

import json
from typing import Any

from dsm_sim.conformance.tell.steps import (
    READ_BACKS_NOTE,
    Finding,
    ProtocolStep,
    comment,
    literal_tokens_comment,
    protocol_steps,
    summary,
    test_name,
    utf16_literal,
)

__all__ = ["is_java", "java_test"]


def is_java(command: str, language: str | None) -> bool:
    """Whether the handler is written in Java: the host said so, or the command runs ``java``."""
    if language is not None:
        return language.lower() in ("java", "kotlin", "jvm")
    words = command.lower().replace('"', " ").replace("'", " ").split()
    return any(w == "java" or w.endswith(("/java", ".jar")) for w in words)


def _java(text: str | None) -> str:
    """A Java string literal for ``text`` (``null`` for None), every non-ASCII unit escaped."""
    return utf16_literal(text)


def _context(ctx: dict[str, Any]) -> str:
    return f"ProtocolSteps.context({_java(json.dumps(ctx, separators=(',', ':')))})"


def _call(step: ProtocolStep) -> str:
    request, op = step.request, step.op
    if op == "exists":
        return f"steps.exists({_context(step.context)})"
    if op == "get":
        return f"steps.get({_context(step.context)})"
    if op == "try_acquire_lock":
        return f"steps.tryAcquireLock({_context(step.context)})"
    if op == "set":
        return (
            f"steps.set({_context(step.context)}, {_java(request['status'])}, "
            f"{_java(request['data_json'])})"
        )
    if op == "release_lock_as_failed":
        return (
            f"steps.releaseLockAsFailed({_context(step.context)}, {_java(request['error_detail'])})"
        )
    if op == "upsert":
        return f"steps.upsert({_context(step.context)}, {_java(request['data_json'])})"
    if op == "reset_expired_locks":
        return "steps.resetExpiredLocks()"
    return "steps.expirePastRetention()"


def java_test(finding: Finding) -> str:
    """A Java class whose ``main`` replays the finding through the contract and throws where they part."""
    name = f"Dsm{test_name(finding.property_name)}Seed{finding.seed}"
    property_name, seed, shape = finding.property_name, finding.seed, finding.shape
    said = summary(finding.message)
    body: list[str] = []
    for step in protocol_steps(finding):
        body.append(f"        steps.at({_java(step.now)});")
        if step.expected is None:
            body.append(f"        {_call(step)};")
            continue
        want = _java(step.expected.as_json())
        body.append(
            f"        ProtocolSteps.expect({want}, {_call(step)}, {_java(step.describe())});"
        )
    handler = "SeedHandler" if shape == "seed" else "Object"
    return "\n".join(
        [
            f"// dsm verify: {property_name} (seed {seed}) as a Java test.",
            f"// {said}" if said else "//",
            "// Compile it with your handler and the host's sources (handlers/java/*.java), make",
            "// createHandler build your handler on the clock it is given, and run its main: the",
            "// first step whose answer is not the reference handler's throws AssertionError.",
            "// Answers are compared as the protocol's values (a record as `get` answers it, a",
            '// token, a count, null, or {"error": KIND}). The calls run one after the other: a',
            "// race may need the kit to show it again.",
            *comment(READ_BACKS_NOTE),
            *literal_tokens_comment(finding),
            f"final class {name} {{",
            f"    static {handler} createHandler(SeedHost.Clock clock) {{",
            "        return new YourHandler(clock); // <- your handler, built on this clock",
            "    }",
            "",
            "    public static void main(String[] args) {",
            '        ProtocolSteps.ManualClock clock = new ProtocolSteps.ManualClock("2000-01-01T00:00:00.000000Z");',
            "        ProtocolSteps steps = new ProtocolSteps(createHandler(clock), clock);",
            *body,
            f'        System.out.println("{name}: every step answered as the reference handler");',
            "    }",
            "}",
            "",
        ]
    )
