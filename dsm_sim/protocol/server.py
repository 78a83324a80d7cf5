"""``dsm serve MODULE:FACTORY``: any Python handler factory, served over the protocol.

This is how the protocol itself is verified: the in-memory handler served
here and driven through :class:`~dsm_sim.protocol.client.ExecHandler` must
pass the kit exactly as it does in process, so any loss on the wire (an
instant cut to milliseconds, a payload re-parsed, an error kind mapped to
the wrong class) shows as a violation of the reference model.

The served handler's clock is the ``now`` of the request it is answering:
each request runs as its own task, and a context variable carries that
task's ``now``, so concurrent requests never see each other's instant.
Requests are validated against the schema too; a malformed one is answered
with error kind ``bad_request``.

``dsm serve --tcp HOST:PORT`` listens instead, with the same framing: each
connection is a session of its own, with its own handler built on its
``open`` (so each starts with an empty store, as the kit's test cases
need), and the server runs until it is stopped.  It prints the address it
listens on as its first line on stdout (port 0 picks a free one), so a
script can start it and read where to connect.

Named stores: a connection whose ``open`` names a store (``"store"``) that
another live connection of the server opened gets a peer of that
connection's handler (:meth:`~reference_engine.instances.SharedStoreHandler.peer`),
so the kit's workers reach one store through separate sessions, as they do
in process.  The server answers ``"named_store": true`` only when the
handler can give peers; the store is forgotten when the connection that
named it first closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import datetime as dt
import json
import os
import re
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from typing import IO, Any, Protocol

from dsm_sim.protocol import versions, wire
from dsm_sim.protocol.client import TcpAddress, parse_address
from dsm_sim.protocol.schema import SchemaProblem, load_schema, problem
from dsm_sim.protocol.secret import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    ServerSecret,
    matches,
    server_secret,
)
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.instances import peer_of
from reference_engine.registry import build_handler
from reference_engine.status import IdempotencyStatus

__all__ = ["RequestClock", "Server", "configure", "main", "serve", "serve_tcp"]

#: The operations of the protocol, as the schema names them.
_OPS = tuple(load_schema()["$defs"]["request"]["properties"]["op"]["enum"])
_NOW: contextvars.ContextVar[dt.datetime] = contextvars.ContextVar("dsm_request_now")
#: The id at the start of a line that is not JSON as a whole (``{"id": 7, ...``).
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d{1,15})\s*[,}]')
#: The longest request line read (a payload at the size limit, escaped, fits many times).
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class _BadRequest(Exception):
    """A well-formed request this server cannot serve (another version, a call before open)."""


class _Unauthorized(Exception):
    """An ``open`` without the server's secret: answered ``unauthorized``, then the session ends."""


class RequestClock:
    """The clock a served handler reads: the ``now`` of the request it is serving.

    Outside any request (a factory reading the clock while it builds the
    handler) it answers the latest request's instant.
    """

    def __init__(self) -> None:
        self.latest: dt.datetime | None = None

    def now(self) -> dt.datetime:
        instant = _NOW.get(None) or self.latest
        if instant is None:
            raise RuntimeError("no request has been received yet, so there is no 'now'")
        return instant

    def __repr__(self) -> str:
        return f"RequestClock(latest={self.latest!r})"


class NamedStores:
    """The handlers that first opened each named store in one server process.

    A later session naming the same store is given a peer of that handler;
    a store whose handler offers no peer is not shared (each session then
    gets a store of its own, and says so by answering without
    ``named_store``).
    """

    def __init__(self) -> None:
        self.owners: dict[str, StateHandler] = {}

    def peer(self, store: str) -> StateHandler | None:
        owner = self.owners.get(store)
        return None if owner is None else peer_of(owner)

    def claim(self, store: str, handler: StateHandler) -> bool:
        """Make ``handler`` the owner of ``store``; whether peers of it can share it."""
        spare = peer_of(handler)
        if spare is None:
            return False
        self.owners[store] = handler
        return True

    def release(self, handler: StateHandler) -> None:
        for store in [name for name, owner in self.owners.items() if owner is handler]:
            del self.owners[store]


