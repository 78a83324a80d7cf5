"""The pytest plugin on handlers out of process: ``--dsm-exec-tcp`` and ``--dsm-exec-timeout``.

Each test runs ``pytest --pyargs dsm_sim.conformance`` in a subprocess, as a
team would in its own CI, against ``dsm serve --tcp`` of a Python factory on a
free port: the in-memory handler must pass every property, a handler without
a server that speaks another protocol version must be what every test
reports (so the option really reaches the server).  The rules for bad
option values are checked in process, without a pytest run each, and a bad address or timeout is one named failure.
"""

from __future__ import annotations

import contextlib
import json
import re
import socketserver
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from handler_servers import dsm_serve_command, serving

from dsm_sim.protocol.client import ExecFactory
from dsm_sim.pytest_plugin import factory_from_options

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MEMORY = "reference_engine.handlers.memory:in_memory_handler"


@pytest.fixture
def serve_tcp() -> Iterator[Callable[[str], str]]:
    """Start ``dsm serve --tcp 127.0.0.1:0 FACTORY``; its address.  Every server is stopped."""
    with contextlib.ExitStack() as servers:
        yield lambda factory: servers.enter_context(serving(dsm_serve_command(factory)))


def _conformance(*options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "--pyargs", "dsm_sim.conformance"]
    command += ["-n", "0", "-p", "no:randomly", "-q", "--dsm-profile=dev", "--dsm-seed=0"]
    return subprocess.run(
        [*command, *options], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def _summary(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr


# Nightly: test_protocol_harness.py runs the kit on the same served handler over TCP on every PR.
@pytest.mark.thorough
def test_the_memory_handler_over_tcp_passes_every_property(
    serve_tcp: Callable[[str], str],
) -> None:
    address = serve_tcp(MEMORY)
    result = _conformance(f"--dsm-exec-tcp={address}", "--dsm-exec-timeout=30")
    assert result.returncode == 0, result.stdout + result.stderr
    # One test per property: each passed, or (a short dev run) was never exercised.
    summary = _summary(result)
    passed = re.search(r"\b(\d+) passed\b", summary)
    skipped = re.search(r"\b(\d+) skipped\b", summary)
    assert passed and "failed" not in summary, result.stdout
    assert int(passed.group(1)) + int(skipped.group(1) if skipped else 0) == 22, summary
    assert int(passed.group(1)) >= 20, summary
    assert result.stdout.count("was never exercised") == (int(skipped.group(1)) if skipped else 0)


class _OtherVersion(socketserver.StreamRequestHandler):
    """A handler server that answers ``open`` with protocol version 9, which no harness speaks."""

    def handle(self) -> None:
        for line in self.rfile:
            request = json.loads(line)
            answer = {"protocol": 9, "concurrent": True} if request["op"] == "open" else None
            self.wfile.write(json.dumps({"id": request["id"], "result": answer}).encode() + b"\n")


def test_the_plugin_shakes_hands_with_the_server_it_is_given() -> None:
    # The option reaches the server: its wrong version is what every test reports.
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OtherVersion) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        host, port = server.server_address[:2]
        try:
            result = _conformance(f"--dsm-exec-tcp={host}:{port}", "-k", "stale_write_rejected")
        finally:
            server.shutdown()
    assert result.returncode != 0
    assert "--dsm-exec-tcp: the handler server does not answer: the handler answered open " in (
        result.stdout
    ), result.stdout
    assert "with protocol version 9; this harness speaks versions 1, 2" in result.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"address": "127.0.0.1:1"}, "cannot connect to the handler server at 127.0.0.1:1"),
        ({"address": "127.0.0.1:7411", "timeout": "0"}, "--dsm-exec-timeout='0': give a number"),
        ({"address": "127.0.0.1:7411", "timeout": "soon"}, "--dsm-exec-timeout='soon'"),
        ({"address": "localhost"}, "--dsm-exec-tcp: 'localhost' is not a TCP address"),
        (
            {"address": "127.0.0.1:7411", "command": "node x.js"},
            "not --dsm-exec and --dsm-exec-tcp",
        ),
        ({"command": "/nonexistent/handler"}, "--dsm-exec: the handler command does not start"),
    ],
)
def test_bad_options_say_what_is_wrong_and_what_is_allowed(
    options: dict[str, str], message: str
) -> None:
    given: dict[str, object] = {"handler": None, "command": None, "address": None, "timeout": None}
    with pytest.raises(pytest.fail.Exception, match=re.escape(message)):
        factory_from_options(**{**given, **options})


def test_a_good_timeout_reaches_the_factory(serve_tcp: Callable[[str], str]) -> None:
    address = serve_tcp(MEMORY)
    factory = factory_from_options(handler=None, command=None, address=address, timeout="2.5")
    assert isinstance(factory, ExecFactory)
    assert factory.timeout == 2.5
    assert str(factory.target) == address
