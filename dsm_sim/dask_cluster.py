"""A Dask cluster for the kit's work: a local one of our own, its set-up, and its errors.

``dsm run --cluster`` (:mod:`dsm_sim.simulator.distributed`) and ``dsm
verify --cluster`` (:mod:`dsm_sim.conformance.cluster`) start and tune a
``LocalCluster`` the same way and say the same when a cluster cannot be
used.  Light on purpose: it imports no simulator or kit module and Dask only
when a cluster is started, because ``dsm verify`` loads it whatever its
options are.  Hypothesis draws from the literals of every local module the
command's process has loaded, so a module loaded only with ``--cluster``
would change what a seed draws.  Its own workers preload this module
(:func:`dask_setup`), and nothing heavier, for the same reason: a worker that
loaded other local modules would hold other constants than the command.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from reference_engine.errors import ConfigurationError

__all__ = [
    "WORKER_SWITCH_INTERVAL",
    "ClusterUnavailableError",
    "dask_setup",
    "local_cluster",
    "quiet_on_give_up",
]


class ClusterUnavailableError(ConfigurationError):
    """The Dask cluster cannot be used: the package is missing or the scheduler unreachable."""

    def __init__(self, where: str, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(
            f"cannot run on the Dask cluster {where}: {reason}. Install the extra "
            "(pip install -e '.[cluster]'), check the scheduler address (tcp://HOST:8786), "
            "or run on this machine with --jobs"
        )


@contextlib.contextmanager
def quiet_on_give_up() -> Iterator[Callable[[], None]]:
    """Once the plan is given up on, Dask's own logs of the workers it kills stay quiet.

    Closing a cluster with runs in flight (a worker blocked in a thread, a
    Ctrl-C) makes Dask log the heartbeats, gathers and streams that break,
    with tracebacks, on stderr, after the command has said what it stopped
    and why.  Every ``distributed`` and ``tornado`` logger is silenced,
    including those Dask's logging configuration gives a level of their own
    (``tornado.application``); their levels come back when the cluster is
    closed.
    """
    saved: dict[str, int] = {}

    def give_up() -> None:
        known = list(logging.root.manager.loggerDict)
        for name in ["distributed", "tornado", *known]:
            if name.split(".")[0] in ("distributed", "tornado"):
                logger = logging.getLogger(name)
                saved.setdefault(name, logger.level)
                logger.setLevel(logging.CRITICAL + 1)

    try:
        yield give_up
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


#: How long a local worker's run holds the GIL before the worker's own event loop
#: may take it (Python's default is 5 ms).  A run is pure Python on its thread; the
#: event loop beside it wakes for messages and heartbeats, and at 5 ms every wake
#: forced a switch away from the run and back.  At 50 ms the event loop waits a
#: little longer (heartbeats are seconds apart) and the run keeps its cache warm:
#: 600 runs took 20.0 s against 20.35 s at 5 ms (alternating, three times each).
WORKER_SWITCH_INTERVAL = 0.05

#: How a local sweep's workers are set up, beside the switch interval above (set by
#: :func:`dask_setup` as each worker starts, a worker its nanny restarts included:
#: :func:`local_cluster` preloads this module): none of Dask's background work a
#: local sweep has no use for, that is the workers' statistical profiler (a thread
#: sampling every 10 ms, for a dashboard nobody opens), the system monitor, and
#: memory checks ten times a second for runs that hold a few MB.
_LOCAL_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, run in each worker of a cluster :func:`local_cluster` starts.

    Only our own workers get it: the interpreters of a cluster given by
    address are their owner's to tune.
    """
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)


def local_cluster(workers: int) -> Any:
    """A ``LocalCluster`` of ``workers`` single-threaded processes, as ``--cluster local`` starts.

    No dashboard, and the scheduler's own HTTP routes on a free loopback port:
    Dask's default, 8787, makes a second local cluster on the machine warn
    (or fail, with warnings as errors).  The workers log only what is
    critical: what goes wrong in a run comes back through its future (the
    run's error, or its crash), and the rest is Dask's own (a task cancelled
    as the cluster closes, a result whose client left while it was being
    sent, a busy event loop), with tracebacks, on the command's stderr.  The
    nannies, in this process, still say when a worker dies.  The workers'
    profiler and monitors run rarely or not at all and their runs keep the GIL
    longer (:data:`_LOCAL_WORKERS`): on two cores they took CPU and the GIL
    from the runs (200 runs: 8.45 s best of three with them, 7.99 s without;
    ``--jobs 2`` 6.19 s).  Raises ImportError without Dask.
    """
    import dask
    from distributed import LocalCluster

    # The nannies hand the configuration they were made under to their workers; preloads
    # the user configured stay, ours comes after them.
    preloads = [*dask.config.get("distributed.worker.preload", []), __name__]
    with dask.config.set({**_LOCAL_WORKERS, "distributed.worker.preload": preloads}):
        return LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL,
        )
