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

A race through peers (several processes on one named store) is recorded
whole: every process's requests, each line tagged with its process and
with the earlier requests still unanswered when it was sent.  ``dsm replay``
then starts as many processes, sends each request when the requests it did
not overlap have been answered (so the ones that overlapped go together
again), as many times as ``--times`` asks, and judges every run's answers by
the reference model: a run whose answers no order of its requests explains
broke the property ("broke 6 of 20 runs").
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
from dsm_sim.protocol import versions, wire
from dsm_sim.protocol.client import (
    ExecFactory,
    TcpAddress,
    exec_factory,
    fresh_store_name,
    tcp_factory,
)
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
#: No run broke the reference model, but some run's judgement ran out of reference calls:
#: its answers were neither explained nor refuted, so the replay cannot say "agree".
EXIT_UNDECIDED = 4
#: Runs of a file whose requests raced, by default: a race breaks in some runs only.
RACE_RUNS = 20
#: The most runs ``--times`` takes.
MAX_TIMES = 10_000
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


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One line of a replay file: the request, its process, and what it overlapped."""

    request: dict[str, Any]
    #: Which of the recorded processes it was sent to (1: the test case's first).
    process: int = 1
    #: Earlier lines (0-based) that had not been answered when it was sent.
    in_flight: tuple[int, ...] = ()


def read_replay(path: Path) -> list[dict[str, Any]]:
    """The requests of a replay file, each checked against the request schema."""
    return [entry.request for entry in read_entries(path)]


def _entry(message: Any, index: int, path: Path, number: int) -> tuple[ReplayEntry, Any]:
    """The entry a line holds, and the request to check against the schema."""
    if not isinstance(message, dict) or "request" not in message:
        return ReplayEntry(message if isinstance(message, dict) else {}), message
    process, in_flight = message.get("process"), message.get("in_flight", [])
    valid = (
        set(message) <= {"process", "in_flight", "request"}
        and isinstance(process, int)
        and not isinstance(process, bool)
        and process >= 1
        and isinstance(in_flight, list)
        and all(
            isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= index for i in in_flight
        )
    )
    if not valid:
        raise ReplayFileError(
            f'{path}:{number} is a tagged line but not {{"process": N >= 1, "in_flight": '
            '[earlier line numbers], "request": {...}}, as dsm verify --exec writes it',
            path=str(path),
            line=number,
        )
    request = message["request"]
    assert isinstance(process, int)
    entry = ReplayEntry(
        request if isinstance(request, dict) else {},
        process,
        tuple(i - 1 for i in in_flight),
    )
    return entry, request


def read_entries(path: Path) -> list[ReplayEntry]:
    """The lines of a replay file, each request checked against the request schema.

    A plain line is a request of process 1, sent after the line before it was
    answered; a tagged line (``{"process": N, "in_flight": [...], "request": {...}}``)
    names its process and the earlier lines (numbered from 1) it overlapped.

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
    requests: list[ReplayEntry] = []
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
        entry, message = _entry(message, len(requests), path, number)
        found = problem("request", message)
        if found is not None:
            raise ReplayFileError(
                f"{path}:{number} is not a protocol request: {found.field or 'the line'}: "
                f"{found.message} (expected {found.expected})",
                path=str(path),
                line=number,
            )
        requests.append(entry)
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


@dataclass(slots=True)
class _Run:
    """One replay of the entries: each answer, when each request went out and came back."""

    pairs: list[ReplayPair]
    #: The process each request went to.
    processes: list[int]
    sent: list[float]
    answered: list[float]
    broken: DsmError | None


