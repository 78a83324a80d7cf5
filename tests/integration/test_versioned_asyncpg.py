"""A race the search once found by luck is found on every seed, short, and replays every time.

The handler (``versioned_asyncpg``) was written from docs/writing-a-handler.md
on plain asyncpg: optimistic writes guarded by a version column.  Its
retention sweep forgets to bump the version, so a holder of an expired lock
past its retention completes over the record the sweep just expired.  The
race matrix runs completion against the retention sweep from exactly that
state, preempting the completion between its read and its write: the bug is
caught before the search on any seed, with a story of at most six steps and
a program that breaks the property every time it is replayed.  The same
handler with the version bumped passes.
"""

from __future__ import annotations

import pytest
from versioned_asyncpg import make_broken, make_correct

from dsm_sim.conformance.report import ResultStatus
from dsm_sim.conformance.runner import verify

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture(autouse=True)
def _postgres(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)


def test_completion_over_a_record_the_retention_sweep_expired_is_caught_on_any_seed() -> None:
    # The race matrix runs before the search and draws nothing: any seed finds it
    # there (seed 7 here; `dsm verify ... --seed N` for any N does the same).  The
    # edge probes, which run first and race nothing, are left out.
    report = verify(make_broken, "ci", seed=7, stop_on_first=True, probes=False)
    (caught,) = report.violations
    assert caught.name == "stale_write_rejected", caught.render()
    assert caught.found_by == "race matrix"
    assert caught.status is ResultStatus.FAILED
    assert caught.story_steps <= 6, caught.render()
    assert caught.confirmed == (2, 2)
    assert "expire_past_retention()" in caught.story and "set(Processed)" in caught.story


def test_the_same_handler_bumping_the_version_passes() -> None:
    report = verify(make_correct, "dev", seed=0)
    assert report.passed, [v.render() for v in report.violations] or report.not_exercised
