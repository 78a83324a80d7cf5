"""``--tokens ordered``: a handler whose fencing tokens grow per item is judged by their order.

A store that fences with a sequence or a rowversion hands out tokens that are
not the record's attempt.  By default the kit refuses them (they are not the
model's attempt numbers); under ``tokens="ordered"`` it accepts any token that
exceeds every earlier token of the item, and still catches a token that does
not grow.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsm_sim.broken.handlers import KeyRoutingHandler
from dsm_sim.conformance.execute.tokens import TokenOrderError, TokenTable, tokens_factory
from dsm_sim.conformance.runner import verify
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError


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
