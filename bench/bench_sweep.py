"""A sweep at scale: every scenario over as many seeds as it takes to reach 10^6 deliveries.

The question a user of ``dsm run --seeds N --jobs J`` asks before putting a
sweep in a nightly job: how long do a million simulated deliveries take on
this machine, and do the correct handlers keep every invariant through all of
them?  The sweep runs every scenario in ``scenarios/`` for seeds 1, 2, 3 ...
through the same ``run_plan`` as ``dsm run --jobs 2``, until the deliveries
reach the target (a first plan of :data:`BLOCK` seeds, then one plan of as
many seeds as its rate says are left, stopped at the first seed that reaches
the target), as ``dsm run`` without ``--report`` does; every run's
verdict counts, and one failing run makes the benchmark fail.  The same
plans then run on a local Dask cluster of two workers (``dsm run --cluster
local --jobs 2``) and with ``jobs=1`` in this process, which give the
speed-up of the second process and the cluster's share of ``--jobs 2``'s
rate; every run must give the same stats and verdict in all three.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = (
    "dsm run over every scenario until 10^6 simulated deliveries: jobs 2, a local Dask "
    "cluster of 2 and jobs 1 (in-memory handler)"
)
HEADERS = (
    "jobs",
    "seeds",
    "runs",
    "deliveries",
    "operations",
    "violations",
    "failed runs",
    "not exercised",
    "seconds",
    "deliveries/s",
    "jobs/1",
    "/jobs 2",
)
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
HANDLER = "reference_engine.handlers.memory:in_memory_handler"
TARGET_ENV = "DSM_BENCH_SWEEP_DELIVERIES"
#: Seeds in the first plan, whose rate sizes the rest: enough runs for both processes.
BLOCK = 25
JOBS = 2


#: The most deliveries the sweep may be asked for: 10^8 is about 14 hours on two cores.
MAX_TARGET = 100_000_000


def _target() -> int:
    """``$DSM_BENCH_SWEEP_DELIVERIES``: an integer from 1 to :data:`MAX_TARGET` (default 10^6)."""
    raw = os.environ.get(TARGET_ENV, "").strip() or "1000000"
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9 and 1 <= int(raw) <= MAX_TARGET):
        raise SystemExit(
            f"{TARGET_ENV}={raw[:40]!r}: give an integer from 1 to {MAX_TARGET}, or unset it "
            "for the default of 1000000"
        )
    return int(raw)


def run(short: bool) -> list[Table]:
    try:
        from dsm_sim.scenario import Scenario, load_scenarios
        from dsm_sim.simulator.parallel import RunOutcome, run_plan
    except ImportError as exc:
        raise BenchSkipped(f"the simulator is not available: {exc}") from exc
    target = 2_000 if short else _target()
    block = 1 if short else BLOCK
    scenarios = load_scenarios(SCENARIOS)
    Plan = list[tuple[Scenario, int]]

    def sweep(runs: Callable[[Plan], Iterator[RunOutcome]], splits: list[int] | None) -> _Sweep:
        """Until the target (``splits`` None), or the seeds of each plan of an earlier sweep."""
        done = _Sweep()
        planned = list(splits or [])
        started = timed()
        while (done.deliveries < target) if splits is None else planned:
            if splits is not None:
                count = planned.pop(0)
            elif done.seeds == 0:
                count = block
            else:
                # The rest in one plan, from the rate so far, with a tenth more as margin:
                # each plan starts its worker processes afresh, and the last runs of a
                # plan leave a worker idle while the other finishes.
                per_seed = done.deliveries / done.seeds
                count = max(block, int((target - done.deliveries) / per_seed * 1.1) + 1)
            first = done.seeds
            seeds_now = range(first + 1, first + count + 1)
            plan = [(s, seed) for seed in seeds_now for s in scenarios]
            outcomes = runs(plan)
            try:
                for n, outcome in enumerate(outcomes, start=1):
                    if outcome.result is None:
                        raise RuntimeError(
                            f"{outcome.scenario.name} seed {outcome.seed}: {outcome}"
                        )
                    done.add(outcome.result)
                    if n % len(scenarios) == 0:  # a seed's runs are all in
                        done.seeds = outcome.seed
                        if splits is None and done.deliveries >= target:
                            break  # the runs still in flight are stopped
            finally:
                close = getattr(outcomes, "close", None)
                if callable(close):
                    close()
            done.splits.append(done.seeds - first)
        done.seconds = timed() - started
        return done

    # As `dsm run` without --report: the workers send back no history.
    parallel = sweep(lambda plan: run_plan(plan, HANDLER, jobs=JOBS, keep_history=False), None)
    swept: list[tuple[int | str, _Sweep]] = [(JOBS, parallel)]
    try:
        from dsm_sim.simulator.distributed import run_plan_on_cluster
    except ImportError:  # pragma: no cover - the dev extra installs Dask
        pass
    else:
        cluster = sweep(
            lambda plan: run_plan_on_cluster(plan, HANDLER, workers=JOBS, keep_history=False),
            parallel.splits,
        )
        swept.append((f"cluster {JOBS}", cluster))
    serial = sweep(lambda plan: run_plan(plan, HANDLER, jobs=1), parallel.splits)
    for name, done in swept:
        if serial.digest != done.digest:
            raise RuntimeError(f"{name} gave other results than jobs=1")
    if parallel.failed:
        failed = ", ".join(parallel.failed[:10])
        raise RuntimeError(f"{len(parallel.failed)} runs broke an invariant: {failed}")
    rows = [
        (
            jobs,
            f"1-{done.seeds}",
            done.runs,
            done.deliveries,
            done.operations,
            done.violations,
            len(done.failed),
            len(done.unreached),
            done.seconds,
            done.deliveries / done.seconds,
            serial.seconds / done.seconds,
            parallel.seconds / done.seconds if jobs != 1 else "-",
        )
        for jobs, done in ((1, serial), *swept)
    ]
    note = (
        f"{len(scenarios)} scenarios x seeds 1-{parallel.seeds} (plans of {parallel.splits} "
        f"seeds): jobs={JOBS} (forkserver workers, start-up included) until {target:,} "
        f"deliveries (${TARGET_ENV}), then the same plans on a LocalCluster of {JOBS} workers "
        "(start-up included) and with jobs=1 in this process; the same stats and verdict for "
        "every run, and every run must keep every invariant"
        + (
            f"; not exercised (a dimension the scenario asks for not reached): "
            f"{', '.join(parallel.unreached[:8])}{', ...' if len(parallel.unreached) > 8 else ''}"
            if parallel.unreached
            else ""
        )
    )
    return [Table(TITLE, HEADERS, rows, note)]


class _Sweep:
    """What a sweep ran and found, summed over its runs."""

    def __init__(self) -> None:
        self.seeds = self.runs = self.deliveries = self.operations = self.violations = 0
        self.seconds = 0.0
        #: Runs that broke an invariant: the benchmark fails on any.
        self.failed: list[str] = []
        #: Runs that kept every invariant but did not reach a dimension their scenario asks
        #: for (NOT EXERCISED): counted, as ``dsm run`` reports them, not a broken invariant.
        self.unreached: list[str] = []
        #: Seeds run by each plan, in order: what a later sweep repeats.
        self.splits: list[int] = []
        self.digest: list[tuple[object, ...]] = []

    def add(self, result: Any) -> None:
        self.runs += 1
        self.deliveries += int(result.stats["deliveries"])
        self.operations += int(result.stats["operations"])
        self.violations += sum(len(i.violations) for i in result.results)
        if result.violated:
            self.failed.append(f"{result.scenario.name} seed {result.seed}")
        elif not result.passed:
            self.unreached.append(f"{result.scenario.name} seed {result.seed}")
        self.digest.append(
            (result.scenario.name, result.seed, result.passed, *result.stats.items())
        )
