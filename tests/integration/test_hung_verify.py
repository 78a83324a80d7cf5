"""``dsm verify`` against handlers that hang: one hung call ends the verification, promptly.

* A handler in another process that never answers one request ends every
  stage at that request, as an in-process call that hangs does: the protocol
  client's timeout counts as a hang too.
* A handler whose every call hangs costs one hung call (and the reads that
  diagnose it), not one per edge probe, per race-matrix cell or per test case.
* A call waiting on an executor thread is abandoned at the call timeout: the
  thread is left running (and the verdict says so), never joined.
* A handler's non-daemon thread does not keep ``dsm verify`` or ``dsm run``
  alive after the verdict.
* ``dsm verify --max-wall`` is a deadline for the whole verification; what did
  not run by then is NOT EXERCISED, never passed.

The bounds are generous (a loaded two-core machine): each is far below what
the hang would cost without the fix, which is the point each test makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hung_handlers import FOREVER_S, RELEASE, every_call, executor_hang

from dsm_sim.conformance.execute.loop import timeouts_seen
from dsm_sim.conformance.report import ResultStatus
from dsm_sim.conformance.runner import verify
from dsm_sim.conformance.tell.outputs import verdict
from dsm_sim.protocol.client import exec_factory
from dsm_sim.protocol.errors import HandlerTimeoutError
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
#: A command that should end in seconds is called hung past this.
BOUND_S = 120.0


def test_one_exec_request_that_is_never_answered_ends_the_verification() -> None:
    """Before: every later test case waited out the request timeout (20 of them, the most kept)."""
    factory = exec_factory(
        [sys.executable, "-m", "dsm_sim.cli", "serve", "hung_handlers:third_get"],
        timeout=5.0,  # a loaded machine starts a Python process in well under that
        env=ENV,
    )
    report = verify(factory, profile="dev", seed=1)
    timed_out = [f for f in factory.failures if isinstance(f, HandlerTimeoutError)]
    # The request that hung, and the replays that confirm its violation: nothing after.
    assert 1 <= len(timed_out) <= 5, [str(f) for f in factory.failures]
    assert report.error is not None and "a handler call hung" in report.error, report.error
    assert "get 'INV-1'" in report.error and "--exec-timeout" in report.error, report.error
    assert report.test_cases == 0 or "the search" in report.error


def test_every_call_hanging_costs_one_hang_not_one_per_probe_cell_or_test_case() -> None:
    """Before: each of the 22 edge probes waited out the call timeout twice."""
    before = timeouts_seen()
    report = verify(every_call, profile="dev", seed=1, call_timeout_s=0.5)
    # The call that hung, and the read that diagnoses it in the same step.
    assert timeouts_seen() - before <= 3
    assert report.error is not None
    assert "a handler call hung during the edge probe" in report.error, report.error
    assert "did not return within 0.5s (--call-timeout)" in report.error
    assert report.error.count("hung") == 1  # said once
    assert report.probes == 1  # the probes, the race matrix and the search stopped there
    assert report.coverage.exercised == 0 and report.test_cases == 0
    assert not report.passed


def test_a_hang_in_the_race_matrix_ends_the_matrix_and_the_search() -> None:
    """Before: every cell of the matrix waited out the call timeout again."""
    before = timeouts_seen()
    report = verify(every_call, profile="dev", seed=1, call_timeout_s=0.5, probes=False)
    assert timeouts_seen() - before <= 3
    assert report.error is not None and "during the race matrix" in report.error, report.error
    assert report.coverage.exercised <= 1 and report.test_cases == 0


@pytest.fixture
def released() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()  # the threads the test left blocked end now


def test_a_call_blocked_on_an_executor_thread_is_abandoned_not_joined(released: None) -> None:
    """Before: closing the test case's loop joined the thread, for as long as it blocked."""
    started = time.monotonic()
    report = verify(executor_hang, profile="dev", seed=1, call_timeout_s=1.0)
    took = time.monotonic() - started
    assert took < BOUND_S < FOREVER_S, took
    assert report.threads_left >= 1
    said = verdict(report)
    assert f"{report.threads_left} handler thread" in said and "left running" in said, said
    assert report.error is not None and "try_acquire_lock()" in report.error


def _dsm(*argv: str, cwd: Path, within: float = BOUND_S) -> tuple[int, str, str, float]:
    """A ``dsm`` command in a process (and session) of its own; fails the test past ``within``."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "dsm_sim.cli", *argv],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"dsm {argv[0]} did not end within {within:g}s:\n{out[-2000:]}\n{err[-2000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err, time.monotonic() - started


def test_a_handlers_non_daemon_thread_does_not_keep_dsm_verify_alive(tmp_path: Path) -> None:
    """Before: the verdict came in seconds, the process ended when the thread did (600 s)."""
    code, out, err, _ = _dsm(
        "verify", "hung_handlers:thread_keeper", "--profile", "dev", "--seed", "1",
        "--cache-dir", str(tmp_path / "cache"), "--json", str(tmp_path / "report.json"),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out + err
    assert out.rstrip().endswith("PASSED"), out
    assert (tmp_path / "report.json").read_text(encoding="utf-8").strip().endswith("}")


def test_a_handlers_non_daemon_thread_does_not_keep_dsm_run_alive(tmp_path: Path) -> None:
    scenario = ROOT / "scenarios" / "flaky-store.toml"
    code, out, err, _ = _dsm(
        "run", str(scenario), "--seed", "1", "--handler", "hung_handlers:thread_keeper",
        "--junit", str(tmp_path / "junit.xml"), cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out + err
    assert "1/1 runs kept every invariant" in out, out
    assert "</testsuites>" in (tmp_path / "junit.xml").read_text(encoding="utf-8")


class SlowCalls(InMemoryStateHandler):
    """Correct, but every lock takes a tenth of a second: a ci run takes many minutes."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.sleep(0.1)
        return await super().try_acquire_lock(ctx)


def slow_calls(clock: Clock) -> SlowCalls:
    return SlowCalls(clock)


def test_max_wall_stops_a_verification_and_what_did_not_run_is_not_passed() -> None:
    started = time.monotonic()
    report = verify(slow_calls, profile="ci", seed=1, max_wall_s=2.0)
    assert time.monotonic() - started < BOUND_S
    assert not report.passed
    gap = next(g for g in report.gaps if g.name == "max-wall")
    assert "--max-wall 2s of real time expired during" in gap.reason, gap
    assert any("NOT EXERCISED max-wall" in line for line in report.not_exercised)
    assert ResultStatus.PASSED not in {r.status for r in report.results}


def test_dsm_verify_max_wall_is_a_deadline_for_the_whole_command(tmp_path: Path) -> None:
    (tmp_path / "dsm_slow_store.py").write_text(
        "import asyncio\n"
        "from reference_engine.handlers.memory import InMemoryStateHandler\n\n"
        "class Slow(InMemoryStateHandler):\n"
        "    async def try_acquire_lock(self, ctx):\n"
        "        await asyncio.sleep(0.1)\n"
        "        return await super().try_acquire_lock(ctx)\n\n"
        "def slow(clock):\n"
        "    return Slow(clock)\n",
        encoding="utf-8",
    )
    code, out, err, took = _dsm(
        "verify", "dsm_slow_store:slow", "--profile", "thorough", "--seed", "1",
        "--max-wall", "3", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path,
    )  # fmt: skip
    assert code == 1, out + err
    assert "NOT EXERCISED max-wall" in out, out
    assert out.splitlines()[-1].startswith("NOT PASSED"), out
    assert "--max-wall 3s of real time expired" in out + err
    assert took < BOUND_S
