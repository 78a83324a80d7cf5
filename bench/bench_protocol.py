"""The handler protocol: what a round trip costs, and ``dsm verify --exec`` against in process.

Two tables.  The first times single operations through each transport: the
in-memory handler in process (the baseline), the Node.js handler, the Java
handler (when a JDK is installed), the C# handlers behind their protocol host
(when Mono is installed) and ``dsm serve`` of the in-memory handler over
stdin/stdout.  ``get`` one at a time is the full round trip; ``exists`` with
10 in flight shows what pipelining recovers.  The second runs the whole
conformance kit on the Node handler, on the C# in-memory handler and on the
in-memory handler in process, same profile and seed, side by side: the bar
is each within 3x of in process.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = "Handler protocol: round trip per operation (µs), each transport vs in process"
VERIFY_TITLE = "dsm verify --exec on the Node and C# handlers vs the in-memory handler in process"
ROOT = Path(__file__).resolve().parent.parent
NODE_HANDLER = ROOT / "handlers" / "node" / "memory.js"
JAVA_HANDLER = ROOT / "handlers" / "java" / "MemoryHandler.java"
DOTNET_BUILD = ROOT / "handlers" / "dotnet" / "build.sh"
MEMORY = "reference_engine.handlers.memory:in_memory_handler"
#: The bar: a handler through the protocol within this many times in process.
TARGET_RATIO = 3.0
#: Full mode runs each verification this many times, alternating, and keeps the fastest.
ROUNDS = 3


async def _round_trips(factory: Callable[[Any], Any], operations: int) -> tuple[float, float]:
    """Microseconds per ``get`` one at a time, and per ``exists`` with 10 in flight."""
    from reference_engine.clock import ManualClock
    from reference_engine.context import StateHandlerContext

    ctx = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="bench",
        entity_execution_id="run-1",
        tenant_id="t1",
        source_app_id="bench",
    ).for_item("INV-1")
    handler = factory(ManualClock())
    await handler.open()
    try:
        await handler.try_acquire_lock(ctx)
        for _ in range(20):  # warm up: JIT, caches, the first pipe wake-ups
            await handler.get(ctx)
        started = timed()
        for _ in range(operations):
            await handler.get(ctx)
        sequential = (timed() - started) / operations * 1e6
        batches = max(1, operations // 10)
        started = timed()
        for _ in range(batches):
            await asyncio.gather(*(handler.exists(ctx) for _ in range(10)))
        pipelined = (timed() - started) / (batches * 10) * 1e6
    finally:
        await handler.close()
    return sequential, pipelined


def _java_command(workdir: Path) -> list[str] | None:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        return None
    subprocess.run([javac, "-d", str(workdir), str(JAVA_HANDLER)], check=True, timeout=300)
    flags = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]
    return [java, *flags, "-cp", str(workdir), "MemoryHandler"]


def _dotnet_commands(workdir: Path) -> dict[str, list[str]]:
    """The C# handlers built with Mono's mcs, by name; none where Mono is missing."""
    mono = shutil.which("mono")
    if mono is None or shutil.which("mcs") is None:
        return {}
    subprocess.run(["bash", str(DOTNET_BUILD), str(workdir)], check=True, timeout=300)
    return {
        "C# MemoryHandler.exe (mono)": [mono, str(workdir / "MemoryHandler.exe")],
        "C# SqliteHandler.exe (mono)": [mono, str(workdir / "SqliteHandler.exe")],
    }


def _transports(node: str, workdir: Path) -> dict[str, Callable[[Any], Any]]:
    from dsm_sim.protocol.client import exec_factory
    from reference_engine.registry import load_factory

    transports: dict[str, Callable[[Any], Any]] = {
        "in process (in_memory_handler)": load_factory(MEMORY),
        "node handlers/node/memory.js": exec_factory([node, str(NODE_HANDLER)]),
    }
    java = _java_command(workdir)
    if java is not None:
        transports["java MemoryHandler"] = exec_factory(java)
    for name, command in _dotnet_commands(workdir / "dotnet").items():
        transports[name] = exec_factory(command)
    serve = [sys.executable, "-m", "dsm_sim.cli", "serve", MEMORY]
    transports["dsm serve in_memory_handler"] = exec_factory(serve)
    return transports


def _verify_seconds(factory: Callable[[Any], Any], short: bool) -> tuple[float, int, bool]:
    from dsm_sim.conformance.runner import verify

    started = timed()
    if short:
        report = verify(factory, profile="dev", seed=0, max_examples=3)
    else:
        report = verify(factory, profile="ci", seed=0)
    return timed() - started, report.test_cases, report.passed


def run(short: bool) -> list[Table]:
    node = shutil.which("node")
    if node is None:
        raise BenchSkipped("node is not installed")
    operations = 200 if short else 3000
    with tempfile.TemporaryDirectory(prefix="dsm-bench-java-") as tmp:
        transports = _transports(node, Path(tmp))
        rows: list[tuple[object, ...]] = []
        base: tuple[float, float] | None = None
        for name, factory in transports.items():
            sequential, pipelined = asyncio.run(_round_trips(factory, operations))
            base = base or (sequential, pipelined)
            rows.append(
                (name, operations, sequential, pipelined, sequential / base[0], pipelined / base[1])
            )
    trips = Table(
        TITLE,
        (
            "handler",
            "ops",
            "get µs",
            "exists µs (10 in flight)",
            "get/in-process",
            "exists/in-process",
        ),
        rows,
        note="get: one request at a time, the full round trip; exists: ten requests on the "
        "wire at once, per request",
    )
    from dsm_sim.protocol.client import exec_factory
    from reference_engine.registry import load_factory

    profile = "dev, 3 examples" if short else "ci"
    # Alternated, best of ROUNDS each: other jobs on the machine slow one run or
    # the other, and the fastest run of each is the least disturbed.
    rounds = 1 if short else ROUNDS
    with tempfile.TemporaryDirectory(prefix="dsm-bench-dotnet-") as tmp:
        sides: dict[str, Callable[[], Callable[[Any], Any]]] = {
            "in process (in_memory_handler)": lambda: load_factory(MEMORY),
            "node handlers/node/memory.js": lambda: exec_factory([node, str(NODE_HANDLER)]),
        }
        dotnet = _dotnet_commands(Path(tmp)).get("C# MemoryHandler.exe (mono)")
        if dotnet is not None:
            sides["C# MemoryHandler.exe (mono)"] = lambda: exec_factory(dotnet)
        runs: dict[str, list[tuple[float, int, bool]]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, make in sides.items():
                runs[name].append(_verify_seconds(make(), short))
    best = {name: min(results) for name, results in runs.items()}
    in_process = best["in process (in_memory_handler)"]
    rows = []
    verdicts = []
    for name, (seconds, cases, passed) in best.items():
        ratio = seconds / in_process[0]
        rows.append((name, profile, cases, seconds, "PASSED" if passed else "FAILED", ratio))
        if name != "in process (in_memory_handler)":
            verdicts.append(
                f"{name.split()[0]} {ratio:.2f} ({'within' if ratio <= TARGET_RATIO else 'over'})"
            )
    side_by_side = Table(
        VERIFY_TITLE,
        ("handler", "profile", "test cases", "seconds", "verdict", "x/in-process"),
        rows,
        note=f"seed 0 for all, best of {rounds} alternating runs; the bar is "
        f"x/in-process <= {TARGET_RATIO:g}: " + ", ".join(verdicts),
    )
    return [trips, side_by_side]
