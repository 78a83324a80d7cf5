"""``--tokens ordered``: fencing tokens judged by their order per item, not by their value.

By default a handler's fencing token is the record's attempt number (1 for a
new record, the previous attempt + 1 for a retry), and the kit compares it
with the model's.  A store may fence with a value of its own that grows with
every grant of an item instead: a database sequence, a ``rowversion``, a
timestamp.  :func:`ordered_tokens` wraps a factory so that such a handler is
judged by what fencing needs, which is order:

* every token ``try_acquire_lock`` grants for an item must be greater than
  every token granted for that item before it, or the call fails with
  :class:`TokenOrderError` (judged as any error the model does not expect);
* the kit's side of the pair is the attempt number the model gives: the
  item's last attempt the kit read back (``get``), or granted, plus one; so
  the model's tokens and the story stay attempts;
* a write carries the handler's own token of the grant the caller holds.

The record's ``attempt`` field is judged as before: it counts the item's
acquisitions (the token is a value the store keeps beside it), and the kit's
side of each grant counts from it, so the two stay one count.  A store that
writes its token into ``attempt`` is told so by ``record_agrees_with_model``.
The wrapper sits between the kit and the handler and adds no call of its
own, so the protocol lines of a replay file are the handler's tokens.  The
state machine applies it (``build_machine(..., tokens=...)``), so a printed
reproduction names the rule and runs under it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from reference_engine.clock import Clock
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import ConfigurationError, DsmError
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.instances import peer_of
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = [
    "TOKEN_MODES",
    "OrderedTokenHandler",
    "TokenOrderError",
    "TokenTable",
    "ordered_tokens",
    "tokens_factory",
]

#: ``dsm verify --tokens``: ``attempts`` (the default) or ``ordered``.
TOKEN_MODES = ("attempts", "ordered")


class TokenOrderError(DsmError):
    """A grant whose token does not exceed an earlier token of the same item."""

    def __init__(self, *, item_key: str, token: int, previous: int) -> None:
        self.item_key = item_key
        self.token = token
        self.previous = previous
        super().__init__(
            f"try_acquire_lock({item_key!r}) granted token {token}, which does not exceed "
            f"{previous}, granted for the item before it: under --tokens ordered every grant "
            "of an item must be greater than all earlier ones, or a stale holder's token "
            "could pass for the new holder's"
        )


class TokenTable:
    """Per item: the handler's tokens and the kit's attempt numbers, paired at each grant."""

    def __init__(self) -> None:
        self.last_wire: dict[RecordKey, int] = {}
        self.last_kit: dict[RecordKey, int] = {}
        self.wire: dict[tuple[RecordKey, int], int] = {}

    def granted(self, ctx: StateHandlerContext, wire: int) -> int:
        """The kit's token for the handler's grant ``wire``; refused out of order."""
        key = ctx.record_key
        previous = self.last_wire.get(key)
        if previous is not None and wire <= previous:
            raise TokenOrderError(item_key=ctx.item_key, token=wire, previous=previous)
        self.last_wire[key] = wire
        kit = self.last_kit.get(key, 0) + 1
        self.last_kit[key] = kit
        self.wire[(key, kit)] = wire
        return kit

    def seen(self, record: StateRecord | None) -> None:
        """A record read back: its attempt is where the item's next grant counts from."""
        if record is not None:
            self.last_kit[record.key] = record.attempt

    def outgoing(self, ctx: StateHandlerContext) -> StateHandlerContext:
        """``ctx`` with the handler's own token in place of the kit's."""
        if ctx.lock_token is None:
            return ctx
        wire = self.wire.get((ctx.record_key, ctx.lock_token))
        if wire is None or wire == ctx.lock_token:
            return ctx
        return dataclasses.replace(ctx, lock_token=wire)


class OrderedTokenHandler:
    """A handler whose tokens are translated at the boundary; everything else passes through."""

    def __init__(self, inner: StateHandler, table: TokenTable | None = None) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "table", table or TokenTable())

    inner: StateHandler
    table: TokenTable

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)  # the kit sets an ExecHandler's ``zone``

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return await self.inner.exists(self.table.outgoing(ctx))

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = await self.inner.get(self.table.outgoing(ctx))
        self.table.seen(record)
        return record

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        wire = await self.inner.try_acquire_lock(self.table.outgoing(ctx))
        return None if wire is None else self.table.granted(ctx, wire)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await self.inner.set(self.table.outgoing(ctx), status, data)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await self.inner.release_lock_as_failed(self.table.outgoing(ctx), error_detail)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await self.inner.upsert(self.table.outgoing(ctx), data)

    async def reset_expired_locks(self) -> int:
        return await self.inner.reset_expired_locks()

    async def expire_past_retention(self) -> int:
        return await self.inner.expire_past_retention()

    def peer(self) -> OrderedTokenHandler | None:
        """A peer on the same store shares the table: a grant is the item's, not the process's."""
        made = peer_of(self.inner)
        return None if made is None else OrderedTokenHandler(made, self.table)


class _OrderedFactory:
    """``factory`` whose handlers are judged by token order; its attributes pass through."""

    def __init__(self, factory: HandlerFactory) -> None:
        self.factory = factory
        self.__qualname__ = getattr(factory, "__qualname__", type(factory).__qualname__)
        self.__module__ = getattr(factory, "__module__", __name__)

    def __call__(self, clock: Clock) -> StateHandler:
        return OrderedTokenHandler(self.factory(clock))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.factory, name)


def ordered_tokens(factory: HandlerFactory) -> HandlerFactory:
    """``factory`` with its handlers' tokens judged by order per item (``--tokens ordered``)."""
    return _OrderedFactory(factory)


def tokens_factory(factory: HandlerFactory, tokens: str) -> HandlerFactory:
    """``factory`` as ``--tokens`` asks: unchanged for ``attempts``, wrapped for ``ordered``."""
    if tokens not in TOKEN_MODES:
        raise ConfigurationError(
            f"unknown --tokens {tokens!r}: use attempts (a token is the record's attempt, the "
            "default) or ordered (any token that grows with every grant of an item)"
        )
    return factory if tokens == "attempts" else ordered_tokens(factory)
