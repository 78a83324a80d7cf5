"""The kit against the in-memory handler, in every form a user would run it.

The pytest form (a ``ConformanceSuite`` subclass and ``pytest --pyargs``),
the CLI (``dsm verify``) and the system-clock mode for handlers that ignore
the clock they are given.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from dsm_sim.conformance import cli
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTY_NAMES
from dsm_sim.conformance.runner import TOP_UP_RUNS, ResultStatus, verify
from dsm_sim.conformance.suite import ConformanceSuite, cached_report
from dsm_sim.profiles import budget
from dsm_sim.pytest_plugin import suite_group
from reference_engine.clock import Clock, SystemClock
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler

pytestmark = pytest.mark.property

MEMORY = "reference_engine.handlers.memory:in_memory_handler"


#: TestInMemoryHandler's seed; its ci verification is also this module's full run.
SUITE_SEED = 7


class TestInMemoryHandler(ConformanceSuite):
    """Exactly what a third party writes: a subclass and one fixture (seeded here)."""

    @pytest.fixture
    def dsm_handler_factory(self) -> HandlerFactory:
        return in_memory_handler

    @pytest.fixture
    def dsm_seed(self) -> int:
        # Whether every property is reached must not be up to a drawn seed.
        return SUITE_SEED

    def test_its_tests_share_one_worker(self, request: pytest.FixtureRequest) -> None:
        # The dsm plugin marks every test of a suite class with one xdist group:
        # under --dist loadgroup the class's one verification runs on one worker.
        if not request.config.pluginmanager.hasplugin("xdist"):
            pytest.skip("pytest-xdist is not loaded")
        mark = request.node.get_closest_marker("xdist_group")
        assert mark is not None, "the dsm plugin did not group this suite class"
        assert mark.args == (suite_group(TestInMemoryHandler),)


def system_clock_handler(clock: Clock) -> InMemoryStateHandler:
    """A handler that ignores the injected clock and reads the wall clock."""
    return InMemoryStateHandler(SystemClock())


def test_system_clock_handler_passes_when_the_wall_clock_is_frozen() -> None:
    report = verify(system_clock_handler, "dev", seed=3, clock_mode=ClockMode.SYSTEM)
    assert report.passed, [v.render() for v in report.violations]
    assert report.result("lock_duration_honoured").checks > 0


def test_system_clock_handler_fails_without_freezing() -> None:
    report = verify(system_clock_handler, "dev", seed=3, stop_on_first=True)
    assert [v.name for v in report.violations] in (
        ["lock_duration_honoured"],
        ["record_agrees_with_model"],
        ["timestamps_in_utc"],
    )


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    code = cli.main(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_passes_the_in_memory_handler(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_cli(capsys, MEMORY, "--profile", "dev", "--seed", "1")
    assert code == 0, out
    assert "at_most_one_live_lock" in out and "PASSED" in out
    assert "FAILED" not in out


def test_cli_reports_a_violation_with_story_and_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = "dsm_sim.broken.handlers:TenantMissingFromKey"
    code, out, _ = _run_cli(capsys, broken, "--profile", "dev", "--seed", "1", "--stop-on-first")
    assert code == 1
    assert "tenant_isolation violated" in out
    assert "What happened:" in out and "=> " in out
    assert "from dsm_sim.broken.handlers import TenantMissingFromKey" in out
    assert "state.teardown()" in out


def test_a_seeded_violation_replays_to_the_same_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Seeded: which program a search shrinks to depends on the seed, never on luck.
    # (What an unseeded run guarantees is checked in test_verify_runs.py.)
    broken = "dsm_sim.broken.handlers:TenantMissingFromKey"
    argv = (broken, "--profile", "dev", "--seed", "1", "--stop-on-first")
    code, out, err = _run_cli(capsys, *argv)
    assert code == 1
    found = re.search(rf"replay this run: (dsm verify {broken} --profile dev --seed 1)\b", err)
    assert found, err
    program = out[out.index("Minimal reproduction") :]
    again, out_again, _ = _run_cli(capsys, *argv)
    assert again == 1
    assert out_again[out_again.index("Minimal reproduction") :] == program


@pytest.mark.parametrize(
    "path", ["no_colon_here", "no.such.module:factory", "reference_engine.handlers.memory:nope"]
)
def test_cli_bad_factory_path_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    code, out, err = _run_cli(capsys, path)
    assert code == 2
    assert err.startswith("dsm verify: ")
    assert path.partition(":")[0] in err
    assert out == ""


def test_dsm_console_script_dispatches_verify() -> None:
    from dsm_sim.cli import main

    assert main(["verify", MEMORY, "--profile", "dev", "--seed", "1"]) == 0


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HYPOTHESIS_PROFILE": "dev"}
    # In one process: this project's own pytest options (``-n auto``) would start a worker
    # per core, each importing everything, for a run of one class.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


# Nightly: TestInMemoryHandler above runs every property through the same plugin on every PR.
@pytest.mark.thorough
def test_pyargs_form_runs_every_property_against_a_named_factory() -> None:
    result = _pytest("--pyargs", "dsm_sim.conformance", f"--dsm-handler={MEMORY}", "--dsm-seed=1")
    assert result.returncode == 0, result.stdout + result.stderr
    counts = dict(
        (word, int(n)) for n, word in re.findall(r"(\d+) (passed|skipped|failed)", result.stdout)
    )
    assert counts.get("passed", 0) + counts.get("skipped", 0) == len(PROPERTY_NAMES)
    assert counts.get("passed", 0) >= len(PROPERTY_NAMES) - 3, result.stdout


def test_pyargs_form_without_a_handler_names_both_ways() -> None:
    result = _pytest("--pyargs", "dsm_sim.conformance", "-x")
    assert result.returncode != 0
    assert "--dsm-handler" in result.stdout and "dsm_handler_factory" in result.stdout


def test_every_property_is_reported_once() -> None:
    report = verify(in_memory_handler, "dev", seed=5)
    assert report.passed
    assert len({r.name for r in report.results}) == len(report.results)
    assert all(
        r.status in (ResultStatus.PASSED, ResultStatus.NOT_EXERCISED) for r in report.results
    )


# On TestInMemoryHandler's worker (loadgroup), so the full ci run below is its report.
@pytest.mark.xdist_group(suite_group(TestInMemoryHandler))
def test_a_run_that_misses_a_property_is_topped_up_before_it_is_called_unexercised() -> None:
    # One step per test case reaches almost nothing: the clean run is followed by
    # the top-up runs, and what none of them reached is reported as not exercised.
    starved = verify(
        in_memory_handler, "ci", seed=5, max_examples=2, step_count=1, probes=False, matrix=False
    )
    assert starved.runs == 1 + TOP_UP_RUNS
    unreached = [r for r in starved.results if r.status is ResultStatus.NOT_EXERCISED]
    assert unreached and all(r.checks == 0 for r in unreached)
    # What was not exercised is no pass: the verdict says so, property by property.
    assert not starved.passed and not starved.violations
    assert {line.split(":")[0] for line in starved.not_exercised} == {
        f"NOT EXERCISED {r.name}" for r in unreached
    }
    waived = verify(
        in_memory_handler,
        "ci",
        seed=5,
        max_examples=2,
        step_count=1,
        probes=False,
        matrix=False,
        waive=[r.name for r in unreached],
    )
    assert waived.passed
    # Under dev a miss is only a skip, and the quick look stays one run.
    assert verify(in_memory_handler, "dev", seed=5, max_examples=2, step_count=1).runs == 1
    # A budget that reaches every property needs no top-up: one run per seed of the
    # profile (the ci run TestInMemoryHandler reads, made once per process).
    full = cached_report(in_memory_handler, "ci", SUITE_SEED, ClockMode.INJECTED)
    assert full.passed and full.runs == len(full.seeds) == budget("ci").seeds
    assert all(r.status is ResultStatus.PASSED for r in full.results)
