"""Simulator throughput: simulated handler calls per second, against the handler's own tight loop.

Simulation efficiency is the share of the handler's own speed a ``dsm run``
turns into checked behaviour: every call the run makes on the handler
(the nodes' calls, the catch-up sweeps, and the reads the checker judges
each call by) is counted, by operation, and the same handler then runs a
tight loop of the same operations in the same proportions.  The ratio of the
two call rates is ``run/tight``.

A second baseline is a bare SimPy environment processing as many events as
the run recorded operations (one timeout per operation, spread over as many
processes as the scenario has workers): ``sim/bare`` is the cost of
everything the simulator adds per operation, the node executor, the handler,
the coroutine bridge, the history recorder and the checker at the end.

Each measurement is taken a few times, alternating run and baseline, and
the fastest of each is kept: on a shared machine the slow readings are
other processes' work, and alternating exposes both to the same load.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Generator
from pathlib import Path
from typing import Any

import simpy
from common import BenchSkipped, Table, timed
from handler_calls import Counting, tight_loop

__all__ = ["TITLE", "run"]

TITLE = "Simulator: handler calls per second in dsm run vs the handler's tight loop"
HEADERS = (
    "handler",
    "items",
    "operations",
    "seconds",
    "sim ops/s",
    "bare SimPy events/s",
    "sim/bare",
    "handler calls",
    "calls/s in run",
    "tight loop calls/s",
    "run/tight",
    "checker",
)
#: Runs per handler in full mode; the fastest run and the fastest baseline are kept.
REPEATS = 3
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "duplicate-storm.toml"


def _bare_simpy(events: int, processes: int) -> float:
    env = simpy.Environment()
    per_process = max(1, events // processes)

    def proc(env: simpy.Environment) -> Generator[Any, Any, None]:
        for _ in range(per_process):
            yield env.timeout(0.05)

    for _ in range(processes):
        env.process(proc(env))
    started = timed()
    env.run()
    return per_process * processes / (timed() - started)


def run(short: bool) -> list[Table]:
    try:
        from dsm_sim.scenario import load_scenario
        from dsm_sim.simulator.run import run_scenario
        from reference_engine.registry import load_factory
    except ImportError as exc:
        raise BenchSkipped(f"the simulator is not available: {exc}") from exc
    base = load_scenario(SCENARIO)
    scenario = dataclasses.replace(base, items=base.items if short else 200)
    factories = {
        "in-memory": "reference_engine.handlers.memory:in_memory_handler",
        "sqlite (memory)": "reference_engine.handlers.sql.factory:sqlite_memory_handler",
    }
    rows: list[tuple[object, ...]] = []
    for name, spec in factories.items():
        factory = load_factory(spec)
        seconds, bare_rate, loop_rate = float("inf"), 0.0, 0.0
        for _ in range(1 if short else REPEATS):
            counting = Counting(factory)
            started = timed()
            result = run_scenario(scenario, seed=1, handler=counting)
            seconds = min(seconds, timed() - started)
            operations = len(result.history.ops)
            calls = sum(counting.calls.values())
            bare_rate = max(bare_rate, _bare_simpy(operations, scenario.workers))
            loop_rate = max(
                loop_rate, asyncio.run(tight_loop(factory, counting.calls, 1000 if short else 4000))
            )
        sim_rate = operations / seconds
        rows.append(
            (
                name,
                scenario.items,
                operations,
                seconds,
                sim_rate,
                bare_rate,
                sim_rate / bare_rate,
                calls,
                calls / seconds,
                loop_rate,
                calls / seconds / loop_rate,
                "pass" if result.passed else "FAIL",
            )
        )
    note = (
        f"scenario {SCENARIO.name} (seed 1); seconds include the checker; "
        f"best of {1 if short else REPEATS}, alternating with the baselines; handler calls: "
        "every call on the handler (the nodes', the sweeps' and the checker's reads), and the "
        "tight loop runs the same operations in the same proportions on the same factory"
    )
    return [Table(TITLE, HEADERS, rows, note)]
