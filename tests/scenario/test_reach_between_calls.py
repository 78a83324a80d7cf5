"""The approval and option-extremes scenarios catch bugs the invoice node's happy path never reaches.

Each handler below has one realistic bug, written for this test: it is
correct on every call the older nodes make, and wrong on a lock-free
decision, an odd error detail, a record that changes between calls, a
caller's object kept after the call, or an ``open`` that touches records.
Each must be caught end to end by the nodes and the checker; the correct
in-memory handler must pass the same seeds, and a seed must replay its
history byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsm_sim.history import History
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.model import ReferenceModel
from reference_engine.record import StateRecord, is_lock_live
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.scenario

S = IdempotencyStatus
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SEEDS = (1, 2, 3)


class BlankDetailAsNull(InMemoryStateHandler):
    """A blank error detail is stored as NULL (``detail.strip() or None``)."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await super().release_lock_as_failed(ctx, error_detail)
        record = self.model.current.get(ctx.record_key)
        if record is not None and not error_detail.strip():
            record.error_detail = None


class LockSweepCountsAttempt(InMemoryStateHandler):
    """The lock sweep also counts the reset as an attempt (``attempt = attempt + 1``)."""

    async def reset_expired_locks(self) -> int:
        now = self.clock.now()
        due = [
            r
            for r in self.model.current.values()
            if r.status is S.PROCESSING and r.locked_until is not None and r.locked_until < now
        ]
        count = self.model.reset_expired_locks(now)
        for record in due:
            record.attempt += 1
        return count


class WaiverOverridesLock(InMemoryStateHandler):
    """``set(Skipped)`` without a token overrides another worker's live lock."""

    async def set(
        self, ctx: StateHandlerContext, status: IdempotencyStatus, data: Any = None
    ) -> None:
        record = self.model.current.get(ctx.record_key)
        now = self.clock.now()
        if (
            ctx.lock_token is None
            and status is S.SKIPPED
            and record is not None
            and is_lock_live(record.status, record.locked_until, now)
        ):
            record.status, record.locked_until, record.updated_at = S.SKIPPED, None, now
            return
        await super().set(ctx, status, data)


class KeepsWrittenObject(InMemoryStateHandler):
    """``get`` hands back the very dict the writer passed (no copy), per instance."""

    def __init__(self, clock: Clock | None = None, model: ReferenceModel | None = None) -> None:
        super().__init__(clock, model)
        self._written: dict[int, Mapping[str, Any]] = {}

    async def set(
        self, ctx: StateHandlerContext, status: IdempotencyStatus, data: Any = None
    ) -> None:
        await super().set(ctx, status, data)
        record = self.model.current.get(ctx.record_key)
        if record is not None and isinstance(data, dict):
            self._written[id(record)] = data

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        found = await super().get(ctx)
        record = self.model.current.get(ctx.record_key)
        kept = None if record is None else self._written.get(id(record))
        if found is None or kept is None:
            return found
        return StateRecord(
            key=found.key,
            status=found.status,
            attempt=found.attempt,
            locked_until=found.locked_until,
            data=kept,
            error_detail=found.error_detail,
            entity_execution_id=found.entity_execution_id,
            source_app_id=found.source_app_id,
            created_at=found.created_at,
            updated_at=found.updated_at,
            retain_until=found.retain_until,
        )


class OpenStartsClean(InMemoryStateHandler):
    """``open`` starts from an empty store, a test shortcut left in: a second instance wipes it."""

    async def open(self) -> None:
        self.model.current.clear()
        self.model.superseded.clear()


CAUGHT = [
    ("approvals", BlankDetailAsNull, {"record_agrees_with_model"}),
    ("approvals", LockSweepCountsAttempt, {"sweep_resets_expired"}),
    ("approvals", WaiverOverridesLock, {"errors_agree_with_model"}),
    ("option-extremes", KeepsWrittenObject, {"data_round_trip"}),
    ("approvals", OpenStartsClean, {"record_agrees_with_model", "no_record_lost"}),
]


@pytest.mark.parametrize(
    ("name", "handler", "expected"), CAUGHT, ids=[c[1].__name__ for c in CAUGHT]
)
def test_bug_is_caught_end_to_end(
    name: str, handler: type[InMemoryStateHandler], expected: set[str]
) -> None:
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    reported = [set(run_scenario(scenario, seed, handler).violated) for seed in SEEDS]
    assert any(found & expected for found in reported), reported


@pytest.mark.parametrize("name", ["approvals", "option-extremes"])
def test_correct_handler_passes_and_replays(name: str) -> None:
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    first = run_scenario(scenario, 2)
    assert first.passed, first.violated
    assert first.history.dumps() == run_scenario(scenario, 2).history.dumps()


def test_history_keeps_the_audit_fields_through_json() -> None:
    """Error details, source apps and stored audit fields survive a dump and a load."""
    history = run_scenario(load_scenario(SCENARIOS / "approvals.toml"), 1).history
    releases = [op for op in history.ops if op.detail is not None]
    assert releases, "the scenario releases no lock"
    assert any(op.after is not None and op.after.audit is not None for op in history.ops)
    loaded = History.loads(history.dumps())
    assert loaded.ops == history.ops
