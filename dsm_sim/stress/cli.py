"""``dsm stress``: a multi-process stress run against PostgreSQL and/or a SQLite file.

Exit status: 0 when every run passes the checker (or, with
``--expect-violation``, when every run is caught), 1 otherwise, 2 for bad
options.  Without ``--db`` it runs on ``DSM_TEST_POSTGRES_URL`` (if set) and
on a fresh SQLite file, which is what ``nox -s stress`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import tempfile
from pathlib import Path

from dsm_sim.stress.runner import StressReport, run_stress
from dsm_sim.stress.settings import BUILTIN_HANDLER_SPEC, MAX_PROCESSES, StressSettings
from reference_engine.errors import DsmError

__all__ = ["configure", "default_databases", "main"]

POSTGRES_ENV = "DSM_TEST_POSTGRES_URL"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        action="append",
        metavar="URL",
        help="SQLAlchemy URL; repeat for several databases (default: $DSM_TEST_POSTGRES_URL "
        "if set, and a fresh SQLite file)",
    )
    parser.add_argument(
        "--handler",
        default=BUILTIN_HANDLER_SPEC,
        metavar="MODULE:FACTORY",
        help=f"factory called as factory(url, clock, schema=...) (default: {BUILTIN_HANDLER_SPEC})",
    )
    parser.add_argument(
        "--processes", type=int, default=8, help=f"OS processes, 1-{MAX_PROCESSES} (default 8)"
    )
    parser.add_argument("--workers", type=int, default=4, help="asyncio workers per process")
    parser.add_argument("--keys", type=int, default=200, help="distinct item keys")
    parser.add_argument("--duplicates", type=int, default=3, help="deliveries per key")
    parser.add_argument(
        "--fail-rate", type=float, default=0.05, help="share of side effects that raise"
    )
    parser.add_argument(
        "--lock-duration", type=float, default=1800.0, help="lock duration in seconds"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the reports as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run's schema and journals")
    parser.add_argument(
        "--expect-violation",
        action="store_true",
        help="succeed only if the checker catches the handler (for broken handlers)",
    )


def default_databases(directory: Path) -> list[str]:
    urls = []
    postgres = os.environ.get(POSTGRES_ENV, "").strip()
    if postgres:
        urls.append(postgres)
    urls.append(f"sqlite+aiosqlite:///{directory / 'stress.sqlite3'}")
    return urls


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="dsm-stress-") as tmp:
        databases = args.db or default_databases(Path(tmp))
        try:
            plans = [
                StressSettings(
                    db_url=url,
                    handler_spec=args.handler,
                    processes=args.processes,
                    workers=args.workers,
                    keys=args.keys,
                    duplicates=args.duplicates,
                    fail_rate=args.fail_rate,
                    lock_duration=dt.timedelta(seconds=args.lock_duration),
                    seed=args.seed,
                )
                for url in databases
            ]
        except DsmError as exc:
            print(f"dsm stress: {exc}", file=sys.stderr)
            return 2
        reports: list[StressReport] = []
        for settings in plans:
            try:
                report = asyncio.run(run_stress(settings, keep=args.keep, limit_s=args.timeout))
            except DsmError as exc:
                print(f"dsm stress: {exc}", file=sys.stderr)
                return 2
            print(report.summary(), flush=True)
            reports.append(report)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_json() for r in reports], indent=2) + "\n")
    if args.expect_violation:
        return 0 if all(not r.passed for r in reports) else 1
    return 0 if all(r.passed for r in reports) else 1
