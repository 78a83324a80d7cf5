"""Telling a racy handler's failure from a crash, and keeping what it showed.

When a handler answers the same steps differently on a second try (two
connections racing, a pool handing out a different connection), Hypothesis
cannot shrink or replay the failure and raises one of its ``Flaky`` errors
instead of the violation.  The violation is still inside (an exception group,
a ``__cause__`` or a ``__context__``), with the story of the run that broke the
property: this module digs it out, so the report says what went wrong once
rather than "the run stopped".
"""

from __future__ import annotations

from collections.abc import Iterator

from dsm_sim.conformance.properties import PropertyViolation

__all__ = ["FLAKY_EXPLANATION", "RACE_EXPLANATION", "find_violation", "is_flaky"]

#: What a flaky result means for the handler author, in one sentence.
FLAKY_EXPLANATION = (
    "the handler answered the same steps differently when they were run again "
    "(a race across connections?), so no shrunk program could be replayed; "
    "the story above is the run that broke the property"
)

#: What a flaky result that some replays broke again means: a race shrunk by repetition.
RACE_EXPLANATION = (
    "the same steps break the property in some replays and not in others: a race whose "
    "interleaving the kit cannot choose (between connections, or processes on one store), so "
    "it was shrunk by repetition, a step left out when the program without it still broke "
    "the property within a few replays, and the count above is how often the program shown did"
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """Every exception reachable from ``exc``: group members, causes, contexts; each once."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)


def find_violation(exc: BaseException) -> PropertyViolation | None:
    """The first property violation ``exc`` is or carries, nearest first."""
    for found in _chain(exc):
        if isinstance(found, PropertyViolation):
            return found
    return None


def is_flaky(exc: BaseException) -> bool:
    """Whether Hypothesis gave up on ``exc`` because the same steps did not fail again.

    Matched on the ``Flaky`` base class of the installed Hypothesis and, for
    versions that name their variants differently, on a class name starting
    with ``Flaky`` (``FlakyFailure``, ``FlakyReplay``, ``FlakyStrategyDefinition``...).
    """
    from hypothesis.errors import Flaky

    return any(
        isinstance(found, Flaky) or any(k.__name__.startswith("Flaky") for k in type(found).__mro__)
        for found in _chain(exc)
    )
