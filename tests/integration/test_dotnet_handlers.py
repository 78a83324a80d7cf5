"""The C# handlers (``handlers/dotnet``) through their protocol host, built with Mono's ``mcs``.

The in-memory handler and the built-in SQLite handler must pass the kit at
the ``dev`` profile with seed 0, the SQLite one raced through several
processes on the store the kit names; each deliberately broken C# variant
must be caught (the read-then-write acquire through those processes);
payload text, the year-9999 limit, the order of ``close`` and a store that
cannot open are checked directly.  Needs Mono (``mcs``, ``mono``),
Mono.Data.Sqlite and Debian's Newtonsoft.Json: skipped where one is missing,
and a failure under ``CI=true`` (``.ci/run`` installs them).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsm_sim.conformance.runner import VerificationReport, verify
from dsm_sim.protocol.client import ExecHandler, exec_factory, preflight
from dsm_sim.protocol.replay import replay
from dsm_sim.scenario import load_scenarios
from dsm_sim.simulator.run import run_scenario
from reference_engine.clock import ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import DsmError, StoreError
from reference_engine.handlers.memory import in_memory_handler
from reference_engine.status import TRANSITIONS, IdempotencyStatus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOTNET = ROOT / "handlers" / "dotnet"
#: What the build needs besides mcs and mono (Debian's libmono-sqlite4.0-cil and
#: libnewtonsoft-json-cil-dev).
LIBRARIES = (
    Path("/usr/lib/mono/4.5/Mono.Data.Sqlite.dll"),
    Path("/usr/lib/pkgconfig/newtonsoft-json.pc"),
)
UTC = dt.UTC
S = IdempotencyStatus


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing toolchain is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The handlers built by ``handlers/dotnet/build.sh`` into a fresh directory."""
    for tool in ("mcs", "mono"):
        if shutil.which(tool) is None:
            _missing(f"{tool} is not installed (apt-get install mono-devel)")
    for library in LIBRARIES:
        if not library.exists():
            _missing(
                f"{library} is missing (apt-get install libmono-sqlite4.0-cil libnewtonsoft-json-cil-dev)"
            )
    out = tmp_path_factory.mktemp("dotnet-build")
    subprocess.run(["bash", str(DOTNET / "build.sh"), str(out)], check=True, timeout=300)
    return out


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the SQLite handler keeps the stores it is named (inherited by its processes)."""
    directory = tmp_path / "stores"
    monkeypatch.setenv("DSM_DOTNET_SQLITE_DIR", str(directory))
    return directory


def _mono(build: Path, program: str, *args: str) -> list[str]:
    mono = shutil.which("mono")
    assert mono is not None
    return [mono, str(build / program), *args]


def _assert_passed(report: VerificationReport) -> None:
    assert report.passed, "\n\n".join(v.render() for v in report.violations) or report.error
    assert report.test_cases > 0 and report.steps > 0


def _ctx(
    item: str = "INV-1", *, retention: dt.timedelta | None = dt.timedelta(days=30)
) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="invoice-dispatch",
        entity_execution_id="run-1",
        tenant_id="t1",
        source_app_id="billing",
        handler_config=HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=retention),
    ).for_item(item)


# --- the contract ------------------------------------------------------------------------------


def test_the_transition_table_is_the_python_one(build: Path, tmp_path: Path) -> None:
    probe = tmp_path / "Probe.cs"
    probe.write_text(
        """
        using System;
        using System.Linq;
        using Dsm.DataStateMachine;
        static class Probe {
            static void Main() {
                foreach (var entry in Statuses.Transitions)
                    Console.WriteLine(entry.Key.WireValue() + ":" +
                        string.Join(",", entry.Value.Select(s => s.WireValue()).OrderBy(s => s)));
            }
        }
        """,
        encoding="utf-8",
    )
    exe = tmp_path / "Probe.exe"
    subprocess.run(
        ["mcs", "-nologo", f"-r:{build / 'Dsm.DataStateMachine.dll'}", f"-out:{exe}", str(probe)],
        check=True,
        timeout=120,
    )
    shutil.copy(build / "Dsm.DataStateMachine.dll", tmp_path)
    out = subprocess.run(["mono", str(exe)], check=True, capture_output=True, text=True, timeout=60)
    table = {
        source: set(filter(None, targets.split(",")))
        for source, targets in (line.split(":") for line in out.stdout.splitlines())
    }
    assert table == {s.value: {t.value for t in TRANSITIONS[s]} for s in IdempotencyStatus}


# --- the kit -----------------------------------------------------------------------------------


def test_the_in_memory_handler_passes_the_kit(build: Path) -> None:
    _assert_passed(verify(exec_factory(_mono(build, "MemoryHandler.exe")), profile="dev", seed=0))


def test_the_sqlite_handler_passes_the_kit_through_processes_on_one_store(
    build: Path, stores: Path
) -> None:
    report = verify(
        exec_factory(_mono(build, "SqliteHandler.exe")), profile="dev", seed=0, max_examples=12
    )
    _assert_passed(report)
    # Each test case's store was named on open and dropped by the close that said so.
    assert stores.is_dir() and not list(stores.iterdir())


def test_a_handler_of_the_seeds_interface_runs_unchanged_and_is_judged_under_seed(
    build: Path,
) -> None:
    """The host adapts the seed's tokenless interface and says so; the kit picks ``seed``."""
    factory = exec_factory(_mono(build, "SeedHandler.exe"))
    assert preflight(factory) is None
    assert (factory.shape, factory.language) == ("seed", "csharp")
    report = verify(factory, profile="dev", seed=0)
    _assert_passed(report)
    assert report.semantics == "seed"
    assert [h.name for h in report.hazards] == ["stale_holder_late_write"]
    assert report.hazards[0].story_steps > 0
    # The contract's handlers say their shape too, and stay under the spec.
    contract = exec_factory(_mono(build, "MemoryHandler.exe"))
    assert preflight(contract) is None
    assert (contract.shape, contract.language) == ("contract", "csharp")
    assert contract.dsm_semantics is None


