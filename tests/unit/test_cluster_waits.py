"""Waiting for a task on a Dask cluster: the deadline, and a cluster left with no worker.

Dask holds a task until a worker can take it, so a cluster whose workers all
left would keep ``dsm verify --cluster`` waiting forever without a deadline.
The wait looks at the scheduler's count of workers and gives the task back
(:class:`NoWorkersError`, run here instead) once it has been zero for a while.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from dsm_sim.conformance import cluster
from dsm_sim.conformance.cluster import ClusterWorkers, NoWorkersError
from dsm_sim.wall import wall_now

pytestmark = pytest.mark.unit


class _Scheduler:
    """A client whose scheduler counts ``workers`` workers (or cannot be asked)."""

    def __init__(self, workers: int | None) -> None:
        self.workers = workers

    def scheduler_info(self) -> dict[str, Any]:
        if self.workers is None:
            raise OSError("the scheduler went away")
        return {"workers": {f"tcp://w{i}": {} for i in range(self.workers)}}


def _on(workers: int | None) -> ClusterWorkers:
    pool = object.__new__(ClusterWorkers)
    pool.client, pool.where = _Scheduler(workers), "tcp://scheduler:8786"
    return pool


@pytest.fixture(autouse=True)
def _short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_POLL_S", 0.01)
    monkeypatch.setattr(cluster, "NO_WORKERS_S", 0.05)


def test_a_finished_task_gives_its_result() -> None:
    future: Future[int] = Future()
    future.set_result(7)
    assert _on(2).result(future, None) == 7


def test_a_cluster_left_with_no_worker_gives_the_task_back() -> None:
    with pytest.raises(NoWorkersError, match="counted no worker"):
        _on(0).result(Future(), None)


def test_a_cluster_with_workers_is_waited_for_until_the_deadline() -> None:
    with pytest.raises(TimeoutError):
        _on(2).result(Future(), wall_now() + 0.1)


def test_a_scheduler_that_cannot_be_asked_is_not_counted_as_empty() -> None:
    # It may be busy; the deadline (if any) bounds the wait, as with workers.
    assert _on(None).count() == -1
    with pytest.raises(TimeoutError):
        _on(None).result(Future(), wall_now() + 0.1)
