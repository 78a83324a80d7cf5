"""The ``begin`` rule: a handler's one-round-trip ``begin`` judged like every other operation.

``begin`` must answer exactly what ``exists`` then ``try_acquire_lock`` answer
at the same instant (:mod:`reference_engine.begin`).  The rule asks the
reference model those two questions, books a granted lock exactly as an
acquire does (the holder, the worker's hold, so the fencing rules later write
with its token), and judges the answer under the properties it stands for:
``exists_agrees_with_model`` (Completed or not), ``acquire_agrees_with_model``
and ``at_most_one_live_lock`` (the token), ``allowed_transitions_only`` (a lock
taken over finished work), and ``record_agrees_with_model`` for the record or
lock expiry the answer carries.

The rule is only part of the machine built for a factory whose handlers
implement ``begin`` themselves (:func:`begins_natively`, asked of a handler
the factory builds, not of its annotation): a handler without
one gets the composed ``begin``, which is its own ``exists`` and
``try_acquire_lock``, already verified; and the rule set of every other
machine, hence every seeded search, stays what it was.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from hypothesis.stateful import rule

from dsm_sim.conformance.execute import bookkeeping as K
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.worlds import Role
from dsm_sim.conformance.judge import judges as J
from dsm_sim.conformance.properties import Finding
from dsm_sim.conformance.reading import at
from dsm_sim.model import WORLD_START, ItemRef, ModelRecord, Outcome, outcome_of
from reference_engine.begin import Acquired, Completed, Locked, begin, native_begin
from reference_engine.clock import ManualClock
from reference_engine.handler import HandlerFactory
from reference_engine.model import effective_status
from reference_engine.status import COMPLETED, IdempotencyStatus

__all__ = ["BeginRules", "begins_natively", "describe_begin", "judge_begin"]

S = IdempotencyStatus


def begins_natively(factory: HandlerFactory) -> bool:
    """Whether handlers built by ``factory`` implement ``begin`` themselves.

    Read from a handler the factory builds, which is closed unopened, never
    from what the factory says it returns: the engine uses a native ``begin``
    whenever the handler it holds has one
    (:func:`reference_engine.begin.native_begin`), so that handler decides.
    A factory annotated with a class that has ``begin`` may return a wrapper
    without one: its composed ``begin`` is two calls, and judging it as one
    atomic call was a false alarm (another call lands between the two).  And
    one annotated without ``begin`` may return a handler that has one, which
    must not go unverified.  A factory that raises is judged by the runs,
    which build handlers the same way.
    """
    known = _ASKED.get(id(factory))
    if known is not None and known[0] is factory:
        return known[1]
    try:
        handler = factory(ManualClock(WORLD_START))
    except Exception:
        return False
    answer = native_begin(handler) is not None
    close = getattr(handler, "close", None)
    if callable(close):
        try:
            closing = close()
        except Exception:  # an unopened handler may refuse to close; nothing is held
            closing = None
        if asyncio.iscoroutine(closing):
            try:
                asyncio.run(closing)
            except Exception:  # refused, or called inside a running loop
                closing.close()
    _ASKED[id(factory)] = (factory, answer)
    return answer


#: Factories already asked, by identity (the factory is kept, so the id stays its own).
_ASKED: dict[int, tuple[HandlerFactory, bool]] = {}


def describe_begin(outcome: Outcome) -> str:
    """``Completed (Processed)``, ``Locked until ...``, ``Acquired token 3`` or the error's class."""
    if outcome.error is not None:
        return type(outcome.error).__name__
    value = outcome.value
    if isinstance(value, Completed):
        return "Completed" + ("" if value.record is None else f" ({value.record.status.label})")
    if isinstance(value, Locked):
        return "Locked" + ("" if value.locked_until is None else f" until {at(value.locked_until)}")
    if isinstance(value, Acquired):
        return f"Acquired token {value.token}"
    return repr(value)


def _expected(done: Outcome, want: Outcome) -> str:
    if done.error is not None or want.error is not None:
        return type(done.error or want.error).__name__
    if done.value:
        return "Completed"
    return "Locked" if want.value is None else f"Acquired token {want.value}"


