"""The in-memory handler: the reference model behind the handler Protocol.

It is the executable spec and the fast store for simulation.  Each call runs
to completion without yielding to the event loop, which is what makes it
atomic; subclasses in the catalogue of broken handlers add ``await`` points
to model real stores' race windows.

``begin`` is native here (the model answers both questions in one step), but
not inherited: a subclass that does not define its own ``begin`` falls back to
the composed one built from its ``exists`` and ``try_acquire_lock``, so a
subclass that changes those can never answer ``begin`` better than they do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference_engine.begin import BeginResult, begin_in_model
from reference_engine.clock import Clock, SystemClock, read_now
from reference_engine.context import StateHandlerContext
from reference_engine.model import ReferenceModel
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["InMemoryStateHandler", "in_memory_handler"]


class InMemoryStateHandler:
    """A :class:`~reference_engine.handler.StateHandler` over :class:`ReferenceModel`."""

    #: ``close()`` then ``open()`` keeps every record: the model outlives both,
    #: so the conformance kit restarts this handler mid-run.
    survives_restart = True

    def __init__(self, clock: Clock | None = None, model: ReferenceModel | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.model = model or ReferenceModel()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "begin" not in cls.__dict__:
            # Withdraw the inherited native begin (see the module docstring);
            # a method set to None also fails the BeginCapable isinstance check.
            setattr(cls, "begin", None)  # noqa: B010 -- mypy refuses a plain assignment

    def peer(self) -> InMemoryStateHandler | None:
        """Another instance on these records, as a second process on one store would be.

        Here the store is the instance's model, so only a class whose state
        is the model gets a peer: a subclass with a constructor of its own
        may keep part of its store beside the model (a routing table, an
        index), which a second instance would not share, and has none.
        """
        if type(self).__init__ is not InMemoryStateHandler.__init__:
            return None
        return type(self)(self.clock, self.model)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return self.model.exists(ctx, read_now(self.clock))

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        return self.model.get(ctx)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return self.model.try_acquire_lock(ctx, read_now(self.clock))

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        return begin_in_model(self.model, ctx, read_now(self.clock))

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(ctx, status, data, read_now(self.clock))

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(ctx, error_detail, read_now(self.clock))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        self.model.upsert(ctx, data, read_now(self.clock))

    async def reset_expired_locks(self) -> int:
        return self.model.reset_expired_locks(read_now(self.clock))

    async def expire_past_retention(self) -> int:
        return self.model.expire_past_retention(read_now(self.clock))


def in_memory_handler(clock: Clock) -> InMemoryStateHandler:
    """Factory for the registry, the conformance kit and the simulator."""
    return InMemoryStateHandler(clock)
