"""A two-statement transaction race on PostgreSQL is the race matrix's, on every seed.

:class:`~dsm_sim.broken.sql.StatusCompareAndSetSqlHandler` takes over an
expired lock with ``UPDATE ... WHERE status = :read`` inside one transaction:
its window lies between one acquire's ``UPDATE`` and its ``COMMIT``.  The
matrix that preempted a call only at its first await, with the scheduler
holding back only the racing calls' own tasks, missed it (the random search
found it after a minute); the matrix that holds back every task and preempts
at every await finds it on every seed, with a program that fails every time
it runs.
"""

from __future__ import annotations

import pytest

from dsm_sim.broken.sql import postgres_status_compare_and_set_handler
from dsm_sim.conformance.runner import ResultStatus, verify

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


#: Every seed with the thorough tier (one to two minutes each, the matrix's first pass over
#: every cell on a real server): on every pull request the same window is the scheduler's
#: (tests/unit/test_scheduler.py), and this store's race the thorough tier's.
SEEDS = [pytest.param(seed, marks=pytest.mark.thorough) for seed in (0, 1, 2, 3, 4)]


#: The matrix reaches this cell's deeper points after every cell's first pass on a real server:
#: 60-90 s with a core free, five times that while other suites load both cores.
DEEP_RACE_TIMEOUT_S = 900


@pytest.mark.timeout(DEEP_RACE_TIMEOUT_S)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_matrix_catches_a_race_between_update_and_commit(
    seed: int, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)
    report = verify(postgres_status_compare_and_set_handler, "ci", seed=seed, stop_on_first=True)
    assert report.error is None, report.error
    assert len(report.violations) == 1, "the race between UPDATE and COMMIT was not caught"
    caught = report.violations[0]
    assert caught.status is ResultStatus.FAILED
    assert caught.found_as == "at_most_one_live_lock", caught.render()
    assert "race matrix" in caught.render()
    assert caught.story_steps <= 6, caught.render()
    # The shrunk program replays the schedule: it fails every time it is run.
    assert caught.confirmed is not None and caught.confirmed[0] == caught.confirmed[1]
    assert "schedule=(" in caught.reproduction  # the program names its interleaving
