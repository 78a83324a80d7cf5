"""What a call did to an item's record, as a path on the state diagram.

The explorer marks a change in red as "not in the transition table", and a
reader who sees red on a passing run learns to ignore it.  So a change is
only ever marked for what the table governs: the item's status moving from
one node to another along no edge of the diagram.  Everything else a call
can do to a record is drawn, never marked:

* a call that changed nothing (a refused acquire, a retry of a write that
  already landed, a sweep that had nothing of the item's to sweep) is not a
  change at all;
* a record rewritten in the same status (new data, an error detail) is a
  change that stays on its node, or takes the node's own edge where the
  table has one (``Skipped -> Skipped``);
* an upsert over Processed keeps the old record as Superseded and writes a
  new Processed record: the table's ``Processed -> Superseded`` edge, with
  the item Processed again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from dsm_sim.history import Op, OpName, RecordView
from dsm_sim.reports.explorer.diagram import INITIAL, Diagram
from dsm_sim.teaching.diagram import EXPIRED_LOCK
from reference_engine.status import IdempotencyStatus

__all__ = ["ChangePath", "change_path", "node_of", "resolve_edge"]

_PROCESSED = IdempotencyStatus.PROCESSED.label
_SUPERSEDED = IdempotencyStatus.SUPERSEDED.label


@dataclass(frozen=True, slots=True)
class ChangePath:
    """The nodes a change went through, as ``A>B`` (``A>B>C`` through Processing, or ``A``
    for a record rewritten in its status); ``forbidden`` when a hop is no edge of the table."""

    edge: str
    forbidden: bool


def node_of(record: RecordView | None, store_now: float | None) -> str:
    """The diagram node a record stands at: a lapsed, unswept Processing lock is its own node."""
    if record is None:
        return INITIAL
    label = record.status.capitalize()
    if (
        record.status == "processing"
        and record.locked_until is not None
        and store_now is not None
        and record.locked_until < store_now
    ):
        return EXPIRED_LOCK
    return label


def resolve_edge(diagram: Diagram, source: str, target: str, *, upsert: bool = False) -> str:
    """The diagram path a record change took, as ``A>B`` (or ``A>B>C`` through Processing).

    A holder whose lock lapsed still writes with its token, so a write from
    the expired-lock node is drawn from Processing; an upsert on a missing or
    failed record (``upsert``) goes through Processing in one write.  A change no path
    explains is returned as is, and the page shows it as not in the table.
    """
    if diagram.has(source, target):
        return f"{source}>{target}"
    if source == EXPIRED_LOCK and diagram.has("Processing", target):
        return f"Processing>{target}"
    if upsert and diagram.has(source, "Processing") and diagram.has("Processing", target):
        return f"{source}>Processing>{target}"
    return f"{source}>{target}"


def _superseded(op: Op, before: RecordView | None, after: RecordView | None) -> bool:
    """An upsert that rewrote a Processed record: the spec keeps the old one as Superseded.

    Whether the store really kept it (rather than overwriting in place) is
    ``upsert_keeps_history``'s to judge; the diagram shows what the call means.
    """
    return (
        op.op is OpName.UPSERT
        and before is not None
        and after is not None
        and before.status == after.status == IdempotencyStatus.PROCESSED.value
    )


def change_path(
    diagram: Diagram, op: Op, before: RecordView | None, after: RecordView | None, now: float
) -> ChangePath:
    """The path ``op`` moved an item along, from record ``before`` to ``after`` at store ``now``."""
    source, target = node_of(before, now), node_of(after, now)
    if _superseded(op, before, after):
        source, target = _PROCESSED, _SUPERSEDED
    elif source == target and not diagram.has(source, target):
        return ChangePath(source, forbidden=False)
    edge = resolve_edge(diagram, source, target, upsert=op.op is OpName.UPSERT)
    hops = edge.split(">")
    forbidden = any(not diagram.has(a, b) for a, b in itertools.pairwise(hops))
    return ChangePath(edge, forbidden)
