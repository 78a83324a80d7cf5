"""The performance targets, and where this run's tables put each: one summary table.

``bench/run.py`` prints it after every benchmark's own tables.  A target
gets a figure only when the benchmark that measures it ran in this run (and
printed its table); otherwise it says ``not run``, or, for a figure no
benchmark here measures, how it is measured.  Nothing is carried over from an
earlier run: the figures beside each target are this run's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from common import Table

__all__ = ["TARGETS", "TITLE", "Target", "summary"]

TITLE = "Performance targets: this run's figure for each, met or not"
HEADERS = ("target", "benchmark", "figure", "status")


class Status(Enum):
    MET = "met"
    NOT_MET = "not met"
    NOT_RUN = "not run"


@dataclass(frozen=True, slots=True)
class Figure:
    """What a benchmark's tables say about a target: the figure as printed, and whether it holds."""

    text: str
    met: bool


#: Reads a target's figure from the tables of its benchmark; None when they hold none.
Reader = Callable[[Sequence[Table]], Figure | None]


@dataclass(frozen=True, slots=True)
class Target:
    """One performance target, the benchmark (``--only`` name) that measures it, how to read it."""

    target: str
    benchmark: str
    read: Reader
    #: Said instead of ``not run`` when no benchmark of ``bench/run.py`` measures it.
    elsewhere: str | None = None


def _column(table: Table, name: str) -> int:
    return list(table.headers).index(name)


def _tables(tables: Sequence[Table], title_starts: str) -> list[Table]:
    return [t for t in tables if isinstance(t, Table) and t.title.startswith(title_starts)]


def _ratio(
    title: str, key: str, column: str, match: Callable[[str], bool], bar: float, *, above: bool
) -> Reader:
    """The ratio in ``column`` of the rows whose ``key`` matches: the worst of them against ``bar``."""

    def read(tables: Sequence[Table]) -> Figure | None:
        values: list[float] = []
        for table in _tables(tables, title):
            k, c = _column(table, key), _column(table, column)
            values += [float(r[c]) for r in table.rows if match(str(r[k]))]  # type: ignore[arg-type]
        if not values:
            return None
        worst = min(values) if above else max(values)
        shown = f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{worst:.2f}"
        return Figure(shown, worst >= bar if above else worst <= bar)

    return read


def _verify_jobs(store: str) -> Reader:
    """``--jobs 2`` over ``--jobs 1`` for one store: summed over the rounds, ≤ 0.6."""

    def read(tables: Sequence[Table]) -> Figure | None:
        seconds = {1: 0.0, 2: 0.0}
        for table in _tables(tables, "dsm verify --jobs"):
            s, j, t = (_column(table, n) for n in ("store", "jobs", "seconds"))
            for row in table.rows:
                if row[s] == store and row[j] in seconds:
                    seconds[int(row[j])] += float(row[t])  # type: ignore[arg-type]
        if not seconds[1] or not seconds[2]:
            return None
        ratio = seconds[2] / seconds[1]
        return Figure(f"{ratio:.2f} ({seconds[2]:.1f} s / {seconds[1]:.1f} s)", ratio <= 0.6)

    return read


def _sweep_seconds(tables: Sequence[Table]) -> Figure | None:
    for table in _tables(tables, "dsm run over every scenario"):
        j, d, s = (_column(table, n) for n in ("jobs", "deliveries", "seconds"))
        for row in table.rows:
            if row[j] == 2:
                seconds, deliveries = float(row[s]), int(row[d])  # type: ignore[arg-type]
                text = f"{seconds:.0f} s for {deliveries:,} deliveries"
                return Figure(text, deliveries >= 10**6 and seconds <= 150)
    return None


def _cluster(tables: Sequence[Table]) -> Figure | None:
    for table in _tables(tables, "dsm run over every scenario"):
        j, r = _column(table, "jobs"), _column(table, "/jobs 2")
        for row in table.rows:
            if str(row[j]).startswith("cluster"):
                ratio = float(row[r])  # type: ignore[arg-type]
                return Figure(f"{ratio:.2f} of --jobs 2's speed", ratio >= 0.85)
    return None