async def _drive(entries: Sequence[ReplayEntry], factory: ExecFactory, pipelined: bool) -> _Run:
    """Send the entries, in as many processes as they name, overlapping as recorded.

    Every process is started before the first request, so a start-up is not
    part of any race.  A request goes out once every earlier request it did
    not overlap has been answered (``pipelined``: at once); a named store is
    renamed to a fresh one, the same for every process, so runs never meet.
    """
    processes = sorted({entry.process for entry in entries})
    handlers = {process: factory(ManualClock()) for process in processes}
    store = fresh_store_name()
    loop = asyncio.get_running_loop()
    count = len(entries)
    answers: list[dict[str, Any] | None] = [None] * count
    sent, answered = [0.0] * count, [0.0] * count
    broken: list[DsmError] = []
    pending: dict[int, asyncio.Task[None]] = {}

    async def send(index: int) -> None:
        entry = entries[index]
        request = entry.request
        if request.get("op") == "open":
            request = versions.with_offer(request)
            if "store" in request:
                request["store"] = store
        sent[index] = loop.time()
        try:
            answers[index] = await handlers[entry.process].send_raw(request)
        except DsmError as exc:
            broken.append(exc)
        finally:
            answered[index] = loop.time()

    try:
        await asyncio.gather(*(handler.connect() for handler in handlers.values()))
        for index, entry in enumerate(entries):
            if not pipelined:
                overlapped = set(entry.in_flight)
                waits = [task for i, task in pending.items() if i not in overlapped]
                if waits:
                    await asyncio.wait(waits)
            if broken:
                break
            task = loop.create_task(send(index))
            pending[index] = task

            def settled(_task: asyncio.Task[None], index: int = index) -> None:
                pending.pop(index, None)

            task.add_done_callback(settled)
            await asyncio.sleep(0)  # on the wire in the order recorded
        if pending:
            await asyncio.wait(list(pending.values()))
    finally:
        await asyncio.gather(
            *(handler.disconnect() for handler in handlers.values()), return_exceptions=True
        )
    reached = max((i + 1 for i in range(count) if sent[i]), default=0)
    pairs = [ReplayPair(entries[i].request, answers[i]) for i in range(reached)]
    return _Run(
        pairs,
        [entry.process for entry in entries[:reached]],
        sent[:reached],
        answered[:reached],
        broken[0] if broken else None,
    )


def replay(
    requests: Sequence[dict[str, Any]], factory: ExecFactory, *, pipelined: bool = False
) -> tuple[list[ReplayPair], DsmError | None]:
    """Send ``requests`` to a fresh handler process; each with its answer, and how it broke.

    Requests are sent one at a time, each after the answer to the one before
    (``pipelined``: all at once).  The second element is the protocol error
    that ended the replay early (a dead or silent process, a malformed
    answer), or None.
    """
    run = asyncio.run(_drive([ReplayEntry(r) for r in requests], factory, pipelined))
    return run.pairs, run.broken


# --- judging a run by the reference model -----------------------------------------------------

#: Reference calls one judgement may make before it gives up (undecided, never "broke").
MAX_JUDGE_CALLS = 200_000


@dataclass(frozen=True, slots=True)
class Breach:
    """A run's answers no order of its requests explains: the request where every order ends."""

    request: dict[str, Any]
    process: int
    got: dict[str, Any]
    expected: dict[str, Any]
    #: Requests an order explained before it met this one.
    explained: int

    def render(self) -> str:
        return (
            "no order of the requests explains the answers: process "
            f"{self.process}'s {describe_request(self.request).strip()} "
            f"answered {describe_answer(self.got)}, where the reference model, after "
            f"{self.explained} request(s) in an order that explains them, answers "
            f"{describe_answer(self.expected)}"
        )


#: Operations that read and never write: the judgement places them without branching.
_READS = frozenset({"get", "exists"})


class _Undecided(Exception):
    """The judgement ran out of reference calls."""


@dataclass(frozen=True, slots=True)
class Undecided:
    """A run the judgement gave up on: no order found yet, none ruled out, budget spent."""

    #: Reference calls spent (:data:`MAX_JUDGE_CALLS`).
    calls: int

    def render(self) -> str:
        return (
            f"undecided: the judgement spent its {self.calls:,} reference calls before it "
            "found an order that explains the answers or ruled every order out; this run's "
            "answers were not judged"
        )


#: How one run was judged: ``None`` (an order explains every answer), a breach, or undecided.
Judgement = Breach | Undecided | None


def _agrees(expected: dict[str, Any], got: dict[str, Any], version: int) -> bool:
    """Whether an answer agrees with the model's, read by the protocol version the run answered."""
    if "error" in expected:
        return "error" in got and versions.agrees(
            version, expected["error"]["kind"], str(got["error"].get("kind"))
        )
    return "error" not in got and got.get("result") == expected.get("result")


def _version(run: _Run) -> int:
    """The protocol version the run's handler answered open with (the newest when unsaid)."""
    for pair in run.pairs:
        if pair.request.get("op") == "open" and pair.answer is not None:
            result = pair.answer.get("result")
            if isinstance(result, dict):
                version = versions.spoken(result.get("protocol"))
                if version is not None:
                    return version.number
    return versions.NEWEST


