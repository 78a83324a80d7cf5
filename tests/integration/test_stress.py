"""The multi-process stress runner against real databases.

The built-in handler must come out clean on PostgreSQL and on a SQLite file,
and the same run must catch the check-then-insert acquire on PostgreSQL:
that second half is what shows the runner and the checker can fail at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import pytest

from dsm_sim.checker import InvariantResult, check_history, is_wall_clock
from dsm_sim.history import History, HistoryRecorder, OpName, Outcome
from dsm_sim.micros import micros_of as us
from dsm_sim.stress import BUILTIN_HANDLER_SPEC, StressReport, StressSettings, run_stress
from dsm_sim.stress.cli import configure, main
from dsm_sim.stress.factories import stress_sql_handler
from dsm_sim.stress.target import DB_URL_ENV, StressTarget, run_target
from reference_engine.clock import SystemClock
from reference_engine.errors import ConfigurationError, InvalidOptionError

pytestmark = pytest.mark.integration

BROKEN_SPEC = "dsm_sim.broken.sql:check_then_insert_handler"


def shaped(db_url: str, handler_spec: str = BUILTIN_HANDLER_SPEC, seed: int = 0) -> StressSettings:
    """The CI shape: 4 processes x 4 workers, 50 keys delivered 3 times each, no faults."""
    return StressSettings(
        db_url=db_url,
        handler_spec=handler_spec,
        processes=4,
        workers=4,
        keys=50,
        duplicates=3,
        seed=seed,
        fault_free=True,
    )


def run(settings: StressSettings) -> StressReport:
    return asyncio.run(run_stress(settings, limit_s=120))


def assert_clean(report: StressReport) -> None:
    assert report.passed, report.summary()
    assert report.effects == report.settings.keys
    assert report.duplicate_keys == ()
    assert report.unfinished_keys == ()
    assert report.unnamed_errors == {}
    assert report.exit_codes == (0,) * report.settings.processes
    # Every delivery ended somewhere: the run did the work it claims.
    delivered = sum(v for k, v in report.outcomes.items() if not k.startswith("recovery_"))
    assert delivered == report.settings.deliveries


@pytest.mark.postgres
def test_builtin_handler_on_postgres_passes_the_checker(postgres_url: str) -> None:
    report = run(shaped(postgres_url))
    assert_clean(report)


def test_builtin_handler_on_a_sqlite_file_passes_the_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DB_URL_ENV, "postgresql://before@127.0.0.1/the-callers")
    report = run(shaped(f"sqlite+aiosqlite:///{tmp_path / 'stress.db'}"))
    assert_clean(report)
    # The run's database was exported for its handlers only: a handler process
    # the caller starts afterwards must not be pointed at a finished run's store.
    assert os.environ[DB_URL_ENV] == "postgresql://before@127.0.0.1/the-callers"
    assert report.store_errors == 0
    # The same run with store errors it did not inject is a failure, not a pass.
    refused = dataclasses.replace(report, store_errors=3)
    assert not refused.passed
    assert any("fault-free" in v for v in refused.violations)
    assert "FAILED" in refused.summary()
    injected = dataclasses.replace(
        refused, settings=dataclasses.replace(report.settings, fault_free=False)
    )
    assert injected.passed


def test_the_handler_is_the_same_clock_factory_as_everywhere_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry-style (clock) factory, told the run's store through the environment.
    monkeypatch.delenv(DB_URL_ENV, raising=False)
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / 'clock.db'}",
        handler_spec="dsm_sim.stress.factories:stress_sql_handler",
        processes=2,
        workers=2,
        keys=10,
        duplicates=2,
        fault_free=True,
    )
    assert settings.target == StressTarget(settings.db_url, None)
    report = run(settings)
    # Every process found the run's store through the environment: the run is clean.
    assert_clean(report)
    # And the environment is the caller's again once the run is over.
    with pytest.raises(ConfigurationError, match=DB_URL_ENV):
        run_target()


def test_a_stress_factory_outside_a_run_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DB_URL_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=DB_URL_ENV):
        stress_sql_handler(SystemClock())


@pytest.mark.postgres
def test_check_then_insert_acquire_is_caught_on_postgres(postgres_url: str) -> None:
    caught: list[StressReport] = []
    for seed in range(3):
        report = run(shaped(postgres_url, BROKEN_SPEC, seed))
        if not report.passed:
            caught.append(report)
            break
    assert caught, "the check-then-insert handler survived three contended runs"
    report = caught[0]
    verdicts = {r.name: r.passed for r in report.results}
    # Durable evidence and the checker agree: a key was charged twice.
    assert report.duplicate_keys
    assert not verdicts["no_duplicate_side_effect"]
    assert not verdicts["at_most_one_live_lock"]


@pytest.mark.mariadb
def test_builtin_handler_on_mariadb_passes_the_checker(mariadb_url: str) -> None:
    assert_clean(run(shaped(mariadb_url)))


@pytest.mark.mariadb
def test_check_then_insert_acquire_is_caught_on_mariadb(mariadb_url: str) -> None:
    caught = None
    for seed in range(3):
        report = run(shaped(mariadb_url, BROKEN_SPEC, seed))
        if not report.passed:
            caught = report
            break
    assert caught is not None, "the check-then-insert handler survived three contended runs"
    verdicts = {r.name: r.passed for r in caught.results}
    assert caught.duplicate_keys
    assert not verdicts["no_duplicate_side_effect"]


def test_cli_runs_a_sqlite_file_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    out = tmp_path / "report.json"
    args = parser.parse_args(
        [
            "--db",
            f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}",
            "--processes",
            "2",
            "--workers",
            "2",
            "--keys",
            "20",
            "--duplicates",
            "2",
            "--json",
            str(out),
        ]
    )
    assert main(args) == 0
    assert "PASSED" in capsys.readouterr().out
    (written,) = json.loads(out.read_text())
    assert written["passed"] is True
    assert written["effects"] == 20
    assert written["deliveries"] == 40
    assert written["fault_free"] is True  # dsm stress injects no store faults


@pytest.mark.parametrize(
    ("field", "value"),
    [("processes", 65), ("processes", 0), ("workers", 0), ("fail_rate", 1.0), ("keys", -1)],
)
def test_bad_settings_are_refused_before_anything_runs(field: str, value: object) -> None:
    with pytest.raises(InvalidOptionError, match=field):
        StressSettings(db_url="sqlite+aiosqlite:///unused.db", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", ["2228450155", "abc123", "a"])
def test_run_ids_of_digits_and_lower_case_letters_are_accepted(run_id: str) -> None:
    assert StressSettings(db_url="sqlite+aiosqlite:///unused.db", run_id=run_id).run_id == run_id


@pytest.mark.parametrize("run_id", ["", "ABC", "a-b", "a b", "é1", "x;drop"])
def test_run_ids_that_cannot_name_a_schema_are_refused(run_id: str) -> None:
    with pytest.raises(InvalidOptionError, match="run_id"):
        StressSettings(db_url="sqlite+aiosqlite:///unused.db", run_id=run_id)


def test_in_memory_sqlite_and_unknown_schemes_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match="in-memory"):
        StressSettings(db_url="sqlite+aiosqlite:///:memory:")
    with pytest.raises(InvalidOptionError, match="unsupported"):
        StressSettings(db_url="oracle://x/y")


def test_a_bad_handler_spec_names_the_expected_form(tmp_path: Path) -> None:
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", handler_spec="no-colon"
    )
    with pytest.raises(ConfigurationError, match=r"package\.module:factory"):
        run(settings)


# --- reading the checker on a wall clock ------------------------------------------------------


def _fencing_history(release_at: tuple[float, float]) -> History:
    """p0 acquires token 1 and releases it; p3 acquires token 2 at [3, 4] and completes."""
    rec = HistoryRecorder(lock_duration=60.0)
    key = "t/4/node//k1"
    first = rec.invoke("p0", OpName.TRY_ACQUIRE_LOCK, key, us(0.0), execution="e0")
    rec.complete(first, Outcome.OK, us(1.0), result=1, token=1)
    second = rec.invoke("p3", OpName.TRY_ACQUIRE_LOCK, key, us(3.0), execution="e3")
    rec.complete(second, Outcome.OK, us(4.0), result=2, token=2)
    release = rec.invoke(
        "p0", OpName.RELEASE_LOCK_AS_FAILED, key, us(release_at[0]), token=1, execution="e0"
    )
    rec.complete(release, Outcome.OK, us(release_at[1]))
    done = rec.invoke("p3", OpName.SET, key, us(6.0), token=2, status="processed", execution="e3")
    rec.complete(done, Outcome.OK, us(7.0))
    return rec.freeze()


def _verdicts(history: History) -> dict[str, InvariantResult]:
    assert is_wall_clock(history)
    return {r.name: r for r in check_history(history)}


def test_a_stale_write_proven_by_the_wall_clock_stays_a_violation() -> None:
    # The release starts after token 2 was handed out: provably stale, and accepted.
    result = _verdicts(_fencing_history((4.5, 5.0)))["stale_write_rejected"]
    assert not result.passed
    assert "stale write accepted" in result.violations[0].message


def test_a_write_concurrent_with_the_takeover_is_not_proven_stale() -> None:
    # The release overlaps the second acquire: it may have committed first,
    # and in that order every write is allowed.
    results = _verdicts(_fencing_history((2.0, 5.0)))
    assert [name for name, r in results.items() if not r.passed] == []
    notes = results["allowed_transitions_only"].notes
    assert any("explains every observation" in note for note in notes)


@pytest.mark.postgres
def test_a_run_the_server_cannot_take_is_refused_before_it_starts(postgres_url: str) -> None:
    settings = StressSettings(db_url=postgres_url, processes=64, workers=256)
    with pytest.raises(InvalidOptionError, match="max_connections"):
        run(settings)


def test_workers_killed_by_the_time_limit_are_reported_as_such(tmp_path: Path) -> None:
    """A limit too short for the run must read as a timeout, not as crashed workers."""
    settings = dataclasses.replace(
        shaped(f"sqlite+aiosqlite:///{tmp_path / 'limit.db'}"),
        processes=2,
        workers=1,
        keys=10,
        duplicates=2,
    )
    report = asyncio.run(run_stress(settings, limit_s=0.2))
    assert not report.passed
    assert report.timed_out == (0, 1)
    stories = [v for v in report.violations if "time limit of 0.2s expired" in v]
    assert len(stories) == 2, report.violations
