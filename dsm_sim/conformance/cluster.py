"""``dsm verify --cluster``: the workers of ``--jobs`` on a Dask cluster instead of this machine.

The verification hands the same tasks to a cluster as to its worker
processes (:mod:`dsm_sim.conformance.parallel`): the race matrix's chunks
and the search's seeds, each a picklable value naming the handler by its
``MODULE:FACTORY`` spec, each answered by a result the parent books in the
order ``--jobs 1`` books it.  So the text, the reports and the exit code
are the same as in one process, and a ``thorough`` verification can use as
many machines as the cluster has.

``local`` starts a ``LocalCluster`` of ``--jobs`` single-threaded worker
processes on this machine (at least two), as ``dsm run --cluster local``
does (:func:`~dsm_sim.simulator.distributed.local_cluster`); an address
(``tcp://scheduler:8786``) uses a running cluster, whose workers must import
the handler's module and this kit, at the same code as here.  A seed's run
is kept only when the worker drew from the constants this process holds,
so a worker whose code differs costs a rerun here, never a different
report (:mod:`dsm_sim.conformance.seeds`).

What a cluster does differently from a pool of processes:

* a worker that dies takes its task to another worker (Dask's own retry);
  a task that killed every worker it was given (``KilledWorker``) is run
  again alone, in a process of its own on this machine, and reported as
  it ends there, as a chunk whose worker died under ``--jobs`` is;
* the workers of a cluster given by address are not this command's to end:
  stopping cancels what was sent, and a call blocked in one of them is
  bounded by the command's deadline, which holds in every worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

__all__ = ["ClusterWorkers", "lost_worker_errors"]

#: How long (seconds) the scheduler of a cluster given by address may take to answer.
CONNECT_TIMEOUT = 10.0


def lost_worker_errors() -> tuple[type[BaseException], ...]:
    """The errors a cluster's future raises when no worker survived its task."""
    try:
        from distributed import KilledWorker
    except ImportError:
        return ()
    return (KilledWorker,)


class ClusterWorkers:
    """Tasks sent to a Dask cluster, each answered by a future, as a process pool answers.

    Raises :class:`~dsm_sim.simulator.distributed.ClusterUnavailableError`
    when Dask is not installed or the scheduler does not answer within
    ``connect_timeout`` seconds.
    """

    def __init__(
        self, address: str | None, workers: int, connect_timeout: float | None = None
    ) -> None:
        from dsm_sim.simulator.distributed import ClusterUnavailableError, local_cluster

        self.where = address or f"LocalCluster({workers} workers)"
        try:
            from distributed import Client
        except ImportError as exc:
            raise ClusterUnavailableError(
                self.where, f"dask.distributed is not installed ({exc})"
            ) from None
        self.own = address is None
        self.stack = contextlib.ExitStack()
        try:
            if address is None:
                cluster = self.stack.enter_context(local_cluster(workers))
                self.client: Any = self.stack.enter_context(Client(cluster))  # type: ignore[no-untyped-call]
            else:
                self.client = self.stack.enter_context(
                    Client(address, timeout=connect_timeout or CONNECT_TIMEOUT)  # type: ignore[no-untyped-call]
                )
        except Exception as exc:
            self.stack.close()
            raise ClusterUnavailableError(self.where, f"{type(exc).__name__}: {exc}") from None
        self.sent: list[Any] = []

    def workers(self) -> int:
        """The workers the scheduler counts now (at least one)."""
        with contextlib.suppress(Exception):
            return max(1, len(self.client.scheduler_info().get("workers", {})))
        return 1

    def submit(self, fn: Callable[[Any], Any], task: object) -> Future[Any]:
        """``fn(task)`` on the cluster; the future answers ``result``, ``done`` and ``cancel``."""
        future = self.client.submit(fn, task, pure=False)
        self.sent.append(future)
        return cast("Future[Any]", future)

    def stop(self) -> None:
        """Cancel everything sent that has not finished (the workers themselves go on)."""
        pending = [future for future in self.sent if not future.done()]
        if pending:
            with contextlib.suppress(Exception):
                self.client.cancel(pending, force=True)
        self.sent = []

    def close(self) -> None:
        """Cancel what is left, then close the client, and a cluster of our own with it."""
        from dsm_sim.simulator.distributed import quiet_on_give_up

        with quiet_on_give_up() as give_up:
            if any(not future.done() for future in self.sent):
                give_up()
                if not self.own:
                    self.stop()
            self.sent = []
            self.stack.close()