async def _judge(run: _Run) -> Judgement:
    """Whether some order of the run's calls, each after those answered before it was sent,
    gives every answer on the reference model (``docs/semantics.md``); the breach if none does.

    A linearizability search (Wing and Gong): at each point any call that no
    unplaced call was answered before may go next; the model is copied only
    where there is a choice.  ``open`` and ``close`` are not judged.
    """
    import copy

    from dsm_sim.protocol.server import Server
    from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler

    calls = [
        i
        for i, pair in enumerate(run.pairs)
        if pair.answer is not None and pair.request.get("op") not in ("open", "close")
    ]
    server = Server(in_memory_handler, lambda _line: None)
    server.clock.latest = wire.decode_instant(run.pairs[0].request["now"], "now")
    await server._perform({"op": "open", "protocol": versions.NEWEST})
    version = _version(run)
    handler = server.handler
    assert isinstance(handler, InMemoryStateHandler)
    spent = [0]
    deepest: list[Breach] = []

    async def expected(index: int) -> dict[str, Any]:
        spent[0] += 1
        if spent[0] > MAX_JUDGE_CALLS:
            raise _Undecided
        message = run.pairs[index].request
        server.clock.latest = wire.decode_instant(message["now"], "now")
        try:
            return {"result": await server._perform(message)}
        except Exception as exc:  # a refusal is an answer, as the server sends it
            return {"error": wire.encode_error(exc)}

    async def search(left: frozenset[int]) -> bool:
        while left:
            # A call may go next when no unplaced call was answered before it was sent.
            first_answer = min(run.answered[i] for i in left)
            ready = sorted(
                (j for j in left if run.sent[j] <= first_answer), key=run.sent.__getitem__
            )
            # A read that agrees now changes nothing: placing it here loses no order, and
            # the search need not branch over it (reads in flight together would
            # otherwise multiply the orders past the judgement's budget).
            placed = False
            for j in ready:
                if run.pairs[j].request.get("op") in _READS and len(ready) > 1:
                    saved = copy.deepcopy(handler.model)
                    got, wanted = run.pairs[j].answer, await expected(j)
                    assert got is not None
                    if _agrees(wanted, got, version):
                        left, placed = left - {j}, True
                        break
                    handler.model = saved
            if placed:
                continue
            if len(ready) == 1:
                (j,) = ready
                got, wanted = run.pairs[j].answer, await expected(j)
                assert got is not None
                if not _agrees(wanted, got, version):
                    miss(j, got, wanted, len(calls) - len(left))
                    return False
                left = left - {j}
                continue
            for j in ready:
                saved = copy.deepcopy(handler.model)
                got, wanted = run.pairs[j].answer, await expected(j)
                assert got is not None
                if not _agrees(wanted, got, version):
                    miss(j, got, wanted, len(calls) - len(left))
                elif await search(left - {j}):
                    return True
                handler.model = saved
            return False
        return True

    def miss(j: int, got: dict[str, Any], wanted: dict[str, Any], explained: int) -> None:
        if not deepest or explained > deepest[0].explained:
            deepest[:] = [Breach(run.pairs[j].request, run.processes[j], got, wanted, explained)]

    try:
        if await search(frozenset(calls)):
            return None
    except _Undecided:
        return Undecided(MAX_JUDGE_CALLS)
    return deepest[0] if deepest else None


def render(
    pairs: Sequence[ReplayPair],
    broken: DsmError | None,
    out: TextIO,
    processes: Sequence[int] | None = None,
) -> None:
    """Each request beside its answer; error answers flagged with ``!``.

    ``processes`` (one per pair) prefixes each request with its process, when several took part.
    """
    shown = [describe_request(pair.request) for pair in pairs]
    if processes is not None:
        shown = [f"p{process} {text}" for process, text in zip(processes, shown, strict=False)]
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


def _positive_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TIMES:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {MAX_TIMES}, got {text!r}")
    return value


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
        "--times",
        type=_positive_count,
        default=None,
        metavar="N",
        help=f"replay the file N times, each run judged (default: {RACE_RUNS} when its requests "
        "raced, across processes or overlapping, else 1)",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="send every request at once, as 'COMMAND < FILE' does, instead of each after "
        "the answer to the one before",
    )


