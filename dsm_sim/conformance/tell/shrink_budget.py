"""A time budget for shrinking, so a caught bug is reported in seconds, not minutes.

Hypothesis shrinks a failing stateful run for up to five minutes.  Most of
that is spent after the program is already short, minimising individual
drawn values (a worker number, a delay) one at a time, each try replaying
the whole program against the handler.  The kit's stories are judged by
their steps, which are mostly gone early; so the kit gives shrinking a
budget per profile and reports the best program found within it.

The budget has two parts.  A hard limit bounds every shrink.  And once the
failing story is short (at most :data:`SHORT_STORY` steps), shrinking stops
as soon as it has *stalled*: no failing program with fewer steps was found
for the profile's settle time.  (Counting any smaller failing program as
progress would never stall: Hypothesis keeps finding ones that differ in a
drawn value the story does not show.)  A one-step story whose values are already simple
then costs a second or two, not the whole limit, while a long story still
gets the whole limit to lose its padding.

Finding a violation does not depend on the budget (generation is fixed by
the seed); how far its program is shrunk does, a little, on the machine's
speed.  A budget counted in replays would be exact, but a replay that is
skipped still pays for drawing every step, and Hypothesis needs two hundred
such replays to notice it is stuck: counting costs more than it saves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hypothesis.internal.conjecture import engine as _engine
from hypothesis.reporting import current_reporter, with_reporter

__all__ = [
    "SETTLE_SECONDS",
    "SHORT_STORY",
    "SHRINK_SECONDS",
    "ShrinkBudget",
    "note_failing_run",
    "shrink_budget",
]

#: Hard limit on seconds of shrinking per failing run, by profile.
SHRINK_SECONDS: dict[str, float] = {"dev": 4.0, "ci": 8.0, "thorough": 60.0}
#: Seconds without a failing program of fewer steps after which a short story is final.
SETTLE_SECONDS: dict[str, float] = {"dev": 1.5, "ci": 2.0, "thorough": 15.0}
#: A story of at most this many steps may stop shrinking once it has stalled.
SHORT_STORY = 6


@dataclass
class ShrinkBudget:
    """How long one failing run may shrink; also the progress seen while it does.

    Hypothesis computes its deadline as ``perf_counter() + MAX_SHRINKING_SECONDS``
    and later asks ``deadline < perf_counter()``; an instance stands in for the
    number, so that the question is answered from the shrink's progress.
    """

    limit: float
    settle: float
    short: int = SHORT_STORY
    best_steps: int | None = None
    last_progress: float = field(default_factory=time.perf_counter)

    def note(self, steps: int) -> None:
        if self.best_steps is None or steps < self.best_steps:
            self.best_steps = steps
            self.last_progress = time.perf_counter()

    def __radd__(self, started: float) -> _Deadline:
        return _Deadline(self, started)


@dataclass(frozen=True)
class _Deadline:
    budget: ShrinkBudget
    started: float

    def __lt__(self, now: float) -> bool:
        budget = self.budget
        if now - self.started > budget.limit:
            return True
        stalled = now - max(self.started, budget.last_progress) > budget.settle
        return stalled and budget.best_steps is not None and budget.best_steps <= budget.short


_active: ShrinkBudget | None = None


def note_failing_run(steps: int) -> None:
    """The machine found a violation after ``steps`` steps (during search or shrinking)."""
    if _active is not None:
        _active.note(steps)


@contextmanager
def shrink_budget(seconds: float, settle: float | None = None) -> Iterator[ShrinkBudget]:
    """Limit shrinking while the block runs (Hypothesis reads the limit then).

    ``settle`` (default: no early stop) ends the shrink of a short story once
    no smaller failing program was found for that many seconds.
    """
    global _active
    budget = ShrinkBudget(limit=seconds, settle=seconds if settle is None else settle)
    saved, saved_active = _engine.MAX_SHRINKING_SECONDS, _active
    _engine.MAX_SHRINKING_SECONDS = budget  # type: ignore[assignment]
    _active = budget
    outer = current_reporter()

    def report(value: object) -> None:
        # The budget is the kit's choice, not slow progress: drop the warning
        # Hypothesis prints when shrinking stops at the limit.
        if not str(value).startswith("WARNING: Hypothesis has spent more than"):
            outer(value)

    try:
        with with_reporter(report):
            yield budget
    finally:
        _engine.MAX_SHRINKING_SECONDS = saved
        _active = saved_active
