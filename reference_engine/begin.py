"""``begin``: "is it done?" and "take the lock" answered in one round trip.

The node pattern asks two questions before the work: ``exists`` (is the item
done?) and ``try_acquire_lock`` (may I work on it?).  Asked separately they
cost two round trips; :func:`begin` asks both at once and answers with one of

* :class:`Completed` — the current record is Processed or Skipped: skip;
* :class:`Locked` — a live lock is held (by another worker, or by this
  execution already): skip;
* :class:`Acquired` — the lock is now this caller's, under ``token``: work.

Its semantics are exactly ``exists`` then ``try_acquire_lock`` at one instant:
what ``exists`` is True for, which statuses may be taken, and expired locks
taken over, all as ``docs/semantics.md`` says, but atomically, so no other
writer can land between the two questions.

``begin`` is deliberately *not* part of the handler Protocol, so the core a
store must implement stays the same ten methods.  A store that can answer in
one statement implements :class:`BeginCapable`; every other handler gets
:func:`composed_begin`, built from its own ``exists`` and ``try_acquire_lock``
(two calls, the same answers, without the atomicity).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reference_engine.context import StateHandlerContext
from reference_engine.handler import StateHandler
from reference_engine.model import ReferenceModel
from reference_engine.record import StateRecord

__all__ = [
    "Acquired",
    "BeginCapable",
    "BeginResult",
    "Completed",
    "Locked",
    "begin",
    "begin_in_model",
    "class_begins",
    "composed_begin",
    "native_begin",
]


@dataclass(frozen=True, slots=True)
class Completed:
    """The item is done (Processed or Skipped): the work must not run again.

    ``record`` is the current record when the store returned it in the same
    round trip; the composed default (``exists`` alone) leaves it None rather
    than pay a third round trip for it.
    """

    record: StateRecord | None = None


@dataclass(frozen=True, slots=True)
class Locked:
    """A live lock is held on the item; ``locked_until`` when the store returned it."""

    locked_until: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Acquired:
    """The caller now holds the lock; ``token`` is its fencing token (the new attempt)."""

    token: int


#: What :func:`begin` answers.
BeginResult = Completed | Locked | Acquired


@runtime_checkable
class BeginCapable(Protocol):
    """A handler that answers ``begin`` itself, atomically and in one round trip.

    The answer must equal ``exists`` then ``try_acquire_lock`` at the same
    instant; the conformance kit checks exactly that for every handler that
    implements this method.
    """

    async def begin(self, ctx: StateHandlerContext) -> BeginResult:
        """Completed, Locked or Acquired, as ``exists`` then ``try_acquire_lock`` would say."""
        ...


def class_begins(cls: type) -> bool:
    """Whether instances of ``cls`` answer ``begin`` themselves (see :func:`native_begin`)."""
    if not callable(getattr(cls, "begin", None)):
        return False
    # A subclass that redefines exists or try_acquire_lock below the class whose
    # begin it inherits: that begin was written for the operations it replaced.
    for klass in cls.__mro__:
        if "begin" in klass.__dict__:
            return True
        if "exists" in klass.__dict__ or "try_acquire_lock" in klass.__dict__:
            return False
    return True


def native_begin(handler: object) -> Callable[[StateHandlerContext], Awaitable[BeginResult]] | None:
    """The handler's own ``begin``, or None when it has none.

    A class may set ``begin = None`` to withdraw an inherited one (the
    in-memory handler's subclasses do, see its docstring); ``isinstance``
    against :class:`BeginCapable` agrees with this function in that case.
    A handler whose ``exists`` or ``try_acquire_lock`` was replaced on the
    instance (a recorder tapping its calls, a test injecting a fault), or
    redefined by a subclass below the class its ``begin`` comes from, has that
    ``begin`` ignored too: the replaced calls must see every question.
    """
    if not class_begins(type(handler)):
        return None
    tapped = getattr(handler, "__dict__", {})
    if "exists" in tapped or "try_acquire_lock" in tapped:
        return None
    own = getattr(handler, "begin", None)
    return own if callable(own) else None


async def composed_begin(handler: StateHandler, ctx: StateHandlerContext) -> BeginResult:
    """``begin`` from ``exists`` and ``try_acquire_lock``: the same answers, two round trips.

    Not atomic: another writer may land between the two calls, exactly as in
    the node pattern this replaces, which fencing already makes safe.
    """
    if await handler.exists(ctx):
        return Completed()
    token = await handler.try_acquire_lock(ctx)
    return Locked() if token is None else Acquired(token)


async def begin(handler: StateHandler, ctx: StateHandlerContext) -> BeginResult:
    """Ask ``handler`` both questions: its own ``begin`` if it has one, else the composed one."""
    own = native_begin(handler)
    if own is not None:
        return await own(ctx)
    return await composed_begin(handler, ctx)


def begin_in_model(
    model: ReferenceModel, ctx: StateHandlerContext, now: dt.datetime
) -> BeginResult:
    """The reference answer: the model's ``exists`` then ``try_acquire_lock`` at ``now``.

    Both are synchronous, so nothing can run between them: this is the
    atomic ``begin`` every native implementation is judged against.  The
    instants an acquire would write are computed first, as a store computes
    its parameters before it asks, so a clock at the end of the calendar is
    refused whatever the record's state.
    """
    ctx.handler_config.locked_until(now)
    ctx.handler_config.retain_until(now)
    if model.exists(ctx, now):
        return Completed(model.get(ctx, now))
    before = model.current.get(ctx.record_key)
    locked_until = None if before is None else before.locked_until
    token = model.try_acquire_lock(ctx, now)
    return Locked(locked_until) if token is None else Acquired(token)
