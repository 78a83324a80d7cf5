"""A handler process on a SQLite file per named store: the built-in SQL handler, or a racy acquire.

Run as ``sqlite_race_handler.py DIR [--racy]``.  It speaks the protocol on
stdin and stdout as ``dsm serve`` does, and answers ``"named_store": true``:
every process opened on the same ``store`` works in ``DIR/<store>.sqlite3``,
so the kit's peers are real processes on one database, as a .NET team's
handler with its own SQLite schema is.  ``close`` with ``drop_store`` removes
the file.

With ``--racy`` the acquire is :class:`~dsm_sim.broken.sql.CheckThenInsertSqlHandler`'s:
it reads the record, sleeps a few milliseconds, then writes the lock without
checking again: two processes that acquire one item together both see it
free and both take token 1 (``at_most_one_live_lock``), as often as their
requests meet inside the window, which the kit cannot schedule.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from dsm_sim.broken.sql import CheckThenInsertSqlHandler
from dsm_sim.protocol.server import MAX_REQUEST_BYTES, Server
from reference_engine.clock import Clock
from reference_engine.handlers.sql.engine import create_engine_for
from reference_engine.handlers.sql.handler import SqlStateHandler

#: The racy acquire's window between its read and its write (``--window SECONDS``).
RACE_WINDOW_S = 0.004


class NamedFileServer(Server):
    """``dsm serve`` whose handler lives in a SQLite file named by the ``open``'s store."""

    def __init__(
        self, directory: Path, racy: bool, send: Any, window: float = RACE_WINDOW_S
    ) -> None:
        super().__init__(self._build, send)
        self.directory = directory
        self.racy = racy
        self.window = window
        self.path = directory / f"own_{os.getpid()}.sqlite3"

    def _build(self, clock: Clock) -> SqlStateHandler:
        engine = create_engine_for(f"sqlite+aiosqlite:///{self.path}")
        if self.racy:
            return CheckThenInsertSqlHandler(engine, clock, race_window=self.window)
        return SqlStateHandler(engine, clock)

    async def _perform(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        if op == "open" and self.handler is None and message.get("store"):
            self.path = self.directory / f"{message['store']}.sqlite3"
            answer = await super()._perform(message)
            return {**answer, "named_store": True}
        answer = await super()._perform(message)
        if op == "close" and message.get("drop_store"):
            _remove(self.path)
        return answer


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def serve(directory: Path, racy: bool, window: float = RACE_WINDOW_S) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_REQUEST_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr

    def send(line: bytes) -> None:
        out.write(line)
        out.flush()

    server = NamedFileServer(directory, racy, send, window)
    try:
        while not server.closed:
            line = await reader.readline()
            if not line:
                break
            if line.strip():
                server.receive(line)
            await asyncio.sleep(0)
        if server.tasks:
            await asyncio.gather(*server.tasks, return_exceptions=True)
    finally:
        if server.handler is not None and not server.closed:
            await server.handler.close()
        out.close()


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    flags = argv[1:]
    window = float(flags[flags.index("--window") + 1]) if "--window" in flags else RACE_WINDOW_S
    asyncio.run(serve(directory, "--racy" in flags, window))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
