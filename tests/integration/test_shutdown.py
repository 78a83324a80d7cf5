"""Nothing is left running: SIGTERM is handled as Ctrl-C, and a handler ends with its whole group.

* A handler command started through a launcher (``sh -c``), which forks a
  helper and then hangs, is ended whole when its request times out: the
  launcher, the handler and the helper.
* ``SIGTERM`` to ``dsm run --jobs 2``, ``dsm stress`` and ``dsm stress
  --broker`` ends the command with status 143 after the clean-up Ctrl-C
  gets: worker processes, handler processes and their helpers are gone, the
  stress run's own files and the broker run's queue are removed.
* ``SIGTERM`` to ``dsm verify --exec`` and to ``dsm run --handler exec:...``
  while the handler process is not answering (its request timeout ten
  minutes away) ends the command at once with 143, every handler process
  ended and none started after.
* Ctrl-C of ``dsm serve --tcp`` with a connection open prints no traceback.

Every command runs in a session of its own under a bound; whatever outlives
a test is killed by it, after the test has looked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from handler_servers import dsm_serve_command
from hung_handlers import SILENT_AFTER_ENV, SILENT_PIDS_ENV

from dsm_sim.protocol.secret import client_secret

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: How long a command may take to end after it was told to: far more than it needs.
BOUND_S = 60.0
FINE = """\
name = "fine"
[run]
items = 4
workers = 2
arrival_window = "10s"
faults_until = "20s"
"""


def _descendants(root: int) -> set[int]:
    """Every live process whose chain of parents leads to ``root`` (read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent has not read its status


def _gone(pids: set[int], within_s: float = 10.0) -> set[int]:
    """The pids of ``pids`` still alive after ``within_s`` seconds (empty when all ended)."""
    until = time.monotonic() + within_s
    while (left := {p for p in pids if _alive(p)}) and time.monotonic() < until:
        time.sleep(0.1)
    return left


def _recorded(pidfile: Path) -> set[int]:
    if not pidfile.exists():
        return set()
    return {int(line) for line in pidfile.read_text().split()}


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``dsm`` commands in sessions of their own; kill whatever they left afterwards."""
    started: list[subprocess.Popen[str]] = []
    seen: set[int] = set()

    def start(
        *argv: str, env: dict[str, str] | None = None, sigint_ignored: bool = False
    ) -> subprocess.Popen[str]:
        # SIGINT ignored, as for a command a script starts with "&": exec keeps it ignored.
        ignoring = [sys.executable, "-c", _IGNORING_SIGINT] if sigint_ignored else []
        process = subprocess.Popen(
            [*ignoring, sys.executable, "-m", "dsm_sim.cli", *argv],
            cwd=tmp_path,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(process)
        return process

    def remember() -> None:
        for process in started:
            seen.update(_descendants(process.pid))

    start.remember = remember  # type: ignore[attr-defined]
    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.kill()
        process.communicate()
    _kill_all(seen | _recorded(tmp_path / "pids"))


_IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
#: Ctrl-C reaches a command at a terminal.  A suite started in the background by a shell
#: without job control (``pytest ... &`` in a script) runs with SIGINT ignored, and every
#: command it starts inherits that: such a command would rightly not stop on Ctrl-C.
_HEARING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _wait_for(condition: Callable[[], object], what: str, within_s: float = BOUND_S) -> None:
    until = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > until:
            pytest.fail(f"{what} did not happen within {within_s:g}s")
        time.sleep(0.05)


def _ended(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the command did not end within {BOUND_S:g}s of being told to")
    return process.returncode, out, err


def _forking(tmp_path: Path) -> str:
    """The launcher command: the shell stays the parent of the handler that hangs."""
    script = HERE / "forking_handler.py"
    return f"exec:sh -c '{sys.executable} {script} {tmp_path / 'pids'}; :'"


def test_a_launched_handler_that_hangs_is_ended_with_everything_it_forked(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "fine.toml").write_text(FINE, encoding="utf-8")
    dsm = spawned(
        "run", "fine.toml", "--seed", "1", "--handler", _forking(tmp_path),
        env={"DSM_EXEC_TIMEOUT": "2"},
    )  # fmt: skip
    code, out, err = _ended(dsm)
    assert code == 1, out + err
    assert "did not answer request" in out, out  # the handler's request timed out
    recorded = _recorded(tmp_path / "pids")
    assert len(recorded) == 2, recorded  # the handler and its helper
    assert _gone(recorded) == set()


def test_sigterm_ends_dsm_run_jobs_with_its_workers_and_handlers(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "fine.toml").write_text(FINE, encoding="utf-8")
    dsm = spawned(
        "run", "fine.toml", "--seeds", "4", "--jobs", "2", "--handler", _forking(tmp_path),
        env={"DSM_EXEC_TIMEOUT": "600"},
    )  # fmt: skip
    _wait_for(lambda: len(_recorded(tmp_path / "pids")) >= 4, "both workers' handlers hanging")
    spawned.remember()  # type: ignore[attr-defined]
    before = _descendants(dsm.pid) | _recorded(tmp_path / "pids")
    dsm.send_signal(signal.SIGTERM)
    code, out, err = _ended(dsm)
    assert code == 143, out + err
    assert "Traceback" not in err, err
    assert _gone(before) == set()


def _silent_handler(tmp_path: Path, after: int) -> tuple[str, dict[str, str]]:
    """A handler command that answers ``after`` calls, then none; and the environment it needs.

    Its request timeout is ten minutes, so only the signal can end the wait.
    """
    command = f"{sys.executable} -m dsm_sim.cli serve hung_handlers:silent_after"
    env = {
        "DSM_EXEC_TIMEOUT": "600",
        SILENT_AFTER_ENV: str(after),
        SILENT_PIDS_ENV: str(tmp_path / "silent"),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
    }
    return command, env


def _terminated_while_silent(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]], dsm: subprocess.Popen[str]
) -> None:
    """SIGTERM once a handler went silent: 143 at once, every handler ended, none started."""
    _wait_for(lambda: _recorded(tmp_path / "silent"), "the handler going silent")
    spawned.remember()  # type: ignore[attr-defined]
    before = _descendants(dsm.pid) | _recorded(tmp_path / "silent")
    dsm.send_signal(signal.SIGTERM)
    code, out, err = _ended(dsm)  # within BOUND_S, a tenth of the request timeout
    assert code == 143, out + err
    assert "Traceback" not in err, err
    assert _gone(before) == set()
    spawned.remember()  # type: ignore[attr-defined]
    assert _recorded(tmp_path / "silent") <= before  # no handler went on and went silent again


def test_sigterm_ends_dsm_verify_exec_while_its_handler_is_silent(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]]
) -> None:
    # Before: the stop was swallowed (the interrupted test case's teardown judged the
    # close that followed), the verification went on and started new handler processes.
    command, env = _silent_handler(tmp_path, after=40)
    dsm = spawned(
        "verify", "--exec", command, "--profile", "dev", "--seed", "1",
        "--cache-dir", str(tmp_path / "cache"), env=env,
    )  # fmt: skip
    _terminated_while_silent(tmp_path, spawned, dsm)


def test_sigterm_ends_dsm_run_while_its_exec_handler_is_silent(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "fine.toml").write_text(FINE, encoding="utf-8")
    command, env = _silent_handler(tmp_path, after=10)
    dsm = spawned(
        "run", "fine.toml", "--seeds", "3", "--handler", f"exec:{command}", env=env
    )  # fmt: skip
    _terminated_while_silent(tmp_path, spawned, dsm)


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_sigterm_ends_dsm_stress_with_its_workers_and_removes_its_files(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]], sigint: str
) -> None:
    database = tmp_path / "stress.sqlite3"
    dsm = spawned(
        "stress", "--db", f"sqlite+aiosqlite:///{database}", "--keys", "100000",
        "--processes", "2", "--workers", "2", "--timeout", "600",
        sigint_ignored=sigint == "ignored",
    )  # fmt: skip
    effects = f"{database.name}.*.effects*"  # the run's own ledger, beside the user's file
    _wait_for(
        lambda: len(_descendants(dsm.pid)) >= 2 and list(tmp_path.glob(effects)),
        "the workers starting",
    )
    time.sleep(1.0)  # the workers are delivering: the signal finds them at work
    spawned.remember()  # type: ignore[attr-defined]
    before = _descendants(dsm.pid)
    dsm.send_signal(signal.SIGTERM)
    code, out, err = _ended(dsm)
    assert code == 143, out + err
    assert "Traceback" not in err, err
    assert _gone(before) == set()
    assert list(tmp_path.glob(effects)) == []


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_sigterm_ends_dsm_stress_broker_and_deletes_its_queue(
    tmp_path: Path, spawned: Callable[..., subprocess.Popen[str]], amqp_url: str, sigint: str
) -> None:
    # With SIGINT ignored (started with "&" by a script), asyncio installs no Ctrl-C
    # handler of its own, and the run ends with every task of its loop cancelled, the
    # broker connection's reader among them: the queue went on living on the broker.
    database = tmp_path / "broker.sqlite3"
    dsm = spawned(
        "stress", "--broker", amqp_url, "--db", f"sqlite+aiosqlite:///{database}",
        "--keys", "20000", "--processes", "2", "--workers", "2", "--kills", "0",
        env={"TMPDIR": str(tmp_path)}, sigint_ignored=sigint == "ignored",
    )  # fmt: skip
    _wait_for(lambda: list(tmp_path.glob("dsm-broker-*/p*.jsonl")), "the consumers starting")
    run_id = next(tmp_path.glob("dsm-broker-*")).name.split("-")[2]
    queue = f"dsm-stress-{run_id}"
    assert asyncio.run(_on_broker(amqp_url, queue))[0]
    spawned.remember()  # type: ignore[attr-defined]
    before = _descendants(dsm.pid)
    dsm.send_signal(signal.SIGTERM)
    code, out, err = _ended(dsm)
    assert code == 143, out + err
    assert "Traceback" not in err, err
    assert _gone(before) == set()
    # Neither the queue nor the exchange (named as the queue) is left.
    assert asyncio.run(_on_broker(amqp_url, queue)) == (False, False)
    assert list(tmp_path.glob("dsm-broker-*")) == []


async def _on_broker(url: str, name: str) -> tuple[bool, bool]:
    """Whether the queue and the exchange called ``name`` exist (a passive declare of each)."""
    import aio_pika
    from aio_pika.exceptions import ChannelNotFoundEntity

    connection = await aio_pika.connect(url)

    async def found(declare: Callable[[Any], Awaitable[object]]) -> bool:
        channel = await connection.channel()  # a missing name closes its channel
        try:
            await declare(channel)
        except ChannelNotFoundEntity:
            return False
        return True

    try:
        return (
            await found(lambda channel: channel.declare_queue(name, passive=True)),
            await found(lambda channel: channel.get_exchange(name, ensure=True)),
        )
    finally:
        await connection.close()


def test_ctrl_c_of_a_tcp_server_with_a_connection_open_prints_no_traceback(
    tmp_path: Path,
) -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HEARING_SIGINT,
            *dsm_serve_command("reference_engine.handlers.memory:in_memory_handler"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        announced = server.stdout.readline()
        # "dsm serve: listening on 127.0.0.1:PORT (secret in ...)"
        port = int(announced.split()[4].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as connection:
            request = {
                "id": 1,
                "op": "open",
                "now": "2026-01-01T09:00:00.000000Z",
                "protocol": 1,
                "protocols": [1, 2],
                "secret": client_secret("127.0.0.1", port),
            }
            connection.sendall((json.dumps(request) + "\n").encode())
            assert b'"result"' in connection.recv(4096)
            server.send_signal(signal.SIGINT)  # Ctrl-C, with the connection still open
            _, err = server.communicate(timeout=BOUND_S)
        assert server.returncode == 0, err
        assert err == "", err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.communicate()
