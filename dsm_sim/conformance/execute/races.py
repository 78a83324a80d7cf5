"""Races between different operations, with the clock moving inside them.

Racing acquire against acquire finds check-then-insert; it never finds a
completion that reads the token, yields, and then writes over the record the
sweep just reset, a release that lands on the lock another worker just took
over, a retention sweep that expires a lock acquired between its ``SELECT``
and its ``UPDATE``, or an acquire that checks expiry with one reading of the
clock and stamps ``locked_until`` with another.  So :meth:`RaceRules.race`
starts two or three different operations on one item at once — acquire,
complete, release, upsert, skip, either sweep, exists — optionally with the
clock stepping forward or back while they run, after putting the clock on
the item's own boundary (its lock expiry, its end of retention).

The interleaving is the kit's choice, not the event loop's: each call (and
the clock move) starts after a drawn number of yields to the loop, so a
handler that awaits between its read and its write is interleaved with the
others at a point the seed replays.  (A handler whose calls block in threads
or on the network interleaves as its store does; a race found there replays
as far as the store allows.)

Judging is by linearisation: the outcome is correct iff some order of the
racing calls, each replayed on the reference model at a reading of the clock
it could have taken, gives every call the answer the handler gave and leaves
the records the handler shows.  A call reads the clock once, anywhere between
its start and its end, and its write may land after a call that read the
clock later: a handler that takes ``now`` and then awaits its store does
exactly that, and is right to.  So a call that started before the clock move
and ended after it may have read either side of it, whatever its place in the
order.  The order in which the handler's calls finished is tried first.  When
no order explains the outcome, the order explaining the most answers is kept,
and the first call it cannot explain is judged as a plain call would be, with
the race named in the message.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import itertools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute import bookkeeping as K
from dsm_sim.conformance.execute.instances import out_of_process
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.execute.scheduler import Interleaving
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.steps import (
    CONTENDERS,
    THIRD,
    WRITERS,
    ClockMove,
    Instant,
    RaceOp,
)
from dsm_sim.conformance.generate.worlds import Role
from dsm_sim.conformance.judge import judges as J
from dsm_sim.conformance.judge.semantics import Retention, SemanticsProfile
from dsm_sim.conformance.reading import at, offset
from dsm_sim.model import (
    ItemRef,
    ModelRecord,
    Outcome,
    ReferenceModel,
    effective_status,
    outcome_of,
    record_copy,
)
from reference_engine.begin import Acquired, Completed, begin, native_begin
from reference_engine.context import StateHandlerContext
from reference_engine.errors import LockError
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = ["ClockMove", "Instant", "RaceOp", "RaceRules"]

S = IdempotencyStatus


ModelCall = Callable[[ReferenceModel, dt.datetime], Any]


@dataclass(slots=True)
class _Call:
    """One racing call: who makes it, and how it runs on the handler and on a model."""

    op: RaceOp
    actor: str
    worker: int
    ctx: StateHandlerContext | None
    hold: K.Hold | None
    text: str
    handler_call: Callable[[], Awaitable[Any]]
    model_call: ModelCall


@dataclass(slots=True)
class _Replay:
    """One order of the racing calls, replayed on a copy of the model."""

    order: tuple[int, ...]  # call indices; -1 is the clock move
    model: ReferenceModel
    outcomes: dict[int, Outcome]
    before: dict[int, tuple[ModelRecord | None, dt.datetime]]
    agreeing: int
    consistent: bool = False


_CLOCK = -1
#: Calls that write nothing: no write of theirs can have failed to land.
_READS = frozenset({RaceOp.EXISTS, RaceOp.GET})


def _readings(
    log: Sequence[tuple[str, int]], call: int, t0: dt.datetime, t1: dt.datetime
) -> tuple[dt.datetime, ...]:
    """The clock readings ``call`` could have taken: before the move, after it, or either."""
    at_ = {entry: i for i, entry in enumerate(log)}
    move = at_.get(("start", _CLOCK))
    start, end = at_.get(("start", call)), at_.get(("end", call))
    if move is None or start is None or end is None:
        return (t0, t1)
    if end < move:
        return (t0,)
    if start > move:
        return (t1,)
    return (t0, t1)


async def _begun(handler: StateHandler, ctx: StateHandlerContext) -> tuple[Any, ...]:
    """A native ``begin``'s answer as the model gives it: what it decided, not what it carried."""
    answer = await begin(handler, ctx)
    if isinstance(answer, Acquired):
        return ("acquired", answer.token)
    return ("completed",) if isinstance(answer, Completed) else ("locked",)


