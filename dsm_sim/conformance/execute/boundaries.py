"""A rule for the instant the lock sweep is most often wrong at: a live lock's last instant.

The sweep takes ``locked_until < now``.  A sweep written with ``<=`` kills a
lock that is still live for one more instant, and only a sweep that runs with
the clock exactly on a record's ``locked_until`` shows it.  Landing on the
instant and sweeping are separate rules elsewhere, so they rarely meet in a
short run; this rule does both in one step, on each record's own expiry
(nodes have their own lock durations).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.model import shown
from reference_engine.status import IdempotencyStatus

__all__ = ["BoundaryRules"]

S = IdempotencyStatus


class BoundaryRules(OperationRules):
    """The lock sweep run exactly at a live lock's expiry."""

    @rule(pick=st.integers(0, 5))
    @step
    def sweep_at_lock_expiry(self, pick: int) -> None:
        """Put the clock on a Processing record's ``locked_until`` and run the lock sweep.

        At that instant the lock is still live: the sweep must leave it alone.
        """
        processing = sorted(
            (r for r in self.model.current.values() if r.status is S.PROCESSING),
            key=lambda r: r.updated_at,
        )
        if self.diverged or not processing:
            return
        record = processing[pick % len(processing)]
        assert record.locked_until is not None
        self.clock.set(record.locked_until)
        self._move(f"moves to {shown(record.key.item_key)}'s lock expiry, its last live instant")
        self.reset_expired_locks()