@pytest.mark.parametrize(
    ("variant", "caught"),
    [
        ("no_fencing", {"stale_write_rejected", "spent_token_rejected"}),
        ("live_lock_takeover", {"at_most_one_live_lock"}),
        ("parsed_payload", {"data_round_trip"}),
        ("read_then_write_acquire", {"at_most_one_live_lock"}),
    ],
)
def test_a_broken_variant_is_caught(
    build: Path, stores: Path, variant: str, caught: set[str]
) -> None:
    factory = exec_factory(_mono(build, "BrokenHandler.exe", variant))
    report = verify(factory, profile="dev", seed=0, stop_on_first=True)
    assert [v.name for v in report.violations] and {v.name for v in report.violations} <= caught, [
        v.render() for v in report.violations
    ] or report.error


# --- the simulator -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "scenario"),
    [
        ("MemoryHandler.exe", "slow-worker"),
        ("SqliteHandler.exe", "lost-replies"),
        ("SqliteHandler.exe", "crash-mid-dispatch"),
    ],
)
def test_a_handler_keeps_every_invariant_of_a_scenario(
    build: Path, stores: Path, program: str, scenario: str
) -> None:
    (loaded,) = load_scenarios(ROOT / "scenarios" / f"{scenario}.toml")
    command = _mono(build, program)
    result = run_scenario(loaded, 1, exec_factory(command), handler_name=f"exec:{program}")
    assert result.passed, result.violated
    assert result.stats["side_effects"], result.stats


# --- the host ----------------------------------------------------------------------------------


@pytest.fixture(params=["MemoryHandler.exe", "SqliteHandler.exe"])
def program(request: pytest.FixtureRequest, build: Path, stores: Path) -> list[str]:
    """The command of each C# handler (the SQLite one keeps its stores under ``stores``)."""
    return _mono(build, str(request.param))


#: The numbers a store's own conversion gets wrong, as the canonical text the harness sends.
PAYLOAD = (
    '{"big":18446744073709551616,"double":1e+300,"exact":9007199254740993,'
    '"float":1.0,"huge":' + "9" * 100 + ',"negative_zero":-0.0,"tiny":5e-324,'
    '"text":"caf\\u00e9 \\ud83d\\ude00 \\u0000"}'
)