def default_times(entries: Sequence[ReplayEntry]) -> int:
    """Runs of a file by default: :data:`RACE_RUNS` when its requests raced, else one."""
    raced = any(entry.in_flight for entry in entries) or len({e.process for e in entries}) > 1
    return RACE_RUNS if raced else 1


@dataclass(frozen=True, slots=True)
class Replays:
    """Every run of a file: the runs, and for each its breach of the reference model, if any."""

    runs: tuple[_Run, ...]
    judgements: tuple[Judgement, ...]

    @property
    def breaches(self) -> tuple[Breach | None, ...]:
        """Each run's breach of the reference model, or None (explained, or undecided)."""
        return tuple(j if isinstance(j, Breach) else None for j in self.judgements)

    @property
    def broke(self) -> int:
        return sum(1 for j in self.judgements if isinstance(j, Breach))

    @property
    def undecided(self) -> int:
        """Runs whose judgement ran out of reference calls: neither agreeing nor broken."""
        return sum(1 for j in self.judgements if isinstance(j, Undecided))

    @property
    def broken(self) -> DsmError | None:
        return next((run.broken for run in self.runs if run.broken is not None), None)


def replay_times(
    entries: Sequence[ReplayEntry], factory: ExecFactory, times: int, *, pipelined: bool = False
) -> Replays:
    """Replay the entries ``times`` times, each run judged by the reference model.

    A run that broke the protocol (a dead process, a timeout) ends the runs.
    """

    async def runs() -> Replays:
        done: list[_Run] = []
        breaches: list[Judgement] = []
        for _ in range(times):
            run = await _drive(entries, factory, pipelined)
            done.append(run)
            breaches.append(None if run.broken is not None or not run.pairs else await _judge(run))
            if run.broken is not None:
                break
        return Replays(tuple(done), tuple(breaches))

    return asyncio.run(runs())


def main(args: argparse.Namespace) -> int:
    try:
        entries = read_entries(args.file)
        factory = (
            exec_factory(args.exec_command, timeout=args.exec_timeout)
            if args.exec_command is not None
            else tcp_factory(args.exec_tcp, timeout=args.exec_timeout)
        )
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm replay: {exc}\n")
        return EXIT_USAGE
    times = args.times if args.times is not None else default_times(entries)
    try:
        done = replay_times(entries, factory, times, pipelined=args.pipelined)
    except DsmError as exc:  # the command does not start, the server is not there
        sys.stderr.write(f"dsm replay: {exc}\n")
        return EXIT_USAGE
    processes = sorted({entry.process for entry in entries})
    several = len(processes) > 1
    how = (
        "all at once"
        if args.pipelined
        else "overlapping as recorded"
        if any(entry.in_flight for entry in entries)
        else "one at a time"
    )
    where = f"{len(processes)} processes" if several else factory.command
    out = printable_stream(sys.stdout)
    out.write(
        f"dsm replay {args.file}: {len(entries)} request(s) to {where}, {how}, "
        f"{len(done.runs)} run(s)\n"
    )
    if several:
        out.write(f"  each process: {factory.command}\n")
    # The first run that broke is shown (or the first run), each request beside its answer.
    shown = next(
        (i for i, b in enumerate(done.breaches) if b is not None),
        next((i for i, j in enumerate(done.judgements) if j is not None), 0),
    )
    run = done.runs[shown]
    if len(done.runs) > 1:
        out.write(f"run {shown + 1}:\n")
    tags = [entry.process for entry in entries] if several else None
    render(run.pairs, run.broken, out, tags)
    judgement = done.judgements[shown]
    if judgement is not None:
        out.write(f"run {shown + 1}: {judgement.render()}\n")
    judged = len(done.runs) - done.undecided
    if done.broke:
        out.write(
            f"broke {done.broke} of {len(done.runs)} run(s): the answers of {done.broke} "
            "broke the reference model (no order of the requests explains them)\n"
        )
    elif done.undecided:
        out.write(
            f"broke 0 of {len(done.runs)} run(s), {done.undecided} undecided: the answers of "
            f"{judged} agree with the reference model; the others were not judged (replay "
            "fewer requests, or the requests of one race)\n"
        )
    else:
        out.write(
            f"broke 0 of {len(done.runs)} run(s): every run's answers agree with the "
            "reference model\n"
        )
    if done.broken is not None or done.broke:
        return EXIT_BROKEN
    return EXIT_UNDECIDED if done.undecided else EXIT_OK
