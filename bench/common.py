"""Shared plumbing for the benchmarks: tables, timing, service URLs, skips.

Every benchmark measures its baseline in the same run and prints the ratio,
so a figure is comparable across machines without trusting absolute speed.
"""

from __future__ import annotations

import compileall
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGES",
    "POSTGRES_ENV",
    "BenchSkipped",
    "SkippedTable",
    "Table",
    "compile_tree",
    "postgres_url",
    "timed",
]

#: The project's packages, which an installed copy has byte-compiled.
PACKAGES = ("reference_engine", "dsm_sim")

POSTGRES_ENV = "DSM_TEST_POSTGRES_URL"


class BenchSkipped(Exception):
    """A benchmark cannot run here (a service or a module is missing); says which."""


@dataclass(frozen=True, slots=True)
class Table:
    """One printed result table; ``title`` is the header the short-mode test looks for."""

    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    note: str = ""

    def render(self) -> str:
        cells = [[str(h) for h in self.headers]] + [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        numeric = [
            all(isinstance(row[i], int | float) or row[i] == "-" for row in self.rows)
            for i in range(len(self.headers))
        ]
        lines = [f"== {self.title} =="]
        for n, row in enumerate(cells):
            lines.append(
                "  ".join(
                    v.rjust(w) if n and right else v.ljust(w)
                    for v, w, right in zip(row, widths, numeric, strict=True)
                ).rstrip()
            )
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class SkippedTable:
    """A table of a benchmark that printed others but could not run this one here; says why."""

    title: str
    reason: str

    def render(self) -> str:
        return f"== {self.title} ==\nskipped: {self.reason}"


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.2f}" if value >= 0.1 or value == 0 else f"{value:.2g}"
    return str(value)


def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        raise BenchSkipped(f"PostgreSQL not configured: set {POSTGRES_ENV}")
    return url


def timed() -> float:
    """A monotonic reading in seconds, for elapsed-time arithmetic only."""
    return time.perf_counter()


def compile_tree(tree: Path) -> None:
    """Byte-compile the project's packages under ``tree``, as installing them does.

    A checkout installed with ``pip install -e`` has no ``.pyc`` files, and
    where ``PYTHONDONTWRITEBYTECODE`` is set no import writes them: every
    command a benchmark starts (and every worker process it forks a server
    for) would then compile the project again, about 0.3 s a process here,
    which no installed copy pays.  ``compileall`` writes them whatever that
    variable says.
    """
    for package in PACKAGES:
        compileall.compile_dir(tree / package, quiet=2)
