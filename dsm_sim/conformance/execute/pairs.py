"""The race matrix's steps: put an item in a start state, race two calls on it, clear the store.

The search draws its races; the matrix (:mod:`dsm_sim.conformance.racing`)
lists them: every ordered pair of operations, from every
:class:`~dsm_sim.conformance.generate.steps.StartState`, through two
instances of the handler on the same store, in every interleaving the
scheduler can force.  These steps are what a matrix cell runs, and what its
reproduction prints: ``prepare`` reaches the state the way a node does,
``race_pair`` runs the two calls under a :data:`~dsm_sim.conformance.execute.scheduler.Schedule`,
``settle`` moves past every record's end and sweeps, so the next cells meet
a store whose records are all Expired and inert.

Neither step is a Hypothesis rule: the search's seeds explore what they did.
"""

from __future__ import annotations

import datetime as dt

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.races import RaceRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.execute.scheduler import Interleaving
from dsm_sim.conformance.generate.steps import RaceOp, StartState
from dsm_sim.conformance.generate.worlds import Role
from dsm_sim.conformance.judge.doubt import HistoryDoubt
from dsm_sim.model import ItemRef
from reference_engine.status import IdempotencyStatus

__all__ = ["FIRST", "HOLDER", "SECOND", "PairSteps"]

S = IdempotencyStatus
#: The worker that takes the item's lock on the way to its start state.
HOLDER = 1
#: Whose instance (and, for a call without a token, whose execution) makes each call.
FIRST, SECOND = 2, 3
_PAST = dt.timedelta(microseconds=1)


