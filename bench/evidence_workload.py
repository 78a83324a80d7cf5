"""One side of the evidence benchmark, run as ``python evidence_workload.py KIND ...`` in its own process.

``bench_evidence.py`` starts this script once per side and round, with
``PYTHONPATH`` naming the source tree under test (this checkout, or the base
commit unpacked beside it), so both sides run the very same workload and
only the code they import differs.  It uses only what both trees have
(``run_scenario``, ``to_json``, ``verify``, ``report_dict``).

Kinds:

* ``run SCENARIOS SEEDS [NAME ...]``: every scenario in ``SCENARIOS`` (or
  those named) at seeds 1 to ``SEEDS``, in-memory handler, in this process (as ``dsm run --jobs 1``
  does).  A first run (not timed) loads every module a run imports.
* ``verify PROFILE CACHE_DIR``: ``dsm verify`` of the in-memory handler at
  seed 0, its handler calls counted (``handler_calls.Counting``), Hypothesis'
  files (its unicode tables, the constants it read from each source file)
  in ``CACHE_DIR`` as ``dsm verify --cache-dir`` puts them.  The kit keeps
  no example database, so nothing is replayed from an earlier run.

It prints one JSON line: the CPU seconds of the timed part (this process
only: neither workload starts others), what was counted (deliveries or
handler calls), and the SHA-256 of the reports (every run's JSON report; the
verification's ``--json`` report without its ``seconds``), which the
benchmark compares between the sides.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _run(scenarios: Path, seeds: int, names: list[str]) -> dict[str, object]:
    from dsm_sim.reports.json_report import to_json
    from dsm_sim.scenario import load_scenarios
    from dsm_sim.simulator.run import run_scenario
    from reference_engine.registry import load_factory

    factory = load_factory("reference_engine.handlers.memory:in_memory_handler")
    chosen = [s for s in load_scenarios(scenarios) if not names or s.name in names]
    plan = [(s, seed) for s in chosen for seed in range(1, seeds + 1)]
    run_scenario(plan[0][0], seed=plan[0][1], handler=factory)  # imports, not timed
    reports = hashlib.sha256()
    deliveries = 0
    cpu = 0.0
    for scenario, seed in plan:
        started = time.process_time()
        result = run_scenario(scenario, seed=seed, handler=factory)
        cpu += time.process_time() - started
        deliveries += result.stats["deliveries"]
        reports.update(to_json(result).encode("utf-8"))
    return {"cpu": cpu, "count": deliveries, "runs": len(plan), "reports": reports.hexdigest()}


def _verify(profile: str, cache: Path) -> dict[str, object]:
    from handler_calls import Counting

    from dsm_sim.conformance.cache import use_cache_dir
    from dsm_sim.conformance.runner import verify
    from dsm_sim.conformance.tell.outputs import report_dict
    from reference_engine.handlers.memory import in_memory_handler

    use_cache_dir(cache)  # as dsm verify does: Hypothesis' files out of the source tree
    counting = Counting(in_memory_handler)
    started = time.process_time()
    report = verify(counting, profile, 0)
    cpu = time.process_time() - started
    fields = report_dict(report)
    fields.pop("seconds", None)  # wall time: the only field that differs between runs
    text = json.dumps(fields, indent=2, ensure_ascii=False)
    return {
        "cpu": cpu,
        "count": sum(counting.calls.values()),
        "runs": 1,
        "reports": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "verdict": fields.get("verdict"),
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) >= 3:
        print(json.dumps(_run(Path(argv[1]), int(argv[2]), argv[3:])))
        return 0
    if argv[:1] == ["verify"] and len(argv) == 3:
        print(json.dumps(_verify(argv[1], Path(argv[2]))))
        return 0
    print(
        "usage: evidence_workload.py run SCENARIOS SEEDS [NAME ...] | verify PROFILE CACHE_DIR",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