def judge_begin(
    ref: ItemRef,
    worker: int,
    got: Outcome,
    done: Outcome,
    want: Outcome,
    record: ModelRecord | None,
    after: ModelRecord | None,
    holder: int | None,
    now: dt.datetime,
    *,
    has_history: bool,
) -> Finding | None:
    """``got`` against the model's ``exists`` (``done``) then ``try_acquire_lock`` (``want``).

    ``record`` is the model's record before the call, ``after`` after it.
    """
    source = effective_status(record, now)
    call = f"worker {worker}'s begin({ref.label})"
    expected = _expected(done, want)
    expected_error = done.error or want.error
    if expected_error is not None or got.error is not None:
        if expected_error is not None and got.agrees_with(Outcome(error=expected_error)):
            return None
        return Finding(
            "errors_agree_with_model",
            f"{call} answered {describe_begin(got)} at {at(now)}; the item is {source.label} "
            f"and begin must answer {expected}",
        )
    value = got.value
    if not isinstance(value, Completed | Locked | Acquired):
        return Finding(
            "acquire_agrees_with_model",
            f"{call} returned {value!r}; begin returns Completed, Locked or Acquired",
        )
    shown = describe_begin(got)
    if done.value:
        if isinstance(value, Acquired):
            return Finding(
                "allowed_transitions_only",
                f"{call} answered {shown} at {at(now)} although the item is {source.label}: "
                f"{source.label} -> Processing is not an allowed transition, and the finished "
                "work would run again",
            )
        if isinstance(value, Locked):
            return Finding(
                "exists_agrees_with_model",
                f"{call} answered {shown} at {at(now)}, but the item is {source.label}: "
                "begin answers Completed for Processed and Skipped",
            )
        if value.record is None:
            return None
        finding = J.judge_record(ref, value.record, after, now, has_history=has_history)
        if finding is None:
            return None
        return Finding(finding.property, f"the record {call} returned: {finding.message}")
    if isinstance(value, Completed):
        return Finding(
            "exists_agrees_with_model",
            f"{call} answered {shown} at {at(now)}, but the item is {source.label}: "
            "only Processed and Skipped are completed",
        )
    if isinstance(value, Acquired):
        if want.value is None:
            assert record is not None  # a missing record is always acquired
            return Finding(
                "at_most_one_live_lock",
                f"{call} answered {shown} at {at(now)} while "
                f"{'worker ' + str(holder) if holder is not None else 'an abandoned holder'}'s "
                f"lock was still live until {at(record.locked_until)}",
            )
        if value.token != want.value:
            return Finding(
                "acquire_agrees_with_model",
                f"{call} answered {shown} at {at(now)}; expected token {want.value} (a new "
                "record gets token 1, a retry the previous attempt + 1)",
            )
        return None
    if want.value is not None:
        return Finding(
            "acquire_agrees_with_model",
            f"{call} answered {shown} at {at(now)}, but the item is {source.label}, which may "
            f"be acquired (expected Acquired token {want.value})",
        )
    expiry = None if record is None else record.locked_until
    if value.locked_until is not None and value.locked_until != expiry:
        return Finding(
            "record_agrees_with_model",
            f"{call} answered {shown}; the live lock runs until {at(expiry)}",
        )
    return None


class BeginRules(OperationRules):
    """Adds ``begin`` to the operations a worker calls (see the module docstring)."""

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def begin(self, worker: int, item: Role) -> None:
        if self.diverged:
            return
        ref = self._ref(item)
        ctx = self._ctx(ref, worker, self._hold(worker, ref))
        now = self.clock.now()
        record = K.copy_record(self.model.current.get(ref.record_key))
        holder = self.holder.get(ref)
        # The model at the same instant: exists, and only when it says no, the acquire.
        done = outcome_of(lambda: self.model.exists(ctx, now))
        want = Outcome(None)
        if done.error is None and not done.value:
            want = outcome_of(lambda: self.model.try_acquire_lock(ctx, now))
        got = self.driver.outcome(lambda: begin(self.handler, ctx))
        self._acquired(ref, worker, want)
        self._step(f"worker {worker}", f"begin({ref.label})", describe_begin(got))
        self._checked("exists_agrees_with_model", "acquire_agrees_with_model")
        if K.is_live(record, now):
            self._checked("at_most_one_live_lock")
        if effective_status(record, now) in COMPLETED:
            self._checked("record_agrees_with_model")
        has_history = any(r.key == ref.record_key for r in self.model.superseded)
        after = self.model.current.get(ref.record_key)
        finding = judge_begin(
            ref, worker, got, done, want, record, after, holder, now, has_history=has_history
        )
        self._report(self._diagnose(ref, finding))
        self._after_step("acquire", item=ref)