class PairSteps(RaceRules):
    """``prepare``, ``race_pair`` and ``settle``: the steps of a race-matrix cell."""

    #: What the last ``race_pair`` did: its choice points, for the matrix to branch from.
    last_interleaving: Interleaving | None = None

    @step
    def prepare(self, item: Role, state: StartState) -> None:
        """Bring ``item`` to ``state`` as a node would: worker 1 acquires, then as the state says.

        A completing write lands with its reply lost, so its holder still has
        its token (spent): a racing retry of that write is a case the matrix
        meets like any other.
        """
        if self.diverged or state is StartState.NONE:
            return
        ref = self._ref(item)
        # Every answer on the way is judged; the record is read back once, after
        # the race (one read where the way there would take one per call).
        self.focus, self._quiet = ref, True
        try:
            self._prepare(ref, state)
        finally:
            self.focus, self._quiet = None, False

    def _prepare(self, ref: ItemRef, state: StartState) -> None:
        self._acquire(HOLDER, ref)
        hold = self._newest_hold(ref)
        record = self.model.current.get(ref.record_key)
        if self.diverged or hold is None or record is None:
            return
        if state is StartState.AT_EXPIRY:
            self._clock_to(record.locked_until, f"{ref.name}'s lock expiry, its last live instant")
        elif state is StartState.EXPIRED:
            self._clock_to(record.locked_until, f"{ref.name}'s lock expiry +1µs", _PAST)
        elif state is StartState.EXPIRED_PAST_RETENTION:
            self._clock_to(record.retain_until, f"{ref.name}'s end of retention +1µs", _PAST)
        elif state is StartState.FAILED:
            self._release(HOLDER, ref, "declined", hold=hold, reply_lost=True)
        elif state is StartState.SKIPPED:
            self._set(HOLDER, ref, S.SKIPPED, None, hold=hold, reply_lost=True)
        elif state is not StartState.LIVE:
            self._set(HOLDER, ref, S.PROCESSED, {"n": 1}, hold=hold, reply_lost=True)
            if state is StartState.SUPERSEDED:
                self._upsert(SECOND, ref, {"n": 2}, hold=None)
            elif state in (StartState.PAST_RETENTION, StartState.EXPIRED_RECORD):
                done = self.model.current.get(ref.record_key)
                if done is not None and not self.diverged:
                    self._clock_to(done.retain_until, f"{ref.name}'s end of retention +1µs", _PAST)
                if state is StartState.EXPIRED_RECORD:
                    self.expire_past_retention()

    def _clock_to(
        self, instant: dt.datetime | None, what: str, past: dt.timedelta = dt.timedelta(0)
    ) -> None:
        if instant is None or self.diverged:
            return
        self.clock.set(instant + past)
        self._move(f"moves to {what}")

    @step
    def race_pair(
        self, item: Role, first: RaceOp, second: RaceOp, schedule: tuple[int, ...] = ()
    ) -> None:
        """``first`` through worker 2's instance and ``second`` through worker 3's, interleaved.

        The holder makes a call that needs a token (with its token); any other
        call is worker 2's or 3's own.  Only the item is read back afterwards,
        unless a sweep raced: a sweep may touch every record.
        """
        self.last_interleaving = None
        if self.diverged:
            return
        ref = self._ref(item)
        data = {"n": 3}
        one = self._call(first, ref, FIRST, data, via=FIRST)
        other = self._call(second, ref, SECOND, data, via=SECOND)
        if one is None or other is None:
            return
        self.last_interleaving = self._race(ref, [one, other], schedule, read_all=False)
        self._asked_again(ref, (FIRST, SECOND))

    def _asked_again(self, ref: ItemRef, workers: tuple[int, ...]) -> None:
        """Each instance that raced answers ``exists``, the node's guard, for the item once more.

        An instance that keeps what it read or wrote (a cache of answers, a
        copy of the record) must still answer for the store after another
        instance changed the item: whichever call came first in the race,
        each instance is asked after both.  An answer that agrees is not
        told (the story stays the race's); one that does not is a step of
        its own, and the finding names the instance that answered.
        """
        for worker in workers:
            if not self.diverged:
                self._ask_again(ref, worker)

    def _ask_again(self, ref: ItemRef, worker: int) -> None:
        instance = self.instances.of(worker)
        if instance is self.handler:
            return  # no peer: the race went through the one instance, nothing to tell apart
        got, finding = self._judged_exists(instance, ref, worker, None)
        if finding is not None:
            self._step(
                f"worker {worker}",
                f"asks its own instance again: exists({ref.label})",
                got.describe(),
            )
            self._report(
                P.Finding(
                    finding.property,
                    f"worker {worker}'s own instance, asked after the race: "
                    + finding.message
                    + " (an instance answers for the store, not from what it saw before "
                    "another instance changed the item)",
                )
            )

    @step
    def settle(self) -> None:
        """Move past every record's end of retention and sweep: the store's records go inert.

        The model then forgets the Expired records of items outside the
        current world (no later step names them again), so the cost of
        judging a race stays that of the items in play.
        """
        if self.diverged:
            return
        model = self.model
        ends = [
            instant
            for record in model.records()
            for instant in (record.retain_until, record.locked_until)
            if instant is not None
        ]
        latest = max(ends, default=self.clock.now())
        if latest >= self.clock.now():
            self.clock.set(latest + _PAST)
            self._move("passes every record's end of retention")
        self.reset_expired_locks()
        self.expire_past_retention()
        if self.diverged:
            return
        keep = {ref.record_key for ref in self.world}
        model.current = {
            key: record
            for key, record in model.current.items()
            if key in keep or record.status is not S.EXPIRED
        }
        model.superseded = [
            record
            for record in model.superseded
            if record.key in keep or record.status is not S.EXPIRED
        ]
        self.doubt = HistoryDoubt()
        refs = set(self.world)
        self.holds = [hold for hold in self.holds if hold.ref in refs]
        self.spent = {hold: how for hold, how in self.spent.items() if hold.ref in refs}
        self.landed = {hold: how for hold, how in self.landed.items() if hold.ref in refs}
        self.holder = {ref: worker for ref, worker in self.holder.items() if ref in refs}
