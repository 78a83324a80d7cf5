"""The benchmarks still run: ``bench/run.py --short`` exits 0 and prints every table.

Speed is never asserted here; the figures live in docs/performance.md and
are produced by ``nox -s bench``.  What is checked is that each benchmark
measured its baseline in the same run (its ratio column is printed) and
that no benchmark was skipped in a CI that has every service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "run.py"

#: Each table's title and the ratio column that proves its baseline ran.
EXPECTED = {
    "SQL statements per operation (built-in handler)": "statements/target",
    "Throughput on PostgreSQL: built-in handler vs raw asyncpg, same statement": "handler/asyncpg",
    "Throughput on MariaDB: built-in handler vs raw asyncmy, same statement": "handler/asyncmy",
    "Simulator: handler calls per second in dsm run vs the handler's tight loop": "run/tight",
    "dsm run --jobs / --cluster: simulated deliveries per second, 1 vs 2 workers": "/jobs 2",
    "Conformance kit: time and examples to catch each broken handler": "catch/clean",
    "Exploration efficiency: calls/s in dsm verify over the same handler's tight loop": (
        "verify/tight"
    ),
    "Exploration efficiency by stage: where each verification's calls and seconds go": (
        "stage/tight"
    ),
    "dsm verify --jobs: wall time of the command, matrix and search in 1 vs 2 processes": (
        "jobs 2/jobs 1"
    ),
    "dsm run over every scenario until 10^6 simulated deliveries: jobs 2, a local Dask "
    "cluster of 2 and jobs 1 (in-memory handler)": "/jobs 2",
    "Full happy path per second (check, acquire, complete): dsm vs Powertools idempotency": (
        "redis/decorator"
    ),
    "Evidence cost: CPU µs per simulated delivery (dsm run) and per kit call (dsm verify), "
    "base vs this code": "this/base",
    # The summary of every target: this run's figure for each, and met / not met / not run.
    "Performance targets: this run's figure for each, met or not": "status",
}


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.thorough  # a minute of every benchmark in short mode: nightly, and nox -s bench
def test_short_benchmarks_run_and_print_every_table(
    postgres_url: str, mariadb_url: str, redis_url: str
) -> None:
    env = {
        **os.environ,
        "DSM_TEST_POSTGRES_URL": postgres_url,
        "DSM_TEST_MARIADB_URL": mariadb_url,
        "DSM_TEST_REDIS_URL": redis_url,
    }
    done = subprocess.run(
        [sys.executable, str(BENCH), "--short"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr}"
    lines = out.splitlines()
    for title, ratio_column in EXPECTED.items():
        header = f"== {title} =="
        assert header in lines, f"missing table {title!r}:\n{out}"
        following = lines[lines.index(header) + 1]
        assert not following.startswith("skipped"), following
        assert ratio_column in following.split("  "), following
    # Both backends were counted: PostgreSQL was not skipped.
    assert any(line.startswith("postgresql ") for line in lines), out
    assert "FAILED" not in out
    # The summary comes last and gives the verify --jobs target in memory a figure.
    summary = lines.index("== Performance targets: this run's figure for each, met or not ==")
    assert all(not line.startswith("== ") for line in lines[summary + 1 :]), out
    row = next(line for line in lines[summary:] if "of --jobs 1's wall time, memory" in line)
    assert row.rstrip().endswith(("met", "not met")), row


def test_an_unknown_benchmark_name_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--only", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
