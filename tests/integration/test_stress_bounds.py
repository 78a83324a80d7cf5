"""``dsm stress`` within its bounds: its time limit, its memory, and a store its processes share.

* ``--timeout`` is a deadline: past it the workers are stopped and the run
  is reported at once as stopped at its limit, instead of the parent
  finishing the remaining keys one by one.
* The documented limits (10^6 keys x 1,000 duplicates) are streamed: no
  process builds the list of 10^9 deliveries.
* Journals that hold more operations than a history may are not read back
  into one: the run is judged by the ledger and the records, and says so.
* A handler whose store is private to its process is refused by name
  (``UnsharedStoreError``, exit 2), not reported as a handler that charges
  every key once per process.

The commands run in processes of their own under a bound far above their
limit, so one that does not stop fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsm_sim.stress import StressSettings, run_stress
from dsm_sim.stress import runner as stress_runner
from dsm_sim.stress.settings import item_key

pytestmark = pytest.mark.integration

#: How long a command may take before it is called hung: far above its --timeout.
BOUND_S = 120
#: The address space each stress process may use: a list of 10^9 deliveries needs far more.
MEMORY_LIMIT = 2 * 1024**3


def dsm_stress(tmp_path: Path, *argv: str, memory: int | None = None) -> tuple[int, str, str]:
    """``dsm stress`` on a SQLite file of ``tmp_path``, in a session of its own, bounded."""
    command = [
        sys.executable,
        "-m",
        "dsm_sim.cli",
        "stress",
        "--db",
        f"sqlite+aiosqlite:///{tmp_path / 'stress.sqlite3'}",
        *argv,
    ]

    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=limit,
    )
    try:
        out, err = process.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"dsm stress did not end within {BOUND_S}s:\n{out}\n{err}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err


@pytest.mark.parametrize(
    "shape",
    [
        ["--keys", "100000"],
        ["--keys", "1000000", "--duplicates", "1000"],
    ],
    ids=["1e5-keys", "1e6-keys-x-1000"],
)
def test_a_run_stops_at_its_time_limit_whatever_its_size(tmp_path: Path, shape: list[str]) -> None:
    code, out, err = dsm_stress(
        tmp_path,
        *shape,
        "--processes",
        "2",
        "--workers",
        "2",
        "--timeout",
        "3",
        memory=MEMORY_LIMIT,
    )
    assert code == 1, out + err
    assert "stopped at the time limit after" in out, out
    assert "the run was stopped at its time limit of 3s" in out, out
    assert "killed, still running when the run's time limit of 3s expired" in out, out
    assert "MemoryError" not in err, err
    assert out.rstrip().endswith("FAILED")


#: The first deliveries of process 1 of 3 at the documented limits, in a process whose
#: memory is bounded: building them all (10^9 tuples) fails there with MemoryError.
FIRST_DELIVERIES = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
from dsm_sim.stress import StressSettings
big = StressSettings(db_url="sqlite+aiosqlite:////tmp/never-opened.sqlite3",
                     keys=1_000_000, duplicates=1_000, processes=3)
deliveries = iter(big.deliveries_for(1))
print([next(deliveries) for _ in range(4)])
"""


def test_deliveries_are_generated_not_listed() -> None:
    code = FIRST_DELIVERIES.replace("MEMORY", str(MEMORY_LIMIT))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=BOUND_S, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = [(item_key(0), 1), (item_key(0), 4), (item_key(0), 7), (item_key(0), 10)]
    assert done.stdout.strip() == repr(expected)
    # The same deliveries as the definition: duplicate d of key k goes to process (k + d) % n.
    small = StressSettings(
        db_url="sqlite+aiosqlite:////tmp/never-opened.sqlite3", keys=7, duplicates=5, processes=3
    )
    for process in range(3):
        assert list(small.deliveries_for(process)) == [
            (item_key(k), d) for k in range(7) for d in range(5) if (k + d) % 3 == process
        ]


def test_journals_past_the_history_limit_are_judged_without_a_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stress_runner, "MAX_HISTORY_ENTRIES", 20)
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / 'big.sqlite3'}",
        processes=1,
        workers=2,
        keys=10,
        duplicates=2,
        fail_rate=0.0,
        fault_free=True,
    )
    report = asyncio.run(run_stress(settings, limit_s=60))
    assert report.history is None and report.results == ()
    assert (
        report.unchecked is not None and "more than the 20 a history may hold" in report.unchecked
    )
    assert report.effects == 10 and report.duplicate_keys == () and report.unfinished_keys == ()
    assert report.passed, report.summary()
    assert "history not checked:" in report.summary()


def test_a_handler_whose_store_is_private_to_its_process_is_refused_by_name(
    tmp_path: Path,
) -> None:
    code, out, err = dsm_stress(
        tmp_path,
        "--handler",
        "reference_engine.handlers.memory:in_memory_handler",
        "--processes",
        "2",
        "--workers",
        "1",
        "--keys",
        "5",
        "--timeout",
        "60",
    )
    assert (code, out) == (2, ""), out + err
    assert err.startswith(
        "dsm stress: the handler reference_engine.handlers.memory:in_memory_handler"
    )
    assert "does not share its store across processes" in err
    assert "found no record where the parent's handler had written one" in err
    assert "Traceback" not in err
