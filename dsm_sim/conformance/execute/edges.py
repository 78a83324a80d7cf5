"""Steps the edge probes take that the search never draws.

:mod:`dsm_sim.conformance.generate.probes` walks each edge of the domain in a fixed
program.  Most of its steps are the search's own rules; these are not
rules (Hypothesis never draws them, so the search's seeds are unchanged), and
exist because a fixed program needs to say *which* record a clock move is
about, and to meet many worlds on one store:

* :meth:`EdgeSteps.enter_world` carries a test case on in another world, so
  eighty near spellings cost one store, not eighty;
* :meth:`EdgeSteps.clock_to_item_lock_expiry` and
  :meth:`EdgeSteps.clock_to_item_retention_end` put the clock on a named
  item's own boundary, where the search's rules pick a record by position;
* :meth:`EdgeSteps.retry_many` retries one item well past the 127 and 255
  acquisitions a narrow counter column holds, judging every answer but
  reading the world back only at the end (and telling it in one line);
* :meth:`EdgeSteps.take_over_many` takes one item over as each lock
  expires, the holder before writing late with its token, so its token
  passes 10 and 100 while older holders still write.

A reproduction that contains them runs as pasted, like any other.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.worlds import Role, World
from dsm_sim.conformance.reading import at
from dsm_sim.model import ItemRef
from reference_engine.status import IdempotencyStatus

__all__ = ["EdgeSteps"]


def _offset(micros: int) -> str:
    return f"{micros:+d}µs" if micros else "exactly"


class EdgeSteps(OperationRules):
    """Steps for fixed programs: another world on the same store, an item's own boundaries."""

    @step
    def enter_world(self, world: World) -> None:
        """Carry on in ``world``: the store keeps every record it has, the items change.

        When an earlier world left a record under one of the new keys, the
        items are read back first, so that record is the starting point, not
        a transition.
        """
        if self.diverged:
            return
        self.setup(world)  # the items, their observers and the zone, as a test case starts
        if not any(ref.record_key in self.model.current for ref in self.world):
            # New keys: nothing to read (a record the handler shows anyway is
            # caught by the next step's reading).
            return
        self.view = {
            ref: outcome.value if outcome.error is None else None
            for ref, outcome in self._observe().items()
        }

    @step
    def clock_jumps_to(self, instant: dt.datetime) -> None:
        """The clock stands at ``instant``: where a trimmed program's steps began."""
        if self.diverged:
            return
        self.clock.set(instant)
        self._move(f"jumps to {at(instant)}")

    @step
    def clock_to_item_lock_expiry(self, item: Role, micros: int = 0) -> None:
        """Put the clock on ``item``'s ``locked_until``, or ``micros`` either side of it."""
        ref = self._ref(item)
        record = self.model.current.get(ref.record_key)
        if self.diverged or record is None or record.locked_until is None:
            return
        self.clock.set(record.locked_until + dt.timedelta(microseconds=micros))
        self._move(f"moves to {ref.name}'s lock expiry, {_offset(micros)}")

    @step
    def clock_to_item_retention_end(self, item: Role, micros: int = 0) -> None:
        """Put the clock on ``item``'s ``retain_until``, or ``micros`` either side of it."""
        ref = self._ref(item)
        record = self.model.current.get(ref.record_key)
        if self.diverged or record is None or record.retain_until is None:
            return
        self.clock.set(record.retain_until + dt.timedelta(microseconds=micros))
        self._move(f"moves to {ref.name}'s end of retention, {_offset(micros)}")

    @step
    def first_hold_writes(
        self,
        item: Role,
        write: str,
        status: IdempotencyStatus | None = None,
        data: dict[str, Any] | None = None,
        error: str = "",
    ) -> None:
        """The item's oldest hold makes ``write`` (``set``, ``release_lock_as_failed`` or
        ``upsert``) with its token, whoever took the item since: another worker, or the
        same execution again (a redelivery the same worker picked up)."""
        ref = self._ref(item)
        hold = next((h for h in self.holds if h.ref == ref), None)
        if self.diverged or hold is None:
            return
        if write == "set" and status is not None:
            self._set(hold.worker, ref, status, data, hold=hold)
        elif write == "release_lock_as_failed":
            self._release(hold.worker, ref, error, hold=hold)
        elif write == "upsert":
            self._upsert(hold.worker, ref, data, hold=hold)

    # --- many retries ---------------------------------------------------------------------------

    _quiet: bool = False

    def _after_step(self, operation: str, *args: Any, **kwargs: Any) -> None:
        if not self._quiet:
            super()._after_step(operation, *args, **kwargs)
            return
        # Quiet: nothing is judged, but what was read is kept, so a later step
        # compares with the store as it is, not as it was before.
        observed = args[0] if args else kwargs.get("observed")
        if observed is not None:
            for ref, outcome in observed.items():
                if outcome.error is None:
                    self.view[ref] = outcome.value

    @step
    def retry_many(self, worker: int, item: Role, times: int) -> None:
        """``times`` acquisitions of ``item``, each released as failed: its attempt climbs.

        Every answer is judged as usual; the records are read back once, at
        the end, and the story tells the loop in one line (with the last
        round in full), so a counter that stops at 127 reads as such.
        """
        ref = self._ref(item)

        def once() -> None:
            self._acquire(worker, ref)
            self._release(worker, ref, "retry")

        self._repeated(
            ref, times, once, "try_acquire_lock and release_lock_as_failed in turn", "acquire"
        )

    @step
    def take_over_many(self, item: Role, times: int) -> None:
        """``times`` take-overs of ``item``: its lock expires, the next worker acquires, and
        the holder it was taken from writes with its old token (refused).

        The writes take turns (``set(Processed)``, ``release_lock_as_failed``,
        ``upsert``), so each fenced write meets an old token one below the
        current one at every digit boundary the history passes: ``9`` against
        ``10`` and ``99`` against ``100``, where a token compared as text
        (``"10" < "9"``) lets the stale write land.
        """
        ref = self._ref(item)
        round_ = [0]

        def once() -> None:
            round_[0] += 1
            record = self.model.current.get(ref.record_key)
            if record is not None and record.locked_until is not None:
                self.clock.set(record.locked_until + dt.timedelta(microseconds=1))
                self._move(f"moves past {ref.name}'s lock expiry")
            previous = next((h for h in reversed(self.holds) if h.ref == ref), None)
            self._acquire(W.WORKERS[round_[0] % len(W.WORKERS)], ref)
            if previous is None or previous not in self.holds:
                return
            kind = round_[0] % 3
            if kind == 0:
                self._set(
                    previous.worker, ref, IdempotencyStatus.PROCESSED, {"n": 1}, hold=previous
                )
            elif kind == 1:
                self._release(previous.worker, ref, "late", hold=previous)
            else:
                self._upsert(previous.worker, ref, {"n": 2}, hold=previous)

        self._repeated(
            ref,
            times,
            once,
            "taken over as each lock expires, the holder before writing late with its token",
            "acquire",
        )

    @rule(worker=W.WORKER, item=W.ITEMS, times=st.sampled_from((7, 9)))
    @step
    def upsert_many(self, worker: int, item: Role, times: int) -> None:
        """``times`` upserts of ``item``: a history of ``times - 1`` superseded rows, or more.

        A store that keeps, indexes or sweeps only the newest few history rows
        shows when an item has more of them than it keeps; the retention
        sweep's count is where a lost or never-expired row is seen.
        """
        ref = self._ref(item)
        round_ = [0]

        def once() -> None:
            round_[0] += 1
            self._upsert(worker, ref, {"n": round_[0]})

        self._repeated(ref, times, once, "upsert in turn, each with new data", "upsert")

    def _repeated(
        self, ref: ItemRef, times: int, once: Callable[[], None], told: str, operation: str
    ) -> None:
        """Run ``once`` ``times`` times quietly; read back at the end; tell it in one line."""
        if self.diverged:
            return
        first = len(self.steps)
        self._quiet = True
        try:
            for _ in range(times):
                once()
        except P.PropertyViolation as violation:
            self._quiet = False
            self._fold_steps(first, ref, told)
            raised = P.PropertyViolation(
                violation.finding, self._story(violation.finding.message), self.zone
            )
            raised.program = violation.program
            raise raised from None
        finally:
            self._quiet = False
        self._fold_steps(first, ref, told)
        self._after_step(operation, steps=2 * times)

    def _fold_steps(self, first: int, ref: ItemRef, told: str) -> None:
        """Steps ``first``.. as one line, but for the last two (the last round, or the failing one)."""
        looped = self.steps[first:]
        if len(looped) <= 4:
            return
        head, tail = looped[0], looped[-2:]
        summary = dataclasses.replace(
            head,
            action=f"{len(looped) - 2} calls on {ref.name}, {told}",
            outcome="each as the spec says (the next two follow)",
        )
        self.steps[first:] = [summary, *tail]
        for index, line in enumerate(self.steps):
            self.steps[index] = dataclasses.replace(line, index=index + 1)
