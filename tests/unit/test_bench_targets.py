"""``bench/run.py``'s summary: each target gets this run's figure, or says why it has none.

No speed is measured here: the tables are made up, and what is checked is
how the summary reads them (a ratio against its bar, a benchmark that did
not run, a target no benchmark of this run measures).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_evidence
from common import Table
from targets import TARGETS, summary

VERIFY_JOBS = "dsm verify --jobs: wall time of the command, matrix and search in 1 vs 2 processes"
HEADERS = ("store", "profile", "round", "jobs", "seconds", "load", "jobs 2/jobs 1", "same output")


def _rows(table: Table) -> dict[str, tuple[str, str]]:
    return {str(row[0]): (str(row[2]), str(row[3])) for row in table.rows}


def _verify_jobs(*rows: tuple[str, int, float]) -> Table:
    return Table(
        VERIFY_JOBS, HEADERS, [(s, "ci", 1, j, sec, 1.0, 1.0, "yes") for s, j, sec in rows]
    )


def test_a_ratio_is_read_against_its_bar_per_store() -> None:
    table = _verify_jobs(
        ("memory", 1, 10.0), ("memory", 2, 5.0), ("sqlite file", 1, 100.0), ("sqlite file", 2, 70.0)
    )
    rows = _rows(summary({"verify-jobs": [table]}))
    memory = rows["dsm verify --jobs 2 ≤ 0.6 of --jobs 1's wall time, memory"]
    assert memory == ("0.50 (5.0 s / 10.0 s)", "met")
    sqlite = rows["dsm verify --jobs 2 ≤ 0.6 of --jobs 1's wall time, sqlite file"]
    assert sqlite == ("0.70 (70.0 s / 100.0 s)", "not met")
    # The benchmark ran, but printed no row for this store (not configured).
    redis = rows["dsm verify --jobs 2 ≤ 0.6 of --jobs 1's wall time, redis"]
    assert redis == ("-", "not run (no figure printed)")


@pytest.mark.parametrize("ran", [{}, {"statements": []}])
def test_a_target_whose_benchmark_did_not_run_gets_no_figure(ran: dict[str, list[Table]]) -> None:
    rows = _rows(summary(ran))
    assert len(rows) == len(TARGETS)
    assert rows["exploration: verify/tight ≥ 0.5, redis"] == ("-", "not run")
    evidence = "evidence: CPU µs per dsm run delivery and per dsm verify call ≤ 0.5 of the base"
    assert rows[evidence] == ("-", "not run")
    assert all(figure == "-" for figure, _ in rows.values())


def test_the_worst_row_decides_a_target_over_several() -> None:
    headers = ("operation", "workers", "handler/asyncpg")
    rows = [("exists", 1, 1.2), ("exists", 8, 0.95), ("exists", 32, 0.85)]
    table = Table("Throughput on PostgreSQL: built-in handler vs raw asyncpg", headers, rows)
    figure, status = _rows(summary({"throughput": [table]}))[
        "built-in handler ≥ 0.9 of the raw driver at 1, 8 and 32 workers"
    ]
    assert figure == "asyncpg 0.85-1.20 (workers 1, 8, 32)"
    assert status == "not met"


def test_evidence_is_read_per_workload_and_both_must_halve() -> None:
    headers = bench_evidence.HEADERS  # the table the evidence benchmark prints
    rows = [("dsm run", 100, 600.0, 280.0, 0.47, 5, "identical")]
    rows.append(("dsm verify", 100, 100.0, 80.0, 0.80, 5, "identical"))
    table = Table("Evidence cost: CPU µs per simulated delivery", headers, rows)
    evidence = "evidence: CPU µs per dsm run delivery and per dsm verify call ≤ 0.5 of the base"
    figure, status = _rows(summary({"evidence": [table]}))[evidence]
    assert figure == "dsm run 0.47, dsm verify 0.80 of the base"
    assert status == "not met"
