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
import os
from collections.abc import Callable
from typing import Any

from common import BenchSkipped, Table, timed
from handler_calls import Counting, tight_loop

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
        counting = Counting(factory)
        started = timed()
        report = verify(counting, profile, SEED)
        seconds = timed() - started
        total = sum(counting.calls.values())
        kit_rate = total / seconds
        loop_rate = asyncio.run(tight_loop(factory, counting.calls, 2000 if short else 6000))
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
        broken = [r.name for r in report.violations]
        if report.error is not None or broken:
            raise RuntimeError(f"the correct {name} handler failed: {report.error or broken}")
        if report.not_exercised and profile != "dev":
            # Under dev (30 test cases, no top-up seeds) a rarely reached property may go
            # unexercised by chance; under ci the top-ups must reach every one.
            raise RuntimeError(f"the correct {name} handler did not pass: {report.not_exercised}")
    note = (
        "calls: every call the kit made on the handler and its peers (probes, race matrix, "
        "search, trimming); the tight loop runs the same operations in the same proportions."
    )
    return [Table(TITLE, HEADERS, rows, note)]
