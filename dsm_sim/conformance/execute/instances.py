"""The handler instances the kit's workers race through: one per worker, on one store.

In production every worker process opens its own handler; what a handler
keeps in the instance (an ``asyncio.Lock`` around check-then-insert, a
token counter, a cache of answers) is then per process, and only the store
is shared.  Racing every worker through the one instance the factory built
would let such a handler serialise or remember its way through the races.
So when the handler offers :meth:`~reference_engine.instances.SharedStoreHandler.peer`,
races go through one instance per worker (worker 1 keeps the factory's, the
sweeps get their own); plain calls stay on the factory's instance, so a
lock taken through a peer is completed through another instance, as a
redelivery to another process would.

Which instance a call uses never depends on a draw, so a seed explores the
same program with or without peers.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.loop import LoopDriver
from dsm_sim.conformance.report import Gap
from dsm_sim.model import Outcome
from reference_engine.handler import StateHandler
from reference_engine.instances import peer_of

__all__ = ["HandlerInstances", "OpenWatcher", "out_of_process"]

#: The worker whose calls go to the instance the factory built.
OWNER = 1


def out_of_process(handler: object) -> bool:
    """Does ``handler`` run its calls in another process (the protocol client)?

    Its await points are the other process's own: the kit cannot choose an
    interleaving there, only start calls together and let the store decide.
    """
    return getattr(handler, "out_of_process", False) is True


class OpenWatcher(Protocol):
    """Told around each peer's ``open()``: what the store held before, and after.

    An ``open()`` must change no record; one that does (a start-up routine
    that fails the locks it finds) is a call of the story like any other.
    """

    def before_open(self) -> object: ...

    def after_open(self, worker: int, before: object) -> None: ...


class HandlerInstances:
    """The factory's instance, and peers opened on first use."""

    #: Told around each peer's open (the machine, which reads the store back).
    watcher: OpenWatcher | None = None

    def __init__(
        self, owner: StateHandler, driver: LoopDriver, stats: RunStats | None = None
    ) -> None:
        self.owner = owner
        self.driver = driver
        self.stats = stats
        self.peers: dict[int, StateHandler] = {}
        #: False once the handler turned out to offer no peer (or one failed to open):
        #: after a failure to open, no later test case of the run tries again.
        self.shared = stats is None or not any(gap.name == "peers" for gap in stats.gaps)
        if stats is not None:
            stats.instances = max(stats.instances, 1)
            stats.out_of_process |= out_of_process(owner)

    def of(self, worker: int) -> StateHandler:
        """The instance ``worker`` calls (``0``: the sweeps' worker)."""
        if worker == OWNER or not self.shared:
            return self.owner
        peer = self.peers.get(worker)
        if peer is not None:
            return peer
        try:
            made = peer_of(self.owner)
        except Exception:
            made = None
        if made is None:
            self.shared = False
            return self.owner
        before = None if self.watcher is None else self.watcher.before_open()
        try:
            self.driver.run(made.open())
        except Exception as exc:
            # A peer that cannot open is no evidence about the handler's
            # answers: verify through the one instance instead, and say so:
            # nothing then raced across instances, which is not a pass.
            with contextlib.suppress(Exception):
                self.driver.run(made.close())
            self.shared = False
            if self.stats is not None and not any(g.name == "peers" for g in self.stats.gaps):
                self.stats.gaps.append(
                    Gap(
                        "peers",
                        "races across instances (one instance per worker on the same store)",
                        f"a peer instance failed to open ({type(exc).__name__}: {exc}); every "
                        "worker raced through the one instance the factory built",
                    )
                )
            return self.owner
        self.peers[worker] = made
        if self.stats is not None:
            self.stats.instances = max(self.stats.instances, 1 + len(self.peers))
        if self.watcher is not None:
            self.watcher.after_open(worker, before)
        return made

    def leave(self, worker: int) -> Outcome:
        """Close worker ``worker``'s peer; its next call opens a new one on the same store."""
        peer = self.peers.pop(worker)
        return self.driver.outcome(peer.close)

    def close_peers(self) -> list[tuple[int, Outcome]]:
        """Close every peer (before the owner, whose close may remove the store)."""
        closed = [(worker, self.driver.outcome(peer.close)) for worker, peer in self.peers.items()]
        self.peers.clear()
        return closed
