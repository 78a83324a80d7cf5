"""Replay files: the protocol requests of a shrunk counterexample, and ``dsm replay``.

When ``dsm verify --exec`` finds a violation, the kit's story and program
speak Python.  A team whose handler is written in C# or Java wants the same
failure in its own terms: the exact request lines its process received.  A
replay file is those lines, one JSON request per line, exactly as they were
sent (``open`` first, ``close`` last when the run got that far), so it can be
piped into the process by hand (``node handler.js < file.jsonl``) or sent
by ``dsm replay file.jsonl --exec CMD``, which waits for each answer before
sending the next request and prints each request beside its answer.

A run's races put several requests on the wire at once; a replay sends them
one after the other, in the order they were first sent.  A bug that needs
two requests to overlap (a check-then-insert acquire) may therefore answer
correctly on replay: ``--pipelined`` sends every line at once, as a pipe does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dsm_sim.input_files import InputFileProblem, read_bounded
from dsm_sim.options import positive_seconds
from dsm_sim.outputs import write_file
from dsm_sim.printable import printable_stream
from dsm_sim.protocol.client import ExecFactory, TcpAddress, exec_factory, tcp_factory
from dsm_sim.protocol.schema import problem
from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "REPLAY_SUBDIR",
    "ReplayFileError",
    "ReplayPair",
    "configure",
    "describe_answer",
    "describe_request",
    "main",
    "read_replay",
    "render",
    "replay",
    "replay_command",
    "replay_name",
    "write_replay",
]

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
#: Where under the cache directory ``dsm verify`` writes replay files by default.
REPLAY_SUBDIR = "replays"


#: The largest replay file read: many requests at the protocol's line limit.
MAX_REPLAY_BYTES = 64 * 1024 * 1024


class ReplayFileError(ConfigurationError):
    """A replay file that cannot be replayed: not found, not JSON, or not protocol requests."""

    def __init__(self, message: str, *, path: str, line: int = 0) -> None:
        self.path = path
        self.line = line
        super().__init__(message)


def replay_name(property_name: str, seed: int) -> str:
    """The file name for one violation: the property and the seed of the run that found it."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", property_name)
    return f"{safe}-seed{seed}.jsonl"


def write_replay(lines: Sequence[bytes], directory: Path, name: str) -> Path:
    """Write request lines (as sent, each ending in a newline) to ``directory/name``."""
    return write_file(directory / name, b"".join(lines))


