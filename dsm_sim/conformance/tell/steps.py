"""A counterexample's protocol requests as steps a test in the handler's language makes.

``dsm verify --exec`` keeps the request lines the handler process received
while the shrunk counterexample ran (the replay file), and beside each the
earlier requests still unanswered when it was sent.  :func:`protocol_steps`
turns them into :class:`ProtocolStep` values: the call the request makes
through the contract, the instant it is made at, the answer the reference
handler gives to the same line (a result, or an error's kind), and the
requests it overlapped.  :func:`together` groups the steps that were on the
wire at once, so a printed test can start them together again.

The printers (one module per language: :mod:`~dsm_sim.conformance.tell.csharp`,
:mod:`~dsm_sim.conformance.tell.node`, :mod:`~dsm_sim.conformance.tell.java`)
only spell these steps; which printer a
handler gets is :mod:`~dsm_sim.conformance.tell.languages`.  Requests sent to
peer processes are left out: a test in one process cannot make them.

Everything a printer needs comes in one :class:`Finding`.  The layer also
does, once for every language, what the steps of a finding are: the kit's
read-backs are left out but for the one that showed the failure
(:mod:`~dsm_sim.conformance.tell.read_backs`), and under ``--tokens
ordered`` the reference is sent its own tokens and each grant is named
(:mod:`~dsm_sim.conformance.tell.grants`, :attr:`ProtocolStep.grant`,
:attr:`ProtocolStep.token`), for a printer that keeps a grant's token in a
variable.
"""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dsm_sim.conformance.tell.grants import Grant, OrderedGrants
from dsm_sim.conformance.tell.read_backs import failing_read_backs, is_read_back
from reference_engine.clock import Clock
from reference_engine.errors import ConfigurationError
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = [
    "LITERAL_TOKENS_NOTE",
    "OPERATIONS",
    "READ_BACKS_NOTE",
    "Expected",
    "Finding",
    "ProtocolStep",
    "comment",
    "expected_answers",
    "literal_tokens_comment",
    "protocol_steps",
    "summary",
    "test_name",
    "together",
    "utf16_literal",
]

_WORDS = re.compile(r"[A-Za-z0-9]+")

#: The operations a test calls through the contract (open and close are the test's own).
OPERATIONS = frozenset(
    {
        "exists",
        "get",
        "try_acquire_lock",
        "set",
        "release_lock_as_failed",
        "upsert",
        "reset_expired_locks",
        "expire_past_retention",
    }
)


#: What every printed test's header says of the kit's read-backs.
READ_BACKS_NOTE = (
    "These are the program's own steps; of the reads the verifier made after each step to "
    "compare the store with its model, only the one that showed the failure is kept."
)
#: What a printed test that spells tokens as the run's values says, when found under
#: ``--tokens ordered``.
LITERAL_TOKENS_NOTE = (
    "Found under --tokens ordered, but this test assumes attempt tokens: it sends the tokens "
    "the handler granted in the run as they were, and expects each grant to be the "
    "reference's attempt number (1, 2, ...), so a handler fencing with a sequence of its own "
    "fails at its first grant. A C# handler's NUnit test keeps each grant's token instead."
)


@dataclass(frozen=True, slots=True)
class Finding:
    """A violation found through the protocol, with everything a printer needs to spell it."""

    property_name: str
    seed: int
    #: The request lines the handler's process received (the replay file's lines).
    lines: Sequence[bytes]
    message: str = ""
    #: Per line, the earlier lines (0-based) unanswered when it was sent; None: not kept.
    in_flight: Sequence[tuple[int, ...]] | None = None
    #: The handler's interface as its host said: ``contract`` or ``seed``.
    shape: str = "contract"
    #: The handler's own answers by request id (the process the factory built), when kept:
    #: they say which of the kit's reads showed the failure, and hold its tokens.
    answers: dict[int, dict[str, Any]] | None = None
    #: ``--tokens``: the rule the finding was made under (``attempts`` or ``ordered``).
    tokens: str = "attempts"


