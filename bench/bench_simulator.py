"""Simulator throughput: simulated handler operations per second, against bare SimPy.

The baseline is a bare SimPy environment processing the same number of
events (one timeout per operation, spread over as many processes as the
scenario has workers), so the ratio is the cost of everything the
simulator adds per operation: the node executor, the handler, the
coroutine bridge, the history recorder and the checker at the end.

Each measurement is taken a few times, alternating run and baseline, and
the fastest of each is kept: on a shared machine the slow readings are
other processes' work, and alternating exposes both to the same load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from pathlib import Path
from typing import Any

import simpy
from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = "Simulator: simulated handler operations per second vs a bare SimPy loop"
HEADERS = (
    "handler",
    "items",
    "operations",
    "seconds",
    "sim ops/s",
    "bare SimPy events/s",
    "sim/bare",
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
        seconds, bare_rate = float("inf"), 0.0
        for _ in range(1 if short else REPEATS):
            started = timed()
            result = run_scenario(scenario, seed=1, handler=spec)
            seconds = min(seconds, timed() - started)
            operations = len(result.history.ops)
            bare_rate = max(bare_rate, _bare_simpy(operations, scenario.workers))
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
                "pass" if result.passed else "FAIL",
            )
        )
    note = (
        f"scenario {SCENARIO.name} (seed 1); seconds include the checker; "
        f"best of {1 if short else REPEATS}, alternating with the baseline"
    )
    return [Table(TITLE, HEADERS, rows, note)]
