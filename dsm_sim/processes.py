"""Ending worker processes: ``SIGTERM`` first, so each ends what it started, then ``SIGKILL``.

Every worker process of the harness (``dsm run --jobs``, ``dsm stress`` and
its broker consumers) installs :func:`~dsm_sim.protocol.groups.stop_on_sigterm`,
which ends the handler processes it started, each with its process group,
and exits.  ``SIGKILL`` cannot be caught, so a worker killed that way would
leave its handler processes running: it is only the fallback for a worker
that does not exit within the grace period.
"""

from __future__ import annotations

from collections.abc import Iterable
from multiprocessing.process import BaseProcess

from dsm_sim.wall import wall_now

__all__ = ["TERM_GRACE_S", "end_processes"]

#: How long a worker sent SIGTERM may take to end its handlers and exit before it is killed.
TERM_GRACE_S = 5.0


def end_processes(processes: Iterable[BaseProcess], grace: float = TERM_GRACE_S) -> None:
    """Stop every live process of ``processes``: SIGTERM, then SIGKILL after ``grace`` seconds."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    until = wall_now() + grace
    for process in alive:
        process.join(max(0.0, until - wall_now()))
        if process.is_alive():
            process.kill()
            process.join()