@dataclass(frozen=True, slots=True)
class Expected:
    """What the reference handler answered: a result value, or an error of ``error_kind``."""

    result: Any = None
    error_kind: str | None = None

    def as_json(self) -> str:
        """The answer as the steps helpers give it: the result's JSON, or ``{"error":KIND}``."""
        if self.error_kind is not None:
            return json.dumps({"error": self.error_kind}, separators=(",", ":"))
        return json.dumps(self.result, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True, slots=True)
class ProtocolStep:
    """One request of the counterexample, as a call through the contract."""

    #: The request as it was sent (``op``, ``now``, ``context`` and the operation's fields).
    request: dict[str, Any]
    #: The reference handler's answer to it; None when it gave none (the run ended first).
    expected: Expected | None
    #: Earlier steps (indexes into the list of steps) still unanswered when it was sent.
    overlaps: tuple[int, ...] = ()
    #: Under ``--tokens ordered``: the grant this step makes, kept in a variable of the test.
    grant: Grant | None = None
    #: Under ``--tokens ordered``: the variable holding the token this step carries.
    token: str | None = None

    @property
    def op(self) -> str:
        return str(self.request["op"])

    @property
    def now(self) -> str:
        return str(self.request["now"])

    @property
    def context(self) -> dict[str, Any]:
        ctx = self.request.get("context")
        return ctx if isinstance(ctx, dict) else {}

    def describe(self) -> str:
        """``request 7: set 'INV-1' token 2 at 2026-...``: the assertion's message."""
        ctx = self.context
        item = f" {ctx['item_key']!r}" if ctx else ""
        token = f" token {ctx['lock_token']}" if ctx.get("lock_token") is not None else ""
        return f"request {self.request['id']}: {self.op}{item}{token} at {self.now}"


def _reference(shape: str) -> Callable[[Clock], InMemoryStateHandler]:
    """The reference handler for a handler of ``shape``: the spec's, or the seed profile's model.

    A handler of the seed's interface is told no token, so the test expects
    of it what the ``seed`` profile does: a write on a Processing record is
    the holder's, a stale holder's included (the hazard, not its finding).
    """
    if shape == "seed":
        from dsm_sim.conformance.judge.semantics import SEED, ProfiledModel

        return lambda clock: InMemoryStateHandler(clock, ProfiledModel(SEED))
    return InMemoryStateHandler


def expected_answers(
    lines: Sequence[bytes], shape: str = "contract", grants: OrderedGrants | None = None
) -> dict[int, Any]:
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
        server = Server(_reference(shape), send)
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


def _first_process(
    lines: Sequence[bytes], in_flight: Sequence[tuple[int, ...]] | None
) -> list[tuple[int, bytes, tuple[int, ...]]]:
    """(line index, request line, earlier line indexes in flight) of the first process's lines.

    A tagged line (``{"process": N, "in_flight": [...], "request": {...}}``, a
    race through peers) is unwrapped; its ``in_flight`` counts lines from 1.
    """
    kept: list[tuple[int, bytes, tuple[int, ...]]] = []
    for index, line in enumerate(lines):
        message = json.loads(line)
        if isinstance(message, dict) and "request" in message and "process" in message:
            if message["process"] != 1:
                continue
            request = json.dumps(message["request"], separators=(",", ":")).encode() + b"\n"
            kept.append((index, request, tuple(i - 1 for i in message.get("in_flight", []))))
            continue
        overlapped = tuple(in_flight[index]) if in_flight is not None else ()
        kept.append((index, line, overlapped))
    return kept


def _grants(finding: Finding) -> OrderedGrants | None:
    """The grant bookkeeping ``--tokens ordered`` needs, from the handler's answers."""
    if finding.tokens == "attempts":
        return None
    if finding.answers is None:
        raise ConfigurationError(
            "a counterexample found under --tokens ordered is printed as a test from the "
            "handler's own answers (its tokens), and none were kept"
        )
    return OrderedGrants(finding.answers)


