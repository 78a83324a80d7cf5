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

from dsm_sim.conformance.loop import LoopDriver
from dsm_sim.model import Outcome
from reference_engine.handler import StateHandler
from reference_engine.instances import peer_of

__all__ = ["HandlerInstances"]

#: The worker whose calls go to the instance the factory built.
OWNER = 1


class HandlerInstances:
    """The factory's instance, and peers opened on first use."""

    def __init__(self, owner: StateHandler, driver: LoopDriver) -> None:
        self.owner = owner
        self.driver = driver
        self.peers: dict[int, StateHandler] = {}
        #: False once the handler turned out to offer no peer (or one failed to open).
        self.shared = True

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
        try:
            self.driver.run(made.open())
        except Exception:
            # A peer that cannot open is no evidence about the handler's
            # answers: verify through the one instance instead.
            with contextlib.suppress(Exception):
                self.driver.run(made.close())
            self.shared = False
            return self.owner
        self.peers[worker] = made
        return made

    def close_peers(self) -> list[tuple[int, Outcome]]:
        """Close every peer (before the owner, whose close may remove the store)."""
        closed = [(worker, self.driver.outcome(peer.close)) for worker, peer in self.peers.items()]
        self.peers.clear()
        return closed
