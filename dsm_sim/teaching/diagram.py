"""``dsm diagram``: print the state diagram generated from the transition table.

The edges are the transitions of :data:`~reference_engine.status.TRANSITIONS`
and nothing else; what the table cannot say is which operation makes each
change, so :data:`OPERATIONS` names it, keyed by the table's own pairs, and a
unit test fails when a transition has no operation or an operation names a
pair the table forbids.  The diagram also draws the one state the table
cannot: a ``Processing`` record whose lock has expired but that no sweep has
reset yet.  It is stored as Processing, but every operation treats it as
Failed, and it heads the list of what handler authors get wrong in
``docs/writing-a-handler.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from reference_engine.status import TRANSITIONS, IdempotencyStatus

__all__ = [
    "EXPIRED_LOCK",
    "EXPIRED_LOCK_ONLY",
    "OPERATIONS",
    "RETENTION",
    "SWEEP",
    "UPSERT_THROUGH",
    "configure",
    "labelled_state_diagram",
    "main",
    "transition_table_markdown",
]

S = IdempotencyStatus

SWEEP = "reset_expired_locks sweep (catch-up worker)"
RETENTION = "expire_past_retention"
#: Upsert without a token on a missing, Failed or Expired record: acquire and
#: complete in one write, checked as the path through Processing.
UPSERT_THROUGH = "upsert (on to Processed in one write)"

#: The operations that make each transition of the table, in the words of the
#: handler protocol.  "the holder" is the execution whose fencing token is live.
OPERATIONS: Mapping[tuple[IdempotencyStatus, IdempotencyStatus], tuple[str, ...]] = {
    (S.NONE, S.PROCESSING): ("try_acquire_lock", UPSERT_THROUGH),
    (S.NONE, S.SKIPPED): ("set(Skipped)",),
    (S.PROCESSING, S.PROCESSED): ("set(Processed) by the holder", "upsert"),
    (S.PROCESSING, S.FAILED): ("release_lock_as_failed by the holder", SWEEP),
    (S.PROCESSING, S.SKIPPED): ("set(Skipped) by the holder",),
    (S.PROCESSING, S.EXPIRED): (RETENTION,),
    (S.PROCESSED, S.SUPERSEDED): ("upsert",),
    (S.PROCESSED, S.SKIPPED): ("set(Skipped)",),
    (S.PROCESSED, S.EXPIRED): (RETENTION,),
    (S.FAILED, S.PROCESSING): ("try_acquire_lock (retry)", UPSERT_THROUGH),
    (S.FAILED, S.SKIPPED): ("set(Skipped)",),
    (S.FAILED, S.EXPIRED): (RETENTION,),
    # Allowed so that "any -> Skipped" holds, but a superseded record is history,
    # and set only ever writes the current record.
    (S.SUPERSEDED, S.SKIPPED): ("never made (history is not current)",),
    (S.SUPERSEDED, S.EXPIRED): (RETENTION,),
    (S.SKIPPED, S.SKIPPED): ("set(Skipped)",),
    (S.SKIPPED, S.EXPIRED): (RETENTION,),
    (S.EXPIRED, S.PROCESSING): ("try_acquire_lock (retry)", UPSERT_THROUGH),
    (S.EXPIRED, S.SKIPPED): ("set(Skipped)",),
}

#: Operations that change a Processing record only once its lock has expired:
#: the sweeps skip live locks.  Their edges start at :data:`EXPIRED_LOCK`.
EXPIRED_LOCK_ONLY: frozenset[str] = frozenset({SWEEP, RETENTION})

#: The diagram's name for "Processing with ``locked_until`` before now, not yet swept".
EXPIRED_LOCK = "ExpiredLock"
_EXPIRED_LOCK_TITLE = "Processing, lock expired, not yet swept"
_EXPIRED_LOCK_NOTE = (
    "Stored as Processing, read as Failed",
    "by exists, set(Skipped) and upsert.",
    "The holder's token still writes",
    "until a sweep or a take-over.",
)
#: The expired lock's edges that are not a change of the stored status: time
#: running out, and the take-over, which ``try_acquire_lock`` makes without
#: waiting for the sweep (the record stays Processing, with the next token).
_EXPIRED_LOCK_EDGES = (
    (S.PROCESSING.label, EXPIRED_LOCK, "locked_until passes (no write)"),
    (EXPIRED_LOCK, S.PROCESSING.label, "try_acquire_lock takes over (attempt + 1)"),
)


def _node(status: IdempotencyStatus) -> str:
    return "[*]" if status is S.NONE else status.label


def _ordered(targets: frozenset[IdempotencyStatus]) -> list[IdempotencyStatus]:
    return sorted(targets, key=list(IdempotencyStatus).index)


def labelled_state_diagram() -> str:
    """:data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2``, each edge labelled by its operations.

    Raises ``KeyError`` for a transition without an entry in :data:`OPERATIONS`,
    so a status added to the table cannot be drawn unexplained.
    """
    # Left to right, as the lifecycle reads: the statuses come in the table's order.
    lines = [
        "stateDiagram-v2",
        "    direction LR",
        f'    state "{_EXPIRED_LOCK_TITLE}" as {EXPIRED_LOCK}',
    ]
    for source in IdempotencyStatus:
        for target in _ordered(TRANSITIONS[source]):
            operations = OPERATIONS[(source, target)]
            groups = [(_node(source), operations)]
            if source is S.PROCESSING:
                groups = [
                    (_node(source), tuple(op for op in operations if op not in EXPIRED_LOCK_ONLY)),
                    (EXPIRED_LOCK, tuple(op for op in operations if op in EXPIRED_LOCK_ONLY)),
                ]
            lines.extend(
                f"    {node} --> {target.label} : {' / '.join(ops)}" for node, ops in groups if ops
            )
        if source is S.PROCESSING:
            lines.extend(f"    {a} --> {b} : {label}" for a, b, label in _EXPIRED_LOCK_EDGES)
    lines.append(f"    note right of {EXPIRED_LOCK}")
    lines.extend(f"        {line}" for line in _EXPIRED_LOCK_NOTE)
    lines.append("    end note")
    return "\n".join(lines)


def transition_table_markdown() -> str:
    """The transition table as a Markdown table (one row per source status)."""
    rows = ["| from | may become |", "| --- | --- |"]
    for source, targets in TRANSITIONS.items():
        names = ", ".join(
            t.label for t in sorted(targets, key=lambda s: list(TRANSITIONS).index(s))
        )
        rows.append(f"| {source.label} | {names} |")
    return "\n".join(rows)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("mermaid", "table"),
        default="mermaid",
        help="mermaid: the labelled state diagram; table: the transition table in Markdown "
        "(default: mermaid)",
    )


def main(args: argparse.Namespace) -> int:
    print(labelled_state_diagram() if args.format == "mermaid" else transition_table_markdown())
    return 0
