"""Running a stress command's plans one after another, and the exit code they earn.

Shared by ``dsm stress`` and ``dsm stress --broker``: the same rules for a
refused plan (exit 2), the ``--json`` file and ``--expect-violation``, so the
two paths cannot drift apart.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dsm_sim.outputs import ReportWriteError, write_report
from reference_engine.errors import DsmError

__all__ = ["RunReport", "exit_code", "run_each"]


class RunReport(Protocol):
    @property
    def passed(self) -> bool: ...

    def summary(self) -> str: ...

    def to_json(self) -> dict[str, object]: ...


P = TypeVar("P")
R = TypeVar("R", bound=RunReport)


def run_each(plans: Sequence[P], run: Callable[[P], Coroutine[Any, Any, R]]) -> list[R] | None:
    """Run every plan, printing each summary; ``None`` once a plan is refused (printed)."""
    reports: list[R] = []
    for plan in plans:
        try:
            report = asyncio.run(run(plan))
        except DsmError as exc:
            print(f"dsm stress: {exc}", file=sys.stderr)
            return None
        print(report.summary(), flush=True)
        reports.append(report)
    return reports


def exit_code(
    reports: Sequence[RunReport], *, json_path: Path | None, expect_violation: bool
) -> int:
    """Write the JSON report if asked; 0 when every run came out as expected, else 1.

    The summaries were printed as the runs ended, so a JSON file that cannot
    be written is named after them (exit 2 unless the verdict is already 1).
    """
    if expect_violation:
        code = 0 if all(not r.passed for r in reports) else 1
    else:
        code = 0 if all(r.passed for r in reports) else 1
    if json_path is not None:
        try:
            write_report(json_path, json.dumps([r.to_json() for r in reports], indent=2) + "\n")
        except OSError as exc:
            error = ReportWriteError(
                option="--json",
                path=str(json_path),
                reason=f"{exc.strerror or type(exc).__name__} ({type(exc).__name__})",
            )
            print(f"dsm stress: {error}", file=sys.stderr)
            return code or 2
    return code
