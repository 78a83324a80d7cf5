"""What the conformance machine draws from, and what it counts across test cases.

The strategies have small, collision-prone domains on purpose: three workers
and four items (one item in two tenants and two scopes) make races, take-overs
and isolation bugs meet within a few steps.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections import Counter
from collections.abc import Callable

from hypothesis import strategies as st

from dsm_sim.model import WORLD_ITEMS, ItemRef, ModelRecord
from reference_engine.context import StateHandlerContext
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DATA",
    "ERRORS",
    "ITEMS",
    "JUMPS_BACK",
    "OBSERVER",
    "OBSERVER_CONTEXTS",
    "STATUSES",
    "TICKS",
    "WORKER",
    "WORKERS",
    "RunStats",
    "context_for",
    "copy_record",
    "is_live",
]

S = IdempotencyStatus
WORKERS = (1, 2, 3)
OBSERVER = 0  # the execution id reads are made under; reads never write

#: INV-1 of tenant t1 is drawn most often, so operations meet on one item; the
#: others are there to collide with it (tenant, scope) or to stay apart.
ITEMS = st.sampled_from((WORLD_ITEMS[0], *WORLD_ITEMS, WORLD_ITEMS[0]))
WORKER = st.sampled_from(WORKERS)
STATUSES = st.sampled_from([s for s in IdempotencyStatus if s is not S.NONE])
DATA = st.none() | st.fixed_dictionaries(
    {"amount": st.integers(0, 9)}, optional={"note": st.text(alphabet="ab'é✓", max_size=3)}
)
OBSERVER_CONTEXTS = {ref: ref.context(OBSERVER) for ref in WORLD_ITEMS}
ERRORS = st.sampled_from(("card declined", "timeout after 30s"))
#: A few telling durations rather than any integer: the shrinker spends its
#: budget removing steps, not walking 900 down to 1.
TICKS = st.sampled_from((1, 59, 60, 61, 300, 600, 899, 900))
JUMPS_BACK = st.sampled_from((1, 60, 600, 3600))


class RunStats:
    """Shared by every test case of one run: what was checked, what was found."""

    def __init__(
        self,
        disabled: frozenset[str] = frozenset(),
        on_test_case: Callable[[int], None] | None = None,
    ) -> None:
        self.disabled = disabled
        self.on_test_case = on_test_case
        self.test_cases = 0
        self.checks: Counter[str] = Counter()
        self.suppressed: Counter[str] = Counter()
        self.first_failure_case: int | None = None


@functools.lru_cache(maxsize=1024)
def context_for(ref: ItemRef, worker: int, token: int | None) -> StateHandlerContext:
    """Contexts are frozen, so one per (item, worker, token) is shared across test cases."""
    return ref.context(worker, lock_token=token)


def is_live(record: ModelRecord | None, now: dt.datetime) -> bool:
    return (
        record is not None
        and record.status is S.PROCESSING
        and record.locked_until is not None
        and now <= record.locked_until
    )


def copy_record(record: ModelRecord | None) -> ModelRecord | None:
    return None if record is None else dataclasses.replace(record)
