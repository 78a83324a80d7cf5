"""The node-facing DataStateMachine: the contextual machine and the null machine.

Node code only ever sees :class:`DataStateMachine`.  The contextual machine
adds the item fields to the base context on every call and keeps the fencing
token of each acquisition, so the node API stays as small as the design says.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol, runtime_checkable

from reference_engine.begin import Acquired, BeginResult, begin
from reference_engine.context import StateHandlerContext
from reference_engine.errors import LockError
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord, check_settable, clean_error_detail, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = ["NULL_MACHINE", "ContextualDataStateMachine", "DataStateMachine", "NullDataStateMachine"]


@runtime_checkable
class DataStateMachine(Protocol):
    """What a node calls; see ``docs/semantics.md`` for each operation's answer."""

    async def exists(self, item_key: str, item_entity_key: str = "") -> bool: ...

    async def try_acquire_lock(self, item_key: str, item_entity_key: str = "") -> bool: ...

    async def begin(self, item_key: str, item_entity_key: str = "") -> BeginResult: ...

    async def set(
        self,
        item_key: str,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
        item_entity_key: str = "",
    ) -> None: ...

    async def release_lock_as_failed(
        self, item_key: str, error_detail: str, item_entity_key: str = ""
    ) -> None: ...

    async def upsert(
        self, item_key: str, data: Mapping[str, Any] | None, item_entity_key: str = ""
    ) -> None: ...

    async def get(self, item_key: str, item_entity_key: str = "") -> StateRecord | None: ...


class ContextualDataStateMachine:
    """Binds a handler to one node execution's base context.

    One instance lives for one execution of one node, which is exactly the
    lifetime of the locks it takes; a crashed worker takes its tokens with it.
    """

    def __init__(self, handler: StateHandler, base_ctx: StateHandlerContext) -> None:
        self.handler = handler
        self.base_ctx = base_ctx
        self._tokens: dict[tuple[str, str], int] = {}

    def context_for(self, item_key: str, item_entity_key: str = "") -> StateHandlerContext:
        """The per-call context: base context + item fields + this execution's token.

        The keys are validated before they are used to look the token up: a
        list or a dict given as a key must be refused by name, not by the
        ``TypeError`` hashing it would raise, and a ``str`` subclass must find
        the token its plain text holds.
        """
        ctx = self.base_ctx.for_item(item_key, item_entity_key)
        token = self._tokens.get((ctx.item_entity_key, ctx.item_key))
        return ctx if token is None else ctx.with_lock_token(token)

    def token_for(self, item_key: str, item_entity_key: str = "") -> int | None:
        """The fencing token this execution holds for an item, if any."""
        ctx = self.base_ctx.for_item(item_key, item_entity_key)
        return self._tokens.get((ctx.item_entity_key, ctx.item_key))

    async def exists(self, item_key: str, item_entity_key: str = "") -> bool:
        return await self.handler.exists(self.context_for(item_key, item_entity_key))

    async def get(self, item_key: str, item_entity_key: str = "") -> StateRecord | None:
        return await self.handler.get(self.context_for(item_key, item_entity_key))

    async def try_acquire_lock(self, item_key: str, item_entity_key: str = "") -> bool:
        ctx = self.context_for(item_key, item_entity_key)
        token = await self.handler.try_acquire_lock(ctx)
        if token is None:
            return False
        self._tokens[(ctx.item_entity_key, ctx.item_key)] = token
        return True

    async def begin(self, item_key: str, item_entity_key: str = "") -> BeginResult:
        """``exists`` and ``try_acquire_lock`` in one call (one round trip where the store can).

        See :mod:`reference_engine.begin`; an :class:`Acquired` token is kept
        exactly as ``try_acquire_lock`` keeps it.
        """
        ctx = self.context_for(item_key, item_entity_key)
        outcome = await begin(self.handler, ctx)
        if isinstance(outcome, Acquired):
            self._tokens[(ctx.item_entity_key, ctx.item_key)] = outcome.token
        return outcome

    async def set(
        self,
        item_key: str,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
        item_entity_key: str = "",
    ) -> None:
        ctx = self.context_for(item_key, item_entity_key)
        check_settable(status)
        encode_data(data)  # refuse a bad payload before any handler sees it
        await self._finish(ctx, self.handler.set(ctx, status, data))

    async def release_lock_as_failed(
        self, item_key: str, error_detail: str, item_entity_key: str = ""
    ) -> None:
        ctx = self.context_for(item_key, item_entity_key)
        detail = clean_error_detail(error_detail)
        await self._finish(ctx, self.handler.release_lock_as_failed(ctx, detail))

    async def upsert(
        self, item_key: str, data: Mapping[str, Any] | None, item_entity_key: str = ""
    ) -> None:
        ctx = self.context_for(item_key, item_entity_key)
        encode_data(data)
        await self._finish(ctx, self.handler.upsert(ctx, data))

    async def _finish(self, ctx: StateHandlerContext, write: Awaitable[None]) -> None:
        """Run a lock-ending write; the token is spent once the write lands or is fenced off.

        A store error leaves the token in place, so retrying the same write is
        still recognised as the holder's.
        """
        slot = (ctx.item_entity_key, ctx.item_key)
        try:
            await write
        except LockError:
            self._tokens.pop(slot, None)
            raise
        self._tokens.pop(slot, None)


class NullDataStateMachine:
    """The machine of a node without a ``dataStateMachine`` block: no guard, no lock.

    ``exists`` is always False and ``try_acquire_lock`` always True, so node
    code written against the guard runs unchanged and simply is not protected.
    """

    async def exists(self, item_key: str, item_entity_key: str = "") -> bool:
        return False

    async def get(self, item_key: str, item_entity_key: str = "") -> StateRecord | None:
        return None

    async def try_acquire_lock(self, item_key: str, item_entity_key: str = "") -> bool:
        return True

    async def begin(self, item_key: str, item_entity_key: str = "") -> BeginResult:
        """Always :class:`Acquired`, with token 0: there is no guard and no lock."""
        return Acquired(0)

    async def set(
        self,
        item_key: str,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
        item_entity_key: str = "",
    ) -> None:
        return None

    async def release_lock_as_failed(
        self, item_key: str, error_detail: str, item_entity_key: str = ""
    ) -> None:
        return None

    async def upsert(
        self, item_key: str, data: Mapping[str, Any] | None, item_entity_key: str = ""
    ) -> None:
        return None

    def __repr__(self) -> str:
        return "NULL_MACHINE"


#: The one shared null object.
NULL_MACHINE = NullDataStateMachine()
