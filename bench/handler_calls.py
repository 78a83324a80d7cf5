"""Counting a handler's calls, and the same calls in a tight loop: the ceiling a tool is measured against.

Both the exploration and the simulation benchmarks ask one question: what
share of the handler's own speed does the tool turn into evidence?  The tool
runs on a factory wrapped in :class:`Counting`, which counts every call made
on every handler (and peer) the factory builds, by operation; then
:func:`tight_loop` runs the same handler on the same operations in the same
proportions, with nothing around the calls.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from common import timed

__all__ = ["OPERATIONS", "Counting", "tight_loop"]

SEED = 0
#: The handler operations counted (``begin`` among them where the handler answers it).
OPERATIONS = (
    "exists",
    "get",
    "try_acquire_lock",
    "begin",
    "set",
    "release_lock_as_failed",
    "upsert",
    "reset_expired_locks",
    "expire_past_retention",
)


class Counting:
    """Counts the calls made on every handler (and peer) a factory builds."""

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        self.factory = factory
        self.calls: Counter[str] = Counter()
        self.__qualname__ = getattr(factory, "__qualname__", "factory")
        self.__module__ = getattr(factory, "__module__", __name__)

    def tap(self, handler: Any) -> Any:
        for name in OPERATIONS:
            method = getattr(handler, name, None)
            if method is None or not callable(method):
                continue

            async def counted(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
                self.calls[_n] += 1
                return await _m(*args, **kwargs)

            setattr(handler, name, counted)
        peer = getattr(handler, "peer", None)
        if callable(peer):

            def counted_peer(_p: Any = peer) -> Any:
                made = _p()
                return None if made is None else self.tap(made)

            handler.peer = counted_peer
        return handler

    def __call__(self, clock: Any) -> Any:
        return self.tap(self.factory(clock))


async def tight_loop(factory: Callable[[Any], Any], mix: Counter[str], calls: int) -> float:
    """Calls per second of ``calls`` operations drawn in ``mix``'s proportions, on fresh items."""
    from reference_engine.clock import ManualClock
    from reference_engine.context import StateHandlerContext
    from reference_engine.status import IdempotencyStatus

    clock = ManualClock(dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC))
    handler = factory(clock)
    await handler.open()
    base = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="flow-1",
        entity_execution_id="run-1",
        tenant_id="t1",
        source_app_id="app-1",
    )
    rng = random.Random(SEED)
    names = [n for n in OPERATIONS if mix[n] and hasattr(handler, n)]
    weights = [mix[n] for n in names]
    tokens: dict[str, int] = {}
    started = timed()
    try:
        for index in range(calls):
            name = rng.choices(names, weights)[0]
            item = f"INV-{rng.randrange(max(calls // 8, 1))}"
            ctx = base.for_item(item)
            held = tokens.get(item)
            try:
                if name == "exists":
                    await handler.exists(ctx)
                elif name == "get":
                    await handler.get(ctx)
                elif name in ("try_acquire_lock", "begin"):
                    token = await handler.try_acquire_lock(ctx)
                    if token is not None:
                        tokens[item] = token
                elif name == "set":
                    await handler.set(
                        ctx.with_lock_token(held), IdempotencyStatus.PROCESSED, {"n": index}
                    )
                elif name == "release_lock_as_failed":
                    await handler.release_lock_as_failed(ctx.with_lock_token(held), "declined")
                elif name == "upsert":
                    await handler.upsert(ctx, {"n": index})
                elif name == "reset_expired_locks":
                    await handler.reset_expired_locks()
                else:
                    await handler.expire_past_retention()
            except Exception:
                pass  # a refusal is a call the store answered, as in the kit
            if index % 64 == 0:
                clock.advance(dt.timedelta(seconds=61))
        return calls / (timed() - started)
    finally:
        await handler.close()
