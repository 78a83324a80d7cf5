"""``dsm verify --jobs``: wall time of the command, race matrix and search in 1 and 2 processes.

Per store (memory, a SQLite file, and PostgreSQL and Redis when
``DSM_TEST_POSTGRES_URL`` and ``DSM_TEST_REDIS_URL`` are set), ``dsm verify
SPEC --seed 0 --jobs 1`` and ``--jobs 2`` run as commands, alternating, so
each pays its own start-up (the workers' included).  The table prints each run's wall time, the 1-minute load
average before it (other jobs on the machine decide what a second process
can give) and whether its output is the first run's with the elapsed
seconds masked.  The in-memory handler's is, whatever ``--jobs``; the SQLite
file handler's differs by a few interleavings between two runs even with
``--jobs 1``, because which await points its calls reach depends on when
aiosqlite's thread answers (the verdict is the same); so, for the same
reason, do PostgreSQL's and Redis'.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from common import Table, timed

__all__ = ["TITLE", "run"]

TITLE = "dsm verify --jobs: wall time of the command, matrix and search in 1 vs 2 processes"
HEADERS = ("store", "profile", "round", "jobs", "seconds", "load", "jobs 2/jobs 1", "same output")
STORES = (
    ("memory", "reference_engine.handlers.memory:in_memory_handler", None),
    ("sqlite file", "reference_engine.handlers.sql.factory:sqlite_file_handler", None),
    (
        "postgresql",
        "reference_engine.handlers.sql.factory:postgres_test_handler",
        "DSM_TEST_POSTGRES_URL",
    ),
    ("redis", "reference_engine.handlers.redis_factory:redis_test_handler", "DSM_TEST_REDIS_URL"),
)
ROOT = Path(__file__).resolve().parent.parent
#: Elapsed seconds in the output (``, 12.3s``): the one thing two runs may print differently.
SECONDS = re.compile(r"\b\d+(\.\d+)?s\b")
#: Rounds of (jobs 1, jobs 2) per store in full mode.
ROUNDS_ENV = "DSM_BENCH_VERIFY_ROUNDS"


def run(short: bool) -> list[Table]:
    profile = "dev" if short else "ci"
    rounds = 1 if short else int(os.environ.get(ROUNDS_ENV, "1"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows: list[tuple[object, ...]] = []
    stores = [(n, spec) for n, spec, needs in STORES if needs is None or os.environ.get(needs)]
    skipped = [
        f"{n} (set {needs})" for n, _, needs in STORES if needs and not os.environ.get(needs)
    ]
    for name, spec in stores[:1] if short else stores:
        first: str | None = None
        for round_ in range(1, rounds + 1):
            one = 0.0
            for jobs in (1, 2):
                load = os.getloadavg()[0]
                command = [sys.executable, "-m", "dsm_sim.cli", "verify", spec, "--seed", "0"]
                started = timed()
                done = subprocess.run(
                    [*command, "--profile", profile, "--jobs", str(jobs)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=False,
                )
                seconds = timed() - started
                if done.returncode != 0:
                    raise RuntimeError(
                        f"{name} --jobs {jobs}: exit {done.returncode}\n{done.stdout}"
                    )
                out = SECONDS.sub("<s>", done.stdout)
                first = first if first is not None else out
                one = one or seconds
                rows.append(
                    (
                        name,
                        profile,
                        round_,
                        jobs,
                        round(seconds, 1),
                        round(load, 1),
                        round(seconds / one, 2),
                        "yes" if out == first else "no",
                    )
                )
    note = (
        "seed 0; each row a `dsm verify` command, start-up included; load: 1-minute load "
        "average before the run; same output: the first run's, elapsed seconds masked"
        + (f"; not measured: {', '.join(skipped)}" if skipped and not short else "")
    )
    return [Table(TITLE, HEADERS, rows, note)]
