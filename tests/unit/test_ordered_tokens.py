"""``--tokens ordered``: a handler whose fencing tokens grow per item is judged by their order.

A store that fences with a sequence or a rowversion hands out tokens that are
not the record's attempt.  By default the kit refuses them (they are not the
model's attempt numbers); under ``tokens="ordered"`` it accepts any token that
exceeds every earlier token of the item, and still catches a token that does
not grow.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from dsm_sim.broken.handlers import KeyRoutingHandler
from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.execute.tokens import (
    OrderedTokenHandler,
    TokenOrderError,
    TokenTable,
    tokens_factory,
)
from dsm_sim.conformance.judge.semantics import DSM
from dsm_sim.conformance.parallel import MachineSpec
from dsm_sim.conformance.runner import verify
from dsm_sim.model import WORLD_START
from reference_engine.clock import Clock, ManualClock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError
from reference_engine.record import StateRecord


class SequenceTokens(KeyRoutingHandler):
    """The reference handler, fencing with ``1000 * attempt + 7`` (a store sequence, say)."""

    step = 1000

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        """Every per-item call reaches the store with the attempt its token stands for."""
        token = ctx.lock_token
        return ctx if token is None else ctx.with_lock_token(token // self.step)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        attempt = await super().try_acquire_lock(ctx)
        return None if attempt is None else self.step * attempt + 7


class RepeatedTokens(SequenceTokens):
    """Every grant of an item gets the same token: a stale holder's passes for the new one's."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.latest: dict[Any, int] = {}

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        granted = await super().try_acquire_lock(ctx)
        if granted is None:
            return None
        self.latest[ctx.record_key] = granted // self.step
        return self.step + 7

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        if ctx.lock_token is None:
            return ctx
        # The store cannot tell its grants apart: any token it gave is the latest holder's.
        return ctx.with_lock_token(self.latest.get(ctx.record_key, 1))


class StoreSequenceTokens(KeyRoutingHandler):
    """The reference handler, fencing with one counter for the whole store (a database sequence).

    Each grant draws the store's next value, whatever the item, so an item's
    tokens grow with gaps (another item's grants fall between) and its first
    token is not 1.  The token is kept beside the record, as a column would
    be; the record's attempt still counts the item's acquisitions.
    """

    #: Where the store's sequence stands when the run starts: other tables drew from it.
    start = 500

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.sequence = itertools.count(self.start)
        #: Per item and token: the acquisition (attempt) the token was granted with.
        self.granted: dict[tuple[Any, int], int] = {}

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        """A token the store never granted for the item fences as no acquisition (attempt 0)."""
        token = ctx.lock_token
        if token is None:
            return ctx
        return ctx.with_lock_token(self.granted.get((ctx.record_key, token), 0))

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        attempt = await super().try_acquire_lock(ctx)
        if attempt is None:
            return None
        token = next(self.sequence)
        self.granted[(ctx.record_key, token)] = attempt
        return token


