"""What the conformance machine keeps track of while it runs: locks held, counts, contexts.

A worker's holds (:class:`Hold`) are what it believes it holds, which is
what a stale writer acts on; :class:`RunStats` is shared by every test case
of one run (checks made, properties already found); contexts are frozen and
shared across test cases.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections import Counter
from collections.abc import Callable

from dsm_sim.conformance.judge.semantics import Hazard
from dsm_sim.conformance.properties import Finding
from dsm_sim.conformance.report import Gap, HazardSeen
from dsm_sim.model import ItemRef, ModelRecord, execution_id, record_copy, shown
from reference_engine.context import StateHandlerContext
from reference_engine.status import IdempotencyStatus

__all__ = ["Hold", "RunStats", "context_for", "copy_record", "is_live"]

S = IdempotencyStatus


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
        #: Steps taken by every test case (after its ``setup``), shrinking's replays included.
        self.steps = 0
        #: Parts of the run that could not be exercised, and why (a peer that failed to open).
        self.gaps: list[Gap] = []
        #: The property the first failing test case broke, before any shrinking.
        self.first_failure_property: str | None = None
        #: The most handler instances (the factory's and its peers) open at once in a test
        #: case, and whether they ran in processes of their own (``--exec``).
        self.instances = 0
        self.out_of_process = False
        #: The hazards of the semantics profile that test cases showed, by name: the
        #: shortest story of each, and how many test cases showed it.
        self.hazards: dict[str, HazardSeen] = {}

    def note_hazard(self, hazard: Hazard, finding: Finding, story: str) -> None:
        """A test case showed what the interface cannot prevent; keep the shortest story."""
        seen = self.hazards.get(hazard.name)
        fresh = HazardSeen(hazard.name, hazard.summary, finding.property, finding.message, story)
        if seen is None or fresh.story_steps < seen.story_steps:
            self.hazards[hazard.name] = fresh.again(0 if seen is None else seen.seen)
        else:
            self.hazards[hazard.name] = seen.again(seen.seen)


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
    return None if record is None else record_copy(record)
