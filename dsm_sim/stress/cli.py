"""``dsm stress``: a multi-process stress run against PostgreSQL and/or a SQLite file.

Exit status: 0 when every run passes the checker (or, with
``--expect-violation``, when every run is caught), 1 otherwise, 2 for bad
options.  Without ``--netfault`` the command injects no store faults, so a
``StoreError`` fails the run; with it, the faults are played between the
worker processes and the database server (docs/netfaults.md) and store
errors are expected, while every invariant is still checked.  ``--handler`` takes the same ``(clock)`` factory as ``dsm verify``; it
must connect to the run's store (:mod:`dsm_sim.stress.target`).  Without ``--db`` it runs on ``DSM_TEST_POSTGRES_URL`` (if set) and
on a fresh SQLite file, which is what ``nox -s stress`` does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

from dsm_sim.options import bounded_int, positive_seconds, rate
from dsm_sim.outputs import OutputKind, check_output
from dsm_sim.stress.broker.cli import add_broker_arguments, broker_main
from dsm_sim.stress.netfault_spec import GRAMMAR, parse_netfaults
from dsm_sim.stress.runner import run_stress
from dsm_sim.stress.settings import (
    BUILTIN_HANDLER_SPEC,
    MAX_DUPLICATES,
    MAX_KEYS,
    MAX_PROCESSES,
    MAX_WORKERS,
    StressSettings,
)
from dsm_sim.stress.verdict import exit_code, run_each
from reference_engine.errors import DsmError, InvalidOptionError

__all__ = ["configure", "default_databases", "main"]

POSTGRES_ENV = "DSM_TEST_POSTGRES_URL"
#: The longest a run may be given (``--timeout``) and the longest lock it may take.
MAX_TIMEOUT_S = 86400.0
MAX_LOCK_S = 86400.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        action="append",
        metavar="URL",
        help="database URL, repeat for several databases: postgresql+asyncpg://USER@HOST/DB "
        "(a plain postgresql:// or postgres:// URL is taken as asyncpg, the driver dsm "
        "installs) or sqlite+aiosqlite:///PATH (sqlite:///PATH the same) in a directory that "
        "exists; anything else is refused before the run (default: $DSM_TEST_POSTGRES_URL if "
        "set, and a fresh SQLite file)",
    )
    parser.add_argument(
        "--handler",
        default=BUILTIN_HANDLER_SPEC,
        metavar="MODULE:FACTORY",
        help="handler factory taking a Clock, as for dsm verify; it must connect every "
        "process to the run's store, named by DSM_STRESS_DB_URL and DSM_STRESS_SCHEMA "
        f"(default: {BUILTIN_HANDLER_SPEC}, the built-in SQL handler); exec:COMMAND or "
        "exec-tcp:HOST:PORT for a handler in another process that declares a shared store",
    )
    parser.add_argument(
        "--processes",
        type=bounded_int(1, MAX_PROCESSES),
        default=8,
        metavar="N",
        help=f"OS processes, 1-{MAX_PROCESSES} (default 8)",
    )
    parser.add_argument(
        "--workers",
        type=bounded_int(1, MAX_WORKERS),
        default=4,
        metavar="N",
        help=f"asyncio workers per process, 1-{MAX_WORKERS} (default 4)",
    )
    parser.add_argument(
        "--keys",
        type=bounded_int(1, MAX_KEYS),
        default=200,
        metavar="N",
        help=f"distinct item keys, 1-{MAX_KEYS} (default 200)",
    )
    parser.add_argument(
        "--duplicates",
        type=bounded_int(1, MAX_DUPLICATES),
        default=3,
        metavar="N",
        help=f"deliveries per key, 1-{MAX_DUPLICATES} (default 3)",
    )
    parser.add_argument(
        "--fail-rate",
        type=rate,
        default=0.05,
        metavar="RATE",
        help="share of side effects that raise, [0, 1) (default 0.05)",
    )
    parser.add_argument(
        "--lock-duration",
        type=positive_seconds(MAX_LOCK_S),
        default=1800.0,
        metavar="SECONDS",
        help=f"lock duration in seconds, above 0 and at most {MAX_LOCK_S:g} (default 1800, "
        "i.e. 30 minutes; 5 with --broker)",
    )
    parser.add_argument(
        "--seed",
        type=bounded_int(-(2**63), 2**63 - 1),
        default=0,
        metavar="N",
        help="seed of the run's random choices: which side effects raise and, with --broker, "
        "the extra publishes and the kills; the same seed makes the same choices, while the "
        "interleaving of the processes stays the operating system's (default 0)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds(MAX_TIMEOUT_S),
        default=600.0,
        metavar="SECONDS",
        help="seconds the workers may run, above 0 and at most "
        f"{MAX_TIMEOUT_S:g} (default 600): past it they are stopped, nothing is recovered, and "
        "the run fails at once as stopped at its time limit, judged by the effect ledger only",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the reports as JSON (checked before the run: a directory, or a path in "
        "a directory that cannot be created or written, is a usage error)",
    )
    parser.add_argument(
        "--netfault",
        action="append",
        default=[],
        metavar="SPEC",
        help="a network fault between the worker processes and the database server, "
        "repeatable; T is seconds since the workers started (2s, 250ms): "
        + " | ".join(GRAMMAR)
        + ". PostgreSQL and MariaDB only; see docs/netfaults.md",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's schema and journals")
    parser.add_argument(
        "--expect-violation",
        action="store_true",
        help="succeed only if the checker catches the handler (for broken handlers)",
    )
    add_broker_arguments(parser)


def default_databases(directory: Path, *, servers_only: bool = False) -> list[str]:
    """``$DSM_TEST_POSTGRES_URL`` if set, and a fresh SQLite file unless only servers will do."""
    urls = []
    postgres = os.environ.get(POSTGRES_ENV, "").strip()
    if postgres:
        urls.append(postgres)
    if not servers_only:
        urls.append(f"sqlite+aiosqlite:///{directory / 'stress.sqlite3'}")
    return urls


def _plans(args: argparse.Namespace, databases: list[str]) -> list[StressSettings]:
    netfaults = parse_netfaults(args.netfault)
    if netfaults and not databases:
        raise InvalidOptionError(
            "netfault",
            f"network faults need a database server: give --db with a PostgreSQL or "
            f"MariaDB URL, or set ${POSTGRES_ENV}",
        )
    return [
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
            fault_free=not netfaults,
            netfaults=netfaults,
        )
        for url in databases
    ]


def main(args: argparse.Namespace) -> int:
    if args.json is not None:
        try:
            check_output("--json", args.json, OutputKind.FILE)
        except DsmError as exc:
            print(f"dsm stress: {exc}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="dsm-stress-") as tmp:
        databases = args.db or default_databases(Path(tmp), servers_only=bool(args.netfault))
        if args.broker and args.netfault:
            print(
                "dsm stress: --netfault is not supported with --broker yet; run it without "
                "--broker",
                file=sys.stderr,
            )
            return 2
        if args.broker:
            return broker_main(args, databases)
        try:
            plans = _plans(args, databases)
        except DsmError as exc:
            print(f"dsm stress: {exc}", file=sys.stderr)
            return 2
        reports = run_each(
            plans, lambda settings: run_stress(settings, keep=args.keep, limit_s=args.timeout)
        )
        if reports is None:
            return 2
    return exit_code(reports, json_path=args.json, expect_violation=args.expect_violation)
