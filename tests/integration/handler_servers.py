"""Handler servers the protocol tests start: a process that announces its TCP address.

``dsm serve --tcp HOST:0`` and ``handlers/node/memory.js --tcp HOST:0`` both
pick a free port and print ``listening on HOST:PORT`` as their first line, so
tests never guess a port that may be taken.  A server that does not announce
itself fails the test with its stderr; every server is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

__all__ = ["ROOT", "dsm_serve_command", "serving"]

ROOT = Path(__file__).resolve().parents[2]
_ANNOUNCED = re.compile(r"listening on (127\.0\.0\.1:\d+)")


def dsm_serve_command(factory: str) -> list[str]:
    """``dsm serve --tcp`` of ``factory`` on a free loopback port."""
    return [sys.executable, "-m", "dsm_sim.cli", "serve", "--tcp", "127.0.0.1:0", factory]


@contextlib.contextmanager
def serving(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[str]:
    """Run a handler server for the block: its announced ``HOST:PORT``."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        cwd=cwd,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        found = _ANNOUNCED.search(first)
        if found is None:
            process.kill()
            _, err = process.communicate(timeout=10)
            pytest.fail(f"{command[1:]} did not announce its address: {first!r} {err}")
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=10)