def _throughput(tables: Sequence[Table]) -> Figure | None:
    parts: list[str] = []
    met = True
    for title, driver in (
        ("Throughput on PostgreSQL", "asyncpg"),
        ("Throughput on MariaDB", "asyncmy"),
    ):
        for table in _tables(tables, title):
            c, w = _column(table, f"handler/{driver}"), _column(table, "workers")
            values = [float(row[c]) for row in table.rows]  # type: ignore[arg-type]
            levels = sorted({int(row[w]) for row in table.rows})  # type: ignore[call-overload]
            if values:
                parts.append(
                    f"{driver} {min(values):.2f}-{max(values):.2f} "
                    f"(workers {', '.join(map(str, levels))})"
                )
                met = met and min(values) >= 0.9 and 32 in levels
    return Figure("; ".join(parts), met) if parts else None


def _evidence(tables: Sequence[Table]) -> Figure | None:
    for table in tables:
        if not isinstance(table, Table):
            continue
        # bench_evidence.py: one row per workload (dsm run, dsm verify), "this/base" the ratio.
        if "this/base" not in table.headers:
            continue
        c = _column(table, "this/base")
        w = _column(table, "workload")
        rows = [(str(row[w]), float(row[c])) for row in table.rows]  # type: ignore[arg-type]
        if rows:
            return Figure(
                ", ".join(f"{name} {ratio:.2f}" for name, ratio in rows) + " of the base",
                all(ratio <= 0.5 for _, ratio in rows),
            )
    return None


def _store(name: str) -> Callable[[str], bool]:
    return lambda value: value == name


_EXPLORATION = "Exploration efficiency: calls/s"
TARGETS: tuple[Target, ...] = (
    *(
        Target(
            f"dsm verify --jobs 2 ≤ 0.6 of --jobs 1's wall time, {store}",
            "verify-jobs",
            _verify_jobs(store),
        )
        for store in ("memory", "sqlite file", "postgresql", "redis")
    ),
    *(
        Target(
            f"exploration: verify/tight ≥ 0.5, {store}",
            "exploration",
            _ratio(_EXPLORATION, "store", "verify/tight", _store(store), 0.5, above=True),
        )
        for store in ("sqlite file", "postgresql", "redis")
    ),
    Target(
        "simulation: run/tight ≥ 0.5 on SQLite",
        "simulator",
        _ratio("Simulator:", "handler", "run/tight", lambda h: "sqlite" in h, 0.5, above=True),
    ),
    # With a 7 µs in-memory handler, the in-memory ratios to a tight loop measure the evidence
    # itself, which a verifier must not drop: those targets are withdrawn, and the evidence's
    # own cost is the target below (with it, the 10^6 sweep's time).
    Target("10^6 simulated deliveries with --jobs 2 in ≤ 150 s", "sweep", _sweep_seconds),
    Target("--cluster local of 2 within 15 % of --jobs 2 (≥ 0.85)", "sweep", _cluster),
    Target(
        "built-in handler ≥ 0.9 of the raw driver at 1, 8 and 32 workers",
        "throughput",
        _throughput,
    ),
    Target(
        "evidence: CPU µs per dsm run delivery and per dsm verify call ≤ 0.5 of the base",
        "evidence",
        _evidence,
    ),
    Target(
        ".ci/run on a clean clone under 10 minutes",
        "-",
        lambda tables: None,
        elsewhere="not a benchmark: timed by .ci/run",
    ),
)


def summary(ran: Mapping[str, Sequence[Table]], targets: Sequence[Target] = TARGETS) -> Table:
    """One row per target: this run's figure from the benchmark that measures it, met or not."""
    rows: list[tuple[object, ...]] = []
    for target in targets:
        figure = target.read(ran[target.benchmark]) if target.benchmark in ran else None
        if figure is not None:
            status = Status.MET if figure.met else Status.NOT_MET
            rows.append((target.target, target.benchmark, figure.text, status.value))
        elif target.benchmark in ran:
            rows.append((target.target, target.benchmark, "-", "not run (no figure printed)"))
        else:
            why = Status.NOT_RUN.value if target.elsewhere is None else target.elsewhere
            rows.append((target.target, target.benchmark, "-", why))
    note = (
        "figure: from this run's tables only (worst and best where a target covers several "
        "rows); not run: its benchmark did not run here (see --only) or was skipped"
    )
    return Table(TITLE, HEADERS, rows, note)
