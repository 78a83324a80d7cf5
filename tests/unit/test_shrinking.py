"""The shrink budget: a hard limit, and an early stop only for short, stalled stories."""

from __future__ import annotations

from hypothesis.internal.conjecture import engine

from dsm_sim.conformance.tell.shrink_budget import ShrinkBudget, note_failing_run, shrink_budget


def _deadline(budget: ShrinkBudget, started: float) -> object:
    # Hypothesis computes ``perf_counter() + MAX_SHRINKING_SECONDS``.
    return started + budget  # type: ignore[operator]


def test_the_hard_limit_ends_every_shrink() -> None:
    budget = ShrinkBudget(limit=8.0, settle=2.0)
    deadline = _deadline(budget, 100.0)
    assert not deadline < 107.9  # type: ignore[operator]
    assert deadline < 108.1  # type: ignore[operator]


def test_a_long_story_keeps_shrinking_while_stalled() -> None:
    budget = ShrinkBudget(limit=8.0, settle=2.0, best_steps=7, last_progress=100.0)
    deadline = _deadline(budget, 100.0)
    assert not deadline < 105.0  # type: ignore[operator]


def test_a_short_story_stops_once_stalled_for_the_settle_time() -> None:
    budget = ShrinkBudget(limit=8.0, settle=2.0, best_steps=6, last_progress=101.0)
    deadline = _deadline(budget, 100.0)
    assert not deadline < 102.9  # type: ignore[operator]
    assert deadline < 103.1  # type: ignore[operator]


def test_progress_before_the_shrink_counts_from_its_start() -> None:
    budget = ShrinkBudget(limit=8.0, settle=2.0, best_steps=1, last_progress=50.0)
    deadline = _deadline(budget, 100.0)
    assert not deadline < 101.5  # type: ignore[operator]
    assert deadline < 102.5  # type: ignore[operator]


def test_only_fewer_steps_count_as_progress() -> None:
    budget = ShrinkBudget(limit=8.0, settle=2.0)
    budget.note(5)
    first = budget.last_progress
    budget.note(5)
    budget.note(9)
    assert budget.best_steps == 5
    assert budget.last_progress == first
    budget.note(2)
    assert budget.best_steps == 2
    assert budget.last_progress >= first


def test_the_budget_is_installed_only_inside_the_block() -> None:
    saved = engine.MAX_SHRINKING_SECONDS
    with shrink_budget(4.0, 1.0) as budget:
        assert engine.MAX_SHRINKING_SECONDS is budget
        note_failing_run(3)
        assert budget.best_steps == 3
    assert engine.MAX_SHRINKING_SECONDS is saved
    note_failing_run(1)  # no budget active: nothing to record, nothing raised
    assert budget.best_steps == 3
