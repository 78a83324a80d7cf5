"""Exploration efficiency: handler calls per second inside ``dsm verify`` over a tight loop's.

The useful speed of a verifier is how much of the handler's behaviour it
explores per second; its ceiling is how fast the handler itself runs.  So,
in one run and per store: ``dsm verify`` (the edge probes, the race matrix
and the search) counts every call it makes on the handler, by operation,
and then the same handler runs a tight loop of the same operations in the
same proportions on its own items.  The ratio of the two call rates is the
share of the handler's own speed the kit turns into evidence; the rest is
the kit's judging, shrinking and per-test-case store set-up.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = "Exploration efficiency: calls/s in dsm verify over the same handler's tight loop"
HEADERS = (
    "store",
    "profile",
    "verify s",
    "calls",
    "calls/s in verify",
    "tight loop calls/s",
    "verify/tight",
    "reads (get) share",
)
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


class _Counting:
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


async def _tight(factory: Callable[[Any], Any], mix: Counter[str], calls: int) -> float:
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


def _stores(short: bool) -> list[tuple[str, Callable[[Any], Any]]]:
    from reference_engine.handlers.memory import in_memory_handler
    from reference_engine.handlers.sql.factory import sqlite_file_handler

    stores: list[tuple[str, Callable[[Any], Any]]] = [
        ("memory", in_memory_handler),
        ("sqlite file", sqlite_file_handler),
    ]
    if short:
        return stores[:1]
    if os.environ.get("DSM_TEST_POSTGRES_URL"):
        from reference_engine.handlers.sql.factory import postgres_test_handler

        stores.append(("postgresql", postgres_test_handler))
    if os.environ.get("DSM_TEST_REDIS_URL"):
        from reference_engine.handlers.redis_factory import redis_test_handler

        stores.append(("redis", redis_test_handler))
    return stores


def run(short: bool) -> list[Table]:
    try:
        from dsm_sim.conformance.runner import verify
    except ImportError as exc:
        raise BenchSkipped(f"the conformance runner is missing: {exc}") from exc
    profile = "dev" if short else "ci"
    rows: list[tuple[object, ...]] = []
    for name, factory in _stores(short):
        counting = _Counting(factory)
        started = timed()
        report = verify(counting, profile, SEED)
        seconds = timed() - started
        total = sum(counting.calls.values())
        kit_rate = total / seconds
        loop_rate = asyncio.run(_tight(factory, counting.calls, 2000 if short else 6000))
        rows.append(
            (
                name,
                profile,
                round(seconds, 1),
                total,
                round(kit_rate),
                round(loop_rate),
                round(kit_rate / loop_rate, 2),
                round(counting.calls["get"] / max(total, 1), 2),
            )
        )
        if not report.passed:
            raise RuntimeError(f"the correct {name} handler did not pass: {report.not_exercised}")
    note = (
        "calls: every call the kit made on the handler and its peers (probes, race matrix, "
        "search, trimming); the tight loop runs the same operations in the same proportions."
    )
    return [Table(TITLE, HEADERS, rows, note)]