def read_replay(path: Path) -> list[dict[str, Any]]:
    """The requests of a replay file, each checked against the request schema.

    The file is read bounded (a regular file of at most :data:`MAX_REPLAY_BYTES`,
    so a FIFO or ``/dev/zero`` is refused unread), must be UTF-8, and a line
    nested deeper than the JSON reader follows is refused by name.
    """
    try:
        data = read_bounded(path, MAX_REPLAY_BYTES)
    except InputFileProblem as exc:
        raise ReplayFileError(
            f"the replay file {path} {exc.problem}; give a regular UTF-8 file of JSON requests "
            f"of at most {MAX_REPLAY_BYTES // (1024 * 1024)} MiB, as dsm verify --exec writes it",
            path=str(path),
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = data.count(b"\n", 0, exc.start) + 1
        raise ReplayFileError(
            f"{path}:{number} is not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} "
            "cannot be decoded; a replay file is UTF-8 text",
            path=str(path),
            line=number,
        ) from None
    requests: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except RecursionError:
            raise ReplayFileError(
                f"{path}:{number} is JSON nested deeper than the reader can follow; a protocol "
                "request nests a few levels at most",
                path=str(path),
                line=number,
            ) from None
        except ValueError as exc:
            raise ReplayFileError(
                f"{path}:{number} is not JSON ({exc}); a replay file holds one JSON request "
                "per line, as dsm verify --exec writes it",
                path=str(path),
                line=number,
            ) from exc
        found = problem("request", message)
        if found is not None:
            raise ReplayFileError(
                f"{path}:{number} is not a protocol request: {found.field or 'the line'}: "
                f"{found.message} (expected {found.expected})",
                path=str(path),
                line=number,
            )
        requests.append(message)
    if not requests:
        raise ReplayFileError(f"the replay file {path} holds no requests", path=str(path))
    return requests


def describe_request(message: dict[str, Any]) -> str:
    """One request as a log reads it: id, operation, item, token, status and the time of day."""
    parts = [f"{message['id']:>4} {message['op']}"]
    context = message.get("context")
    if isinstance(context, dict):
        parts.append(
            f"{context.get('item_key')!r} ({context.get('tenant_id')}/{context.get('scope_code')})"
        )
        if context.get("lock_token") is not None:
            parts.append(f"token {context['lock_token']}")
    if "status" in message:
        parts.append(str(message["status"]))
    now = str(message.get("now", ""))
    parts.append(f"@ {now[11:26] or now}")
    return " ".join(parts)


def describe_answer(answer: dict[str, Any]) -> str:
    if "error" in answer:
        error = answer["error"]
        return f"ERROR {error.get('kind')}: {error.get('message')}"
    result = answer.get("result")
    if isinstance(result, dict) and "status" in result and "key" in result:
        return f"record {result['status']}, attempt {result['attempt']}"
    return json.dumps(result, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ReplayPair:
    """One replayed request and the answer it got (None when the handler broke first)."""

    request: dict[str, Any]
    answer: dict[str, Any] | None

    @property
    def error_kind(self) -> str | None:
        if self.answer is None or "error" not in self.answer:
            return None
        return str(self.answer["error"].get("kind"))


async def _replay(
    requests: Sequence[dict[str, Any]], factory: ExecFactory, pipelined: bool
) -> tuple[list[ReplayPair], DsmError | None]:
    handler = factory(ManualClock())
    await handler.connect()
    pairs: list[ReplayPair] = []
    broken: DsmError | None = None
    try:
        if pipelined:
            outcomes = await asyncio.gather(
                *(handler.send_raw(r) for r in requests), return_exceptions=True
            )
            for request, outcome in zip(requests, outcomes, strict=True):
                if isinstance(outcome, DsmError):
                    broken = broken or outcome
                    pairs.append(ReplayPair(request, None))
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    pairs.append(ReplayPair(request, outcome))
        else:
            for request in requests:
                try:
                    pairs.append(ReplayPair(request, await handler.send_raw(request)))
                except DsmError as exc:
                    broken = exc
                    break
    finally:
        await handler.disconnect()
    return pairs, broken


def replay(
    requests: Sequence[dict[str, Any]], factory: ExecFactory, *, pipelined: bool = False
) -> tuple[list[ReplayPair], DsmError | None]:
    """Send ``requests`` to a fresh handler process; each with its answer, and how it broke.

    Requests are sent one at a time, each after the answer to the one before
    (``pipelined``: all at once).  The second element is the protocol error
    that ended the replay early (a dead or silent process, a malformed
    answer), or None.
    """
    return asyncio.run(_replay(requests, factory, pipelined))


def render(pairs: Sequence[ReplayPair], broken: DsmError | None, out: TextIO) -> None:
    """Each request beside its answer; error answers flagged with ``!``."""
    shown = [describe_request(pair.request) for pair in pairs]
    width = min(72, max((len(s) for s in shown), default=0))
    for pair, left in zip(pairs, shown, strict=True):
        if pair.answer is None:
            out.write(f"  {left:<{width}}  -> (no answer)\n")
            continue
        flag = "!" if "error" in pair.answer else " "
        out.write(f"{flag} {left:<{width}}  -> {describe_answer(pair.answer)}\n")
    kinds = [pair.error_kind for pair in pairs if pair.error_kind is not None]
    answered = sum(1 for pair in pairs if pair.answer is not None)
    summary = f"{answered} request(s) answered, {len(kinds)} with an error"
    if kinds:
        counts = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
        summary += " (" + ", ".join(f"{k}: {n}" for k, n in counts.items()) + ")"
    out.write(summary + "\n")
    if broken is not None:
        out.write(f"The handler broke the protocol: {type(broken).__name__}: {broken}\n")


def replay_command(path: Path, factory: ExecFactory) -> str:
    """The ``dsm replay`` command for a replay file and the handler it was recorded against."""
    target = factory.target
    if isinstance(target, TcpAddress):
        return shlex.join(["dsm", "replay", str(path), "--exec-tcp", str(target)])
    return shlex.join(["dsm", "replay", str(path), "--exec", factory.command])


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE.jsonl", help="a replay file")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--exec",
        dest="exec_command",
        metavar="COMMAND",
        help="start this handler command and send it the file's requests",
    )
    target.add_argument(
        "--exec-tcp",
        metavar="HOST:PORT",
        help="connect to the handler server at this address instead",
    )
    parser.add_argument(
        "--exec-timeout",
        type=positive_seconds(3600.0),
        default=None,
        metavar="SECONDS",
        help="how long the handler may take to answer one request (default: "
        "$DSM_EXEC_TIMEOUT, else 10)",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="send every request at once, as 'COMMAND < FILE' does, instead of each after "
        "the answer to the one before",
    )


def main(args: argparse.Namespace) -> int:
    try:
        requests = read_replay(args.file)
        factory = (
            exec_factory(args.exec_command, timeout=args.exec_timeout)
            if args.exec_command is not None
            else tcp_factory(args.exec_tcp, timeout=args.exec_timeout)
        )
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm replay: {exc}\n")
        return EXIT_USAGE
    try:
        pairs, broken = replay(requests, factory, pipelined=args.pipelined)
    except DsmError as exc:  # the command does not start, the server is not there
        sys.stderr.write(f"dsm replay: {exc}\n")
        return EXIT_USAGE
    how = "all at once" if args.pipelined else "one at a time"
    print(f"dsm replay {args.file}: {len(requests)} request(s) to {factory.command}, {how}")
    render(pairs, broken, printable_stream(sys.stdout))
    return EXIT_BROKEN if broken is not None else EXIT_OK
