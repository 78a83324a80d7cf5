"""A handler server takes only connections that know its shared secret.

``dsm serve --tcp`` and ``handlers/node/memory.js --tcp`` hold a store: a
stranger who can connect could read every tenant's payloads and, with a
``now`` of its choosing, sweep live locks and expire finished records.  Each
server therefore answers an ``open`` without its secret with
``unauthorized`` and ends the connection, listens on loopback for a bare
port, and refuses a non-loopback address unless it was given a secret.  The
harness finds a loopback server's drawn secret by the address; a configured
one it reads from ``DSM_SERVE_SECRET``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from handler_servers import ROOT, serving

from dsm_sim.protocol.client import ExecHandler, parse_address
from dsm_sim.protocol.errors import HandlerUnauthorizedError
from dsm_sim.protocol.secret import SECRET_ENV, secret_path
from reference_engine.clock import ManualClock

pytestmark = pytest.mark.integration

MEMORY = "reference_engine.handlers.memory:in_memory_handler"
SERVE = [sys.executable, "-m", "dsm_sim.cli", "serve"]


def _node() -> str:
    path = shutil.which("node")
    if path is not None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("node is not installed (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip("node is not installed")


def _command(server: str, address: str) -> list[str]:
    if server == "dsm-serve":
        return [*SERVE, "--tcp", address, MEMORY]
    return [_node(), str(ROOT / "handlers" / "node" / "memory.js"), "--tcp", address]


SERVERS = ["dsm-serve", "node"]


def _exchange(address: str, *lines: dict[str, object]) -> list[dict[str, object]]:
    """Send raw request lines on one connection; every answer until the server closes it."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        conn.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return [json.loads(line) for line in received.splitlines()]


NOW = "2026-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("server", SERVERS)
def test_an_open_without_the_secret_is_unauthorized_and_nothing_else_is_served(
    server: str,
) -> None:
    with serving(_command(server, "127.0.0.1:0")) as address:
        sweep = {"id": 2, "op": "reset_expired_locks", "now": "9999-01-01T00:00:00.000000Z"}
        for secret in ({}, {"secret": "guessed"}):
            answers = _exchange(
                address, {"id": 1, "op": "open", "now": NOW, "protocol": 1, **secret}, sweep
            )
            # The sweep after a refused open is never read: the connection ends.
            assert [a["id"] for a in answers] == [1]
            error = answers[0]["error"]
            assert isinstance(error, dict) and error["kind"] == "unauthorized"
            assert "shared secret" in str(error["message"])


@pytest.mark.parametrize("server", SERVERS)
def test_the_harness_finds_a_loopback_servers_drawn_secret_and_keeps_it_out_of_transcripts(
    server: str,
) -> None:
    with serving(_command(server, "127.0.0.1:0")) as address:
        target = parse_address(address)
        written = secret_path(target.host, target.port)
        assert written.is_file() and written.stat().st_mode & 0o777 == 0o600
        secret = written.read_text(encoding="utf-8").strip()

        async def session() -> list[bytes]:
            handler = ExecHandler(target, ManualClock())
            await handler.open()
            await handler.close()
            return handler.transcript

        transcript = asyncio.run(session())
        assert transcript and all(secret.encode() not in line for line in transcript)
    assert not written.exists(), "the drawn secret's file outlived its server"


@pytest.mark.parametrize("server", SERVERS)
def test_a_configured_secret_is_required_and_a_wrong_one_is_a_named_error(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, SECRET_ENV: "s3cret-for-this-test"}
    with serving(_command(server, "127.0.0.1:0"), env=env) as address:
        target = parse_address(address)
        assert not secret_path(target.host, target.port).exists()

        async def session() -> None:
            handler = ExecHandler(target, ManualClock())
            try:
                await handler.open()
            finally:
                await handler.close()

        monkeypatch.setenv(SECRET_ENV, "s3cret-for-this-test")
        asyncio.run(session())
        monkeypatch.setenv(SECRET_ENV, "wrong")
        with pytest.raises(HandlerUnauthorizedError, match=SECRET_ENV):
            asyncio.run(session())


@pytest.mark.parametrize("server", SERVERS)
def test_a_non_loopback_address_without_a_secret_is_refused_before_it_binds(server: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSM_SERVE_SECRET")}
    done = subprocess.run(
        _command(server, "0.0.0.0:0"), capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr and SECRET_ENV in done.stderr
    assert "listening" not in done.stdout


def test_dsm_serve_with_a_bare_port_listens_on_loopback() -> None:
    with serving([*SERVE, "--tcp", "0", MEMORY]) as address:
        assert address.startswith("127.0.0.1:")


def test_a_stopped_dsm_serve_removes_its_secret_file() -> None:
    process = subprocess.Popen(
        [*SERVE, "--tcp", "127.0.0.1:0", MEMORY], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "(secret in " in first, first
        written = Path(first.split("(secret in ", 1)[1].rstrip(")\n"))
        assert written.is_file()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert not written.exists()
    finally:
        if process.poll() is None:  # a failed assertion must not leave the server running
            process.kill()
            process.wait(timeout=10)
