"""A counterexample as a ``node:test`` file: the steps a Node team runs with ``node --test``.

For a handler written for Node (the host says ``"language": "node"`` on
``open``, or the command runs ``node``), :func:`node_test` spells the
counterexample's steps (:mod:`~dsm_sim.conformance.tell.steps`) as a test of
Node's own runner (Node 18 and later, no package): each request becomes a
call through the contract (``handlers/node/steps.js``, ``ProtocolSteps``) at
its instant of a ``ManualClock``, asserting with ``assert.deepStrictEqual``
the answer the reference handler gives to the same line.  The first
assertion that fails is the breaking step.

Requests that were on the wire at once in the run (a race) are started
together again, each at its instant, and their answers checked after: a
handler whose acquire awaits between its read and its write shows the race
there as it did under the kit.  A handler of the seed's interface is wrapped
as the host wraps it (``{ shape: "seed" }``).  The tokens are the run's
values: a finding made under ``--tokens ordered`` says in its header that
the test assumes attempt tokens (``literal_tokens_comment``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsm_sim.conformance.tell.steps import (
    READ_BACKS_NOTE,
    Finding,
    ProtocolStep,
    comment,
    literal_tokens_comment,
    protocol_steps,
    summary,
    together,
)

__all__ = ["NODE_STEPS_PACKAGE", "is_node", "node_steps_module", "node_test"]

#: How a team's project reaches ``steps.js`` when it installs ``handlers/node`` as a package.
NODE_STEPS_PACKAGE = "dsm-node-handlers/steps.js"
_LANGUAGES = ("node", "javascript", "js", "typescript", "ts")


def is_node(command: str, language: str | None) -> bool:
    """Whether the handler is written for Node: the host said so, or the command runs ``node``."""
    if language is not None:
        return language.lower() in _LANGUAGES
    words = command.lower().replace('"', " ").replace("'", " ").split()
    return any(w in ("node", "nodejs") or w.endswith(("/node", "/nodejs")) for w in words)


def node_steps_module() -> str:
    """Where the printed test requires ``steps.js`` from: this checkout's, else the package's."""
    checkout = Path(__file__).resolve().parents[3] / "handlers" / "node" / "steps.js"
    return str(checkout) if checkout.is_file() else NODE_STEPS_PACKAGE


def _js(value: Any) -> str:
    """A JavaScript literal for a JSON value (JSON is JavaScript), every non-ASCII unit escaped."""
    return json.dumps(value, ensure_ascii=True)


def _context(ctx: dict[str, Any]) -> str:
    return "ctx(" + _js(ctx) + ")"


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
            f"steps.set({_context(step.context)}, {_js(request['status'])}, "
            f"{_js(request['data_json'])})"
        )
    if op == "release_lock_as_failed":
        return (
            f"steps.releaseLockAsFailed({_context(step.context)}, {_js(request['error_detail'])})"
        )
    if op == "upsert":
        return f"steps.upsert({_context(step.context)}, {_js(request['data_json'])})"
    if op == "reset_expired_locks":
        return "steps.resetExpiredLocks()"
    return "steps.expirePastRetention()"


def _check(step: ProtocolStep, answer: str, indent: str) -> str:
    if step.expected is None:
        return f"{indent}await {answer};"
    want = step.expected.as_json()
    return f"{indent}assert.deepStrictEqual(await {answer}, {want}, {_js(step.describe())});"


def _body(steps: Sequence[ProtocolStep]) -> list[str]:
    indent = "    "
    lines: list[str] = []
    for run in together(steps):
        if len(run) == 1:
            (step,) = run
            lines.append(f"{indent}steps.at({_js(step.now)});")
            lines.append(_check(step, _call(step), indent))
            continue
        ids = ", ".join(str(step.request["id"]) for step in run)
        lines.append(f"{indent}{{")
        lines.append(f"{indent}  // requests {ids} were on the wire at once: started together")
        for number, step in enumerate(run):
            lines.append(f"{indent}  steps.at({_js(step.now)});")
            lines.append(f"{indent}  const answer{number} = {_call(step)};")
        for number, step in enumerate(run):
            lines.append(_check(step, f"answer{number}", indent + "  "))
        lines.append(f"{indent}}}")
    return lines


def node_test(finding: Finding, *, steps_module: str | None = None) -> str:
    """A ``node:test`` file that replays the finding through the contract and fails where they part.

    ``steps_module`` is where the file requires ``steps.js`` from (default
    :func:`node_steps_module`).
    """
    property_name, seed = finding.property_name, finding.seed
    said = summary(finding.message)
    module = steps_module or node_steps_module()
    options = ', { shape: "seed" }' if finding.shape == "seed" else ""
    return "\n".join(
        [
            f"// dsm verify: {property_name} (seed {seed}) as a node:test test.",
            f"// {said}" if said else "//",
            "// Save it beside your tests, make createHandler build your handler on the clock it",
            "// is given, and run `node --test THIS_FILE`: the first assertion that fails is the",
            "// breaking step. Each answer is compared with what the reference handler answers:",
            "// a record as `get` answers it, a token or a count, null, or { error: KIND }.",
            "// Requests that raced in the run are started together again.",
            *comment(READ_BACKS_NOTE),
            *literal_tokens_comment(finding),
            '"use strict";',
            "",
            'const test = require("node:test");',
            'const assert = require("node:assert/strict");',
            f"const {{ ManualClock, ProtocolSteps }} = require({_js(module)});",
            "",
            "function createHandler(clock) {",
            "  return new YourHandler(clock); // <- your handler, built on this clock",
            "}",
            "",
            "const ctx = (fields) => Object.freeze(fields);",
            "",
            f"test({_js(f'{property_name} (seed {seed})')}, async () => {{",
            '  const clock = new ManualClock("2000-01-01T00:00:00.000000Z");',
            f"  const steps = new ProtocolSteps(createHandler(clock), clock{options});",
            "  await steps.open();",
            "  try {",
            *_body(protocol_steps(finding)),
            "  } finally {",
            "    await steps.close();",
            "  }",
            "});",
            "",
        ]
    )
