"""``ExecHandler``: a handler in another process, in any language, behind the handler Protocol.

The harness starts the user's command, speaks the protocol of
``docs/protocol.md`` over its stdin and stdout (or connects to a handler that
is a server, over TCP with the same framing), and hands the kit an object
that looks like any in-process handler.  Requests carry ids, so the kit's
races really are concurrent: several requests are on the wire before the
first answer, and answers may come back in any order.  ``now`` is read from
the clock the factory was given, once per request, so the kit's clock
jumps reach the process as data.

Nothing here may hang the harness: every wait has a timeout, a process that
dies or writes garbage fails the requests in flight with a named
:class:`~dsm_sim.protocol.errors.ProtocolError` carrying its stderr tail, and
``close`` always kills and reaps the process.  The timeout is a timer on the
loop rather than ``asyncio.wait_for``, because the simulator drives handler
coroutines step by step inside a task of its own, where a ``wait_for`` would
cancel the driver instead of failing the request.

An :class:`ExecFactory` starts the processes of its next two handlers while
the current one works (:class:`_Spares`): the kit starts one process per test
case, and paying each start-up in series was most of a verification's wall
time.

Every request line sent is kept (:attr:`ExecHandler.transcript`), so the
shrunk counterexample of a verification can be written out as a replay file
(:mod:`dsm_sim.protocol.replay`).

Each handler a factory builds names a fresh store on ``open``.  A process
that can work in a named store (answering ``"named_store": true``) lets
the kit and the simulator open *peers*: more processes on the same store,
so races between workers reach the store from separate processes, as in
production.  That is how a handler that serves one request at a time
(``"concurrent": false``) is still raced inside the kit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
import json
import math
import os
import re
import secrets
import shlex
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsm_sim.hangs import note_hang
from dsm_sim.options import seconds_from_env
from dsm_sim.protocol import groups, versions, wire
from dsm_sim.protocol.errors import (
    HandlerExitedError,
    HandlerInternalError,
    HandlerStartError,
    HandlerTimeoutError,
    HandlerUnauthorizedError,
    MalformedResponseError,
    ProtocolError,
    UnexpectedResponseError,
    VersionMismatchError,
)
from dsm_sim.protocol.schema import problem
from dsm_sim.protocol.secret import SECRET_ENV, SECRET_FILE_ENV, client_secret
from dsm_sim.wall import past_deadline, remaining
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError, DsmError
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_LINE_BYTES",
    "MAX_TIMEOUT",
    "TIMEOUT_ENV",
    "ExecFactory",
    "ExecHandler",
    "Recording",
    "Target",
    "TcpAddress",
    "describe_target",
    "exec_factory",
    "parse_address",
    "preflight",
    "tcp_factory",
]

#: Seconds a request may wait for its answer; a store under load answers in milliseconds.
DEFAULT_TIMEOUT = 10.0
TIMEOUT_ENV = "DSM_EXEC_TIMEOUT"
#: The longest a request may wait for its answer (``--exec-timeout`` and the variable):
#: past an hour a silent handler is hung, not slow.
MAX_TIMEOUT = 3600.0
#: The longest answer line read: a record with a payload at the size limit,
#: escaped, is well under this; a runaway writer is stopped here, not in memory.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: How much of the process's stderr an error quotes.
STDERR_TAIL_BYTES = 4096
#: How many protocol failures a factory keeps for the report.
MAX_RECORDED_FAILURES = 20
#: What a store name sent on ``open`` looks like: safe as a SQL identifier,
#: a file name and a key prefix in every store a handler might use.
STORE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def fresh_store_name() -> str:
    """A store name no other handler of any run has used."""
    return f"dsm_{secrets.token_hex(8)}"


class Recording:
    """Every request the processes of one test case were sent, in the order they were sent.

    The handler the factory builds and each of its peers (the other
    processes on its named store) share one recording, each under its own
    process number (1 for the factory's).  Beside each line it keeps which
    earlier requests were still unanswered when it was sent: what overlapped
    it, so ``dsm replay`` can send them together again, in as many processes.
    """

    def __init__(self) -> None:
        #: (process number, request line as sent, 0-based indexes of the requests in flight).
        self.entries: list[tuple[int, bytes, tuple[int, ...]]] = []
        self._in_flight: set[int] = set()
        self.processes = 1

    def join(self) -> int:
        """A number for one more process on this recording."""
        self.processes += 1
        return self.processes

    def sent(self, process: int, line: bytes) -> int:
        index = len(self.entries)
        self.entries.append((process, line, tuple(sorted(self._in_flight))))
        self._in_flight.add(index)
        return index

    def answered(self, index: int) -> None:
        self._in_flight.discard(index)

    def lines(self) -> list[bytes]:
        """The replay file's lines: the requests as sent, tagged when several processes took part.

        A recording of one process is its request lines as they are (``CMD < FILE``
        replays it); with peers every line is ``{"process": N, "in_flight": [...],
        "request": {...}}``, ``in_flight`` naming by line number (from 1) the earlier
        requests not answered yet when it was sent.
        """
        if len({process for process, _, _ in self.entries}) <= 1:
            return [line for _, line, _ in self.entries]
        tagged: list[bytes] = []
        for process, line, in_flight in self.entries:
            request = line.rstrip(b"\n").decode("ascii")
            shown = ",".join(str(i + 1) for i in in_flight)
            tagged.append(
                f'{{"process":{process},"in_flight":[{shown}],"request":{request}}}\n'.encode()
            )
        return tagged


def default_timeout() -> float:
    """``$DSM_EXEC_TIMEOUT`` if set, else :data:`DEFAULT_TIMEOUT`; bounded as ``--exec-timeout``."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT, MAX_TIMEOUT, flag="--exec-timeout")


def checked_timeout(seconds: float) -> float:
    """``seconds`` if it is a bound ``--exec-timeout`` would take, else :class:`ConfigurationError`."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_TIMEOUT
    ):
        raise ConfigurationError(
            f"the handler's request timeout must be a finite number of seconds above 0 and at "
            f"most {MAX_TIMEOUT:g}, got {seconds!r}"
        )
    return float(seconds)


def split_command(command: str | Sequence[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise ConfigurationError("the handler command is empty; give e.g. --exec 'node handler.js'")
    return argv


@dataclass(frozen=True, slots=True)
class TcpAddress:
    """Where a handler that is a server listens (``--exec-tcp host:port``)."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str, *, listen: bool = False) -> TcpAddress:
    """``host:port`` (``[::1]:port`` for IPv6) as a :class:`TcpAddress`, or a usage error.

    ``listen``: the address to bind, where port 0 asks the system for a free one.
    """
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    low = 0 if listen else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) < 65536:
        example = "--tcp 127.0.0.1:0" if listen else "--exec-tcp 127.0.0.1:7411"
        raise ConfigurationError(
            f"{text!r} is not a TCP address; give host:port with a port from {low} to 65535, "
            f"e.g. {example}"
        )
    return TcpAddress(host, int(port))


