"""The protocol beyond ``dsm verify --exec``: the simulator, handlers that are servers, replays.

* ``dsm run --handler exec:CMD``: the Node handler keeps every invariant of a
  shipped scenario, its ``no_fencing`` mode is caught, and the simulated
  clock reaches it as ``now``.
* ``--exec-tcp``: the in-memory handler served by ``dsm serve --tcp`` on an
  ephemeral port passes the kit, one connection per test case on one
  shared server process.
* Replay files: a violation found through the protocol leaves the request
  lines of its shrunk counterexample, which ``dsm replay`` sends again, and
  which answer differently on the correct handler.

Node is skipped where missing, and a failure under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from handler_servers import dsm_serve_command, serving

import dsm_sim.protocol.replay as replay_module
from dsm_sim.cli import main
from dsm_sim.conformance.runner import verify
from dsm_sim.protocol.client import exec_factory, parse_address, tcp_factory
from dsm_sim.protocol.replay import read_replay, replay
from dsm_sim.protocol.schema import problem
from dsm_sim.scenario import load_scenarios
from dsm_sim.simulator.clock import DEFAULT_EPOCH
from dsm_sim.simulator.run import run_scenario
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_HANDLER = ROOT / "handlers" / "node" / "memory.js"
SERVED = "reference_engine.handlers.memory:in_memory_handler"
INSTANCE_LOCKED = "dsm_sim.broken.instances:RemoteInstanceLockedAcquire"
SERVE = [sys.executable, "-m", "dsm_sim.cli", "serve"]
CTX = StateHandlerContext(
    scope_id=4,
    scope_code="Element",
    entity_id="flow-1",
    entity_execution_id="run-1",
    tenant_id="t1",
    source_app_id="app-1",
)


def _node() -> str:
    path = shutil.which("node")
    if path is not None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("node is not installed (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip("node is not installed")


# --- dsm run --handler exec:CMD ------------------------------------------------------------

#: Slow workers outlive their lock, the sweep resets it and a late copy takes
#: over: the first worker's set must be fenced off.
SLOW_WORKER = ROOT / "scenarios" / "slow-worker.toml"


def test_node_handler_keeps_every_invariant_of_a_scenario_on_simulated_time() -> None:
    node = _node()
    (scenario,) = load_scenarios(SLOW_WORKER)
    factory = exec_factory([node, str(NODE_HANDLER)])
    result = run_scenario(scenario, 1, factory, handler_name=f"exec:{node} {NODE_HANDLER}")
    assert result.passed, result.violated
    # Locks expired and were fenced off: only simulated time, sent as now, can do that
    # in a run that takes two real seconds.
    assert result.stats["stale_writes_rejected"], result.stats
    instants = [json.loads(line)["now"] for line in factory.last_transcript]
    assert (
        instants[0]
        == "2026-01-01T09:00:00.000000Z"
        == DEFAULT_EPOCH.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    )
    assert max(instants) >= "2026-01-01T09:04:00", "the run's 4 faulty minutes reached the handler"


def test_node_handler_without_fencing_fails_the_scenario(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node()
    spec = f"exec:{node} {NODE_HANDLER}"
    monkeypatch.setenv("DSM_NODE_BUG", "no_fencing")  # inherited by the handler process
    code = main(["run", str(SLOW_WORKER), "--seed", "1", "--handler", spec])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "stale_write_rejected" in out
    assert "stale write accepted" in out
    assert f"--handler '{spec}'" in out  # the replay line pastes into a shell


def test_run_refuses_a_handler_command_that_does_not_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["run", str(SLOW_WORKER), "--seed", "1", "--handler", "exec:/nonexistent/handler"])
    assert code == 2
    assert "does not start" in capsys.readouterr().err


def test_a_silent_handler_in_the_simulator_is_a_named_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulator drives handler coroutines by hand: the timeout must still
    # fail the request with its own error instead of cancelling the driver.
    script = tmp_path / "silent.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            for line in sys.stdin:
                req = json.loads(line)
                if req["op"] in ("open", "close"):
                    answer = {"protocol": 1, "concurrent": True} if req["op"] == "open" else None
                    print(json.dumps({"id": req["id"], "result": answer}), flush=True)
                else:
                    time.sleep(60)
            """
        ),
        encoding="utf-8",
    )
    # Long enough for a Python start-up on a loaded machine: open must not time out.
    monkeypatch.setenv("DSM_EXEC_TIMEOUT", "1.5")
    command = f"{sys.executable} {script}"
    code = main(["run", str(SLOW_WORKER), "--seed", "1", "--handler", f"exec:{command}"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "FAIL slow-worker seed 1: the handler broke the protocol, so the run stopped: "
        "HandlerTimeoutError: the handler process did not answer request 2 (get"
    ) in out
    assert "0/0 runs kept every invariant; 1 stopped by a protocol error" in out


def test_dsm_run_takes_exec_as_dsm_verify_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``dsm run --exec CMD`` is ``dsm run --handler exec:CMD``: same runs, same replay line."""
    command = shlex.join([*SERVE, SERVED])
    target = [str(SLOW_WORKER), "--seed", "1"]
    assert main(["run", *target, "--handler", f"exec:{command}"]) == 0
    long_form = capsys.readouterr().out
    assert main(["run", *target, "--exec", command]) == 0
    assert capsys.readouterr().out == long_form
    assert main(["run", *target, "--exec", command, "--handler", "broken:no_fencing"]) == 2
    assert "not --handler and --exec" in capsys.readouterr().err


def test_a_peer_process_dying_on_open_stops_the_run_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A worker's own process on the run's store exits on open: the run stops and says
    # why, instead of SimPy failing to rebuild the error (a traceback, exit status 3).
    script = tmp_path / "peerless.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            for line in sys.stdin:
                req = json.loads(line)
                if req["op"] == "open":
                    marker = os.path.join(sys.argv[1], req.get("store", "none"))
                    if os.path.exists(marker):
                        sys.stderr.write("peer: cannot reach the store\\n")
                        sys.exit(3)
                    open(marker, "w").close()
                    answer = {"protocol": 1, "concurrent": True, "named_store": True}
                    print(json.dumps({"id": req["id"], "result": answer}), flush=True)
                elif req["op"] == "close":
                    print(json.dumps({"id": req["id"], "result": None}), flush=True)
                    break
                else:
                    result = False if req["op"] == "exists" else None
                    print(json.dumps({"id": req["id"], "result": result}), flush=True)
            """
        ),
        encoding="utf-8",
    )
    command = f"{sys.executable} {script} {tmp_path}"
    code = main(["run", str(SLOW_WORKER), "--seed", "1", "--handler", f"exec:{command}"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "FAIL slow-worker seed 1: the handler broke the protocol, so the run stopped: "
        "HandlerExitedError: the handler process exited with status 3 before answering "
        "request 1 (open)"
    ) in out
    assert "cannot reach the store" in out


# --- --exec-tcp ------------------------------------------------------------------------------


def _serving_tcp(factory: str) -> contextlib.AbstractContextManager[str]:
    """``dsm serve --tcp`` of ``factory`` on a free port: its address."""
    return serving(dsm_serve_command(factory))


@pytest.fixture(scope="module")
def served_tcp() -> Iterator[str]:
    """``dsm serve --tcp`` of the in-memory handler on a free port: its address."""
    with _serving_tcp(SERVED) as address:
        yield address


def test_memory_handler_served_over_tcp_passes_the_kit(
    served_tcp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--exec-tcp", served_tcp, "--profile", "dev", "--seed", "0"]
    # The server runs in the zone it was started in: the test cases' zones never reach it.
    code = main([*argv, "--waive", "time-zones"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.rstrip().endswith("PASSED")
    assert f"--exec-tcp {served_tcp}" in out.splitlines()[0]
    assert "waived time-zones: " in out


def test_each_tcp_connection_starts_with_an_empty_store(served_tcp: str) -> None:
    import asyncio

    from reference_engine.clock import ManualClock
    from reference_engine.context import StateHandlerContext

    ctx = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="flow-1",
        entity_execution_id="run-1",
        tenant_id="t1",
        source_app_id="app-1",
    ).for_item("INV-1")
    factory = tcp_factory(served_tcp)

    async def acquire_twice() -> list[int | None]:
        first, second = factory(ManualClock()), factory(ManualClock())
        await first.open()
        await second.open()
        try:
            return [await first.try_acquire_lock(ctx), await second.try_acquire_lock(ctx)]
        finally:
            await first.close()
            await second.close()

    assert asyncio.run(acquire_twice()) == [1, 1]


def test_connections_that_name_one_store_share_it(served_tcp: str) -> None:
    """A peer is a second session on the store its handler named: what one writes, all read."""
    import asyncio

    from reference_engine.clock import ManualClock

    ctx = CTX.for_item("INV-7")

    async def through_a_peer() -> tuple[bool, int | None, int | None, bool]:
        owner = tcp_factory(served_tcp)(ManualClock())
        await owner.open()
        peer = owner.peer()
        assert peer is not None and peer.store == owner.store and not peer.owns_store
        await peer.open()
        try:
            token = await owner.try_acquire_lock(ctx)
            refused = await peer.try_acquire_lock(ctx)
            held = CTX.for_item("INV-7", lock_token=token)
            await peer.set(held, IdempotencyStatus.PROCESSED, None)
            return owner.named_store, token, refused, await owner.exists(ctx)
        finally:
            await peer.close()
            await owner.close()

    assert asyncio.run(through_a_peer()) == (True, 1, None, True)


def test_a_lock_held_by_the_served_instance_is_caught_across_connections() -> None:
    """Served over TCP, each of the kit's workers is a session of its own on the named store.

    The handler makes acquire atomic with an ``asyncio.Lock`` in the instance:
    through one session (and in the ``dsm serve`` of one process, whose store
    no other process reaches) the races never interleave; through peers they
    do, as between two worker processes.
    """
    with _serving_tcp(INSTANCE_LOCKED) as address:
        # The race is the subject: the edge probes, which race nothing, are left out.
        report = verify(tcp_factory(address), "dev", seed=0, stop_on_first=True, probes=False)
    assert [v.found_as for v in report.violations] == ["at_most_one_live_lock"]
    # Through one process the race matrix and the search pass it (the edge
    # probes, which race nothing, are left out of this half).
    one_process = exec_factory([*SERVE, INSTANCE_LOCKED])
    alone = verify(one_process, "dev", seed=0, stop_on_first=True, max_examples=4, probes=False)
    assert alone.error is None and not alone.violations, [v.render() for v in alone.violations]
    assert alone.coverage is not None and alone.coverage.exercised > 0


def test_a_tcp_address_nobody_listens_on_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["verify", "--exec-tcp", f"127.0.0.1:{port}", "--profile", "dev"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot connect to the handler server" in err
    assert main(["verify", "--exec-tcp", "localhost", "--profile", "dev"]) == 2
    assert "not a TCP address" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "listen", "host", "port"),
    [
        ("127.0.0.1:7411", False, "127.0.0.1", 7411),
        ("[::1]:7411", False, "::1", 7411),
        ("localhost:0", True, "localhost", 0),
    ],
)
def test_tcp_addresses_are_parsed(text: str, listen: bool, host: str, port: int) -> None:
    address = parse_address(text, listen=listen)
    assert (address.host, address.port) == (host, port)
    assert parse_address(str(address), listen=listen) == address


@pytest.mark.parametrize("text", ["localhost", "127.0.0.1:0", ":7411", "h:70000", "h:x"])
def test_a_bad_tcp_address_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ConfigurationError, match="host:port with a port from 1 to 65535"):
        parse_address(text)


# --- replay files ------------------------------------------------------------------------------


def test_a_violation_leaves_a_replay_file_that_reproduces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node()
    command = f"{node} {NODE_HANDLER}"
    replays = tmp_path / "replays"
    with monkeypatch.context() as patched:
        patched.setenv("DSM_NODE_BUG", "no_fencing")
        code = main(
            [
                *("verify", "--exec", command, "--profile", "dev", "--seed", "0"),
                *("--stop-on-first", "--replay-dir", str(replays)),
                *("--cache-dir", str(tmp_path / "cache")),
            ]
        )
    captured = capsys.readouterr()
    assert code == 1, captured.out
    # Without fencing a stale holder's write lands, and so does a spent token's.
    found = re.search(
        r"FAILED \(1 violated: (stale_write_rejected|spent_token_rejected)\)", captured.out
    )
    assert found, captured.out
    (path,) = replays.glob("*.jsonl")
    assert path.name == f"{found.group(1)}-seed0.jsonl"
    assert f"dsm replay {path} --exec '{command}'" in captured.err
    # A Node handler's counterexample is also a node:test file beside it, and printed.
    (printed,) = replays.glob("*.test.js")
    assert printed.name == f"{found.group(1)}-seed0.test.js"
    assert f"as a node:test file (node --test) ({printed})" in captured.out
    assert 'require("node:test")' in printed.read_text(encoding="utf-8")

    lines = path.read_text(encoding="utf-8").splitlines()
    requests = [json.loads(line) for line in lines]
    assert all(problem("request", r) is None for r in requests)
    assert requests[0]["op"] == "open"
    assert [r["id"] for r in requests] == sorted({r["id"] for r in requests})

    broken = exec_factory([node, str(NODE_HANDLER)], env={"DSM_NODE_BUG": "no_fencing"})
    correct = exec_factory([node, str(NODE_HANDLER)])
    on_broken, broke = replay(read_replay(path), broken)
    on_correct, _ = replay(read_replay(path), correct)
    assert broke is None and len(on_broken) == len(requests)
    # The stale write the kit reported lands on the broken handler and is fenced
    # off by the correct one; up to there, both answer alike.
    differing = [
        (b, c)
        for b, c in zip(on_broken, on_correct, strict=True)
        if b.answer is not None
        and c.answer is not None
        and b.answer != c.answer
        and b.request["op"] != "open"
    ]
    assert differing, "the replay answers the same on both handlers"
    first_broken, first_correct = differing[0]
    assert first_correct.error_kind == "stale_lock"
    assert first_broken.error_kind is None
    assert first_broken.request["op"] in ("set", "release_lock_as_failed", "upsert")
    assert first_broken.request["context"]["lock_token"] is not None

    # The same file, by the command line, against the correct handler.
    assert main(["replay", str(path), "--exec", command]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^! .*-> ERROR stale_lock", shown, re.MULTILINE), shown
    assert f"{len(requests)} request(s) answered" in shown


def _two_acquires(path: Path) -> Path:
    """A replay file by hand: open, two acquires of one item, close."""
    now = "2026-03-02T09:00:00.000000Z"
    context = {
        "tenant_id": "t1",
        "source_app_id": "app-1",
        "scope_id": 4,
        "scope_code": "Element",
        "entity_id": "flow-1",
        "entity_execution_id": "run-1",
        "item_entity_key": "",
        "item_key": "INV-1",
        "lock_duration_us": 1_800_000_000,
        "retention_us": None,
        "lock_token": None,
    }
    messages = [
        {"id": 1, "op": "open", "now": now, "protocol": 1, "protocols": [1, 2]},
        {"id": 2, "op": "try_acquire_lock", "now": now, "context": context},
        {"id": 3, "op": "try_acquire_lock", "now": now, "context": context},
        {"id": 4, "op": "close", "now": now},
    ]
    path.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    return path


def test_plain_stdin_replay_works_too(tmp_path: Path) -> None:
    # A replay file is line-delimited requests: "CMD < file.jsonl" needs no harness.
    node = _node()
    path = _two_acquires(tmp_path / "two.jsonl")
    with path.open("rb") as stdin:
        done = subprocess.run(
            [node, str(NODE_HANDLER)], stdin=stdin, capture_output=True, timeout=30, check=True
        )
    answers = {a["id"]: a for a in map(json.loads, done.stdout.decode().splitlines())}
    assert sorted(answers) == [1, 2, 3, 4]
    assert sorted([answers[2]["result"], answers[3]["result"]], key=str) == [1, None]


def test_a_run_the_judgement_gives_up_on_is_undecided_not_agreeing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _two_acquires(tmp_path / "two.jsonl")
    command = f"{_node()} {NODE_HANDLER}"
    assert main(["replay", str(path), "--exec", command]) == 0
    assert "broke 0 of 1 run(s): every run's answers agree" in capsys.readouterr().out
    # One reference call is not enough to explain two acquires: the run is not judged,
    # and the replay says so instead of calling it agreeing.
    monkeypatch.setattr(replay_module, "MAX_JUDGE_CALLS", 1)
    assert main(["replay", str(path), "--exec", command]) == replay_module.EXIT_UNDECIDED
    out = capsys.readouterr().out
    assert "broke 0 of 1 run(s), 1 undecided" in out
    assert "run 1: undecided: the judgement spent its 1 reference calls" in out
    assert "every run's answers agree" not in out


def test_a_replay_file_that_is_not_requests_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": 1, "op": "open", "now": "2026-03-02T09:00:00Z", "protocol": 1}\n'
        '{"id": 2, "op": "teleport"}\n',
        encoding="utf-8",
    )
    assert main(["replay", str(path), "--exec", "true"]) == 2
    assert f"{path}:2 is not a protocol request" in capsys.readouterr().err
