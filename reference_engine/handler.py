"""The handler contract: one Protocol a store implements to back the DataStateMachine.

A third party implements this class and a :data:`HandlerFactory`; the factory
is what the registry, the conformance kit and the simulator all accept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["HandlerFactory", "StateHandler"]


@runtime_checkable
class StateHandler(Protocol):
    """Persistence of item records; the semantics are in ``docs/semantics.md``.

    Every method reads "now" from the clock the handler was built with, so
    simulated time and clock jumps reach it.  Each call must be atomic with
    respect to concurrent callers on other connections or processes.
    """

    async def open(self) -> None:
        """Create whatever storage is needed; idempotent, safe to call on every start."""
        ...

    async def close(self) -> None:
        """Release connections; the handler is not used afterwards."""
        ...

    async def exists(self, ctx: StateHandlerContext) -> bool:
        """True iff the item's current record is completed (Processed or Skipped)."""
        ...

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        """The item's current (non-superseded) record, or None."""
        ...

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        """Take the processing lock; return the new fencing token, or None if not acquired."""
        ...

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Move the item to ``status`` (Processed, Failed, Skipped or Expired)."""
        ...

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        """Give up the lock held under ``ctx.lock_token``, recording the item as Failed."""
        ...

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        """Record a (newer) Processed result; a previous Processed record becomes Superseded."""
        ...

    async def reset_expired_locks(self) -> int:
        """Sweep: ``Processing AND locked_until < now -> Failed``; return how many."""
        ...

    async def expire_past_retention(self) -> int:
        """Sweep: records past their retention become Expired; return how many."""
        ...


#: Builds a handler around the clock it must read "now" from.
HandlerFactory = Callable[[Clock], StateHandler]
