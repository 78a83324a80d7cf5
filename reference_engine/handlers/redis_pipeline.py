"""One pipelined Redis connection for the handler's scripts: the hot path's round trips, batched.

Every per-item write of :class:`~reference_engine.handlers.redis_handler.RedisStateHandler`
is one ``EVALSHA``.  Through a connection pool, each concurrent caller checks
out a connection, sends, waits and returns it: a system call each way per
call, and the client library's per-command machinery (pool, retry wrapper,
timeouts) around each.  Here a command sent while nothing is in flight
leaves at once; commands sent while replies are awaited go into one buffer
that is flushed once per event-loop iteration; and the replies, which Redis
sends in order, resolve the callers' futures in order.  Eight callers
cost one ``send`` and usually one ``recv``, and a lone caller pays only for
its own command.

Every reply is awaited at most ``timeout`` seconds (the handler's command
timeout, as redis-py's ``socket_timeout`` bounds its own reads): a server
that stops answering (frozen, a dead network path) fails the call with
``redis.exceptions.TimeoutError``, and the connection is dropped, since a
reply that comes later would answer the wrong caller.

Deliberately small: RESP2 replies (status, error, integer, bulk string,
array), ``AUTH`` and ``SELECT`` from the URL, TCP or a Unix socket.  A TLS
URL (``rediss://``) is not handled here; the handler then keeps redis-py's
pool for its scripts.  Failures are raised as redis-py's own exception
classes, so the handler's one error mapping (``StoreError``) covers both.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["DEFAULT_TIMEOUT_S", "PipelinedConnection", "pipelinable"]

#: Seconds a reply may take by default: redis-py's own default ``socket_timeout``.
DEFAULT_TIMEOUT_S = 5.0

_CRLF = b"\r\n"


def pipelinable(url: str) -> bool:
    """Whether :class:`PipelinedConnection` can serve ``url`` (no TLS)."""
    return not url.startswith("rediss://")


def _encode(args: tuple[str | int | bytes, ...]) -> bytes:
    """One command as a RESP array of bulk strings.

    The hot loop: the usual command is all ASCII text, for which a character
    count is a byte count, so it is framed as one string and encoded once;
    anything else is framed argument by argument in bytes.
    """
    parts = [f"*{len(args)}\r\n"]
    for arg in args:
        text = arg if type(arg) is str else str(arg) if type(arg) is int else None
        if text is None:
            return _encode_bytes(args)
        parts.append(f"${len(text)}\r\n{text}\r\n")
    framed = "".join(parts)
    return framed.encode("ascii") if framed.isascii() else _encode_bytes(args)


def _encode_bytes(args: tuple[str | int | bytes, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if type(arg) is str:
            data = arg.encode("utf-8")
        elif type(arg) is bytes:
            data = arg
        else:
            data = str(arg).encode("utf-8")
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class _Incomplete(Exception):
    """The buffer ends inside a reply; wait for more bytes."""


class _Parser:
    """Incremental RESP2 reader over a growing buffer."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.pos = 0

    def feed(self, data: bytes) -> None:
        if self.pos:
            del self.buffer[: self.pos]
            self.pos = 0
        self.buffer += data

    def replies(self) -> list[Any]:
        out: list[Any] = []
        while self.pos < len(self.buffer):
            start = self.pos
            try:
                out.append(self._reply())
            except _Incomplete:
                self.pos = start
                break
        return out

    def _line(self) -> bytes:
        end = self.buffer.find(_CRLF, self.pos)
        if end < 0:
            raise _Incomplete
        line = bytes(self.buffer[self.pos : end])
        self.pos = end + 2
        return line

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8")
        if kind == b"-":
            text = rest.decode("utf-8", "replace")
            return NoScriptError(text) if text.startswith("NOSCRIPT") else ResponseError(text)
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            end = self.pos + size
            if end + 2 > len(self.buffer):
                raise _Incomplete
            value = bytes(self.buffer[self.pos : end]).decode("utf-8")
            self.pos = end + 2
            return value
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise ResponseError(f"unexpected reply from Redis: {line[:40]!r}")


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: PipelinedConnection) -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        self.owner._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._lost(exc)


