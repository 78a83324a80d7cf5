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
does (:func:`~dsm_sim.dask_cluster.local_cluster`); an address
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
  stopping cancels what was sent.  The command's deadline stops a chunk or
  a seed at its next call, but a call that blocks a worker's thread is not
  interrupted there (Dask runs tasks off the main thread, and only the main
  thread can be); the command stops waiting for it at the deadline;
* a cluster whose scheduler counts no worker for :data:`NO_WORKERS_S` would
  hold its tasks until one joins: they run here instead, each alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, cast

from dsm_sim.dask_cluster import ClusterUnavailableError, local_cluster, quiet_on_give_up
from dsm_sim.wall import patience, wall_now

__all__ = ["ClusterWorkers", "NoWorkersError", "lost_worker_errors"]

#: How long (seconds) the scheduler of a cluster given by address may take to answer.
CONNECT_TIMEOUT = 10.0
#: How long (seconds) a cluster may count no worker before the tasks it holds are run here.
NO_WORKERS_S = 30.0
#: How often (seconds) a wait for a task looks whether the cluster still has a worker.
_POLL_S = 2.0


class NoWorkersError(Exception):
    """The cluster counted no worker for :data:`NO_WORKERS_S`: its task runs alone, here."""


def lost_worker_errors() -> tuple[type[BaseException], ...]:
    """The errors a cluster's future raises when no worker survived its task."""
    try:
        from distributed import KilledWorker
    except ImportError:
        return ()
    return (KilledWorker,)


class ClusterWorkers:
    """Tasks sent to a Dask cluster, each answered by a future, as a process pool answers.

    Raises :class:`~dsm_sim.dask_cluster.ClusterUnavailableError`
    when Dask is not installed or the scheduler does not answer within
    ``connect_timeout`` seconds.
    """

    def __init__(
        self, address: str | None, workers: int, connect_timeout: float | None = None
    ) -> None:
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
        except BaseException as exc:  # Ctrl-C while it starts: what started is ended too
            self.stack.close()
            if not isinstance(exc, Exception):
                raise
            raise ClusterUnavailableError(self.where, f"{type(exc).__name__}: {exc}") from None

    def workers(self) -> int:
        """The workers the scheduler counts now (at least one)."""
        return max(1, self.count())

    def result(self, future: Future[Any], deadline: float | None) -> Any:
        """``future``'s result, waiting no longer than ``deadline`` (a ``wall_now`` instant).

        Raises :class:`TimeoutError` once the deadline passed, and
        :class:`NoWorkersError` once the scheduler counted no worker for
        :data:`NO_WORKERS_S` seconds (Dask would hold the task until one joins).
        """
        alone_since: float | None = None
        while True:
            left = patience(deadline)
            try:
                return future.result(timeout=_POLL_S if left is None else min(left, _POLL_S))
            except TimeoutError:
                if left is not None and left <= _POLL_S:
                    raise
            if self.count() != 0:  # workers, or a scheduler too busy to say: not empty
                alone_since = None
            elif alone_since is None:
                alone_since = wall_now()
            elif wall_now() - alone_since >= NO_WORKERS_S:
                raise NoWorkersError(
                    f"the cluster {self.where} counted no worker for {NO_WORKERS_S:.0f} s"
                )

    def count(self) -> int:
        """The workers the scheduler counts now (-1 when it cannot be asked)."""
        try:
            return len(self.client.scheduler_info().get("workers", {}))
        except Exception:
            return -1

    def submit(self, fn: Callable[[Any], Any], task: object) -> Future[Any]:
        """``fn(task)`` on the cluster; the future answers ``result``, ``done`` and ``cancel``."""
        return cast("Future[Any]", self.client.submit(fn, task, pure=False))

    def stop(self, sent: Sequence[Future[Any]]) -> None:
        """Cancel what of ``sent`` has not finished (the workers themselves go on)."""
        pending = [future for future in sent if not future.done()]
        if pending:
            with contextlib.suppress(Exception):
                self.client.cancel(pending, force=True)

    def close(self, sent: Sequence[Future[Any]]) -> None:
        """Cancel what of ``sent`` is left, then close the client, and a cluster of our own."""
        with quiet_on_give_up() as give_up:
            if any(not future.done() for future in sent):
                give_up()
                if not self.own:
                    self.stop(sent)
            self.stack.close()
