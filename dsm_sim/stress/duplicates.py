"""Which keys charged twice a network fault excuses: the lease expired and fencing held.

A stress run counts duplicates straight from the durable effect rows, so a
broken handler is caught even if the history were incomplete.  Under network
faults a second charge is the price of leases: a worker partitioned past its
lock did its effect, another worker took the expired item over and did it
again.  That is acceptable only when both of these hold, each from its own
evidence:

* the checker, reading the whole history, found the earlier lease expired
  before the later token was acquired (no ``no_duplicate_side_effect``
  violation for the key), and
* the journals show every earlier holder's lock-ending write (``set`` or
  ``release_lock_as_failed``) rejected with ``StaleLockError`` and none
  accepted: the stale write reached the store and fencing turned it away.

A run without network faults excuses nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from dsm_sim.checker import InvariantResult
from dsm_sim.history import OpName
from dsm_sim.stress.history_builder import history_key
from dsm_sim.stress.journal import EventType, Operation
from dsm_sim.stress.ledger import EffectRow
from dsm_sim.stress.settings import StressSettings
from reference_engine.errors import StaleLockError

__all__ = ["LOCK_ENDING", "excused_duplicates", "fenced_writes"]

LOCK_ENDING = frozenset({OpName.SET, OpName.RELEASE_LOCK_AS_FAILED})


def fenced_writes(operations: Iterable[Operation]) -> int:
    """Lock-ending writes the store rejected with ``StaleLockError``."""
    return sum(
        1 for op in operations if op.op in LOCK_ENDING and op.error == StaleLockError.__name__
    )


def excused_duplicates(
    settings: StressSettings,
    effects: Iterable[EffectRow],
    operations: Sequence[Operation],
    results: Iterable[InvariantResult],
) -> tuple[str, ...]:
    """The item keys with more than one effect row that the rules above excuse, sorted."""
    if not settings.netfaults:
        return ()
    flagged = {v.key for r in results if r.name == "no_duplicate_side_effect" for v in r.violations}
    rows: dict[str, list[EffectRow]] = defaultdict(list)
    for row in effects:
        rows[row.item_key].append(row)
    writes: dict[tuple[str, str, int | None], list[Operation]] = defaultdict(list)
    for op in operations:
        if op.op in LOCK_ENDING:
            writes[(op.key, op.execution, op.token)].append(op)
    excused = []
    for key, charged in sorted(rows.items()):
        if len(charged) < 2 or history_key(settings, key) in flagged:
            continue
        tokens = [row.token for row in charged]
        if None in tokens or len(set(tokens)) != len(tokens):
            continue
        latest = max(t for t in tokens if t is not None)
        if all(
            _fenced(writes[(key, row.execution, row.token)])
            for row in charged
            if row.token != latest
        ):
            excused.append(key)
    return tuple(excused)


def _fenced(attempts: Sequence[Operation]) -> bool:
    """Rejected by fencing at least once, and never accepted."""
    return any(op.error == StaleLockError.__name__ for op in attempts) and not any(
        op.outcome is EventType.OK for op in attempts
    )