class Server:
    """Answers protocol requests with one handler built by ``factory`` on ``open``."""

    def __init__(
        self,
        factory: HandlerFactory,
        send: Callable[[bytes], None],
        *,
        shared_store: bool = False,
        stores: NamedStores | None = None,
        secret: str | None = None,
    ) -> None:
        self.factory = factory
        #: The secret every ``open`` must carry (a TCP server's); None on stdin, whose
        #: only client is the process that started this one.
        self.secret = secret
        self.send = send
        #: Declared on ``open``: the factory's handlers all reach one store (``--shared-store``).
        self.shared_store = shared_store
        self.clock = RequestClock()
        self.handler: StateHandler | None = None
        #: Where this server's sessions find each other's named stores; None
        #: for a server of one session (stdin), whose store no other process
        #: can reach, so it never claims to work in a named one.
        self.stores = stores
        self.named_store = False
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()

    def write(self, message: dict[str, Any]) -> None:
        # One synchronous write per answer: concurrent tasks never interleave a line.
        self.send(wire.encode_line(message))

    def refuse(self, request_id: int, why: str) -> None:
        """Answer one request with ``bad_request``; the session goes on."""
        self.write({"id": request_id, "error": {"kind": "bad_request", "message": why}})

    def receive(self, line: bytes) -> None:
        """Start answering one request line (as a task of its own)."""
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            why = "JSON nested too deep to read" if isinstance(exc, RecursionError) else str(exc)
            # A line that starts like a request still gets its answer, so the client waits
            # for nothing; without a readable id there is no one to answer.
            leading = _LEADING_ID.match(line)
            if leading is not None and int(leading.group(1)) >= 1:
                self.refuse(int(leading.group(1)), f"the request line is not JSON: {why}")
            else:
                sys.stderr.write(f"dsm serve: a request line is not JSON ({why}); ignored\n")
            return
        request_id = message.get("id") if isinstance(message, dict) else None
        op = message.get("op") if isinstance(message, dict) else None
        found: SchemaProblem | None
        if op not in _OPS:
            found = SchemaProblem("op", f"one of {', '.join(_OPS)}", f"unknown op {op!r}")
        else:  # the op's own shape gives a precise field; the union would not
            found = problem(f"request_{op}", message)
        if found is not None or not isinstance(request_id, int):
            if isinstance(request_id, int) and request_id >= 1:
                where = found.field if found is not None else "id"
                why = found.message if found is not None else "no integer id"
                self.write(
                    {
                        "id": request_id,
                        "error": {"kind": "bad_request", "message": f"{where}: {why}"},
                    }
                )
            else:
                sys.stderr.write(
                    f"dsm serve: a request without a usable id: {wire.short(message)}\n"
                )
            return
        try:
            now = wire.decode_instant(message["now"], "now")
        except wire.WireValueError as exc:
            self.refuse(request_id, str(exc))
            return
        self.clock.latest = now
        task = asyncio.get_running_loop().create_task(
            self._answer(message, now), context=contextvars.copy_context()
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, message: dict[str, Any], now: dt.datetime) -> None:
        _NOW.set(now)
        request_id = message["id"]
        try:
            result = await self._perform(message)
        except (_BadRequest, wire.WireValueError) as exc:
            self.refuse(request_id, str(exc))
            return
        except _Unauthorized as exc:
            self.closed = True  # nothing more is read from a client that cannot authenticate
            self.write({"id": request_id, "error": {"kind": "unauthorized", "message": str(exc)}})
            return
        except Exception as exc:  # every refusal (and any crash) is an answer, never a dead server
            self.write({"id": request_id, "error": wire.encode_error(exc)})
            return
        self.write({"id": request_id, "result": result})

    async def _perform(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        if op == "open":
            if self.secret is not None and not matches(self.secret, message.get("secret")):
                said = "a wrong secret" if "secret" in message else "no secret"
                raise _Unauthorized(
                    f"this handler server takes connections that know its shared secret, and "
                    f"this open carried {said}; the harness sends it from {SECRET_ENV}, "
                    f"{SECRET_FILE_ENV}, or on loopback the file the server wrote when it started"
                )
            offer = versions.offered(message["protocol"], message.get("protocols"))
            if versions.NEWEST not in offer:
                raise _BadRequest(
                    f"this server speaks protocol version {versions.NEWEST}; the open offered "
                    f"{versions.describe(offer)}. A harness that speaks version {versions.NEWEST} "
                    f"offers it in 'protocols' (docs/protocol.md, Versions)"
                )
            name = getattr(self.factory, "__qualname__", type(self.factory).__name__)
            store = message.get("store")
            if self.handler is None:
                joined = None if store is None or self.stores is None else self.stores.peer(store)
                if joined is None:
                    self.handler = build_handler(self.factory, self.clock, name=name)
                else:
                    self.handler = joined
                self.named_store = joined is not None
            await self.handler.open()
            if store is not None and self.stores is not None and not self.named_store:
                self.named_store = self.stores.claim(store, self.handler)
            answer: dict[str, Any] = {
                "protocol": versions.NEWEST,
                "concurrent": True,
                "name": f"dsm serve {name}",
            }
            if self.shared_store:
                answer["shared_store"] = True
            if self.named_store:
                answer["named_store"] = True
            return answer
        handler = self.handler
        if handler is None:
            raise _BadRequest(f"{op} before open")
        if op == "close":
            self.closed = True
            if self.stores is not None:
                self.stores.release(handler)
            await handler.close()
            return None
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "reset_expired_locks": handler.reset_expired_locks,
            "expire_past_retention": handler.expire_past_retention,
        }
        if op in calls:
            return await calls[op]()
        ctx = wire.decode_context(message["context"])
        if op == "exists":
            return await handler.exists(ctx)
        if op == "get":
            record = await handler.get(ctx)
            return None if record is None else wire.encode_record(record)
        if op == "try_acquire_lock":
            return await handler.try_acquire_lock(ctx)
        if op == "set":
            status = IdempotencyStatus(message["status"])
            await handler.set(ctx, status, _data(message["data_json"]))
            return None
        if op == "release_lock_as_failed":
            await handler.release_lock_as_failed(ctx, message["error_detail"])
            return None
        assert op == "upsert"
        await handler.upsert(ctx, _data(message["data_json"]))
        return None