def test_payload_text_comes_back_exactly_as_sent(program: list[str]) -> None:
    now = "2026-03-02T09:00:00.000000Z"
    context = {
        "tenant_id": "t1",
        "source_app_id": "billing",
        "scope_id": 4,
        "scope_code": "Element",
        "entity_id": "invoice-dispatch",
        "entity_execution_id": "run-1",
        "item_entity_key": "",
        "item_key": "INV-1",
        "lock_duration_us": 1_800_000_000,
        "retention_us": None,
        "lock_token": None,
    }
    requests: list[dict[str, Any]] = [
        {"id": 1, "op": "open", "now": now, "protocol": 1, "store": "dsm_payload"},
        {"id": 2, "op": "upsert", "now": now, "context": context, "data_json": PAYLOAD},
        {"id": 3, "op": "get", "now": now, "context": context},
        {"id": 4, "op": "close", "now": now, "drop_store": True},
    ]
    pairs, broken = replay(requests, exec_factory(program))
    assert broken is None
    answers = {pair.request["id"]: pair.answer for pair in pairs}
    assert answers[2] == {"id": 2, "result": None}
    record = answers[3]["result"]
    assert record["data_json"] == PAYLOAD
    assert math.copysign(1.0, json.loads(record["data_json"])["negative_zero"]) == -1.0


def test_everything_sent_before_close_is_answered_before_it(build: Path, stores: Path) -> None:
    # The broken acquire awaits between its read and its write, so its answer comes from
    # another thread, after the host has read close: close must wait for it.
    now = "2026-03-02T09:00:00.000000Z"
    context = {
        "tenant_id": "t1",
        "source_app_id": "a",
        "scope_id": 4,
        "scope_code": "Element",
        "entity_id": "e",
        "entity_execution_id": "r",
        "item_entity_key": "",
        "item_key": "INV-1",
        "lock_duration_us": 1_000_000,
        "retention_us": None,
        "lock_token": None,
    }
    requests: list[dict[str, Any]] = [
        {"id": 1, "op": "open", "now": now, "protocol": 1, "store": "dsm_close_order"},
        *(
            {
                "id": 2 + n,
                "op": "try_acquire_lock",
                "now": now,
                "context": {**context, "item_key": f"INV-{n}"},
            }
            for n in range(5)
        ),
        {"id": 7, "op": "close", "now": now, "drop_store": True},
    ]
    factory = exec_factory(_mono(build, "BrokenHandler.exe", "read_then_write_acquire"))
    pairs, broken = replay(requests, factory, pipelined=True)
    assert broken is None
    assert [pair.answer for pair in pairs[1:6]] == [{"id": 2 + n, "result": 1} for n in range(5)]
    assert pairs[6].answer == {"id": 7, "result": None}


def _outcomes(handler: Any) -> list[str]:
    """What each call near the end of year 9999 does: the class of its result or of its error."""
    steps: list[Callable[[], Any]] = [
        lambda: handler.try_acquire_lock(_ctx("A")),
        lambda: handler.set(_ctx("A"), S.SKIPPED, {"n": 1}),
        lambda: handler.set(_ctx("A"), S.PROCESSING, None),  # refused before the instant
        lambda: handler.set(_ctx("A"), S.SKIPPED, {"blob": "x" * 300_000}),  # too large first
        lambda: handler.release_lock_as_failed(_ctx("A"), "no token"),  # no token first
        lambda: handler.upsert(_ctx("A"), {"n": 2}),
        lambda: handler.upsert(_ctx("B", retention=None), {"n": 3}),  # kept forever: fine
        lambda: handler.get(_ctx("A")),
        lambda: handler.exists(_ctx("B", retention=None)),
        lambda: handler.reset_expired_locks(),
    ]

    async def calls() -> list[str]:
        seen: list[str] = []
        await handler.open()
        try:
            for step in steps:
                try:
                    seen.append(type(await step()).__name__)
                except DsmError as exc:
                    seen.append(type(exc).__name__)
        finally:
            await handler.close()
        return seen

    return asyncio.run(calls())


def test_instants_past_year_9999_are_refused_as_the_model_refuses_them(program: list[str]) -> None:
    # 23:45 on the last day: now + 30 min of lock and now + 30 days of retention are past it.
    end = dt.datetime(9999, 12, 31, 23, 45, tzinfo=UTC)
    expected = _outcomes(in_memory_handler(ManualClock(end)))
    assert expected.count("InstantOutOfRangeError") == 3, expected
    assert _outcomes(ExecHandler(program, ManualClock(end), store="dsm_year_9999")) == expected


