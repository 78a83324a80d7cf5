"""The Hypothesis state machine that runs a handler beside the reference model.

:class:`~dsm_sim.conformance.execute.operations.OperationRules` drives each operation
and compares the world after every step; this module adds what makes stores
fail in production: workers racing on one item, a worker crashing with its
lock, a holder stalling past its expiry and waking with a stale token, a
second attempt landing exactly on a lock's expiry, and a retention sweep
landing exactly on a record's end of retention.  Rules cannot take pytest
fixtures, so a machine class is built per handler factory with
:func:`build_machine`; the program Hypothesis prints for a failure builds it
the same way, and runs as pasted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance.execute import bookkeeping as K
from dsm_sim.conformance.execute.begin import BeginRules, begins_natively
from dsm_sim.conformance.execute.boundaries import BoundaryRules
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.execute.deployments import DeploymentRules
from dsm_sim.conformance.execute.edges import EdgeSteps
from dsm_sim.conformance.execute.lifecycle import LifecycleRules
from dsm_sim.conformance.execute.pairs import PairSteps
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.execute.replies import ReplyRules
from dsm_sim.conformance.execute.spellings import SpellingRules
from dsm_sim.conformance.execute.tokens import tokens_factory
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.worlds import Role
from dsm_sim.conformance.judge import judges as J
from dsm_sim.conformance.judge.semantics import Retention, SemanticsProfile, resolve_semantics
from dsm_sim.model import ModelRecord, Outcome, outcome_of, shown
from reference_engine.handler import HandlerFactory
from reference_engine.status import IdempotencyStatus

__all__ = ["ConformanceMachine", "build_machine"]

S = IdempotencyStatus


class ConformanceMachine(
    PairSteps,
    ReplyRules,
    SpellingRules,
    LifecycleRules,
    BoundaryRules,
    DeploymentRules,
    EdgeSteps,
):
    """The operations, plus races, crashes, stalls, lost replies and boundary contention."""

    @rule(item=W.ITEMS, guarded=st.booleans())
    @step
    def race_to_acquire(self, item: Role, guarded: bool) -> None:
        """All workers at once, interleaving at every ``await``: a check-then-insert loses."""
        if self.diverged:
            return
        ref = self._ref(item)
        now = self.clock.now()
        record = K.copy_record(self.model.current.get(ref.record_key))
        holder = self.holder.get(ref)
        contexts = {w: self._ctx(ref, w, self._hold(w, ref)) for w in W.WORKERS}
        guard_says_done = self.model.exists(contexts[W.WORKERS[0]], now)
        answers: dict[int, bool] = {}

        def attempt(worker: int) -> Callable[[], Any]:
            handler = self.instances.of(worker)

            async def run() -> int | None:
                if guarded:
                    answers[worker] = await handler.exists(contexts[worker])
                    if answers[worker]:
                        return None
                return await handler.try_acquire_lock(contexts[worker])

            return run

        outcomes = dict(
            zip(W.WORKERS, self.driver.gather([attempt(w) for w in W.WORKERS]), strict=True)
        )
        for worker, answer in answers.items():
            self._checked("exists_agrees_with_model")
            finding = J.judge_exists(
                ref, worker, Outcome(answer), Outcome(guard_says_done), record, now
            )
            self._report(self._diagnose(ref, finding))
        winners = [w for w, o in outcomes.items() if o.error is None and o.value is not None]
        actor = winners[0] if len(winners) == 1 else W.WORKERS[0]
        want = outcome_of(lambda: self.model.try_acquire_lock(contexts[actor], now))
        self._acquired(ref, actor, want)
        shown = ", ".join(f"worker {w}: {self._grant_shown(ref, o)}" for w, o in outcomes.items())
        how = "exists then try_acquire_lock" if guarded else "try_acquire_lock"
        self._step("workers 1-3", f"race: {how}({ref.label})", shown)
        self._checked("at_most_one_live_lock", "acquire_agrees_with_model")
        self._report(
            self._diagnose(
                ref, J.judge_race(ref, outcomes, want, record, holder, now, tokens=self.tokens)
            )
        )
        self._after_step("acquire")

    @rule(worker=W.WORKER)
    @step
    def crash(self, worker: int) -> None:
        """The worker dies mid-work: none of its executions completes or releases what it holds."""
        if self.diverged:
            return
        mine = [hold for hold in self.holds if hold.worker == worker]
        held = ", ".join(hold.ref.name for hold in mine) or "nothing"
        for hold in mine:
            self.holds.remove(hold)
            self.spent.pop(hold, None)
        self._step(f"worker {worker}", "crashes", f"abandons {held}")

    @rule(pick=st.integers(0, 5), succeed=st.booleans(), data=W.DATA, error=W.ERRORS)
    @step
    def finish_held_work(
        self, pick: int, succeed: bool, data: dict[str, Any] | None, error: str
    ) -> None:
        """A holder completes its item (or gives up), possibly after its lock was swept.

        A holder whose lock was swept or taken over is a stale worker waking
        up: its write must be fenced off with StaleLockError.  The holder may
        be an execution the worker left behind, with an older token.
        """
        hold = self._pick_hold(pick)
        if self.diverged or hold is None:
            return
        if succeed:
            self._set(hold.worker, hold.ref, S.PROCESSED, data, hold=hold)
        else:
            self._release(hold.worker, hold.ref, error, hold=hold)

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def skip_item(self, worker: int, item: Role) -> None:
        """A node decides an item needs no work: ``set(Skipped)`` with no data, from any status.

        The commonest write without data, so it is where a store that writes
        ``data = NULL`` instead of keeping the stored data shows.
        """
        if not self.diverged:
            self._set(worker, self._ref(item), S.SKIPPED, None, hold=None)

    @rule(pick=st.integers(0, 5))
    @step
    def holder_stalls_past_expiry(self, pick: int) -> None:
        """A holder pauses (GC, network) past its lock's expiry and the catch-up sweep runs.

        When it wakes, its token is stale: :meth:`finish_held_work` then checks
        that its write is fenced off.
        """
        hold = self._pick_hold(pick)
        if self.diverged or hold is None:
            return
        record = self.model.current.get(hold.ref.record_key)
        if record is None or record.locked_until is None:
            return
        self.clock.set(record.locked_until + dt.timedelta(seconds=1))
        self._move(f"passes {hold.who}'s lock expiry on {hold.ref.name} while it stalls")
        self.reset_expired_locks()

    def _processing(self) -> list[ModelRecord]:
        return [r for r in self.model.current.values() if r.status is S.PROCESSING]

    @rule(pick=st.integers(0, 5), offset=st.sampled_from((-1, 0, 1)))
    @step
    def clock_to_lock_expiry(self, pick: int, offset: int) -> None:
        """Land exactly on (or a second either side of) a lock's expiry: ``<=`` vs ``<``.

        Each node has its own lock duration, so the instant is the record's own
        ``locked_until``, never a world-wide constant.
        """
        processing = sorted(self._processing(), key=lambda r: r.updated_at)
        if self.diverged or not processing:
            return
        record = processing[pick % len(processing)]
        assert record.locked_until is not None
        self.clock.set(record.locked_until + dt.timedelta(seconds=offset))
        self._move(f"moves to {shown(record.key.item_key)}'s lock expiry {offset:+d}s")

    @rule(pick=st.integers(0, 7), offset=st.sampled_from((0, -1, 1)))
    @step
    def clock_to_retention_end(self, pick: int, offset: int) -> None:
        """Land exactly on (or 1 µs either side of) a record's ``retain_until``, then sweep.

        Retention is a day and ticks are at most fifteen minutes, so only a
        landing on the instant tells ``retain_until < now`` from ``<=``.  A
        record kept forever has no such instant: the sweep runs where the
        clock stands, and must leave it alone.
        """
        records = [*self.model.current.values(), *self.model.superseded]
        if self.diverged or not records:
            return
        record = records[pick % len(records)]
        if record.retain_until is not None:
            self.clock.set(record.retain_until + dt.timedelta(microseconds=offset))
            self._move(f"moves to {shown(record.key.item_key)}'s retention end {offset:+d}µs")
        self.expire_past_retention()

    @rule(first=W.WORKER, second=W.WORKER, item=W.ITEMS, offset=st.sampled_from((0, -1, 1)))
    @step
    def contend_at_lock_expiry(self, first: int, second: int, item: Role, offset: int) -> None:
        """A second attempt lands exactly on a lock's expiry, where it is still live.

        ``now == locked_until`` is the instant a ``<=`` written as ``<`` (or the
        reverse) gets wrong; random clock moves almost never hit it.
        """
        if self.diverged:
            return
        ref = self._ref(item)
        self._acquire(first, ref)
        record = self.model.current.get(ref.record_key)
        if self.diverged or record is None or record.locked_until is None:
            return
        self.clock.set(record.locked_until + dt.timedelta(seconds=offset))
        self._move(f"moves to {ref.name}'s lock expiry {offset:+d}s")
        self._acquire(second, ref)


def build_machine(
    factory: HandlerFactory,
    *,
    clock_mode: ClockMode = ClockMode.INJECTED,
    stats: K.RunStats | None = None,
    name: str = "HandlerConformance",
    time_zone: str | None = None,
    semantics: SemanticsProfile | str | None = None,
    tokens: str = "attempts",
) -> type[ConformanceMachine]:
    """A state-machine class verifying handlers built by ``factory``.

    ``stats`` collects check counts across test cases and says which
    properties are already known to fail (they stop a test case instead of
    failing it, so a second run can look for other violations).
    ``time_zone`` (a POSIX ``TZ``) pins every test case to one zone instead of
    the one each draws.  ``semantics`` is the profile the handler is judged
    by (a name, a profile, or None for the one the factory declares, else
    :data:`~dsm_sim.conformance.judge.semantics.DSM`).
    ``tokens`` is how the handler's fencing tokens are judged (``dsm verify
    --tokens``): ``attempts`` or ``ordered``
    (:mod:`dsm_sim.conformance.execute.tokens`).  The machine applies it, not
    its caller, so a printed reproduction that names it runs under the same
    rule as the verification that found it.
    """
    profile = resolve_semantics(semantics, factory)
    judged = tokens_factory(factory, tokens)
    namespace = {
        "factory": staticmethod(judged),
        "tokens": tokens,
        "clock_mode": clock_mode,
        "time_zone": time_zone,
        "semantics": profile,
        "stats": stats or K.RunStats(),
        "__module__": __name__,
        "__qualname__": name,
    }
    # begin is judged only where the handler answers it itself (dsm_sim.conformance.execute.begin).
    bases = (BeginRules, ConformanceMachine) if begins_natively(judged) else (ConformanceMachine,)
    # A sweep the library does not have is no rule; the rules that land on a
    # boundary and then sweep still read the world back there.
    if not profile.lock_sweep:
        namespace["reset_expired_locks"] = step(_no_lock_sweep)
    if profile.retention is Retention.TTL:
        namespace["expire_past_retention"] = step(_no_retention_sweep)
    return type(name, bases, namespace)


def _no_lock_sweep(self: ConformanceMachine) -> None:
    """In place of a lock sweep the library lacks: compare the world with the model."""
    self._after_step("sweep")


def _no_retention_sweep(self: ConformanceMachine) -> None:
    """In place of a retention sweep the library lacks (a TTL): compare the world with the model."""
    self._after_step("sweep")


_no_lock_sweep.__name__ = "reset_expired_locks"
_no_retention_sweep.__name__ = "expire_past_retention"