def _model_begin(model: ReferenceModel, ctx: StateHandlerContext, now: dt.datetime) -> Any:
    if model.exists(ctx, now):
        return ("completed",)
    token = model.try_acquire_lock(ctx, now)
    return ("locked",) if token is None else ("acquired", token)


def _seen_record(record: StateRecord | None, whole: bool = True) -> tuple[Any, ...] | None:
    """What a racing ``get`` saw, as the model can say it: every field a write sets together.

    A ``get`` that reads the row and its payload apart returns a record no
    write ever made (one write's status with another's data); compared whole,
    it matches no order of the calls.
    """
    if record is None:
        return None
    if not whole:
        return (record.status, record.attempt, None, None, None, None)
    data = None if record.data is None else encode_data(record.data)
    return (
        record.status,
        record.attempt,
        record.locked_until,
        data,
        record.error_detail,
        record.retain_until,
    )


async def _read(
    handler: StateHandler, ctx: StateHandlerContext, whole: bool
) -> tuple[Any, ...] | None:
    return _seen_record(await handler.get(ctx), whole)


def _model_read(
    model: ReferenceModel, ctx: StateHandlerContext, whole: bool
) -> tuple[Any, ...] | None:
    record = model.current.get(ctx.record_key)
    return None if record is None else _seen_record(record.to_state_record(), whole)


def _copied(model: ReferenceModel, calls: Sequence[_Call]) -> ReferenceModel:
    """A copy of ``model`` the calls can be replayed on without touching it.

    Calls on one item change only that item's record (and may append a
    history row): the rest is shared.  A sweep changes any record, current or
    superseded: each is copied.  A record's fields are immutable values (its
    data is kept as JSON text), so a copy of each record is a whole copy.
    """
    copied = copy.copy(model)
    if any(call.op.sweeps for call in calls):
        copied.current = {key: record_copy(record) for key, record in model.current.items()}
        copied.superseded = [record_copy(record) for record in model.superseded]
        return copied
    keys = {call.ctx.record_key for call in calls if call.ctx is not None}
    copied.current = {
        key: record_copy(record) if key in keys else record for key, record in model.current.items()
    }
    copied.superseded = list(model.superseded)
    return copied


def _seen(outcome: Outcome) -> str:
    if outcome.error is not None:
        return type(outcome.error).__name__
    if outcome.value is None:
        return "no record"
    status, attempt, _, data, detail, _ = outcome.value
    shown = f"{status.label} with token {attempt}"
    if data is not None:
        shown += f", data {J.short_data(data)}"
    if detail is not None:
        shown += f", error detail {J.short_data(detail)}"
    return shown


def _judge_begun(
    ref: ItemRef,
    call: _Call,
    got: Outcome,
    want: Outcome,
    record: ModelRecord | None,
    now: dt.datetime,
) -> P.Finding:
    """A racing ``begin`` whose answer no order explains: which property its answer breaks."""
    source = effective_status(record, now).label
    said = got.describe() if got.error is not None else " ".join(map(str, got.value))
    expected = want.describe() if want.error is not None else " ".join(map(str, want.value))
    where = f"{call.actor}'s begin({ref.label}) answered {said} at {at(now)}"
    if got.error is not None or want.error is not None:
        name = "errors_agree_with_model"
    elif got.value[0] == "acquired" and want.value[0] == "completed":
        name = "allowed_transitions_only"
    elif got.value[0] == "acquired" and want.value[0] == "locked":
        name = "at_most_one_live_lock"
    elif "completed" in (got.value[0], want.value[0]):
        name = "exists_agrees_with_model"
    else:
        name = "acquire_agrees_with_model"
    return P.Finding(name, f"{where}; the item is {source} and begin must answer {expected}")


# Calls that never leave a record Failed: with only these and lock sweeps in a
# race, a record that turns Failed was failed by a sweep.
_NEVER_FAIL = frozenset(
    {RaceOp.SWEEP, RaceOp.EXISTS, RaceOp.GET, RaceOp.RETENTION, RaceOp.ACQUIRE, RaceOp.BEGIN}
)


