"""Idempotency statuses and the one transition table every other module reads.

Handlers, the reference model, the invariant checkers and the state diagram in
``docs/semantics.md`` all consult :data:`TRANSITIONS`; nothing else may encode
which status can follow which.  Keeping the rule in one place is what lets the
harness say "this handler made a transition the spec forbids" without two
copies of the spec drifting apart.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping

from reference_engine.errors import ForbiddenTransitionError

__all__ = [
    "ACQUIRABLE",
    "COMPLETED",
    "TRANSITIONS",
    "IdempotencyStatus",
    "allowed_targets",
    "check_path",
    "check_transition",
    "is_allowed",
    "mermaid_state_diagram",
]


class IdempotencyStatus(enum.Enum):
    """Lifecycle of one work item's record.

    ``NONE`` stands for "no record yet"; it is never stored.  Values are the
    lower-case strings written to the database so a row is readable by eye.
    """

    NONE = "none"
    PROCESSING = "processing"
    PROCESSED = "processed"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    SKIPPED = "skipped"
    EXPIRED = "expired"

    @property
    def label(self) -> str:
        """Human name used in errors, tables and diagrams ("Processed")."""
        return self.name.capitalize()

    def __repr__(self) -> str:
        # A valid Python expression, so Hypothesis' printed reproductions run.
        return f"IdempotencyStatus.{self.name}"


S = IdempotencyStatus

#: The single source of truth: for each status, the statuses that may follow it.
#: ``Failed``/``Expired`` -> ``Processing`` is the retry of a failed or expired
#: item by ``try_acquire_lock``; ``Any -> Skipped`` and ``Any -> Expired`` are
#: spelled out per status so the table is complete and printable.
TRANSITIONS: Mapping[IdempotencyStatus, frozenset[IdempotencyStatus]] = {
    S.NONE: frozenset({S.PROCESSING, S.SKIPPED}),
    S.PROCESSING: frozenset({S.PROCESSED, S.FAILED, S.SKIPPED, S.EXPIRED}),
    S.PROCESSED: frozenset({S.SUPERSEDED, S.SKIPPED, S.EXPIRED}),
    S.FAILED: frozenset({S.PROCESSING, S.SKIPPED, S.EXPIRED}),
    S.SUPERSEDED: frozenset({S.SKIPPED, S.EXPIRED}),
    S.SKIPPED: frozenset({S.SKIPPED, S.EXPIRED}),
    S.EXPIRED: frozenset({S.PROCESSING, S.SKIPPED}),
}

#: Statuses for which ``exists`` answers True: the work is done (or decided
#: not to be done) and must not be repeated.
COMPLETED: frozenset[IdempotencyStatus] = frozenset({S.PROCESSED, S.SKIPPED})

#: Statuses ``try_acquire_lock`` may take over (besides a missing record and an
#: expired ``Processing`` lock, which is treated as ``Failed``).
ACQUIRABLE: frozenset[IdempotencyStatus] = frozenset({S.NONE, S.FAILED, S.EXPIRED})


def allowed_targets(source: IdempotencyStatus) -> frozenset[IdempotencyStatus]:
    """The statuses that may follow ``source``."""
    return TRANSITIONS[source]


def is_allowed(source: IdempotencyStatus, target: IdempotencyStatus) -> bool:
    """Whether the table permits ``source -> target``."""
    return target in TRANSITIONS[source]


def check_transition(
    source: IdempotencyStatus, target: IdempotencyStatus, *, item_key: str = ""
) -> None:
    """Raise :class:`ForbiddenTransitionError` unless ``source -> target`` is allowed."""
    if not is_allowed(source, target):
        raise ForbiddenTransitionError(
            source=source.label,
            target=target.label,
            allowed=tuple(sorted(s.label for s in TRANSITIONS[source])),
            item_key=item_key,
        )


def check_path(path: Iterable[IdempotencyStatus], *, item_key: str = "") -> None:
    """Check every step of a compound operation (e.g. upsert = acquire + complete)."""
    steps = list(path)
    for source, target in itertools.pairwise(steps):
        check_transition(source, target, item_key=item_key)


def mermaid_state_diagram() -> str:
    """Render :data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2`` block.

    ``docs/semantics.md`` embeds this output; a unit test regenerates it and
    fails if the document drifts from the table.
    """
    lines = ["stateDiagram-v2"]
    for source in IdempotencyStatus:
        for target in sorted(TRANSITIONS[source], key=lambda s: list(IdempotencyStatus).index(s)):
            left = "[*]" if source is S.NONE else source.label
            lines.append(f"    {left} --> {target.label}")
    return "\n".join(lines)