def _data(data_json: str | None) -> Any:
    return wire.decode_data(data_json, "data_json")


class LineSource(Protocol):
    """Where a session reads request lines: a stream reader, or a file read in a thread."""

    async def readline(self) -> bytes: ...


class FileLines:
    """Request lines of a regular file (``dsm serve F < requests.jsonl``), read in a thread.

    asyncio reads only pipes, sockets and terminals without blocking, so a file
    on stdin is read a line at a time off the event loop, with the same line
    limit as a pipe (a longer line is a ``ValueError``, as from the reader).
    """

    def __init__(self, stream: IO[bytes], limit: int = MAX_REQUEST_BYTES) -> None:
        self.stream = stream
        self.limit = limit

    async def readline(self) -> bytes:
        loop = asyncio.get_running_loop()
        line = await loop.run_in_executor(None, self.stream.readline, self.limit + 1)
        if len(line) > self.limit:
            raise ValueError(f"a line is over {self.limit} bytes")
        return line


async def serve(factory: HandlerFactory, out: IO[bytes], *, shared_store: bool = False) -> None:
    """Answer requests from stdin until ``close`` has been answered or stdin ends."""
    loop = asyncio.get_running_loop()
    reader: LineSource
    if stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
        reader = FileLines(sys.stdin.buffer)
    else:
        stream = asyncio.StreamReader(limit=MAX_REQUEST_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), sys.stdin)
        reader = stream

    def send(line: bytes) -> None:
        out.write(line)
        out.flush()

    await _session(factory, reader, send, shared_store=shared_store)


async def serve_tcp(
    factory: HandlerFactory,
    address: TcpAddress,
    announce: Callable[[str], None],
    *,
    shared_store: bool = False,
    secret: ServerSecret,
    drawn: bool = False,
) -> None:
    """Serve every connection to ``address`` as a session of its own, until cancelled.

    Every connection's ``open`` must carry ``secret``; a ``drawn`` one is written
    where a harness on this machine finds it by the address, and removed at the end.
    """

    stores = NamedStores()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _session(
                factory,
                reader,
                writer.write,
                shared_store=shared_store,
                stores=stores,
                secret=secret.value,
            )
        except ConnectionError:
            pass  # the harness dropped the connection (a timeout): nothing left to answer
        except asyncio.CancelledError:
            # The server is stopping (Ctrl-C, SIGTERM) with this connection open: the session
            # ends here.  Ending normally, not cancelled: asyncio's stream callback would
            # print the cancellation as an error with its traceback.
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(
        on_connection, address.host, address.port, limit=MAX_REQUEST_BYTES
    )
    host, port = server.sockets[0].getsockname()[:2]
    # A stop (SIGTERM from a CI timeout or a test's terminate) ends the serving task, so the
    # drawn secret's file is removed rather than left behind for the next server on the port.
    loop, serving = asyncio.get_running_loop(), asyncio.current_task()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        if serving is not None:
            loop.add_signal_handler(signal.SIGTERM, serving.cancel)
    try:
        if drawn:
            secret.write_for(address.host, port)
        shown = "" if secret.written is None else f" (secret in {secret.written})"
        announce(f"{TcpAddress(host, port)}{shown}")
        async with server:
            await server.serve_forever()
    finally:
        secret.remove()


