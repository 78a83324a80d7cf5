"""A fault-injecting TCP proxy on loopback, in front of a real PostgreSQL or Redis.

Clients (a handler's driver) connect to the proxy's ephemeral port instead of
the server's; every byte then passes through two queues per connection, one
per :class:`~.events.Direction`, where the faults act:

* **latency** holds each chunk for a fixed delay before forwarding it;
* **stall** stops forwarding without closing anything, which is what a
  partition looks like to TCP: the sockets stay up, writes are accepted, no
  reply comes.  The bytes stay queued, and flow in order once resumed;
* **partition** is a stall of both directions for T seconds, healed either by
  letting the queued bytes flow (``heal="resume"``: late requests reach the
  server after the partition, the case fencing exists for) or by resetting
  every connection (``heal="reset"``: the queued bytes are lost);
* **reset** aborts every connection now with a TCP RST on both sides, in the
  middle of whatever statement is in flight;
* **refuse** resets each new connection as soon as it is accepted, so a
  client that reconnects and retries by itself (redis-py does) still fails.

Delays use the event loop's timers, never a wall clock read; the event log
(:attr:`FaultProxy.windows`) is timed by an injectable ``clock`` (the loop's
time by default), so a test can give it the clock of its own history.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from dsm_sim.netfaults.errors import FaultWaitTimeoutError, InvalidFaultError, ProxyStateError
from dsm_sim.netfaults.events import Direction, FaultKind, FaultWindow

__all__ = ["HEAL_MODES", "FaultProxy", "Heal"]

Heal = Literal["resume", "reset"]
HEAL_MODES: tuple[Heal, ...] = ("resume", "reset")
_CHUNK = 65536
#: How long :meth:`FaultProxy.wait_queued` waits by default before it gives up.
WAIT_QUEUED_S = 60.0
_BOTH = (Direction.TO_SERVER, Direction.TO_CLIENT)


def _hard_close(writer: asyncio.StreamWriter) -> None:
    """Abort with an RST (SO_LINGER 0), as a crashed peer or a middlebox reset would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied connection: the client's stream, the server's, and a queue each way."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.queues: dict[Direction, deque[tuple[float, bytes]]] = {d: deque() for d in _BOTH}
        self.wakeups: dict[Direction, asyncio.Event] = {d: asyncio.Event() for d in _BOTH}
        self.eof: dict[Direction, bool] = dict.fromkeys(_BOTH, False)
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def queued(self, direction: Direction) -> int:
        return sum(len(chunk) for _, chunk in self.queues[direction])

    async def read(self, reader: asyncio.StreamReader, direction: Direction) -> None:
        """Queue what arrives, stamped with when it may leave; keeps reading while stalled."""
        loop = asyncio.get_running_loop()
        while True:
            chunk = await reader.read(_CHUNK)
            if not chunk:
                self.eof[direction] = True
                self.wakeups[direction].set()
                return
            self.queues[direction].append((loop.time() + self.proxy.latency(direction), chunk))
            self.wakeups[direction].set()
            self.proxy.notify()

    async def write(self, writer: asyncio.StreamWriter, direction: Direction) -> None:
        """Forward queued chunks in order, each once due and while the direction flows."""
        loop = asyncio.get_running_loop()
        queue = self.queues[direction]
        while True:
            if not queue:
                if self.eof[direction]:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                self.wakeups[direction].clear()
                await self.wakeups[direction].wait()
                continue
            await self.proxy.flowing(direction).wait()
            due, chunk = queue[0]
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue  # a stall may have begun meanwhile
            queue.popleft()
            writer.write(chunk)
            await writer.drain()
            self.proxy.notify()

    def reset(self) -> None:
        """Abort both sides now; queued bytes are lost, as they are with a real RST."""
        if self.closed:
            return
        self.closed = True
        for queue in self.queues.values():
            queue.clear()
        for writer in (self.client, self.server):
            if writer is not None:
                _hard_close(writer)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``, with faults on demand.

    Use it as ``async with FaultProxy(host, port) as proxy:`` and point the
    client at ``proxy.port``.  One proxy belongs to one event loop.  Only
    connections made through it are faulted, so a second worker that must
    not be partitioned connects to the server directly (or through a second
    proxy).
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_host = listen_host
        self._clock = clock
        self._server: asyncio.Server | None = None
        self._state = "not started"
        self._links: set[_Link] = set()
        self._latency: dict[Direction, float] = dict.fromkeys(_BOTH, 0.0)
        self._flowing: dict[Direction, asyncio.Event] = {}
        self._changed: asyncio.Event | None = None
        self._refusing = False
        self._open: dict[tuple[FaultKind, str], tuple[float, str]] = {}
        self._windows: list[FaultWindow] = []
        #: The handler task of each accepted connection, awaited by close() so none is left behind.
        self._handlers: set[asyncio.Task[object]] = set()
        #: How many connections were accepted in total (a reconnect shows here).
        self.accepted = 0

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on an ephemeral port, so parallel tests never collide on one."""
        if self._server is not None:
            return
        self._flowing = {d: asyncio.Event() for d in _BOTH}
        for event in self._flowing.values():
            event.set()
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self._state = "listening"

    async def close(self) -> None:
        """Stop listening and reset what is still connected; the log is kept.

        Nothing is left running: a connection task surviving its event loop
        would be cancelled at interpreter exit and reported as an error there.
        """
        server, self._server = self._server, None
        if server is not None:
            server.close()  # accept nothing more while the rest is torn down
        for link in list(self._links):
            link.reset()
        for event in self._flowing.values():
            event.set()  # a connect held by a partition sees its link closed and returns
        current = asyncio.current_task()
        pending = [task for task in self._handlers if task is not current]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        self._state = "closed"
        now = self._now()
        for (kind, _key), (start, detail) in list(self._open.items()):
            self._windows.append(FaultWindow(kind, start, now, detail))
        self._open.clear()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The ephemeral port clients connect to."""
        server = self._require("port")
        port: int = server.sockets[0].getsockname()[1]
        return port

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    # --- faults --------------------------------------------------------------------------

    def set_latency(self, to_server: float = 0.0, to_client: float = 0.0) -> None:
        """Hold every chunk this many seconds per direction (0 removes the delay).

        Applies to bytes read from now on; bytes already queued keep their due time.
        """
        self._require("set_latency")
        for name, value in (("to_server", to_server), ("to_client", to_client)):
            if not (isinstance(value, int | float) and 0 <= value < 3600):
                raise InvalidFaultError(
                    "set_latency", f"{name}={value!r}", "a number of seconds in [0, 3600)"
                )
        self._latency = {
            Direction.TO_SERVER: float(to_server),
            Direction.TO_CLIENT: float(to_client),
        }
        self._close_window(FaultKind.LATENCY)
        if to_server or to_client:
            self._open_window(
                FaultKind.LATENCY, detail=f"to_server={to_server:g}s to_client={to_client:g}s"
            )

    def stall(self, direction: Direction | None = None) -> None:
        """Stop forwarding (one direction, or both) without closing; bytes queue in the proxy."""
        self._require("stall")
        for d in self._directions("stall", direction):
            if self._flowing[d].is_set():
                self._flowing[d].clear()
                self._open_window(FaultKind.STALL, key=d.value, detail=d.value)

    def resume(self, direction: Direction | None = None) -> None:
        """Forward again; what queued during the stall flows first, in order."""
        self._require("resume")
        for d in self._directions("resume", direction):
            if not self._flowing[d].is_set():
                self._close_window(FaultKind.STALL, key=d.value)
                self._flowing[d].set()

    def begin_partition(self) -> None:
        """Stall both directions and new connections until :meth:`heal`."""
        self._require("begin_partition")
        if (FaultKind.PARTITION, "") in self._open:
            raise InvalidFaultError(
                "begin_partition", "a partition is already active", "heal() it first"
            )
        self._open_window(FaultKind.PARTITION)
        for event in self._flowing.values():
            event.clear()

    def heal(self, heal: Heal = "resume") -> int:
        """End the partition: let queued bytes flow, or reset every connection first.

        Returns how many connections were reset (0 for ``"resume"``).
        """
        self._require("heal")
        if heal not in HEAL_MODES:
            raise InvalidFaultError("heal", f"heal={heal!r}", " or ".join(map(repr, HEAL_MODES)))
        if (FaultKind.PARTITION, "") not in self._open:
            raise InvalidFaultError("heal", "no partition is active", "begin_partition() first")
        reset = self.reset_connections() if heal == "reset" else 0
        self._close_window(FaultKind.PARTITION, detail=f"heal={heal}")
        for d in _BOTH:
            if (FaultKind.STALL, d.value) not in self._open:
                self._flowing[d].set()
        return reset

    async def partition(self, seconds: float, *, heal: Heal = "resume") -> int:
        """Partition for ``seconds`` (loop time), then heal; run it as a task to act meanwhile."""
        if not (isinstance(seconds, int | float) and 0 <= seconds < 3600):
            raise InvalidFaultError("partition", f"seconds={seconds!r}", "a number in [0, 3600)")
        if heal not in HEAL_MODES:
            raise InvalidFaultError(
                "partition", f"heal={heal!r}", " or ".join(map(repr, HEAL_MODES))
            )
        self.begin_partition()
        await asyncio.sleep(seconds)
        return self.heal(heal)

    def reset_connections(self) -> int:
        """Abort every open connection now with an RST to both ends; returns how many."""
        self._require("reset_connections")
        links = list(self._links)
        for link in links:
            link.reset()
        self._links.clear()
        now = self._now()
        self._windows.append(FaultWindow(FaultKind.RESET, now, now, f"{len(links)} connection(s)"))
        return len(links)

    def refuse(self, refusing: bool = True) -> None:
        """While on, every new connection is reset as soon as it is accepted."""
        self._require("refuse")
        if refusing and not self._refusing:
            self._open_window(FaultKind.REFUSE)
        elif not refusing and self._refusing:
            self._close_window(FaultKind.REFUSE)
        self._refusing = refusing

    # --- observing -----------------------------------------------------------------------

    @property
    def windows(self) -> tuple[FaultWindow, ...]:
        """Every fault so far, ended ones first in order, then those still active."""
        now_open = [
            FaultWindow(kind, start, None, detail)
            for (kind, _), (start, detail) in self._open.items()
        ]
        return (*self._windows, *now_open)

    def queued(self, direction: Direction) -> int:
        """Bytes held in the proxy now, in ``direction``, over all connections."""
        return sum(link.queued(direction) for link in self._links)

    async def wait_queued(
        self, direction: Direction, min_bytes: int = 1, *, give_up_after: float = WAIT_QUEUED_S
    ) -> int:
        """Wait until at least ``min_bytes`` are held in ``direction`` (a stalled request arrived).

        Fault tests call this before moving on, so the fault provably caught the
        call's bytes instead of racing them.  ``give_up_after`` only stops a
        test that would otherwise hang; the wait ends as soon as the bytes are
        there, so it is generous: on a loaded machine a server's reply (a
        MariaDB statement, say) can take seconds to come.
        """
        self._require("wait_queued")
        changed = self._changed
        assert changed is not None
        try:
            async with asyncio.timeout(give_up_after):
                while self.queued(direction) < min_bytes:
                    changed.clear()
                    await changed.wait()
        except TimeoutError:
            raise FaultWaitTimeoutError(
                f"{min_bytes} byte(s) queued {direction.value}",
                f"{self.queued(direction)} byte(s) over {self.connections} connection(s)",
                give_up_after,
            ) from None
        return self.queued(direction)

    def latency(self, direction: Direction) -> float:
        return self._latency[direction]

    def flowing(self, direction: Direction) -> asyncio.Event:
        return self._flowing[direction]

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # --- internals -----------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _require(self, control: str) -> asyncio.Server:
        if self._server is None:
            raise ProxyStateError(control, self._state)
        return self._server

    def _directions(self, control: str, direction: Direction | None) -> tuple[Direction, ...]:
        if direction is None:
            return _BOTH
        if not isinstance(direction, Direction):
            raise InvalidFaultError(
                control,
                f"direction={direction!r}",
                "Direction.TO_SERVER, Direction.TO_CLIENT or None (both)",
            )
        return (direction,)

    def _open_window(self, kind: FaultKind, *, key: str = "", detail: str = "") -> None:
        self._open.setdefault((kind, key), (self._now(), detail))

    def _close_window(self, kind: FaultKind, *, key: str = "", detail: str = "") -> None:
        opened = self._open.pop((kind, key), None)
        if opened is not None:
            start, first = opened
            text = ", ".join(part for part in (first, detail) if part)
            self._windows.append(FaultWindow(kind, start, self._now(), text))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        if self._refusing:
            _hard_close(writer)
            return
        link = _Link(self, writer)
        self._links.add(link)
        try:
            # A partitioned network does not carry the connect either.
            await self._flowing[Direction.TO_SERVER].wait()
            if link.closed:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port
                )
            except OSError:
                link.reset()  # the client sees the upstream refusal as a reset
                return
            link.server = up_writer
            if link.closed:
                _hard_close(up_writer)
                return
            link.tasks = [
                asyncio.ensure_future(link.read(reader, Direction.TO_SERVER)),
                asyncio.ensure_future(link.write(up_writer, Direction.TO_SERVER)),
                asyncio.ensure_future(link.read(up_reader, Direction.TO_CLIENT)),
                asyncio.ensure_future(link.write(writer, Direction.TO_CLIENT)),
            ]
            done, _ = await asyncio.wait(link.tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(not task.cancelled() and task.exception() is not None for task in done):
                link.reset()  # one side failed (a peer's RST): pass it on to the other
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            if not link.closed:
                link.closed = True
                for task in link.tasks:
                    task.cancel()
                for side in (link.client, link.server):
                    if side is not None:
                        side.close()