def test_a_store_that_cannot_open_is_a_store_error(build: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    handler = ExecHandler(
        _mono(build, "SqliteHandler.exe"),
        ManualClock(),
        env={"DSM_DOTNET_SQLITE_DIR": str(blocker / "stores")},
        store="dsm_unopenable",
    )

    async def open_it() -> None:
        try:
            await handler.open()
        finally:
            await handler.close()

    with pytest.raises(StoreError, match="cannot prepare the SQLite store"):
        asyncio.run(open_it())


# --- what the host cannot format or read ------------------------------------------------------

#: A handler whose get returns, at once or from a continuation, a record the protocol cannot say.
UNSAYABLE = """
using System;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Protocol;

sealed class Unsayable : IDataStateMachineHandler {
    readonly InMemoryDataStateMachineHandler inner;
    public Unsayable(IClock clock) { inner = new InMemoryDataStateMachineHandler(clock); }

    public async Task<StateRecord> GetAsync(StateHandlerContext c, CancellationToken t) {
        var key = c.ItemKey.StartsWith("null-key") ? null : new RecordKey("t1", 4, "e", "", c.ItemKey);
        var status = c.ItemKey.StartsWith("bad-status") ? (IdempotencyStatus)99 : IdempotencyStatus.Processing;
        if (c.ItemKey.EndsWith("async")) await Task.Delay(20);
        var now = new DateTime(2026, 3, 2, 9, 0, 0, DateTimeKind.Utc);
        return new StateRecord(key, status, 1, null, null, null, "r", "a", now, now, null);
    }
    public Task<bool> ExistsAsync(StateHandlerContext c, CancellationToken t) { return inner.ExistsAsync(c, t); }
    public Task<long?> TryAcquireLockAsync(StateHandlerContext c, CancellationToken t) { return inner.TryAcquireLockAsync(c, t); }
    public Task SetAsync(StateHandlerContext c, IdempotencyStatus s, string d, CancellationToken t) { return inner.SetAsync(c, s, d, t); }
    public Task ReleaseLockAsFailedAsync(StateHandlerContext c, string e, CancellationToken t) { return inner.ReleaseLockAsFailedAsync(c, e, t); }
    public Task UpsertAsync(StateHandlerContext c, string d, CancellationToken t) { return inner.UpsertAsync(c, d, t); }
    public Task<int> ResetExpiredLocksAsync(CancellationToken t) { return inner.ResetExpiredLocksAsync(t); }
    public Task<int> ExpirePastRetentionAsync(CancellationToken t) { return inner.ExpirePastRetentionAsync(t); }
}

static class Program {
    static int Main(string[] args) {
        return DsmProtocolHost.Run(args, clock => new Unsayable(clock), new HostOptions { Name = "unsayable" });
    }
}
"""

NOW = "2026-03-02T09:00:00.000000Z"
CONTEXT = {
    "tenant_id": "t1",
    "source_app_id": "a",
    "scope_id": 4,
    "scope_code": "Element",
    "entity_id": "e",
    "entity_execution_id": "r",
    "item_entity_key": "",
    "item_key": "INV-1",
    "lock_duration_us": 1_000_000,
    "retention_us": None,
    "lock_token": None,
}


@pytest.fixture(scope="module")
def unsayable(build: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("unsayable")
    (folder / "Unsayable.cs").write_text(UNSAYABLE, encoding="utf-8")
    exe = folder / "Unsayable.exe"
    subprocess.run(
        [
            "mcs",
            "-nologo",
            f"-r:{build / 'Dsm.DataStateMachine.dll'}",
            f"-out:{exe}",
            str(folder / "Unsayable.cs"),
        ],
        check=True,
        timeout=120,
    )
    shutil.copy(build / "Dsm.DataStateMachine.dll", folder)
    return ["mono", str(exe)]


def _serve(command: list[str], lines: list[bytes]) -> tuple[dict[int, dict[str, Any]], str]:
    """Every answer of one host process given ``lines`` (and a close), by id; and its stderr."""
    close = json.dumps({"id": 99, "op": "close", "now": NOW}).encode()
    done = subprocess.run(
        command,
        input=b"\n".join([*lines, close, b""]),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    by_id = {answer["id"]: answer for answer in answers}
    assert len(by_id) == len(answers), answers
    return by_id, done.stderr.decode("utf-8", "replace")


def _request(request_id: int, op: str, **fields: Any) -> bytes:
    return json.dumps({"id": request_id, "op": op, "now": NOW, **fields}).encode()


OPEN = _request(1, "open", protocol=1, protocols=[1, 2])


def test_a_record_the_host_cannot_write_is_answered_internal_at_once_or_later(
    unsayable: list[str],
) -> None:
    items = ["null-key-sync", "null-key-async", "bad-status-sync", "bad-status-async"]
    gets = [
        _request(2 + n, "get", context={**CONTEXT, "item_key": item})
        for n, item in enumerate(items)
    ]
    answers, stderr = _serve(unsayable, [OPEN, *gets])
    unanswered = [item for n, item in enumerate(items) if 2 + n not in answers]
    assert unanswered == [], f"never answered; stderr: {stderr!r}"
    for n, item in enumerate(items):
        assert answers[2 + n]["error"]["kind"] == "internal", (item, answers[2 + n])
        assert f"request {2 + n} " in stderr, (item, stderr)
    assert answers[99] == {"id": 99, "result": None}


def test_a_request_nested_past_the_limit_is_a_bad_request_and_the_host_serves_on(
    build: Path,
) -> None:
    deep = b'{"id": 2, "op": "get", "junk": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    after = _request(3, "exists", context=CONTEXT)
    answers, stderr = _serve(_mono(build, "MemoryHandler.exe"), [OPEN, deep, after])
    assert answers[2]["error"]["kind"] == "bad_request", answers
    assert "nested" in answers[2]["error"]["message"]
    assert answers[3] == {"id": 3, "result": False}
    assert "nested" in stderr


def test_invalid_utf8_in_a_request_is_a_bad_request_not_a_replacement_character(
    build: Path,
) -> None:
    payload = (
        b'{"id": 2, "op": "upsert", "now": "' + NOW.encode() + b'", "data_json": "\\"a\xff\xfeb\\""'
    )
    payload += b', "context": ' + json.dumps(CONTEXT).encode() + b"}"
    read = _request(3, "get", context=CONTEXT)
    answers, stderr = _serve(_mono(build, "MemoryHandler.exe"), [OPEN, payload, read])
    assert answers[2]["error"]["kind"] == "bad_request", answers
    assert "UTF-8" in answers[2]["error"]["message"]
    assert answers[3] == {"id": 3, "result": None}, "nothing was stored"
    assert "UTF-8" in stderr


# --- the protocol version and what handler code does to the host -----------------------------


def test_the_host_speaks_version_2_and_answers_it_when_only_1_is_offered(build: Path) -> None:
    memory = _mono(build, "MemoryHandler.exe")
    answers, _stderr = _serve(memory, [OPEN])
    assert answers[1]["result"]["protocol"] == 2
    # A harness that offers only version 1 gets the host's version and no store, so it
    # stops with VersionMismatchError instead of misjudging the answers.
    answers, stderr = _serve(
        memory, [_request(1, "open", protocol=1), _request(2, "get", context=CONTEXT)]
    )
    assert answers[1]["result"]["protocol"] == 2
    assert "open did not offer protocol version 2" in stderr


#: A handler whose every call prints on Console.Out, and whose acquire of item "throw" throws.
CHATTY = """
using System;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Protocol;

sealed class Chatty : IDataStateMachineHandler {
    readonly InMemoryDataStateMachineHandler inner;
    public Chatty(IClock clock) { inner = new InMemoryDataStateMachineHandler(clock); }

    static void Say(string what, StateHandlerContext c) {
        Console.WriteLine("chatty: " + what + " " + c.ItemKey);
        Console.Write("{\\"id\\": 2, \\"result\\": 99}");
        Console.Out.Flush();
    }

    public Task<long?> TryAcquireLockAsync(StateHandlerContext c, CancellationToken t) {
        Say("acquire", c);
        if (c.ItemKey != "throw") return inner.TryAcquireLockAsync(c, t);
        throw new InvalidOperationException("the handler threw on purpose");
    }
    public Task<StateRecord> GetAsync(StateHandlerContext c, CancellationToken t) { Say("get", c); return inner.GetAsync(c, t); }
    public Task<bool> ExistsAsync(StateHandlerContext c, CancellationToken t) { Say("exists", c); return inner.ExistsAsync(c, t); }
    public Task SetAsync(StateHandlerContext c, IdempotencyStatus s, string d, CancellationToken t) { Say("set", c); return inner.SetAsync(c, s, d, t); }
    public Task ReleaseLockAsFailedAsync(StateHandlerContext c, string e, CancellationToken t) { return inner.ReleaseLockAsFailedAsync(c, e, t); }
    public Task UpsertAsync(StateHandlerContext c, string d, CancellationToken t) { return inner.UpsertAsync(c, d, t); }
    public Task<int> ResetExpiredLocksAsync(CancellationToken t) { return inner.ResetExpiredLocksAsync(t); }
    public Task<int> ExpirePastRetentionAsync(CancellationToken t) { return inner.ExpirePastRetentionAsync(t); }
}

static class Program {
    static int Main(string[] args) {
        return DsmProtocolHost.Run(args, clock => new Chatty(clock), new HostOptions { Name = "chatty" });
    }
}
"""


@pytest.fixture(scope="module")
def chatty(build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``Chatty.exe`` built with ``mcs -debug``, beside the host it references."""
    folder = tmp_path_factory.mktemp("chatty")
    source = folder / "Chatty.cs"
    source.write_text(CHATTY, encoding="utf-8")
    exe = folder / "Chatty.exe"
    reference = f"-r:{build / 'Dsm.DataStateMachine.dll'}"
    subprocess.run(
        ["mcs", "-nologo", "-debug", reference, f"-out:{exe}", str(source)], check=True, timeout=120
    )
    shutil.copy(build / "Dsm.DataStateMachine.dll", folder)
    return exe


def test_console_output_of_handler_code_goes_to_stderr_never_among_the_answers(
    chatty: Path,
) -> None:
    token = {**CONTEXT, "lock_token": 1}
    requests = [
        OPEN,
        _request(2, "try_acquire_lock", context=CONTEXT),
        _request(3, "set", context=token, status="processed", data_json='{"n":1}'),
        _request(4, "exists", context=CONTEXT),
        _request(5, "get", context=CONTEXT),
    ]
    # _serve reads every stdout line as an answer: a line of chatter there fails it.
    answers, stderr = _serve(["mono", str(chatty)], requests)
    assert answers[2] == {"id": 2, "result": 1}
    assert answers[3] == {"id": 3, "result": None}
    assert answers[4] == {"id": 4, "result": True}
    assert answers[5]["result"]["status"] == "processed"
    assert answers[5]["result"]["data_json"] == '{"n":1}'
    for said in ("acquire INV-1", "set INV-1", "exists INV-1", "get INV-1"):
        assert f"chatty: {said}" in stderr, stderr


def _thrown(command: list[str]) -> str:
    answers, _stderr = _serve(
        command, [OPEN, _request(2, "try_acquire_lock", context={**CONTEXT, "item_key": "throw"})]
    )
    error = answers[2]["error"]
    assert error["kind"] == "internal" and error["type"] == "System.InvalidOperationException"
    return str(error["message"])


def test_a_thrown_exception_names_its_file_and_line_under_mono_debug(chatty: Path) -> None:
    line = 1 + CHATTY.splitlines().index(
        next(text for text in CHATTY.splitlines() if "threw on purpose" in text)
    )
    message = _thrown(["mono", "--debug", str(chatty)])
    assert "the handler threw on purpose" in message
    assert f"Chatty.cs:{line}" in message, message
    assert "no file or line numbers" not in message


def test_without_mono_debug_the_answer_says_how_to_get_file_and_line(chatty: Path) -> None:
    message = _thrown(["mono", str(chatty)])
    assert "Chatty.cs:" not in message
    assert "mcs -debug" in message and "mono --debug" in message, message


# --- the invoice node --------------------------------------------------------------------------


def test_the_invoice_node_charges_each_invoice_once_on_both_handlers(build: Path) -> None:
    out = subprocess.run(
        _mono(build, "InvoiceExample.exe"), capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    checks = [line for line in out.stdout.splitlines() if line.startswith("  ")]
    assert len(checks) == 14 and all(line.startswith("  ok") for line in checks), out.stdout


# --- NUnit: the contract fixture, and a counterexample as a test ---------------------------------


@pytest.fixture(scope="module")
def nunit(build: Path) -> Path:
    """``nunit-console`` and ``nunit.framework`` (Debian's nunit-console, libnunit-cil-dev)."""
    if shutil.which("nunit-console") is None:
        _missing("nunit-console is not installed (apt-get install nunit-console libnunit-cil-dev)")
    found = subprocess.run(["pkg-config", "--exists", "nunit"], check=False)
    if found.returncode != 0:
        _missing("nunit.framework is missing (apt-get install libnunit-cil-dev)")
    return build


def _nunit(directory: Path, sources: list[Path], out: str, *references: Path) -> str:
    """Build ``sources`` as a test library beside ``references`` and run it: nunit-console's output."""
    subprocess.run(
        [
            "mcs", "-nologo", "-langversion:7.2", "-warnaserror+", "-target:library",
            "-pkg:nunit", *(f"-r:{r}" for r in references), f"-out:{directory / out}",
            *map(str, sources),
        ],
        check=True, timeout=120,
    )  # fmt: skip
    for reference in references:
        if reference.parent != directory:
            shutil.copy(reference, directory)
    run = subprocess.run(
        ["nunit-console", "-nologo", f"-work={directory}", str(directory / out)],
        capture_output=True, text=True, timeout=120, cwd=directory, check=False,
    )  # fmt: skip
    return run.stdout + run.stderr


def test_the_nunit_contract_fixture_builds_with_mcs_and_passes_under_nunit_console(
    nunit: Path,
) -> None:
    sources = sorted((DOTNET / "Dsm.DataStateMachine.Tests").glob("*.cs"))
    output = _nunit(
        nunit, sources, "Dsm.DataStateMachine.Tests.dll", nunit / "Dsm.DataStateMachine.dll"
    )
    assert re.search(r"Tests run: [1-9]\d*, Errors: 0, Failures: 0", output), output


@pytest.mark.parametrize("tokens", ["attempts", "ordered"])
def test_a_counterexample_is_printed_as_an_nunit_test_that_fails_at_the_breaking_step(
    nunit: Path, tmp_path: Path, tokens: str
) -> None:
    """Under either token rule; under ``ordered`` the test keeps each grant's token in a
    variable and asserts its order (the handler's tokens are attempts, which grow)."""
    from dsm_sim.conformance.tell.csharp import is_csharp, nunit_test
    from dsm_sim.conformance.tell.read_backs import is_read_back
    from dsm_sim.conformance.tell.steps import Finding

    factory = exec_factory(_mono(nunit, "BrokenHandler.exe", "no_fencing"))
    assert preflight(factory) is None and factory.language == "csharp"
    assert is_csharp(factory.command, factory.language)
    kept: list[bytes] = []
    answers: dict[int, dict[str, Any]] = {}

    def keep(result: object) -> None:
        kept.extend(factory.last_transcript)
        answers.update(factory.last_answers)

    report = verify(
        factory, profile="dev", seed=0, stop_on_first=True, on_violation=keep, tokens=tokens
    )
    assert report.violations[0].name == "stale_write_rejected"
    message = report.violations[0].message
    finding = Finding("stale_write_rejected", 0, kept, message, answers=answers, tokens=tokens)
    test = nunit_test(finding)
    assert ("var token" in test) is (tokens == "ordered"), test
    assert "new YourHandler(clock)" in test and "ManualClock" in test
    # The program's own steps only: the kit's reads (as run-0) showed nothing the set did not.
    reads = sum(is_read_back(json.loads(line)) for line in kept)
    assert reads > 0 and '"run-0"' not in test, test
    broken = "new Dsm.DataStateMachine.Handlers.InMemoryDataStateMachineHandler(clock, new Dsm.Handlers.Broken.NoFencing())"
    source = tmp_path / "Broken.cs"
    source.write_text(test.replace("new YourHandler(clock)", broken), encoding="utf-8")
    output = _nunit(
        tmp_path,
        [source],
        "Broken.dll",
        nunit / "Dsm.DataStateMachine.dll",
        nunit / "BrokenHandler.exe",
    )
    assert "Failures: 1" in output, output
    assert '"{\\"error\\":\\"stale_lock\\"}"' in output or '{"error":"stale_lock"}' in output, (
        output
    )
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    source = fixed / "Fixed.cs"
    source.write_text(
        test.replace(
            "new YourHandler(clock)",
            "new Dsm.DataStateMachine.Handlers.InMemoryDataStateMachineHandler(clock)",
        ),
        encoding="utf-8",
    )
    output = _nunit(fixed, [source], "Fixed.dll", nunit / "Dsm.DataStateMachine.dll")
    assert re.search(r"Tests run: 1, Errors: 0, Failures: 0", output), output