def _expected(answer: dict[str, Any] | None) -> Expected | None:
    if answer is None:
        return None
    error = answer.get("error")
    if isinstance(error, dict):
        return Expected(error_kind=str(error["kind"]))
    return Expected(result=answer.get("result"))


def protocol_steps(finding: Finding) -> list[ProtocolStep]:
    """The steps of ``finding`` a test makes through the contract, each with its expected answer.

    ``finding.in_flight[i]`` names the earlier lines (0-based) unanswered when
    line ``i`` was sent, for a recording of one process (whose replay lines
    carry no tags); without it the steps overlap only as tagged lines say.
    The reference is the one of ``finding.shape``; the kit's read-backs are
    kept only where one showed the failure; under ``--tokens ordered`` each
    grant and each token it hands on are named.
    """
    grants = _grants(finding)
    kept = _first_process(finding.lines, finding.in_flight)
    answers = expected_answers([line for _, line, _ in kept], finding.shape, grants)
    requests = [(index, json.loads(line), overlapped) for index, line, overlapped in kept]
    calls = [request for _, request, _ in requests if request.get("op") in OPERATIONS]
    shown = failing_read_backs(calls, answers, finding.answers, ordered=grants is not None)
    step_of: dict[int, int] = {}
    steps: list[ProtocolStep] = []
    for index, request, overlapped in requests:
        if request.get("op") not in OPERATIONS:
            continue
        if is_read_back(request) and request["id"] not in shown:
            continue
        overlaps = tuple(step_of[i] for i in overlapped if i in step_of)
        step_of[index] = len(steps)
        grant = None if grants is None else grants.grants.get(request["id"])
        token = None if grants is None else grants.carried.get(request["id"])
        steps.append(
            ProtocolStep(request, _expected(answers.get(request["id"])), overlaps, grant, token)
        )
    return steps


def together(steps: Sequence[ProtocolStep]) -> list[list[ProtocolStep]]:
    """The steps in runs that were on the wire at once: each overlapped one of its run.

    A step joins the run before it when it was sent while a step of that run
    was unanswered; otherwise it starts a run of its own.  A test makes a
    run's calls together (the race), then checks their answers.
    """
    runs: list[list[ProtocolStep]] = []
    members: set[int] = set()
    for index, step in enumerate(steps):
        if runs and members.intersection(step.overlaps):
            runs[-1].append(step)
        else:
            runs.append([step])
            members = set()
        members.add(index)
    return runs


def test_name(property_name: str) -> str:
    """``stale_write_rejected`` -> ``StaleWriteRejected``: a name every language takes."""
    return "".join(w.capitalize() for w in _WORDS.findall(property_name)) or "Counterexample"


def summary(message: str, limit: int = 300) -> str:
    """The finding's message on one line, cut at ``limit`` characters: a comment's text."""
    return " ".join(message.split())[:limit]


def comment(text: str, width: int = 88) -> list[str]:
    """``text`` as ``//`` comment lines of at most ``width`` characters (C#, JavaScript, Java)."""
    return ["// " + line for line in textwrap.wrap(text, width - 3)]


def literal_tokens_comment(finding: Finding) -> list[str]:
    """The header lines of a test that spells tokens as the run's values: under ``ordered`` only."""
    return [] if finding.tokens == "attempts" else comment(LITERAL_TOKENS_NOTE)


def utf16_literal(text: str | None) -> str:
    """A string literal of the C family (C#, Java) for ``text``; ``null`` for None.

    Printable ASCII stays as it is, every other code unit is a ``\\uXXXX``
    escape (astral characters as their UTF-16 surrogate pair), so the printed
    test compiles under any source encoding and shows invisible characters.
    """
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