class PipelinedConnection:
    """Commands from any number of callers on one connection, flushed once per loop turn.

    Opened on first use on the running loop (connections belong to their
    loop); a lost connection fails every call in flight with
    ``redis.exceptions.ConnectionError`` (their outcome is unknown, as with
    any client) and the next call connects afresh.
    """

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.options = cast(Callable[[str], dict[str, Any]], parse_url)(url)
        #: Seconds a reply (or a connect) may take before the call fails and the link drops.
        self.timeout = timeout
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._parser = _Parser()

    async def execute(self, *args: str | int | bytes) -> Any:
        """Send one command and await its reply; an error reply is raised."""
        if self._transport is None:
            await self._connect()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue(_encode(args), future)
        reply = await self._reply(future)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _reply(self, future: asyncio.Future[Any]) -> Any:
        """``future``'s reply, or a timeout that drops the connection (a timer: no task)."""
        timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, future: asyncio.Future[Any]) -> None:
        if future.done():
            return
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        self._fail(
            RedisTimeoutError(
                f"Redis did not answer within {self.timeout:g}s (the handler's command "
                "timeout): the server is frozen, overloaded or unreachable"
            )
        )

    async def evalsha(
        self, sha: str, script: str | bytes, keys: list[str], args: list[str | int]
    ) -> Any:
        """``EVALSHA``, loading the script once when the server does not know it."""
        try:
            return await self.execute("EVALSHA", sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self.execute("EVAL", script, len(keys), *keys, *args)

    def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._fail(RedisConnectionError("the connection was closed"))

    # --- internals -------------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._connecting is not None:
            await asyncio.shield(self._connecting)
            return
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            try:
                path = self.options.get("path")
                if path:
                    opening = loop.create_unix_connection(lambda: _Protocol(self), path)
                else:
                    host = self.options.get("host", "localhost")
                    port = int(self.options.get("port", 6379))
                    opening = loop.create_connection(lambda: _Protocol(self), host, port)
                transport, _ = await asyncio.wait_for(opening, self.timeout)
            except TimeoutError as exc:
                raise RedisTimeoutError(
                    f"cannot connect to Redis within {self.timeout:g}s (the handler's command "
                    "timeout)"
                ) from exc
            except OSError as exc:
                raise RedisConnectionError(f"cannot connect to Redis: {exc}") from exc
            # No isinstance check: other event loops (uvloop) have transport types of their own.
            self._parser = _Parser()
            self._transport = transport
            setup: list[tuple[str | int, ...]] = []
            if self.options.get("password"):
                user = self.options.get("username")
                password = self.options["password"]
                setup.append(("AUTH", user, password) if user else ("AUTH", password))
            if self.options.get("db"):
                setup.append(("SELECT", int(self.options["db"])))
            for command in setup:
                future: asyncio.Future[Any] = loop.create_future()
                self._queue(_encode(command), future)
                reply = await self._reply(future)
                if isinstance(reply, ResponseError):
                    self.close()
                    raise reply
            self._connecting.set_result(None)
        except BaseException as exc:
            self._connecting.set_exception(exc)
            self._connecting.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            self._connecting = None

    def _queue(self, packed: bytes, future: asyncio.Future[Any]) -> None:
        if self._transport is None:
            future.set_exception(RedisConnectionError("the connection was lost"))
            return
        idle = not self._pending
        self._pending.append(future)
        if idle:
            # Nothing in flight: a lone caller's command leaves now, not a loop turn later.
            self._transport.write(packed)
            return
        self._outgoing.append(packed)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._outgoing and self._transport is not None:
            data = b"".join(self._outgoing)
            self._outgoing.clear()
            self._transport.write(data)

    def _received(self, data: bytes) -> None:
        self._parser.feed(data)
        for reply in self._parser.replies():
            if not self._pending:
                break
            future = self._pending.popleft()
            if not future.done():
                future.set_result(reply)

    def _lost(self, exc: Exception | None) -> None:
        self._transport = None
        reason = f": {exc}" if exc is not None else ""
        self._fail(RedisConnectionError(f"the connection to Redis was lost{reason}"))

    def _fail(self, error: Exception) -> None:
        self._outgoing.clear()
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(error)
