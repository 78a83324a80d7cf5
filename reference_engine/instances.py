"""Another handler on the same store: what a second worker process would open.

Production runs many worker processes, each with its own handler instance:
its own connections, its own caches, its own in-process locks, one shared
store.  A handler whose atomicity or fencing lives in the instance (an
``asyncio.Lock`` around check-then-insert, a token counter, a cache of
``exists`` answers) is correct with one instance and wrong with two.  A
handler that can build a second instance on its own store says so with
:meth:`SharedStoreHandler.peer`; the conformance kit then races its workers
through separate instances.

The capability is optional and lives outside the core
:class:`~reference_engine.handler.StateHandler` contract: a handler that
cannot share its store (a private in-memory SQLite database) answers
``None``, and one without the method is verified through one instance.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from reference_engine.handler import StateHandler

__all__ = ["SharedStoreHandler", "peer_of"]


@runtime_checkable
class SharedStoreHandler(Protocol):
    def peer(self) -> StateHandler | None:
        """A new, unopened handler on this one's store, sharing nothing else with it.

        The caller opens and closes it; closing it must leave the store (and
        the instance it came from) as they are.  ``None``: the store cannot
        be reached from a second instance.
        """
        ...


def peer_of(handler: object) -> StateHandler | None:
    """``handler.peer()`` when the handler offers one, else ``None``."""
    if not isinstance(handler, SharedStoreHandler):
        return None
    return handler.peer()