async def _session(
    factory: HandlerFactory,
    reader: LineSource,
    send: Callable[[bytes], None],
    *,
    shared_store: bool = False,
    stores: NamedStores | None = None,
    secret: str | None = None,
) -> None:
    server = Server(factory, send, shared_store=shared_store, stores=stores, secret=secret)
    try:
        while not server.closed:
            try:
                line = await reader.readline()
            except ValueError:
                sys.stderr.write(f"dsm serve: a request line is over {MAX_REQUEST_BYTES} bytes\n")
                break
            except ConnectionError:
                break  # the harness dropped the connection (a timeout): the session ends
            if not line:
                break
            if line.strip():
                server.receive(line)
            await asyncio.sleep(0)  # let the request's task start in arrival order
        if server.tasks:
            await asyncio.gather(*server.tasks, return_exceptions=True)
    finally:
        # Also when the server stops with the session open (cancelled): requests still
        # running are cancelled and the handler releases its store.
        for task in server.tasks:
            task.cancel()
        if server.handler is not None and not server.closed:
            if server.stores is not None:
                server.stores.release(server.handler)
            await server.handler.close()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tcp",
        metavar="[HOST:]PORT",
        default=None,
        help="listen on this TCP address instead of stdin/stdout, one session per "
        "connection (a bare PORT listens on 127.0.0.1; port 0 picks a free port; the address "
        "is printed first). Every connection must know the shared secret: "
        f"{SECRET_ENV} or --secret-file; on loopback without one, the server draws one and "
        "writes it where the harness finds it. Any other address needs one",
    )
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        default=None,
        help=f"with --tcp: the file holding the shared secret (else {SECRET_ENV}, "
        f"{SECRET_FILE_ENV})",
    )
    parser.add_argument(
        "--shared-store",
        action="store_true",
        help="declare on open that every process (and connection) of this factory reaches "
        "one store, as dsm stress requires; only for a factory whose store is shared, e.g. "
        "dsm_sim.stress.factories:stress_sql_handler on the run's database",
    )
    parser.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        help="handler factory to serve on stdin/stdout, e.g. "
        "reference_engine.handlers.memory:in_memory_handler",
    )


def main(args: argparse.Namespace) -> int:
    from reference_engine.registry import check_factory, load_factory

    try:
        factory = load_factory(args.factory)
        check_factory(factory, args.factory)
        address = None if args.tcp is None else parse_address(_with_host(args.tcp), listen=True)
        if address is None and args.secret_file is not None:
            raise ConfigurationError("--secret-file goes with --tcp; stdin needs no secret")
        secret, drawn = (
            (None, False) if address is None else server_secret(address.host, args.secret_file)
        )
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm serve: {exc}\n")
        return 2
    if address is not None:
        assert secret is not None
        return _main_tcp(
            factory, address, shared_store=args.shared_store, secret=secret, drawn=drawn
        )
    # The protocol owns stdout: anything the handler prints goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr
    try:
        asyncio.run(serve(factory, out, shared_store=args.shared_store))
    finally:
        out.close()
    return 0


def _with_host(text: str) -> str:
    """``--tcp PORT`` (or ``:PORT``) listens on loopback: a stranger cannot reach it."""
    bare = text.strip().removeprefix(":")
    return f"127.0.0.1:{bare}" if bare.isdigit() else text


def _main_tcp(
    factory: HandlerFactory,
    address: TcpAddress,
    *,
    shared_store: bool,
    secret: ServerSecret,
    drawn: bool,
) -> int:
    def announce(where: str) -> None:
        print(f"dsm serve: listening on {where}", flush=True)

    try:
        asyncio.run(
            serve_tcp(
                factory,
                address,
                announce,
                shared_store=shared_store,
                secret=secret,
                drawn=drawn,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    except OSError as exc:  # the address is taken, or not ours to bind
        sys.stderr.write(f"dsm serve: cannot listen on {address}: {exc}\n")
        return 2
    return 0
