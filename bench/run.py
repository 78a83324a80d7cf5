"""Entry point of the benchmarks: ``python bench/run.py [--short] [--only NAME ...]``.

``nox -s bench`` runs the full mode; CI runs ``--short``, which only checks
that every benchmark still runs and prints its table.  Speed is never
asserted: each table carries its own baseline, measured in the same run.
After every benchmark's tables comes one more: each performance target with
this run's figure for it, met, not met or not run (:mod:`targets`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchSkipped, Table, compile_tree
from targets import summary

__all__ = ["BENCHMARKS", "main"]

ROOT = Path(__file__).resolve().parent.parent

#: name -> module in this directory
BENCHMARKS = {
    "statements": "bench_statements",
    "throughput": "bench_throughput",
    "simulator": "bench_simulator",
    "jobs": "bench_jobs",
    "sweep": "bench_sweep",
    "catalogue": "bench_catalogue",
    "exploration": "bench_exploration",
    "verify-jobs": "bench_verify_jobs",
    "protocol": "bench_protocol",
    "peers": "bench_peers",
    "evidence": "bench_evidence",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__)
    parser.add_argument("--short", action="store_true", help="small sizes, for CI")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run these only")
    args = parser.parse_args(argv)
    failed = []
    ran: dict[str, list[Table]] = {}
    mode = "short" if args.short else "full"
    print(f"dsm benchmarks ({mode} mode)", flush=True)
    compile_tree(ROOT)
    for name in args.only or list(BENCHMARKS):
        module = importlib.import_module(BENCHMARKS[name])
        started = time.perf_counter()
        try:
            tables = module.run(args.short)
        except BenchSkipped as exc:
            print(f"== {module.TITLE} ==\nskipped: {exc}\n", flush=True)
            continue
        except Exception:
            failed.append(name)
            print(f"== {module.TITLE} ==\nFAILED:\n{traceback.format_exc()}", flush=True)
            continue
        for table in tables:
            print(table.render(), flush=True)
        ran[name] = [table for table in tables if isinstance(table, Table)]
        print(f"({name}: {time.perf_counter() - started:.1f}s)\n", flush=True)
    print(summary(ran).render(), flush=True)
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
