"""``dsm run --jobs`` and ``--cluster``: simulated deliveries per second, 1 vs 2 workers.

The baseline is the same plan (every scenario in ``scenarios/``, the same
seeds, the in-memory handler) run with ``jobs=1`` in this process, measured
in the same run, so the ratio is the speed-up from the extra process on
this machine and does not depend on how fast the machine is.  The same plan
then runs on a local Dask cluster of two single-threaded worker processes
(``dsm run --cluster local --jobs 2``), cluster start-up included, and is
compared with ``jobs=2`` as well.  As ``dsm run`` does when it writes no
report, the workers send back each run's verdict and stats, not its history.
The outcomes of every row are compared (stats and verdict of every run): a
speed-up that changed a result would be no speed-up.
"""

from __future__ import annotations

import os
from pathlib import Path

from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = "dsm run --jobs / --cluster: simulated deliveries per second, 1 vs 2 workers"
HEADERS = (
    "jobs",
    "runs",
    "deliveries",
    "operations",
    "violations",
    "seconds",
    "deliveries/s",
    "jobs/1",
    "/jobs 2",
)
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
HANDLER = "reference_engine.handlers.memory:in_memory_handler"
#: Seeds per scenario in full mode; more (``DSM_BENCH_JOBS_SEEDS=30``) spread the
#: cluster's start-up, a second or two, over a longer plan.
SEEDS_ENV = "DSM_BENCH_JOBS_SEEDS"
#: Short mode (CI): enough runs for two processes to have work, a few seconds in all.
SHORT = ("duplicate-storm", "slow-worker", "flaky-store", "crash-mid-dispatch")


def run(short: bool) -> list[Table]:
    try:
        from dsm_sim.scenario import load_scenario, load_scenarios
        from dsm_sim.simulator.parallel import run_plan
    except ImportError as exc:
        raise BenchSkipped(f"the simulator is not available: {exc}") from exc
    if short:
        scenarios = [load_scenario(SCENARIOS / f"{name}.toml") for name in SHORT]
        seeds = 1
    else:
        scenarios = load_scenarios(SCENARIOS)
        raw = os.environ.get(SEEDS_ENV, "3")
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{SEEDS_ENV} must be a whole number of seeds, 1 or more; got {raw!r}")
        seeds = int(raw)
    plan = [(s, seed) for s in scenarios for seed in range(1, seeds + 1)]
    rows: list[tuple[object, ...]] = []
    seen: list[tuple[object, ...]] = []
    base_rate = two_rate = 0.0
    for jobs in (1, 2, "cluster 2"):
        started = timed()
        if jobs == "cluster 2":
            try:
                from dsm_sim.simulator.distributed import run_plan_on_cluster
            except ImportError:
                continue
            outcomes = list(run_plan_on_cluster(plan, HANDLER, workers=2, keep_history=False))
        else:
            assert isinstance(jobs, int)
            outcomes = list(run_plan(plan, HANDLER, jobs=jobs, keep_history=False))
        seconds = timed() - started
        results = []
        for outcome in outcomes:
            if outcome.result is None:
                raise RuntimeError(f"{outcome.scenario.name} seed {outcome.seed}: {outcome}")
            results.append(outcome.result)
        digest = tuple((r.scenario.name, r.seed, r.passed, tuple(r.stats.items())) for r in results)
        if seen and digest != seen[0]:
            raise RuntimeError(f"jobs={jobs} gave other results than jobs=1")
        seen.append(digest)
        deliveries = sum(_count(r.stats["deliveries"]) for r in results)
        operations = sum(_count(r.stats["operations"]) for r in results)
        violations = sum(len(i.violations) for r in results for i in r.results)
        rate = deliveries / seconds
        base_rate = base_rate or rate
        if jobs == 2:
            two_rate = rate
        rows.append(
            (
                jobs,
                len(results),
                deliveries,
                operations,
                violations,
                seconds,
                rate,
                rate / base_rate,
                rate / two_rate if two_rate else "-",
            )
        )
    note = (
        f"{len(scenarios)} scenarios x seeds 1-{seeds}, in-memory handler; jobs=1 runs in this "
        "process, jobs=2 in forkserver workers, cluster 2 on a LocalCluster of 2 worker processes "
        "(start-up included in both); same stats for every run"
    )
    return [Table(TITLE, HEADERS, rows, note)]


def _count(value: object) -> int:
    """A run's count from its stats (whose values are any scalar)."""
    if not isinstance(value, int):
        raise TypeError(f"expected a count, got {value!r}")
    return value
