"""``dsm demo``: the command that runs the walk-through, and writes its explorer page.

Exit status 0 when every narrated claim held, 1 when the store contradicted
one, 2 on bad input.  With ``--html FILE`` the walk-through prints exactly
the same lines, and the page's path is said on standard error, where it
cannot mix with the narration a script may diff.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from dsm_sim.outputs import OutputKind, ReportWriteError, check_output
from dsm_sim.teaching.demo import SCENARIOS, run_demo
from dsm_sim.teaching.demo_page import record_demo, write_demo_html
from reference_engine.errors import DsmError

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "scenario", choices=SCENARIOS, nargs="?", default="invoice", help="walk-through to run"
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="database URL (sqlite+aiosqlite:///file.db or postgresql+asyncpg://...); "
        "default: a fresh SQLite file in a temporary directory. The demo's tenant rows "
        "are cleared before the run",
    )
    parser.add_argument(
        "--schema",
        default=None,
        help="PostgreSQL schema for the table (created if missing)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the database (and the demo's rows) after the run",
    )
    parser.add_argument(
        "--handler",
        metavar="MODULE:FACTORY",
        default=None,
        help="run on your own handler instead: a factory taking (clock) and returning a "
        "handler over an empty store, as dsm verify takes it; MODULE is imported from the "
        "current directory first. Not combined with --db, --schema or --keep",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the walk-through as a self-contained explorer page (time scrubber, "
        "records, state diagram, every handler call) to FILE",
    )


def main(args: argparse.Namespace) -> int:
    """Exit 0 when every narrated claim held, 1 when the store contradicted one, 2 on bad input."""
    handler: str | None = getattr(args, "handler", None)
    html: Path | None = getattr(args, "html", None)
    try:
        if html is not None:
            # Before the walk-through, as every report path is: a directory, a path under a
            # file, a FIFO or /dev/full is a usage error now, not a traceback (or a hang) later.
            check_output("--html", html, OutputKind.FILE)
            if html.is_file() and not html.is_symlink():
                print(
                    f"dsm demo: --html {str(html)!r} exists; it will be replaced", file=sys.stderr
                )
            tape, outcome = asyncio.run(
                record_demo(args.db, schema=args.schema, keep=args.keep, handler=handler)
            )
            try:
                written = write_demo_html(html, tape, outcome)
            except OSError as exc:
                raise ReportWriteError(
                    option="--html", path=str(html), reason=exc.strerror or str(exc)
                ) from exc
            print(f"dsm demo: explorer page written to {written}", file=sys.stderr)
        else:
            outcome = asyncio.run(
                run_demo(args.db, schema=args.schema, keep=args.keep, handler=handler)
            )
    except DsmError as exc:
        hint = ""
        if handler is not None and "cannot import" in str(exc):
            hint = (
                "; run dsm from the folder that holds the module (or its package), "
                "or add that folder to PYTHONPATH"
            )
        print(f"dsm demo: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return 2
    return 0 if outcome.ok else 1
