"""What a check-then-insert acquire can break, for the tests that catch one in another process."""

from __future__ import annotations

from dsm_sim.conformance.generate.steps import RaceOp
from dsm_sim.conformance.program import Program
from dsm_sim.conformance.properties import PROPERTY_NAMES

__all__ = ["RACY_ACQUIRE_BREAKS", "racing_calls"]

#: What an acquire that reads, then writes unconditionally, can break when another call
#: lands in between: the lock it grants twice and the grants the spec allows, and what
#: it writes over (a completion, a release, an upsert's history, a skip, a sweep's reset
#: or a retention sweep's removal), as read back in a record, an answer or an error, or
#: as the holder's next write.  Not the properties no race on one item can break.
RACY_ACQUIRE_BREAKS = frozenset(PROPERTY_NAMES) - {
    "tenant_isolation",
    "scope_isolation",
    "entity_isolation",
    "key_identity",
    "invalid_keys_refused",
    "timestamps_in_utc",
    "lock_duration_honoured",
    "closes_cleanly",
}


def racing_calls(program: Program | None) -> set[RaceOp]:
    """The operations the failing program's races made at once."""
    racing: set[RaceOp] = set()
    for call in () if program is None else program.steps:
        if call.rule == "race":
            racing.update(call.argument("ops", ()))
        elif call.rule == "race_pair":
            racing.update((call.argument("first"), call.argument("second")))
        elif call.rule == "race_to_acquire":
            racing.add(RaceOp.ACQUIRE)
    return racing
