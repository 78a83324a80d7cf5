"""What the conformance machine draws from, and what it counts across test cases.

The strategies have small, collision-prone domains on purpose: three workers
and eight items per world (the hot item in two tenants, two scopes, two
entities, a near spelling and a split of its key; see
:mod:`dsm_sim.conformance.worlds`) make races, take-overs and isolation bugs
meet within a few steps.  Rules draw a :class:`~dsm_sim.conformance.worlds.Role`
and act on that role's item in the test case's world.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections import Counter
from collections.abc import Callable

from hypothesis import strategies as st

from dsm_sim.conformance.payloads import DATA, ERRORS, OBJECTS, PLAIN_DATA
from dsm_sim.conformance.worlds import Role
from dsm_sim.model import ItemRef, ModelRecord, execution_id, shown
from reference_engine.context import StateHandlerContext
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DATA",
    "ERRORS",
    "ITEMS",
    "JUMPS_BACK",
    "OBJECTS",
    "OBSERVER",
    "PLAIN_DATA",
    "STATUSES",
    "TICKS",
    "WORKER",
    "WORKERS",
    "Hold",
    "RunStats",
    "context_for",
    "copy_record",
    "is_live",
]

S = IdempotencyStatus
WORKERS = (1, 2, 3)
OBSERVER = 0  # the execution id reads are made under; reads never write

#: The hot item is drawn most often, so operations meet on one item; the
#: others are there to collide with it (tenant, scope, entity, key) or to stay apart.
ITEMS = st.sampled_from((Role.HOT, *Role, Role.HOT))
WORKER = st.sampled_from(WORKERS)
STATUSES = st.sampled_from([s for s in IdempotencyStatus if s is not S.NONE])
#: A few telling durations rather than any integer: the shrinker spends its
#: budget removing steps, not walking 900 down to 1.  Seconds matter: some
#: nodes lock for five.
TICKS = st.sampled_from((1, 59, 60, 61, 300, 600, 899, 900, 2, 4, 6))
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
        #: The property the first failing test case broke, before any shrinking.
        self.first_failure_property: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """A lock some execution believes it holds: who, on what, with which token.

    A worker's current execution holds its latest tokens; an execution it left
    behind (a redelivery started while it still ran) keeps its own, and may
    wake and write with them: that is a stale writer of the same worker.
    """

    worker: int
    ref: ItemRef
    token: int
    execution: str

    @property
    def who(self) -> str:
        # The world may prefix every execution id; the first is still "the worker".
        default = execution_id(self.worker)
        return f"worker {self.worker}" + (
            "" if self.execution.endswith(default) else f" (execution {shown(self.execution)})"
        )


@functools.lru_cache(maxsize=4096)
def context_for(
    ref: ItemRef,
    worker: int,
    token: int | None,
    execution: str | None = None,
    source_app: str | None = None,
) -> StateHandlerContext:
    """Contexts are frozen, so one per (item, worker, token, execution, app) is shared across cases.

    ``source_app`` is the app the worker runs in (the world draws one per
    worker): a store must stamp each write with its own call's, not the first
    it saw.
    """
    ctx = ref.context(worker, lock_token=token, execution=execution)
    if source_app is None or source_app == ctx.source_app_id:
        return ctx
    return dataclasses.replace(ctx, source_app_id=source_app)


def is_live(record: ModelRecord | None, now: dt.datetime) -> bool:
    return (
        record is not None
        and record.status is S.PROCESSING
        and record.locked_until is not None
        and now <= record.locked_until
    )


def copy_record(record: ModelRecord | None) -> ModelRecord | None:
    return None if record is None else dataclasses.replace(record)