def _swept_live(
    calls: Sequence[_Call],
    view: dict[ItemRef, StateRecord | None],
    prior: ReferenceModel,
    t0: dt.datetime,
    semantics: SemanticsProfile,
) -> P.Finding | None:
    """A lock sweep that stamped its reset at or before the lock's expiry: it took a live lock.

    A sweep's ``updated_at`` is its own reading of now, so whichever order of
    the race is taken, a reset stamped while ``locked_until >= now`` broke
    ``Processing AND locked_until < now``, even when the clock moved on
    before the answer came back and the reset count looks right. Only where
    the stamp is the exact reading (strict semantics) is it evidence.
    """
    if not semantics.strict or not any(c.op is RaceOp.SWEEP for c in calls):
        return None
    for ref, got in view.items():
        if any(
            c.op not in _NEVER_FAIL and c.ctx is not None and c.ctx.record_key == ref.record_key
            for c in calls
        ):
            continue
        before = prior.current.get(ref.record_key)
        if (
            got is not None
            and got.status is S.FAILED
            and before is not None
            and before.status is S.PROCESSING
            and before.locked_until is not None
            and got.updated_at is not None
            and t0 <= got.updated_at
            and semantics.lock_live(before.locked_until, got.updated_at)
        ):
            return P.Finding(
                "sweep_only_expired",
                f"the lock sweep reset {ref.label} to Failed at {at(got.updated_at)} (its "
                f"updated_at), while its lock ran until {at(before.locked_until)}: a sweep takes "
                "only Processing records with locked_until < now",
            )
    return None


def _in_sequence(log: Sequence[tuple[str, int]]) -> tuple[int, ...] | None:
    """The calls' order when each ran from start to end before the next started, else None."""
    order: list[int] = []
    running: int | None = None
    for kind, event in log:
        if kind == "start":
            if running is not None:
                return None
            running = event
        elif event != running:
            return None
        else:
            order.append(event)
            running = None
    return tuple(event for event in order if event != _CLOCK)


def _told(happened: Interleaving, calls: Sequence[_Call]) -> str:
    """How the kit interleaved the calls, when it chose to: who it preempted, where."""
    switches = [c for c in happened.choices if c.preempts]
    if not switches:
        return ""
    names = [
        calls[call].actor for c in switches if (call := happened.call_of(c.chosen)) < len(calls)
    ]
    if not names:
        return ""
    return f" (interleaved: {', then '.join(names)} ran while the other call waited at an await)"