#: A handler process to start (a command line) or a handler server to connect to.
Target = str | Sequence[str] | TcpAddress


def describe_target(target: Target) -> str:
    """The target as the user gave it: the command line, or ``tcp host:port``."""
    if isinstance(target, TcpAddress):
        return f"tcp {target}"
    return target if isinstance(target, str) else shlex.join(list(target))


class _PipeWriter(asyncio.streams.FlowControlMixin):
    """The protocol behind a :class:`asyncio.StreamWriter` on a child's stdin pipe.

    ``FlowControlMixin`` gives ``drain`` its back-pressure; this adds the close
    waiter ``StreamWriter.wait_closed`` asks for.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._closed: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


class _Spawned:
    """A handler process started with :class:`subprocess.Popen`, not yet bound to a loop.

    Started outside any event loop, so a factory can start the next test
    case's process while the current one runs (see :class:`_Spares`): the
    kit runs each test case on a loop of its own, and a process started by
    ``asyncio.create_subprocess_exec`` would belong to the loop that started it.
    :meth:`attach` connects its pipes to the running loop when it is used.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: str | None) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        # A group of its own: a launcher's child and the helpers it forks end with it.
        self.popen = groups.spawn(self.argv, env, cwd)
        self.pid = self.popen.pid
        self.stderr: asyncio.StreamReader | None = None

    @property
    def returncode(self) -> int | None:
        code = self.popen.poll()
        if code is not None:
            groups.end_group(self.popen)  # what it started and left behind
        return code

    def matches(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> bool:
        return self.argv == list(argv) and self.env == env and self.cwd == cwd

    def kill(self) -> None:
        """Kill the process and every process of its group (a launcher's child, its helpers)."""
        groups.end_group(self.popen)

    async def wait(self) -> int:
        """The exit status, once the process has exited (polled: no child watcher, no thread)."""
        delay = 0.0005
        while (code := self.popen.poll()) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.005)
        groups.end_group(self.popen)  # what it started and left behind
        return code

    def discard(self) -> None:
        """Kill a process nobody will use, and reap it."""
        self.kill()
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5.0)
        groups.end_group(self.popen)

    async def attach(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Its stdout and stdin as streams of the running loop (stderr in :attr:`stderr`)."""
        popen = self.popen
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        loop = asyncio.get_running_loop()
        stdout = asyncio.StreamReader(limit=MAX_LINE_BYTES, loop=loop)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stdout, loop=loop), popen.stdout
        )
        stderr = asyncio.StreamReader(limit=MAX_LINE_BYTES, loop=loop)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stderr, loop=loop), popen.stderr
        )
        transport, protocol = await loop.connect_write_pipe(lambda: _PipeWriter(loop), popen.stdin)
        self.stderr = stderr
        return stdout, asyncio.StreamWriter(transport, protocol, None, loop)


#: A pool of spares: processes started ahead for one environment, oldest first.
_Pool = collections.deque[_Spawned]


class _Spares:
    """Processes started ahead for a factory's next handlers, so start-up overlaps work.

    The kit starts a process per test case: a Node process takes 50 to 120 ms
    to be ready and a JVM several times that, which is most of the wall time
    of a verification when paid in series.  A spare is used only if it was
    started with the same command, directory and environment the next
    handler would use (the environment is compared in full, so a variable
    set in between is never missed: every spare is then killed and reaped).
    Spares are kept per time zone: each test case of the kit runs its
    processes with its own zone in ``TZ``, so a process started for one zone
    waits for the next test case in that zone while the others use theirs.
    Two are kept per zone, at most :attr:`LIMIT` in all (the zone used
    longest ago gives its up first); spares still unused when the factory
    goes away, or at exit, are killed.
    """

    DEPTH = 2
    LIMIT = 6

    def __init__(self) -> None:
        #: The spares of each time zone, the one used last at the end.
        self.pools: dict[tuple[object, ...], _Pool] = {}
        #: The environment but ``TZ`` every pool was started in.
        self.base: tuple[object, ...] | None = None

    @staticmethod
    def _key(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> tuple[object, ...]:
        return (tuple(argv), tuple(sorted(env.items())), cwd)

    def _pool(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> _Pool:
        """The spares for this environment, used last now; every other environment's but
        ``TZ`` is discarded (a variable set in between: their spares are stale)."""
        key = self._key(argv, env, cwd)
        base = self._key(argv, {k: v for k, v in env.items() if k != "TZ"}, cwd)
        if self.base != base:
            self.discard()
            self.base = base
        pool = self.pools.pop(key, None) or collections.deque()
        self.pools[key] = pool
        return pool

    @property
    def spares(self) -> list[_Spawned]:
        return [spare for pool in self.pools.values() for spare in pool]

    def take(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> _Spawned | None:
        pool = self._pool(argv, env, cwd)
        while pool:
            spare = pool.popleft()
            if spare.returncode is None and spare.matches(argv, env, cwd):
                return spare
            spare.discard()
        return None

    def refill(self, argv: Sequence[str], env: dict[str, str], cwd: str | None) -> None:
        pool = self._pool(argv, env, cwd)
        while len(pool) < self.DEPTH:
            try:
                pool.append(_Spawned(argv, env, cwd))
            except OSError:
                break  # the next handler starts its own and reports why it cannot
        # Over the limit: the zones used longest ago give up their spares first.
        while len(self.spares) > self.LIMIT:
            oldest = next(iter(self.pools))
            if self.pools[oldest] is pool:
                break
            for spare in self.pools.pop(oldest):
                spare.discard()

    def discard(self) -> None:
        while self.pools:
            _, pool = self.pools.popitem()
            while pool:
                pool.popleft().discard()


@dataclass(slots=True)
class _Pending:
    op: str
    label: str
    ctx: StateHandlerContext | None
    future: asyncio.Future[Any]
    #: Hand back the whole answer (schema-checked) instead of its decoded result.
    raw: bool = False
    #: The request's ``now`` (None for a replayed line) and its fields: a version's reading
    #: of an answer needs them.
    now: dt.datetime | None = None
    request: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class ExecHandler:
    """A :class:`~reference_engine.handler.StateHandler` served by a process over the protocol.

    The process is started by :meth:`open` (one process per handler, so each
    handler starts empty, as the kit requires) and ended by :meth:`close`.
    A :class:`TcpAddress` target connects to a server instead: one connection
    per handler, and the server gives each connection an empty store.
    """

    def __init__(
        self,
        command: Target,
        clock: Clock,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        failures: list[DsmError] | None = None,
        spares: _Spares | None = None,
        store: str | None = None,
        owns_store: bool = True,
        zone: str | None = None,
        recording: Recording | None = None,
    ) -> None:
        if store is not None and not STORE_NAME.fullmatch(store):
            raise ConfigurationError(
                f"a store name is 1-40 characters of a-z, 0-9 and _, starting with a letter; "
                f"got {store[:60]!r}"
            )
        self.target = command
        self.address = command if isinstance(command, TcpAddress) else None
        self.argv = [] if isinstance(command, TcpAddress) else split_command(command)
        self.command = describe_target(command)
        self.clock = clock
        self.timeout = default_timeout() if timeout is None else checked_timeout(timeout)
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        #: What the process said about itself on ``open``.
        self.concurrent = False
        #: Whether its store is one that other processes of the command reach too.
        self.shared_store = False
        #: The store named on ``open`` (None: the process chooses), and whether
        #: the process said it works in it, so that peers can be opened on it.
        self.store = store
        self.named_store = False
        #: The interface the process said it serves (``contract``, or ``seed``: the seed's
        #: tokenless writes), and the language it said it is written in (None: not said).
        self.shape = "contract"
        self.language: str | None = None
        #: The protocol version the process answered open with: its answers are read by that
        #: version's text (:mod:`dsm_sim.protocol.versions`).
        self.protocol = versions.NEWEST
        #: The one handler of a named store that removes it on ``close``.
        self.owns_store = owns_store
        #: The POSIX ``TZ`` the process runs in (set before :meth:`open`; the kit sets
        #: each test case's), also named in the ``open`` request; None: the harness's own.
        self.zone = zone
        self.name = ""
        #: Every request line written, in order: the raw material of a replay file.
        self.transcript: list[bytes] = []
        #: Each answer the handler gave, by request id: a counterexample printed as a test
        #: keeps the one read that showed the failure (:mod:`dsm_sim.conformance.tell.csharp`).
        self.answers: dict[int, dict[str, Any]] = {}
        #: The requests of this process and its peers, shared with them (a peer joins it).
        self.recording = Recording() if recording is None else recording
        self.process = 1 if recording is None else recording.join()
        #: The handler server's shared secret, sent with ``open`` over TCP only.
        self._secret: str | None = None
        self._process: _Spawned | None = None
        #: Where a process started ahead of time waits (a factory's), or None to start on open.
        self._spares = spares
        self._reader_stream: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._answered: set[int] = set()
        self._broken: DsmError | None = None
        self._stderr: collections.deque[bytes] = collections.deque()
        self._stderr_size = 0
        self._reader: asyncio.Task[None] | None = None
        self._stderr_reader: asyncio.Task[None] | None = None
        self._one_at_a_time = asyncio.Lock()
        #: Every protocol failure this handler met, in order (shared by a factory's handlers).
        self.failures: list[DsmError] = [] if failures is None else failures

    def __repr__(self) -> str:
        return f"ExecHandler({self.command!r})"

    @property
    def _peer(self) -> str:
        return "handler process" if self.address is None else f"handler server at {self.address}"

    def _record(self, error: DsmError) -> None:
        # The kit's story names only the error's class; the report quotes these in full.
        if len(self.failures) < MAX_RECORDED_FAILURES:
            self.failures.append(error)

    # --- the process or connection ---------------------------------------------------------

    async def connect(self) -> None:
        """Start the process (or connect to the server) without shaking hands.

        :meth:`open` is this plus the handshake; ``dsm replay`` sends the
        ``open`` of its file instead.
        """
        if self._writer is not None:
            return
        if self.address is not None:
            await self._connect_tcp(self.address)
            return
        env = {**os.environ, **(self.env or {})}
        if self.zone is not None:
            env["TZ"] = self.zone
        spawned = None if self._spares is None else self._spares.take(self.argv, env, self.cwd)
        if spawned is None:
            try:
                spawned = _Spawned(self.argv, env, self.cwd)
            except OSError as exc:
                error = HandlerStartError(
                    f"cannot start the handler command {self.command!r}: {exc}",
                    command=self.command,
                )
                self._record(error)
                raise error from exc
        self._process = spawned
        try:
            self._reader_stream, self._writer = await spawned.attach()
        except BaseException:
            spawned.discard()
            raise
        if self._spares is not None:
            self._spares.refill(self.argv, env, self.cwd)
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(
            self._read_answers(), name=f"dsm-exec-stdout[{self._process.pid}]"
        )
        self._stderr_reader = loop.create_task(
            self._read_stderr(), name=f"dsm-exec-stderr[{self._process.pid}]"
        )

    async def _connect_tcp(self, address: TcpAddress) -> None:
        try:
            self._reader_stream, self._writer = await asyncio.wait_for(
                asyncio.open_connection(address.host, address.port, limit=MAX_LINE_BYTES),
                remaining(self.timeout)[0],
            )
        except (OSError, TimeoutError) as exc:
            why = (
                f"no connection within {self.timeout:g}s" if isinstance(exc, TimeoutError) else exc
            )
            error = HandlerStartError(
                f"cannot connect to the handler server at {address}: {why}; start it first "
                "(e.g. dsm serve --tcp HOST:PORT MODULE:FACTORY) and give its address",
                command=self.command,
            )
            self._record(error)
            raise error from exc
        self._secret = client_secret(address.host, address.port, {**os.environ, **(self.env or {})})
        self._reader = asyncio.get_running_loop().create_task(
            self._read_answers(), name=f"dsm-exec-tcp[{address}]"
        )

    async def open(self) -> None:
        if self._writer is not None:
            return
        await self.connect()
        try:
            # Every version spoken, and 1 in "protocol" for a host written to version 1,
            # which reads no list and repeats it (docs/protocol.md, Versions).
            args: dict[str, Any] = {"protocol": versions.FIRST, "protocols": list(versions.OFFER)}
            if self.store is not None:
                args["store"] = self.store
            if self.zone is not None:
                args["zone"] = self.zone
            result = await self._call("open", args)
            version = versions.spoken(result["protocol"])
            if version is None:
                raise VersionMismatchError(offered=versions.OFFER, answered=result["protocol"])
        except BaseException:
            await self._shutdown()
            raise
        self.protocol = version.number
        self.concurrent = bool(result["concurrent"])
        self.shared_store = bool(result.get("shared_store", False))
        self.named_store = self.store is not None and bool(result.get("named_store", False))
        self.name = str(result.get("name", ""))
        self.shape = str(result.get("shape", "contract"))
        self.language = str(result.get("language", "")) or None

    #: Its calls run in another process: the kit cannot choose their interleaving.
    out_of_process = True

    @property
    def opens_in_zone(self) -> bool:
        """Whether the harness starts the process, so :attr:`zone` reaches it as ``TZ``.

        A server's (``--exec-tcp``) runs in the zone it was started in.
        """
        return self.address is None

    @property
    def pipelines_requests(self) -> bool:
        """Whether several requests may be on the wire at once (the process said so on open)."""
        return self.concurrent

    def peer(self) -> ExecHandler | None:
        """Another process on this handler's named store, or None when it has none.

        The peer shares the factory's command, environment, timeout and
        failure log, and never removes the store: the handler that named it
        does, on its own ``close`` after the peers'.
        """
        if not self.named_store or self.store is None:
            return None
        return ExecHandler(
            self.target,
            self.clock,
            timeout=self.timeout,
            env=self.env,
            cwd=self.cwd,
            failures=self.failures,
            spares=self._spares,
            store=self.store,
            owns_store=False,
            zone=self.zone,
            recording=self.recording,
        )

    async def close(self) -> None:
        """Ask the process to close, then make sure it is gone, whatever it did."""
        if self._writer is None:
            return
        try:
            if self._broken is None:
                last = self.named_store and self.owns_store
                await self._call("close", {"drop_store": True} if last else {})
        finally:
            await self._shutdown()

    async def disconnect(self) -> None:
        """End the process or connection without sending ``close`` (a replay file sends its own)."""
        await self._shutdown()

    async def _shutdown(self) -> None:
        writer = self._writer
        if writer is None:
            return
        if not writer.is_closing():
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        returncode: int | None = None
        process = self._process
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), remaining(self.timeout, final=True)[0])
            except TimeoutError:
                process.kill()
                await process.wait()
            returncode = process.returncode
        for task in (self._reader, self._stderr_reader):
            if task is None or task.done():
                # Done already, or cancelled by an earlier shutdown (open's, when open
                # failed): awaiting a cancelled task again would raise CancelledError.
                continue
            # On a timeout wait_for cancels it: a grandchild process keeps the pipe open.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task, 1.0)
        if self._broken is None:
            self._broken = HandlerExitedError(
                request="any request after close",
                returncode=returncode,
                stderr_tail="",
                peer=self._peer,
            )

    async def _read_stderr(self) -> None:
        process = self._process
        assert process is not None and process.stderr is not None
        while chunk := await process.stderr.read(4096):  # attached with stdout
            self._stderr.append(chunk)
            self._stderr_size += len(chunk)
            while self._stderr_size - len(self._stderr[0]) >= STDERR_TAIL_BYTES:
                self._stderr_size -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        text = b"".join(self._stderr)[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-20:])

    async def _settled_stderr(self) -> str:
        """The stderr tail once the process has written its last words (briefly waited for)."""
        if self._stderr_reader is not None and not self._stderr_reader.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stderr_reader), 0.5)
        return self.stderr_tail()

    async def _read_answers(self) -> None:
        stream = self._reader_stream
        assert stream is not None
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # the line outgrew the reader's limit
                self._break(
                    MalformedResponseError(
                        f"the handler wrote a line longer than {MAX_LINE_BYTES} bytes",
                        request=self._in_flight(),
                        expected=f"one JSON answer per line, at most {MAX_LINE_BYTES} bytes",
                    )
                )
                self._kill()
                return
            except ConnectionError:
                line = b""  # a server that reset the connection: reported as closed
            if not line:
                break
            if line.strip():
                self._dispatch(line)
        returncode: int | None = None
        if self._process is not None:
            with contextlib.suppress(TimeoutError):
                returncode = await asyncio.wait_for(self._process.wait(), 1.0)
        tail = await self._settled_stderr()
        self._break(
            HandlerExitedError(
                request=self._in_flight(), returncode=returncode, stderr_tail=tail, peer=self._peer
            )
        )

    def _kill(self) -> None:
        """Stop a peer that can no longer be trusted: kill the process, or drop the connection."""
        if self._process is not None:
            self._process.kill()
        elif self._writer is not None:
            self._writer.transport.abort()

    def _in_flight(self) -> str:
        labels = [pending.label for pending in self._pending.values()]
        return ", ".join(labels) if labels else "no request (none was in flight)"

    def _break(self, error: DsmError) -> None:
        """The stream can no longer be trusted: fail what is in flight and every later call."""
        if self._broken is None:
            self._broken = error
            if self._pending or not isinstance(error, HandlerExitedError):
                self._record(error)
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(copy.copy(error))
        self._pending.clear()

    # --- answers -------------------------------------------------------------------------

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
            shown = line[:120].decode("utf-8", "replace").rstrip("\n")
            self._break(
                MalformedResponseError(
                    f"the handler wrote a line that is not JSON ({exc}) while answering "
                    f"{self._in_flight()}: {shown!r}",
                    request=self._in_flight(),
                    expected="one JSON answer per line",
                )
            )
            self._kill()
            return
        if not isinstance(message, dict) or not isinstance(message.get("id"), int):
            found = problem("response", message)
            field = found.field if found is not None else "id"
            self._break(
                MalformedResponseError(
                    f"the handler wrote an answer without an integer id while answering "
                    f"{self._in_flight()}: {wire.short(message)}",
                    request=self._in_flight(),
                    field=field or "id",
                    expected="an object with the integer id of the request it answers",
                )
            )
            self._kill()
            return
        response_id = message["id"]
        pending = self._pending.pop(response_id, None)
        if pending is None:
            again = "answered already" if response_id in self._answered else "was never sent"
            self._break(
                UnexpectedResponseError(
                    f"the handler answered request id {response_id}, which {again} "
                    f"(in flight: {self._in_flight()})",
                    response_id=response_id,
                    request=f"request {response_id}",
                )
            )
            self._kill()
            return
        self._answered.add(response_id)
        self.answers[response_id] = message
        try:
            value = (
                self._check_raw(pending, message) if pending.raw else self._decode(pending, message)
            )
        except DsmError as exc:
            if isinstance(exc, ProtocolError | HandlerInternalError):
                self._record(exc)
            if not pending.future.done():
                pending.future.set_exception(exc)
            return
        if not pending.future.done():
            pending.future.set_result(value)

    def _check_raw(self, pending: _Pending, message: dict[str, Any]) -> dict[str, Any]:
        """The whole answer, once the schema has accepted it (``dsm replay`` prints it as is)."""
        found = problem("response", message)
        if found is None and "result" in message and "error" not in message:
            found = problem(f"result_{pending.op}", message["result"], prefix="result")
        if found is not None:
            raise MalformedResponseError(
                f"the answer to {pending.label} breaks the protocol schema at "
                f"{found.field or 'the top level'}: {found.message} (expected {found.expected})",
                request=pending.label,
                field=found.field,
                expected=found.expected,
            )
        return message

    def _decode(self, pending: _Pending, message: dict[str, Any]) -> Any:
        has_result, has_error = "result" in message, "error" in message
        if has_result == has_error:
            which = "both 'result' and 'error'" if has_result else "neither 'result' nor 'error'"
            raise MalformedResponseError(
                f"the answer to {pending.label} has {which}: {wire.short(message)}",
                request=pending.label,
                field="result" if has_result else "",
                expected="exactly one of 'result' and 'error'",
            )
        found = problem("response", message)
        if found is None and has_result:
            found = problem(f"result_{pending.op}", message["result"], prefix="result")
        if found is not None:
            raise MalformedResponseError(
                f"the answer to {pending.label} breaks the protocol schema at "
                f"{found.field or 'the top level'}: {found.message} (expected {found.expected})",
                request=pending.label,
                field=found.field,
                expected=found.expected,
            )
        if has_error:
            body = message["error"]
            kind = body["kind"]
            # An answer the handler's version gave for what a later version named.
            reading = versions.earlier_reading(
                self.protocol, kind, pending.op, pending.ctx, pending.now, pending.request
            )
            if reading is not None:
                raise reading
            if body["kind"] == "bad_request":
                raise ProtocolError(
                    f"the handler refused {pending.label} as malformed: {body['message']}",
                    request=pending.label,
                )
            if body["kind"] == "unauthorized":
                raise HandlerUnauthorizedError(
                    f"the {self._peer} refused the connection: {body['message']}. Give the "
                    f"harness the server's secret in {SECRET_ENV} (or a file named by "
                    f"{SECRET_FILE_ENV}), as docs/protocol.md describes",
                    command=self.command,
                )
            if body["kind"] == "internal":
                note = versions.note(
                    self.protocol, kind, pending.op, pending.ctx, pending.now, pending.request
                )
                raise HandlerInternalError(
                    f"the handler failed on {pending.label}: {body['message']}{note}",
                    request=pending.label,
                    error_type=str(body.get("type", "")),
                )
            raise wire.decode_error(body, pending.ctx)
        result = message["result"]
        if pending.op == "get" and result is not None:
            try:
                return wire.decode_record(result)
            except wire.WireValueError as exc:
                raise MalformedResponseError(
                    f"the answer to {pending.label} passes the protocol schema but cannot be "
                    f"decoded at {exc.field}: {exc.problem}",
                    request=pending.label,
                    field=exc.field,
                    expected="a real instant (YYYY-MM-DD within the calendar) and data_json "
                    "that is JSON nested at most as deep as the reader follows",
                ) from None
        return result

    # --- requests ------------------------------------------------------------------------

    async def _call(
        self, op: str, args: dict[str, Any], ctx: StateHandlerContext | None = None
    ) -> Any:
        if self._writer is None:
            raise ProtocolError(f"{op} was called before open()", request=op)
        if self._broken is not None:
            raise copy.copy(self._broken)
        if self.concurrent:
            return await self._exchange(next(self._ids), op, args, ctx)
        async with self._one_at_a_time:  # ids in the order the requests go out
            return await self._exchange(next(self._ids), op, args, ctx)

    async def send_raw(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request message as it is (its own id and ``now``); the whole answer back.

        ``dsm replay`` sends the lines of a replay file this way, one at a time.
        The answer is schema-checked like any other; an error answer is
        returned, not raised, so it can be shown next to its request.
        """
        if self._writer is None:
            raise ProtocolError("send_raw was called before connect()", request="replay")
        if self._broken is not None:
            raise copy.copy(self._broken)
        request_id = message.get("id")
        if not isinstance(request_id, int) or request_id in self._pending:
            raise ProtocolError(
                f"a replayed request needs an id not in flight, got {request_id!r}",
                request="replay",
                field="id",
                expected="a positive integer not in flight",
            )
        # A file may reuse an id once its earlier request was answered.
        self._answered.discard(request_id)
        op = str(message.get("op", "?"))
        answer: dict[str, Any] = await self._exchange(
            request_id, op, {}, None, raw=True, prepared=dict(message)
        )
        return answer

    async def _exchange(
        self,
        request_id: int,
        op: str,
        args: dict[str, Any],
        ctx: StateHandlerContext | None,
        *,
        raw: bool = False,
        prepared: dict[str, Any] | None = None,
    ) -> Any:
        writer = self._writer
        assert writer is not None
        if self._broken is not None:  # broke while this call waited for its turn
            raise copy.copy(self._broken)
        now: dt.datetime | None = None
        if prepared is not None:
            message = prepared
            item = (
                message.get("context", {}).get("item_key")
                if isinstance(message.get("context"), dict)
                else None
            )
        else:
            now = self.clock.now()
            message = {"id": request_id, "op": op, "now": wire.encode_instant(now)}
            if ctx is not None:
                message["context"] = wire.encode_context(ctx)
            message.update(args)
            item = None if ctx is None else ctx.item_key
        label = f"request {request_id} ({op}{'' if item is None else ' ' + repr(item)})"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[request_id] = _Pending(op, label, ctx, future, raw, now, message)
        # A timer, not wait_for: see the module's docstring.  Never past the command's
        # wall-clock deadline (a closing request gets a short grace past it).
        wait, by_deadline = remaining(self.timeout, final=op == "close")
        timer = loop.call_later(wait, self._time_out, request_id, label, by_deadline)
        line = wire.encode_line(message)
        self.transcript.append(line)
        recorded = self.recording.sent(self.process, line)
        if op == "open" and self._secret is not None:
            # The secret goes on the wire only: transcripts become replay files people share.
            line = wire.encode_line({**message, "secret": self._secret})
        try:
            try:
                writer.write(line)
                # Inside the deadline: a peer that stops reading fills the pipe, and the
                # timer's kill wakes this drain.
                await writer.drain()
            except ConnectionError:
                pass  # the peer is gone; the reader reports how, with its stderr
            return await future
        finally:
            timer.cancel()
            self.recording.answered(recorded)

    def _time_out(self, request_id: int, label: str, by_deadline: bool = False) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None or pending.future.done():
            return
        error: DsmError
        if by_deadline:
            # Not the handler's failure: the command ran out of time while it waited.
            error = past_deadline(f"{label} waited for the {self._peer}, which was stopped")
            self._broken = self._broken or error
        else:
            error = HandlerTimeoutError(
                request=label, timeout=self.timeout, stderr_tail=self.stderr_tail()
            )
            # A hang like an in-process call's: the kit stops at the first of either.
            note_hang(
                f"{label} got no answer from the {self._peer} within the {self.timeout:g}s "
                "request timeout (--exec-timeout)"
            )
        pending.future.set_exception(error)
        self._break(error)
        self._kill()

    # --- the handler Protocol ------------------------------------------------------------

    async def exists(self, ctx: StateHandlerContext) -> bool:
        result: bool = await self._call("exists", {}, ctx)
        return result

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        # The answer was decoded (or refused as malformed) as it arrived.
        result: StateRecord | None = await self._call("get", {}, ctx)
        return result

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        result: int | None = await self._call("try_acquire_lock", {}, ctx)
        return result

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        data_json = wire.wire_data(data, status)
        wire_status = status.value if isinstance(status, IdempotencyStatus) else str(status)
        await self._call("set", {"status": wire_status, "data_json": data_json}, ctx)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await self._call("release_lock_as_failed", {"error_detail": error_detail}, ctx)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await self._call("upsert", {"data_json": wire.wire_data(data)}, ctx)

    async def reset_expired_locks(self) -> int:
        result: int = await self._call("reset_expired_locks", {})
        return result

    async def expire_past_retention(self) -> int:
        result: int = await self._call("expire_past_retention", {})
        return result


class ExecFactory:
    """A handler factory for a command line (or a server's address): each call builds a handler.

    Each handler runs on its own process (or connection).  The request lines
    of the latest handler built are kept in :attr:`last_transcript`: after a
    failing verification run, that is the shrunk counterexample Hypothesis
    replayed last.
    """

    def __init__(
        self,
        command: Target,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        named_stores: bool = True,
    ) -> None:
        if not isinstance(command, TcpAddress):
            split_command(command)  # an empty command is a usage error now, not at the first open
        # A bad bound (here or in $DSM_EXEC_TIMEOUT) is a usage error now, not at the first open.
        if timeout is None:
            default_timeout()
        else:
            checked_timeout(timeout)
        self.target = command
        self.command = describe_target(command)
        self.timeout = timeout
        self.env = env
        self.cwd = cwd
        #: Whether each handler names a fresh store of its own on ``open``.
        self.named_stores = named_stores
        # Not importable by name: a printed reproduction says "your_factory" instead
        # of naming this class, which would not build the same handler.
        kind = "exec-tcp" if isinstance(command, TcpAddress) else "exec"
        shown = str(command) if isinstance(command, TcpAddress) else self.command
        self.__qualname__ = f"<{kind} {shown}>"
        #: The processes started ahead for the next handlers; killed when this factory goes.
        self._spares = _Spares()
        weakref.finalize(self, self._spares.discard)
        #: Protocol failures of every handler built here, first ones first.
        self.failures: list[DsmError] = []
        #: The request lines of the latest handler built, as sent, and its answers by id.
        self.last_transcript: list[bytes] = []
        self.last_answers: dict[int, dict[str, Any]] = {}
        #: The requests of the latest handler built and of its peers, as sent.
        self.last_recording = Recording()
        #: What the handler said on its first ``open`` (:func:`preflight`): its interface,
        #: its language and the protocol version it is judged by.
        self.shape = "contract"
        self.language: str | None = None
        self.protocol = versions.NEWEST

    @property
    def dsm_semantics(self) -> Any:
        """The semantics profile the handler's shape calls for (``seed``), else None.

        ``dsm verify`` reads it as a Python factory's declared profile, so a
        handler of the seed's interface is judged under ``seed`` without a flag.
        """
        if self.shape == "seed":
            from dsm_sim.conformance.judge.semantics import SEED

            return SEED
        return None

    def __call__(self, clock: Clock) -> ExecHandler:
        handler = ExecHandler(
            self.target,
            clock,
            timeout=self.timeout,
            env=self.env,
            cwd=self.cwd,
            failures=self.failures,
            spares=None if isinstance(self.target, TcpAddress) else self._spares,
            store=fresh_store_name() if self.named_stores else None,
        )
        self.last_transcript = handler.transcript
        self.last_answers = handler.answers
        self.last_recording = handler.recording
        return handler

    def __repr__(self) -> str:
        if isinstance(self.target, TcpAddress):
            return f"tcp_factory({str(self.target)!r})"
        return f"exec_factory({self.command!r})"

    def _identity(self) -> tuple[object, ...]:
        env = None if self.env is None else tuple(sorted(self.env.items()))
        target = self.target if isinstance(self.target, TcpAddress) else self.command
        return (target, self.timeout, env, self.cwd, self.named_stores)

    # Equal for the same command line: the pytest suite verifies once per factory,
    # and each test's fixture builds a new one.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExecFactory) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())


def exec_factory(
    command: str | Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    named_stores: bool = True,
) -> ExecFactory:
    """``(clock) -> handler`` for the handler process ``command`` starts.

    ``named_stores=False`` never names a store on ``open``, so no handler
    gets peers: every call of a test case goes to one process.
    """
    return ExecFactory(command, timeout=timeout, env=env, cwd=cwd, named_stores=named_stores)


def tcp_factory(address: str | TcpAddress, *, timeout: float | None = None) -> ExecFactory:
    """``(clock) -> handler`` for a handler server at ``host:port``: one connection per handler."""
    target = parse_address(address) if isinstance(address, str) else address
    return ExecFactory(target, timeout=timeout)


def preflight(factory: ExecFactory) -> str | None:
    """Start the process once and shake hands: why it cannot be verified, or None.

    A command that is misspelt or speaks another protocol would otherwise fail
    every test case the same way; said once, before the run, it is a usage error.
    """
    from reference_engine.clock import ManualClock

    async def probe() -> None:
        handler = factory(ManualClock())
        try:
            await handler.open()
            factory.shape, factory.language = handler.shape, handler.language
            factory.protocol = handler.protocol
        finally:
            await handler.close()

    try:
        asyncio.run(probe())
    except DsmError as exc:
        return str(exc)
    return None
