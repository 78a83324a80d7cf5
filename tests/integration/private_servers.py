"""Servers of a test's own, which it may restart, freeze or stop without touching the shared ones.

A PostgreSQL server started with ``initdb`` and ``pg_ctl`` on a free port, as
the ``postgres`` user; tests use it through the ``private_postgres`` fixture
(``conftest.py``).  :meth:`PrivateServer.freeze` stops every process of the
server with ``SIGSTOP`` (the server then accepts TCP connections and answers
nothing, which no server setting can time out) and :meth:`PrivateServer.thaw`
lets it go on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PrivateServer", "private_postgres_server"]


@dataclass(frozen=True)
class PrivateServer:
    """A PostgreSQL server of this test's own: its data directory, port and binaries."""

    bin_dir: Path
    data_dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data_dir}"
        _as_postgres(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "-l",
            str(self.data_dir / "server.log"),
            *args,
        )

    def restart(self) -> None:
        self.ctl("-m", "fast", "restart")

    def processes(self) -> list[int]:
        """The postmaster and every process it started (the backends, the background workers)."""
        first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        postmaster = int(first)
        children = []
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError, ValueError):
                fields = dict(
                    line.split(":\t", 1)
                    for line in status.read_text().splitlines()
                    if ":\t" in line
                )
                if int(fields.get("PPid", "0")) == postmaster:
                    children.append(int(status.parent.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        """SIGSTOP the whole server: connections stay open, nothing is answered."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _as_postgres(*command: str) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", *command], check=True, timeout=90, capture_output=True
    )


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: a missing service is a failure, not a skip)")
    pytest.skip(reason)


@contextlib.contextmanager
def private_postgres_server() -> Iterator[PrivateServer]:
    """A fresh PostgreSQL server on a free port, stopped and deleted afterwards."""
    bin_dir = _postgres_bin()
    if bin_dir is None or shutil.which("runuser") is None:
        _unavailable("needs the PostgreSQL server binaries (initdb, pg_ctl) and runuser")
    if os.geteuid() != 0:
        _unavailable("needs root, to run a PostgreSQL server of its own as the postgres user")
    assert bin_dir is not None
    data_dir = Path(tempfile.mkdtemp(prefix="dsm-private-pg-"))
    shutil.chown(data_dir, "postgres", "postgres")
    server = PrivateServer(bin_dir, data_dir, _free_port())
    try:
        _as_postgres(
            str(bin_dir / "initdb"),
            "-D",
            str(data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        )
        server.ctl("start")
        yield server
    finally:
        with contextlib.suppress(OSError, ValueError):
            server.thaw()  # a frozen server cannot stop
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            server.ctl("-m", "immediate", "stop")
        shutil.rmtree(data_dir, ignore_errors=True)
