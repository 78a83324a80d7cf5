"""Lost replies and fresh executions: what a real worker sees that a test usually hides.

A worker that sees a ``StoreError`` or a timeout after its write actually
landed still holds its token and retries (the invoice node retries ``set``
after a charge), or gives up and releases.  That token is *spent*: the
write it stood for has happened.  ``docs/semantics.md`` says what happens
next, and the kit holds every handler to it: a write with a spent token
changes nothing (property ``spent_token_rejected``).  The same write made
again succeeds, since it has happened; any other (new data, a release after
the completion) is refused with ``StaleLockError``.  Above all it never moves
a Processed record to Failed: that hands finished work to the next delivery,
a second charge.

An acquisition's reply can be lost too: the lock is taken, the worker does
not know its token, and may read the record back to find it is the holder
(its own execution id is on the record).

Every kit worker starts with one execution id and may start fresh ones (a
redelivered message is a new execution of the node); the execution it left
behind keeps its tokens and may wake later, a stale writer of the same worker.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance.execute import bookkeeping as K
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.steps import LandedWrite
from dsm_sim.conformance.generate.worlds import Role
from reference_engine.status import IdempotencyStatus

__all__ = ["LandedWrite", "ReplyRules"]

S = IdempotencyStatus


class ReplyRules(OperationRules):
    """Writes and acquisitions whose replies are lost, the retries after them, redeliveries."""

    @rule(pick=st.integers(0, 5), kind=st.sampled_from(tuple(LandedWrite)), data=W.PLAIN_DATA)
    @step
    def write_lands_reply_lost(
        self, pick: int, kind: LandedWrite, data: dict[str, Any] | None
    ) -> None:
        """A holder's completing write lands, and the holder sees an error instead."""
        hold = self._pick_hold(pick)
        if self.diverged or hold is None:
            return
        if kind is LandedWrite.SET:
            self._set(hold.worker, hold.ref, S.PROCESSED, data, hold=hold, reply_lost=True)
        elif kind is LandedWrite.RELEASE:
            self._release(hold.worker, hold.ref, "timeout after 30s", hold=hold, reply_lost=True)
        else:
            self._upsert(hold.worker, hold.ref, data, hold=hold, reply_lost=True)

    @rule(pick=st.integers(0, 5), release=st.booleans(), data=W.PLAIN_DATA, again=st.booleans())
    @step
    def retry_landed_write(
        self, pick: int, release: bool, data: dict[str, Any] | None, again: bool = False
    ) -> None:
        """The caller of a landed write makes it ``again``, retries ``set(Processed)`` with
        ``data``, or gives up and releases.

        Always with its spent token, and the record must not move: the same
        write again succeeds, any other is refused.
        """
        hold = self._pick_hold(pick, spent=True)
        if self.diverged or hold is None:
            return
        if again and hold in self.landed:
            operation, call, model_call = self.landed[hold]
            self._write(operation, hold.worker, hold.ref, call, model_call, hold=hold)
        elif release:
            self._release(hold.worker, hold.ref, "gave up after a timeout", hold=hold)
        else:
            self._set(hold.worker, hold.ref, S.PROCESSED, data, hold=hold)

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def acquire_reply_lost(self, worker: int, item: Role) -> None:
        """The lock is taken, but the worker never learns its token."""
        self._acquire(worker, self._ref(item), reply_lost=True)

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def reads_back_own_lock(self, worker: int, item: Role) -> None:
        """After a lost reply the worker reads the record back; if its own execution holds
        the lock, it carries on with the token the record shows."""
        if self.diverged:
            return
        ref = self._ref(item)
        self.get(worker, item)
        record = self.model.current.get(ref.record_key)
        execution = self._execution(worker)
        if (
            self.diverged
            or record is None
            or not K.is_live(record, self.clock.now())
            or record.entity_execution_id != execution
            or any(h.ref == ref and h.token == record.attempt for h in self.holds)
        ):
            return
        self.holds.append(K.Hold(worker, ref, record.attempt, execution))
        self._step(
            f"worker {worker}", f"recognises its own lock on {ref.name}", f"token {record.attempt}"
        )

    @rule(worker=W.WORKER)
    @step
    def new_delivery(self, worker: int) -> None:
        """The worker starts a fresh execution (a redelivered message); the one it leaves
        behind keeps its tokens and may still wake and write."""
        if self.diverged:
            return
        self.deliveries[worker] += 1
        self._step(f"worker {worker}", f"starts execution {self._execution(worker)}")