class RaceRules(OperationRules):
    """Different operations on one item at once, interleaved where the seed says."""

    @rule(
        item=W.ITEMS,
        ops=st.tuples(
            st.sampled_from(WRITERS), st.sampled_from(CONTENDERS), st.sampled_from(THIRD)
        ).map(lambda drawn: [op for op in drawn if op is not None]),
        workers=st.lists(W.WORKER, min_size=3, max_size=3),
        schedule=W.SCHEDULES,
        instant=st.sampled_from(tuple(Instant)),
        move=st.sampled_from(tuple(ClockMove)),
        data=W.PLAIN_DATA,
    )
    @step
    def race(
        self,
        item: Role,
        ops: list[RaceOp],
        workers: list[int],
        schedule: tuple[int, ...],
        instant: Instant,
        move: ClockMove,
        data: dict[str, Any] | None,
    ) -> None:
        if self.diverged:
            return
        ref = self._ref(item)
        needs_holder = {RaceOp.COMPLETE, RaceOp.RELEASE, RaceOp.FAIL} & set(ops)
        if needs_holder and self._newest_hold(ref) is None and self.holds:
            # A completion or release needs a holder: race on the item last locked.
            ref = self.holds[-1].ref
        self._place_clock(ref, instant)
        calls = [c for i, op in enumerate(ops) if (c := self._call(op, ref, workers[i], data))]
        if not self.semantics.completion_retries:
            # One completion per hold: a flow that never retries one never races two.
            held = [c.hold for c in calls]
            calls = [c for i, c in enumerate(calls) if c.hold is None or c.hold not in held[:i]]
        if len(calls) < 2 and move is ClockMove.NONE:
            return
        self._race(ref, calls, schedule, move)

    def _race(
        self,
        ref: ItemRef,
        calls: Sequence[_Call],
        schedule: tuple[int, ...],
        move: ClockMove = ClockMove.NONE,
        *,
        read_all: bool = True,
    ) -> Interleaving:
        """Run ``calls`` (and the clock ``move``) in the interleaving ``schedule`` picks; judge it.

        ``read_all`` reads every item of the world back afterwards; without it
        only ``ref`` is read, unless a sweep raced (a sweep touches every item).
        """
        t0 = self.clock.now()
        t1 = t0 + move.delta(ref)
        moves = move is not ClockMove.NONE
        got, happened = self._run(calls, schedule, move.delta(ref) if moves else None)
        log = happened.log
        if read_all or any(c.op.sweeps for c in calls):
            observed = self._observe()
        elif (seen := self._in_world(ref)) is not None:
            observed = {seen: self._observe_one(seen)}
        else:
            observed = self._observe()
        view = {r: o.value for r, o in observed.items() if o.error is None}
        if len(view) < len(observed):
            view = {}  # a read that failed explains nothing: no order is consistent
        replay = self._linearise(ref, calls, got, log, t0, t1, moves, view)
        if any(c.op is RaceOp.RETENTION for c in calls):
            if not replay.consistent:
                replay = self._with_doubt(ref, calls, got, log, t0, t1, moves, view, replay)
            self.doubt.prune(replay.model, min(t0, t1))
        sequence = _in_sequence(log)
        if not replay.consistent and sequence is not None and not moves:
            # The calls ran one after the other: judged as plain calls in that order,
            # never as a race no order explains.
            replay = self._replay(sequence, calls, got, t0, t1)
        prior = self.model
        self._adopt(ref, calls, replay)
        parts = [f"{c.actor} {c.text} -> {self._shown(c, got[i])}" for i, c in enumerate(calls)]
        if moves:
            parts.append(f"clock {offset(move.delta(ref))}")
        if sequence is not None and not moves:
            told = ", then ".join(parts[i] for i in sequence)
            self._step("in sequence", told, f"now {at(self.clock.now())}")
        else:
            how = _told(happened, calls)
            self._step("race", " ‖ ".join(parts) + how, f"now {at(self.clock.now())}")
        self._count(calls)
        if not replay.consistent:
            self._report(
                _swept_live(calls, view, prior, t0, self.semantics)
                or self._explain(
                    ref, calls, got, replay, in_sequence=sequence is not None, prior=prior
                )
            )
        # An upsert may compress acquire and complete into one step (Failed -> Processed).
        upserted = any(c.op is RaceOp.UPSERT for c in calls)
        self._after_step("upsert" if upserted else "race", observed, steps=len(calls) + upserted)
        return happened

    # --- setting up ---------------------------------------------------------------------------

    def _place_clock(self, ref: ItemRef, instant: Instant) -> None:
        record = self.model.current.get(ref.record_key)
        if instant is Instant.NOW or record is None:
            return
        if instant in (Instant.LOCK_EXPIRY, Instant.PAST_LOCK):
            if record.status is not S.PROCESSING or record.locked_until is None:
                return
            extra = dt.timedelta(microseconds=0 if instant is Instant.LOCK_EXPIRY else 1)
            self.clock.set(record.locked_until + extra)
            what = "lock expiry" if instant is Instant.LOCK_EXPIRY else "lock expiry +1µs"
        else:
            if record.retain_until is None:
                return
            self.clock.set(record.retain_until + dt.timedelta(microseconds=1))
            what = "retention end +1µs"
        self._move(f"moves to {ref.name}'s {what}")

    def _newest_hold(self, ref: ItemRef) -> K.Hold | None:
        for hold in reversed(self.holds):
            if hold.ref == ref:
                return hold
        return None

    def _call(
        self,
        op: RaceOp,
        ref: ItemRef,
        worker: int,
        data: dict[str, Any] | None,
        *,
        via: int | None = None,
    ) -> _Call | None:
        """The racing call ``op`` on ``ref`` by ``worker`` (the holder, for a token's writes).

        ``via`` names the worker whose instance makes the call (default: the
        caller's own); None when the call does not apply (no holder for a
        token's write, an operation the library lacks, ``begin`` the handler
        does not answer itself).
        """
        semantics = self.semantics
        if (
            (op is RaceOp.UPSERT and not semantics.supports("upsert"))
            or (op is RaceOp.SKIP and not semantics.can_set(S.SKIPPED))
            or (op is RaceOp.FAIL and not semantics.can_set(S.FAILED))
            or (op is RaceOp.EXPIRE and not semantics.can_set(S.EXPIRED))
            or (op is RaceOp.RELEASE and not semantics.supports("release_lock_as_failed"))
            or (op is RaceOp.SWEEP and not semantics.lock_sweep)
            or (op is RaceOp.RETENTION and semantics.retention is Retention.TTL)
            or (op is RaceOp.BEGIN and not hasattr(self, "begin"))
        ):
            return None  # the library has no such call
        if op.sweeps:
            handler = self.instances.of(0 if via is None else via)
            if op is RaceOp.SWEEP:
                return _Call(
                    op, "catch-up worker", 0, None, None, "reset_expired_locks()",
                    handler.reset_expired_locks,
                    lambda model, now: model.reset_expired_locks(now),
                )  # fmt: skip
            return _Call(
                op, "retention worker", 0, None, None, "expire_past_retention()",
                handler.expire_past_retention,
                lambda model, now: model.expire_past_retention(now),
            )  # fmt: skip
        hold = self._newest_hold(ref) if op.needs_token else None
        if op.needs_token:
            if hold is None:
                return None
            worker = hold.worker
        elif op in (RaceOp.ACQUIRE, RaceOp.BEGIN):
            hold = self._hold(worker, ref)
        ctx = self._ctx(ref, worker, hold)
        handler = self.instances.of(worker if via is None else via)
        actor = f"worker {worker}" if hold is None else hold.who
        token = "" if hold is None else f" with token {hold.token}"
        # Another item of the world with the same name (another tenant's) makes the
        # bare name ambiguous in the story: the full label then.
        name = ref.name if sum(r.name == ref.name for r in self.world) == 1 else ref.label
        if op is RaceOp.ACQUIRE:
            return _Call(
                op, actor, worker, ctx, hold, f"try_acquire_lock({name})",
                lambda: handler.try_acquire_lock(ctx),
                lambda model, now: model.try_acquire_lock(ctx, now),
            )  # fmt: skip
        if op is RaceOp.BEGIN:
            if native_begin(handler) is None:
                # This instance composes begin from two calls: the machine's rule
                # judges a native begin, which this one is not.
                return None
            return _Call(
                op, actor, worker, ctx, hold, f"begin({name})",
                lambda: _begun(handler, ctx),
                lambda model, now: _model_begin(model, ctx, now),
            )  # fmt: skip
        if op is RaceOp.COMPLETE:
            return _Call(
                op, actor, worker, ctx, hold, f"set(Processed) on {name}{token}",
                lambda: handler.set(ctx, S.PROCESSED, data),
                lambda model, now: model.set(ctx, S.PROCESSED, data, now),
            )  # fmt: skip
        if op is RaceOp.FAIL:
            return _Call(
                op, actor, worker, ctx, hold, f"set(Failed) on {name}{token}",
                lambda: handler.set(ctx, S.FAILED, None),
                lambda model, now: model.set(ctx, S.FAILED, None, now),
            )  # fmt: skip
        if op is RaceOp.RELEASE:
            return _Call(
                op, actor, worker, ctx, hold, f"release_lock_as_failed on {name}{token}",
                lambda: handler.release_lock_as_failed(ctx, "card declined"),
                lambda model, now: model.release_lock_as_failed(ctx, "card declined", now),
            )  # fmt: skip
        if op is RaceOp.UPSERT:
            return _Call(
                op, actor, worker, ctx, None, f"upsert(data={J.short_data(data)}) on {name}",
                lambda: handler.upsert(ctx, data),
                lambda model, now: model.upsert(ctx, data, now),
            )  # fmt: skip
        if op is RaceOp.SKIP:
            return _Call(
                op, actor, worker, ctx, None, f"set(Skipped) on {name}",
                lambda: handler.set(ctx, S.SKIPPED, None),
                lambda model, now: model.set(ctx, S.SKIPPED, None, now),
            )  # fmt: skip
        if op is RaceOp.EXPIRE:
            return _Call(
                op, actor, worker, ctx, None, f"set(Expired) on {name}",
                lambda: handler.set(ctx, S.EXPIRED, None),
                lambda model, now: model.set(ctx, S.EXPIRED, None, now),
            )  # fmt: skip
        if op is RaceOp.GET:
            whole = semantics.strict  # a library's own resolutions: its status and token only
            return _Call(
                op, actor, worker, ctx, None, f"get({name})",
                lambda: _read(handler, ctx, whole),
                lambda model, now: _model_read(model, ctx, whole),
            )  # fmt: skip
        return _Call(
            op, actor, worker, ctx, None, f"exists({name})",
            lambda: handler.exists(ctx),
            lambda model, now: model.exists(ctx, now),
        )  # fmt: skip

    # --- running ------------------------------------------------------------------------------

    def _run(
        self, calls: Sequence[_Call], schedule: tuple[int, ...], move: dt.timedelta | None
    ) -> tuple[list[Outcome], Interleaving]:
        """Run every call (and the clock move, as one more task) in the scheduled interleaving.

        The log of starts and ends tells the judge which side of the clock move
        each call could have read.  A handler in another process interleaves
        as its store has it: its calls start together.
        """

        async def clock_move() -> None:
            assert move is not None
            self.clock.advance(move)

        runners: list[Callable[[], Awaitable[Any]]] = [c.handler_call for c in calls]
        if move is not None:
            runners.append(clock_move)
        outcomes, happened = self.driver.interleave(
            runners, schedule, controlled=not out_of_process(self.handler)
        )
        if move is not None:
            # The clock move is the last task; the judges know it as _CLOCK.
            index = len(calls)
            happened = dataclasses.replace(
                happened,
                log=tuple((kind, _CLOCK if e == index else e) for kind, e in happened.log),
            )
        return outcomes[: len(calls)], happened

    # --- judging ------------------------------------------------------------------------------

    def _linearise(
        self,
        ref: ItemRef,
        calls: Sequence[_Call],
        got: Sequence[Outcome],
        log: Sequence[tuple[str, int]],
        t0: dt.datetime,
        t1: dt.datetime,
        moves: bool,
        view: dict[ItemRef, StateRecord | None],
    ) -> _Replay:
        """The first explanation in order of likelihood, or the order explaining the most answers.

        When the chosen explanation writes history rows, the other explanations
        are read to the end as well: they may differ in what no read shows (a
        superseded row's ``retain_until``), and :attr:`doubt` keeps those
        values for the retention sweeps that will tell them apart.
        """
        best: _Replay | None = None
        chosen: _Replay | None = None
        since = len(self.model.superseded)
        others: list[ReferenceModel] = []
        for order, nows in self._candidates(len(calls), log, t0, t1, moves):
            replay = self._replay(order, calls, got, t0, t1, nows)
            consistent = replay.agreeing == len(calls) and self._shows(view, replay.model)
            if chosen is not None:
                if consistent:
                    others.append(replay.model)
                continue
            if consistent:
                replay.consistent = True
                chosen = replay
                if len(replay.model.superseded) == since:
                    return replay  # no history written: nothing hidden to tell apart
            elif best is None or replay.agreeing > best.agreeing:
                best = replay
        if chosen is not None:
            self.doubt.note(chosen.model, others, since)
            return chosen
        assert best is not None
        return best

    def _with_doubt(
        self,
        ref: ItemRef,
        calls: Sequence[_Call],
        got: Sequence[Outcome],
        log: Sequence[tuple[str, int]],
        t0: dt.datetime,
        t1: dt.datetime,
        moves: bool,
        view: dict[ItemRef, StateRecord | None],
        replay: _Replay,
    ) -> _Replay:
        """A race with a retention sweep no order explains: try the history an earlier race allowed."""
        saved = self.model
        for patch in self.doubt.patches(saved):
            self.model = copy.deepcopy(saved)
            self.doubt.apply(self.model, patch)
            patched = self._linearise(ref, calls, got, log, t0, t1, moves, view)
            if patched.consistent:
                self.model = saved
                return patched
        self.model = saved
        return replay

    @staticmethod
    def _candidates(
        count: int, log: Sequence[tuple[str, int]], t0: dt.datetime, t1: dt.datetime, moves: bool
    ) -> Iterator[tuple[tuple[int, ...], Sequence[dt.datetime] | None]]:
        """Orders of the calls, each with the clock readings, likeliest first.

        First each call reads the clock when it started and writes land as
        they finished; then the calls as atomic steps around the clock move
        (the order the handler finished them in first); then every call that
        spanned the move reading either side of it, wherever its write landed.
        A candidate that replays exactly as an earlier one (the same calls in
        the same order at the same readings) is not yielded again.
        """
        seen: set[tuple[tuple[int, ...], tuple[dt.datetime, ...]]] = set()
        for order, nows in RaceRules._all_candidates(count, log, t0, t1, moves):
            calls = tuple(e for e in order if e != _CLOCK)
            if nows is None:
                moved = order.index(_CLOCK) if _CLOCK in order else len(order)
                read = tuple(t1 if order.index(c) > moved else t0 for c in calls)
                key = (calls, tuple(r for _, r in sorted(zip(calls, read, strict=True))))
            else:
                key = (calls, tuple(nows))
            if key not in seen:
                seen.add(key)
                yield order, nows

    @staticmethod
    def _all_candidates(
        count: int, log: Sequence[tuple[str, int]], t0: dt.datetime, t1: dt.datetime, moves: bool
    ) -> Iterator[tuple[tuple[int, ...], Sequence[dt.datetime] | None]]:
        events = [*range(count), *([_CLOCK] if moves else [])]
        finished = tuple(e for kind, e in log if kind == "end" and e in events)
        first = finished if len(finished) == len(events) else tuple(events)
        in_finish = tuple(e for e in first if e != _CLOCK)
        call_orders = [
            in_finish,
            *(o for o in itertools.permutations(range(count)) if o != in_finish),
        ]
        if moves:
            starts = [_readings(log, i, t0, t1)[0] for i in range(count)]
            for order in call_orders:
                yield order, starts
        for order in [first, *(o for o in itertools.permutations(events) if o != first)]:
            if not moves or all(
                t0 in _readings(log, call, t0, t1)
                if order.index(call) < order.index(_CLOCK)
                else t1 in _readings(log, call, t0, t1)
                for call in range(count)
            ):
                # A call cannot read the clock on a side of the move the log rules out.
                yield order, None
        if moves:
            readings = [_readings(log, i, t0, t1) for i in range(count)]
            for order in call_orders:
                for nows in itertools.product(*readings):
                    yield order, nows

    def _replay(
        self,
        order: Sequence[int],
        calls: Sequence[_Call],
        got: Sequence[Outcome],
        t0: dt.datetime,
        t1: dt.datetime,
        nows: Sequence[dt.datetime] | None = None,
        *,
        base: ReferenceModel | None = None,
        unlanded: int | None = None,
    ) -> _Replay:
        """Replay ``order``; a call reads ``nows[call]`` if given, else the clock where it stands.

        ``base`` is the model the calls start from (the machine's, by default).
        The call ``unlanded`` answers what the handler answered but changes
        nothing: the replay of a write that never landed.
        """
        model = _copied(self.model if base is None else base, calls)
        now = t0
        outcomes: dict[int, Outcome] = {}
        before: dict[int, tuple[ModelRecord | None, dt.datetime]] = {}
        for event in order:
            if event == _CLOCK:
                now = t1
                continue
            if nows is not None:
                now = nows[event]
            call = calls[event]
            key = None if call.ctx is None else call.ctx.record_key
            record = None if key is None else K.copy_record(model.current.get(key))
            before[event] = (record, now)
            if event == unlanded:
                outcomes[event] = got[event]
                continue
            outcomes[event] = outcome_of(functools.partial(call.model_call, model, now))
        agreeing = sum(1 for i, o in outcomes.items() if got[i].agrees_with(o))
        return _Replay(tuple(order), model, outcomes, before, agreeing)

    def _shows(self, view: dict[ItemRef, StateRecord | None], model: ReferenceModel) -> bool:
        """Does the handler's world read back as ``model`` says it must?"""
        now = self.clock.now()
        model_view = self._model_view(model)
        if not view:
            return False
        history = {record.key for record in model.superseded}
        for ref in view:
            if J.judge_record(
                ref,
                view.get(ref),
                model_view[ref],
                now,
                has_history=ref.record_key in history,
                semantics=self.semantics,
            ):
                return False
        return True

    def _adopt(self, ref: ItemRef, calls: Sequence[_Call], replay: _Replay) -> None:
        """Make the chosen order the model's history, and book locks taken and given up."""
        self.model = replay.model
        for index in replay.order:
            if index == _CLOCK:
                continue
            call, want = calls[index], replay.outcomes[index]
            if call.op is RaceOp.ACQUIRE:
                self._acquired(ref, call.worker, want)
            elif call.hold is not None and (
                want.error is None or isinstance(want.error, LockError)
            ):
                if call.hold in self.holds:
                    self.holds.remove(call.hold)
                self.spent.pop(call.hold, None)
                if want.error is None and self.holder.get(ref) == call.worker:
                    del self.holder[ref]

    def _count(self, calls: Sequence[_Call]) -> None:
        self._checked("errors_agree_with_model")
        names = {
            RaceOp.ACQUIRE: ("at_most_one_live_lock", "acquire_agrees_with_model"),
            RaceOp.COMPLETE: ("stale_write_rejected",),
            RaceOp.RELEASE: ("stale_write_rejected",),
            RaceOp.SWEEP: ("sweep_only_expired",),
            RaceOp.RETENTION: ("retention_sweep_agrees_with_model",),
            RaceOp.EXISTS: ("exists_agrees_with_model",),
            RaceOp.FAIL: ("stale_write_rejected",),
            RaceOp.BEGIN: ("exists_agrees_with_model", "acquire_agrees_with_model"),
            RaceOp.GET: ("record_agrees_with_model",),
        }
        for call in calls:
            self._checked(*names.get(call.op, ()))

    @staticmethod
    def _shown(call: _Call, outcome: Outcome) -> str:
        if call.op is RaceOp.ACQUIRE:
            return outcome.describe_grant()
        if outcome.error is None and outcome.value is None:
            return "ok"
        return outcome.describe()

    def _explain(
        self,
        ref: ItemRef,
        calls: Sequence[_Call],
        got: Sequence[Outcome],
        replay: _Replay,
        *,
        in_sequence: bool = False,
        prior: ReferenceModel | None = None,
    ) -> P.Finding | None:
        """The first call of ``replay`` that deviated, judged by that call's own check.

        That is the first call whose answer disagrees, unless the calls ran
        one after the other and an earlier one answered as it should but its
        write never landed, which explains that answer: a completion that
        changed nothing is the completion's finding, not the sweep's that then
        found the lock still there.  In a race, a write another call wrote
        over looks as if it never landed: there the answer's own check is
        the more telling (two grants are ``at_most_one_live_lock``).
        """
        names = [("the clock move" if e == _CLOCK else calls[e].text) for e in replay.order]
        context = (
            ""
            if in_sequence
            else f"in a race of {', '.join(c.text for c in calls)}, no order of the calls "
            f"explains what the handler did; taking them as {' then '.join(names)}: "
        )
        for position, index in enumerate(replay.order):
            if index == _CLOCK or got[index].agrees_with(replay.outcomes[index]):
                continue
            finding = (
                None
                if prior is None or not in_sequence
                else self._unlanded(ref, calls, got, replay, position, prior)
            ) or self._judge_call(ref, calls[index], got[index], replay, index)
            if finding is not None:
                return P.Finding(finding.property, context + finding.message)
        return None  # every answer agrees: the records read back are judged next

    def _unlanded(
        self,
        ref: ItemRef,
        calls: Sequence[_Call],
        got: Sequence[Outcome],
        replay: _Replay,
        position: int,
        prior: ReferenceModel,
    ) -> P.Finding | None:
        """An earlier write that answered as it should but never landed, if that explains
        the answer of the call at ``position`` in ``replay``; judged as the record read
        back after that write would have been judged."""
        deviating = replay.order[position]
        t0 = t1 = self.clock.now()
        nows = [replay.before[i][1] if i in replay.before else t0 for i in range(len(calls))]
        for earlier, index in enumerate(replay.order[:position]):
            if (
                index == _CLOCK
                or calls[index].op in _READS
                or got[index].error is not None
                or not got[index].agrees_with(replay.outcomes[index])
            ):
                continue
            without = self._replay(
                replay.order, calls, got, t0, t1, nows, base=prior, unlanded=index
            )
            if not got[deviating].agrees_with(without.outcomes[deviating]):
                continue
            prefix = replay.order[: earlier + 1]
            landed = self._replay(prefix, calls, got, t0, t1, nows, base=prior).model
            lost = self._replay(prefix, calls, got, t0, t1, nows, base=prior, unlanded=index)
            want = landed.current.get(ref.record_key)
            have = lost.model.current.get(ref.record_key)
            finding = J.judge_record(
                ref,
                None if have is None else have.to_state_record(),
                want,
                nows[index],
                has_history=any(r.key == ref.record_key for r in landed.superseded),
                semantics=self.semantics,
                tokens=self.tokens,
            )
            if finding is None:
                continue
            call = calls[index]
            return P.Finding(
                finding.property,
                f"{call.actor}'s {call.text} answered {self._shown(call, got[index])} but "
                f"never landed, as {calls[deviating].actor}'s {calls[deviating].text} -> "
                f"{self._shown(calls[deviating], got[deviating])} after it shows: "
                + finding.message,
            )
        return None

    def _judge_call(
        self, ref: ItemRef, call: _Call, got: Outcome, replay: _Replay, index: int
    ) -> P.Finding | None:
        want = replay.outcomes[index]
        record, now = replay.before[index]
        if call.op is RaceOp.ACQUIRE:
            holder = self.holder.get(ref)
            return J.judge_acquire(
                ref, call.worker, got, want, record, holder, now, tokens=self.tokens
            )
        if call.op is RaceOp.EXISTS:
            return J.judge_exists(ref, call.worker, got, want, record, now)
        if call.op is RaceOp.GET:
            return P.Finding(
                "errors_agree_with_model" if got.error is not None else "record_agrees_with_model",
                f"{call.actor}'s get({ref.label}) at {at(now)} saw {_seen(got)}; the record "
                f"was {_seen(want)}",
            )
        if call.op is RaceOp.BEGIN:
            return _judge_begun(ref, call, got, want, record, now)
        if call.op is RaceOp.SWEEP:
            if got.error is None and isinstance(got.value, int) and isinstance(want.value, int):
                name = "sweep_only_expired" if got.value > want.value else "sweep_resets_expired"
                return P.Finding(
                    name,
                    f"reset_expired_locks() at {at(now)} reported {got.value} resets; "
                    f"expected {want.value}",
                )
            return J.judge_sweep({}, got, want, now)
        if call.op is RaceOp.RETENTION:
            return J.judge_retention_sweep(got, want, 0, now)
        token = None if call.hold is None else call.hold.token
        spent_by = None if call.hold is None else self.spent.get(call.hold)
        operation = call.text.split(" on ")[0]
        return J.judge_write(
            operation,
            ref,
            call.worker,
            token,
            got,
            want,
            record,
            now,
            spent_by=spent_by,
            fenced=self.semantics.fenced,
        )
