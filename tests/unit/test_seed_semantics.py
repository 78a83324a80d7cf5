"""The ``seed`` semantics profile: the seed's interface, whose writes carry no token.

A handler of the seed's ``IDataStateMachineHandler`` cannot refuse a stale
holder's late write: it is never told who is writing.  Under the ``seed``
profile everything else is judged as under the spec, and that write is
reported as the hazard ``stale_holder_late_write`` with its story: not passed
silently, not refused.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsm_sim.conformance.judge.semantics import SEED, SEMANTICS, resolve_semantics
from dsm_sim.conformance.runner import verify
from dsm_sim.conformance.tell.outputs import report_dict, verdict
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.status import IdempotencyStatus

S = IdempotencyStatus


class SeedShaped(InMemoryStateHandler):
    """The reference handler as the seed's interface reaches it: a write carries no token.

    What the seed promises it keeps: a write on a Processing record is the
    holder's (the only caller the seed's flow lets write there).
    """

    async def _as_holder(self, ctx: StateHandlerContext) -> StateHandlerContext:
        record = await super().get(ctx)
        if record is not None and record.status is S.PROCESSING:
            return ctx.with_lock_token(record.attempt)
        return ctx.with_lock_token(None)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await super().set(await self._as_holder(ctx), status, data)

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await super().release_lock_as_failed(await self._as_holder(ctx), error_detail)

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await super().upsert(await self._as_holder(ctx), data)


def seed_shaped(clock: Clock) -> SeedShaped:
    return SeedShaped(clock)


def _run(semantics: str | None, **how: Any) -> Any:
    return verify(
        seed_shaped,
        profile="dev",
        seed=0,
        semantics=semantics,
        matrix=False,
        volume=False,
        **how,
    )


def test_the_seed_profile_is_known_by_name_and_survives_pickling() -> None:
    assert SEMANTICS["seed"] is SEED
    assert resolve_semantics("seed") is SEED
    assert pickle.loads(pickle.dumps(SEED)) is SEED
    assert not SEED.fenced
    assert SEED.hazards["stale_write_rejected"].name == "stale_holder_late_write"


def test_under_the_spec_the_tokenless_write_is_a_violation() -> None:
    report = _run(None, stop_on_first=True)
    assert not report.passed
    assert report.violations[0].name == "stale_write_rejected"
    assert not report.hazards


def test_under_the_seed_profile_it_is_a_named_hazard_with_its_story(tmp_path: Path) -> None:
    report = _run("seed")
    assert not report.violations, "\n\n".join(v.render() for v in report.violations)
    assert [h.name for h in report.hazards] == ["stale_holder_late_write"]
    hazard = report.hazards[0]
    assert hazard.line().startswith("hazard: stale_holder_late_write — ")
    assert "landed" in hazard.message and hazard.story_steps > 0
    assert report.result("stale_write_rejected").status.value == "waived"
    assert "stale_holder_late_write" in verdict(report)
    data = report_dict(report)
    assert data["hazards"][0]["name"] == "stale_holder_late_write"
    assert data["hazards"][0]["line"] == hazard.line()
    json.dumps(data)
    assert "--semantics seed" in report.replay_command()


def test_a_copy_of_the_model_numbers_its_grants_on_its_own() -> None:
    # A race is judged by replaying candidate orders on copies of the model: a grant in one
    # candidate must not number the next one's (a worker answered before another would be
    # told token 2 for a new record).
    import copy

    from dsm_sim.conformance.judge.semantics import ProfiledModel
    from dsm_sim.model import WORLD_ITEMS, WORLD_START

    ref = WORLD_ITEMS[0]
    model = ProfiledModel(SEED)
    first = copy.copy(model)
    first.current = {}
    assert first.try_acquire_lock(ref.context(3), WORLD_START) == 1
    second = copy.copy(model)
    second.current = {}
    assert second.try_acquire_lock(ref.context(2), WORLD_START) == 1
    assert model.last_token == {} and first.last_token != model.last_token