class TokenInAttempt(StoreSequenceTokens):
    """Fences correctly, but writes the store's token into the record's attempt."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = await super().get(ctx)
        if record is None or record.attempt == 0:
            return record
        latest = max(t for (key, t), _ in self.granted.items() if key == record.key)
        return dataclasses.replace(record, attempt=latest)


class BackwardsTokens(SequenceTokens):
    """Each grant of an item gets a smaller token than the one before (a counter run down)."""

    def _route(self, ctx: StateHandlerContext) -> StateHandlerContext:
        token = ctx.lock_token
        return ctx if token is None else ctx.with_lock_token(self.step - token)

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        attempt = await KeyRoutingHandler.try_acquire_lock(self, ctx)
        return None if attempt is None else self.step - attempt


def store_sequence_tokens(clock: Clock) -> StoreSequenceTokens:
    return StoreSequenceTokens(clock)


def token_in_attempt(clock: Clock) -> TokenInAttempt:
    return TokenInAttempt(clock)


def backwards_tokens(clock: Clock) -> BackwardsTokens:
    return BackwardsTokens(clock)


def sequence_tokens(clock: Clock) -> SequenceTokens:
    return SequenceTokens(clock)


def repeated_tokens(clock: Clock) -> RepeatedTokens:
    return RepeatedTokens(clock)


def _run(factory: Any, tokens: str) -> Any:
    return verify(
        factory,
        profile="dev",
        seed=0,
        max_examples=40,
        tokens=tokens,
        matrix=False,
        volume=False,
        stop_on_first=True,
    )


def test_a_sequence_token_fails_as_an_attempt_number_and_passes_by_order() -> None:
    by_value = _run(sequence_tokens, "attempts")
    assert not by_value.passed
    assert by_value.violations[0].name == "acquire_agrees_with_model"
    by_order = _run(sequence_tokens, "ordered")
    assert not by_order.violations, "\n".join(v.render() for v in by_order.violations)
    assert by_order.tokens == "ordered"
    assert "--tokens ordered" in by_order.replay_command()


def test_a_token_that_does_not_grow_is_caught_under_ordered_tokens() -> None:
    report = _run(repeated_tokens, "ordered")
    assert report.violations
    assert "does not exceed" in report.violations[0].message + report.violations[0].story


def test_the_table_pairs_the_handlers_tokens_with_attempts() -> None:
    table = TokenTable()
    ctx = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="e",
        entity_execution_id="x",
        tenant_id="t",
        source_app_id="a",
    ).for_item("INV-1")
    assert table.granted(ctx, 5_000_001) == 1
    assert table.outgoing(ctx.with_lock_token(1)).lock_token == 5_000_001
    with pytest.raises(TokenOrderError, match="does not exceed 5000001"):
        table.granted(ctx, 5_000_001)
    assert table.granted(ctx, 5_000_002) == 2


def test_an_unknown_token_mode_is_a_usage_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown --tokens"):
        tokens_factory(sequence_tokens, "rowversion")


def test_store_wide_sequence_tokens_pass_by_order_and_fail_by_value_naming_the_option() -> None:
    by_order = _run(store_sequence_tokens, "ordered")
    assert not by_order.violations, "\n".join(v.render() for v in by_order.violations)
    by_value = _run(store_sequence_tokens, "attempts")
    assert by_value.violations[0].name == "acquire_agrees_with_model"
    assert "--tokens ordered" in by_value.violations[0].message


def test_tokens_that_go_backwards_for_an_item_are_a_finding_that_says_so() -> None:
    report = _run(backwards_tokens, "ordered")
    assert report.violations
    found = report.violations[0]
    assert "does not exceed" in found.message, found.render()
    assert "--tokens ordered" in found.message
    # The story counts in attempts, as the model does, and shows the handler's own tokens.
    assert f"token 1 (the handler's {BackwardsTokens.step - 1})" in found.story


def test_under_ordered_tokens_the_records_attempt_counts_acquisitions_not_the_token() -> None:
    report = _run(token_in_attempt, "ordered")
    assert report.violations
    found = report.violations[0]
    assert found.name == "record_agrees_with_model", found.render()
    assert f"carries attempt {StoreSequenceTokens.start}" in found.message
    assert "counts the item's acquisitions" in found.message


def test_a_reproduction_found_under_ordered_tokens_runs_under_them_and_fails_alike() -> None:
    report = _run(backwards_tokens, "ordered")
    found = report.violations[0]
    assert "tokens='ordered'" in found.reproduction
    namespace: dict[str, Any] = {"__name__": "reproduction"}
    with pytest.raises(Exception, match="does not exceed"):
        exec(compile(found.reproduction, "<reproduction>", "exec"), namespace)


def test_the_worker_processes_of_the_race_matrix_judge_by_the_same_rule() -> None:
    spec = MachineSpec(
        handler="tests.unit.test_ordered_tokens:sequence_tokens",
        mode=ClockMode.INJECTED,
        name="HandlerConformance",
        semantics=DSM,
        time_zone=None,
        limit=None,
        tokens="ordered",
    )
    machine = spec.machine(RunStats())
    assert machine.tokens == "ordered"
    assert isinstance(machine.factory(ManualClock(WORLD_START)), OrderedTokenHandler)
