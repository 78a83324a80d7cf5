"""A counterexample replayed as the explorer plays it: every handler call, step by step.

The story says what happened in six lines; the explorer shows it: each call
on its worker's lane, the record each step left, the state diagram moving.
To draw it, one replay of the reported program (the last confirmation, so
no handler call is added) runs with a :class:`CallTape` listening:

* every instance a worker calls (the factory's, each peer as it opens) has
  its calls wrapped where they are made, adding no await point, so the
  scheduler's interleaving is the one the confirmation replays;
* the records come from the kit's own read-back after each step
  (``state.view``), so the tape reads nothing itself;
* each step of the program is one chapter, titled by its line of the story.

Times on the page are the kit's clock.  A clock that jumps back would fold
the timeline over itself, so calls are placed one after another on the
page's axis, and the axis is labelled with the kit's clock readings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dsm_sim.history import History, Op, OpName, Outcome, RecordView, key_of
from dsm_sim.micros import Micros, micros_in
from dsm_sim.model import ItemRef
from dsm_sim.reports.explorer.model import Chapter, TraceViolation
from dsm_sim.simulator.views import DATA_WIDTH, data_text, view_of
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord

__all__ = ["CallTape", "Replayed"]

_ITEM_CALLS = {
    "exists": OpName.EXISTS,
    "try_acquire_lock": OpName.TRY_ACQUIRE_LOCK,
    "set": OpName.SET,
    "release_lock_as_failed": OpName.RELEASE_LOCK_AS_FAILED,
    "upsert": OpName.UPSERT,
}
_SWEEPS = {
    "reset_expired_locks": OpName.RESET_EXPIRED_LOCKS,
    "expire_past_retention": OpName.EXPIRE_PAST_RETENTION,
}
#: Events on the page's axis are this far apart (microseconds), so the scrubber steps
#: through each.
_APART = 1000
CATCHUP_LANE = "catch-up worker"


class _Machine(Protocol):
    """What the tape reads of a conformance machine between steps."""

    handler: StateHandler
    view: dict[ItemRef, StateRecord | None]
    steps: list[Any]

    @property
    def clock(self) -> Clock: ...


@dataclass(frozen=True, slots=True)
class Replayed:
    """A replay recorded for the explorer: its calls, chapters and the kit's clock."""

    history: History
    chapters: tuple[Chapter, ...]
    #: The kit's clock (microseconds since ``history.epoch``) at each call, by call index.
    store_clock: Mapping[int, Micros]
    violations: tuple[TraceViolation, ...]
    #: Did this replay break the property again (a flaky finding's may not)?
    reproduced: bool


@dataclass(slots=True)
class _Pending:
    process: str
    op: OpName
    key: str
    invoke: Micros
    reading: Micros
    token: int | None = None
    status: str | None = None
    data: str | None = None


def _wrote(op: OpName, outcome: Outcome, result: object) -> bool:
    """Could this call have changed its record (a write that was not refused)?"""
    if outcome is not Outcome.OK or not op.is_write:
        return False
    return bool(result) if op is OpName.TRY_ACQUIRE_LOCK else True


class CallTape:
    """Listens to one replay: taps each instance, snapshots the kit's readings per step."""

    def __init__(self) -> None:
        self._tapped: list[object] = []  # kept alive, so an id() is never reused
        self._state: _Machine | None = None
        self.epoch: dt.datetime | None = None
        self._t: Micros = 0
        self._pending: list[tuple[int, _Pending]] = []
        self._done: list[tuple[_Pending, Micros, Outcome, Any, str | None, int, int]] = []
        self._step_of_call: list[int] = []
        self._views: list[dict[str, RecordView | None]] = [{}]
        self._told: list[tuple[str, ...]] = []
        self._step = 0
        self._step_lines = 0

    # --- listening ------------------------------------------------------------------------
    def attach(self, state: _Machine) -> None:
        """Tap the machine's instances: the factory's now, each peer as it opens."""
        self._state = state
        self._tap(state.handler)
        instances = getattr(state, "instances", None)
        if instances is not None:
            of = instances.of

            def tapped_of(worker: int) -> StateHandler:
                instance: StateHandler = of(worker)
                self._tap(instance)
                return instance

            instances.of = tapped_of

    def entered(self) -> None:
        """The world is entered: the page's clock starts at the kit's clock now."""
        assert self._state is not None
        self.epoch = self._state.clock.now()
        self._views = [self._snapshot()]

    def step_begins(self) -> None:
        assert self._state is not None
        self._step_lines = len(self._state.steps)

    def step_ends(self, *, broke: bool = False) -> None:
        """Close the step: its chapter tells the story's lines it added, titled by the last.

        A step that ``broke`` a property stopped before the kit read the
        records back: the tape reads them then, the verdict being in.
        """
        assert self._state is not None
        added = self._state.steps[self._step_lines :]
        self._told.append(tuple(s.render().strip() for s in added))
        self._views.append(self._snapshot(self._read_back() if broke else self._state.view))
        self._step += 1

    def _read_back(self) -> Mapping[ItemRef, StateRecord | None]:
        """Every item's record through the factory's instance (what the kit's read-back does)."""
        state = self._state
        assert state is not None
        observers: Mapping[ItemRef, StateHandlerContext] = getattr(state, "observers", {})
        driver = getattr(state, "driver", None)
        if driver is None:
            return state.view

        async def read() -> dict[ItemRef, StateRecord | None]:
            return {ref: await state.handler.get(ctx) for ref, ctx in observers.items()}

        try:
            seen: dict[ItemRef, StateRecord | None] = driver.run(read())
        except Exception:
            return state.view  # the page shows the last records the kit read
        return seen

    # --- the result -----------------------------------------------------------------------
    def replayed(self, *, property_name: str, message: str, reproduced: bool) -> Replayed:
        epoch = self.epoch or dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        ops: list[Op] = []
        clock: dict[int, Micros] = {}
        firsts: dict[int, int] = {}
        changed: set[tuple[int, str]] = set()
        for pending, complete, outcome, result, error, step, _ in sorted(
            self._done, key=lambda d: (d[0].invoke, d[6])
        ):
            index = len(ops)
            firsts.setdefault(step, index)
            before_view, after_view = (
                self._views[step],
                self._views[min(step + 1, len(self._views) - 1)],
            )
            keys: tuple[str, ...] = ()
            before = after = None
            if pending.op in _SWEEPS.values():
                keys = tuple(
                    sorted(k for k in after_view if after_view.get(k) != before_view.get(k))
                )
            else:
                # The kit reads back once per step: the step's change is the first
                # writing call's; the calls before it saw the old record, those after the new.
                old, new = before_view.get(pending.key), after_view.get(pending.key)
                if (step, pending.key) in changed:
                    before = after = new
                elif old != new and _wrote(pending.op, outcome, result):
                    changed.add((step, pending.key))
                    before, after = old, new
                else:
                    before = after = old
            scalar = (
                result if isinstance(result, bool | int | float | str) or result is None else None
            )
            ops.append(
                Op(
                    index=index,
                    process=pending.process,
                    op=pending.op,
                    key=pending.key,
                    invoke=pending.invoke,
                    complete=complete,
                    outcome=outcome,
                    result=scalar,
                    token=pending.token,
                    status=pending.status,
                    error=error,
                    store_time=pending.reading,
                    execution=pending.process,
                    keys=keys,
                    data=pending.data,
                    probed=pending.op is not OpName.EXISTS and not pending.op.is_sweep,
                    before=before,
                    after=after,
                )
            )
            clock[index] = pending.reading
        chapters: list[Chapter] = []
        quiet: list[str] = []  # steps without a handler call (a clock move) join the next
        for step, told in enumerate(self._told):
            if step not in firsts or not told:
                quiet.extend(told)
                continue
            chapters.append(Chapter(firsts[step], told[-1], (*quiet, *told)))
            quiet = []
        last_step = max(firsts) if firsts else None
        flagged = tuple(
            o.index for o in ops if last_step is not None and o.index >= firsts[last_step]
        )
        history = History(
            epoch=epoch,
            lock_duration=1800.0,
            ops=tuple(ops),
            meta={"source": "dsm verify counterexample"},
        )
        violation = TraceViolation(property_name, message, "", flagged, ())
        return Replayed(
            history, tuple(chapters), clock, (violation,) if reproduced else (), reproduced
        )

    # --- recording ------------------------------------------------------------------------
    def _tap(self, instance: StateHandler) -> None:
        if any(instance is seen for seen in self._tapped):
            return
        self._tapped.append(instance)
        for name, op in _ITEM_CALLS.items():
            if callable(getattr(instance, name, None)):
                setattr(instance, name, self._item_call(op, getattr(instance, name)))
        for name, op in _SWEEPS.items():
            if callable(getattr(instance, name, None)):
                setattr(instance, name, self._sweep(op, getattr(instance, name)))

    def _reading(self) -> Micros:
        assert self._state is not None and self.epoch is not None
        return micros_in(self._state.clock.now() - self.epoch)

    def _next_t(self) -> Micros:
        self._t = max(self._t + _APART, self._reading() if self.epoch else 0)
        return self._t

    def _start(self, pending: _Pending) -> int:
        ticket = len(self._pending)
        self._pending.append((ticket, pending))
        return ticket

    def _finish(
        self, ticket: int, pending: _Pending, outcome: Outcome, result: Any, error: str | None
    ) -> None:
        self._done.append((pending, self._next_t(), outcome, result, error, self._step, ticket))

    def _item_call(
        self, op: OpName, call: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(call)
        async def recorded(ctx: StateHandlerContext, *args: Any, **kwargs: Any) -> Any:
            if self.epoch is None:
                return await call(ctx, *args, **kwargs)
            status = getattr(args[0], "value", None) if op is OpName.SET and args else None
            payload: object = kwargs.get(
                "data", args[1] if op is OpName.SET and len(args) > 1 else None
            )
            if op is OpName.UPSERT and args:
                payload = args[0]
            pending = _Pending(
                process=ctx.entity_execution_id,
                op=op,
                key=key_of(ctx.record_key),
                invoke=self._next_t(),
                reading=self._reading(),
                token=ctx.lock_token,
                status=status,
                data=data_text(payload),
            )
            ticket = self._start(pending)
            try:
                result = await call(ctx, *args, **kwargs)
            except BaseException as exc:
                self._finish(ticket, pending, Outcome.FAIL, None, type(exc).__name__)
                raise
            if op is OpName.TRY_ACQUIRE_LOCK and result:
                pending.token = result if isinstance(result, int) else pending.token
            self._finish(ticket, pending, Outcome.OK, result, None)
            return result

        return recorded

    def _sweep(
        self, op: OpName, call: Callable[[], Awaitable[int]]
    ) -> Callable[[], Awaitable[int]]:
        @functools.wraps(call)
        async def recorded() -> int:
            if self.epoch is None:
                return await call()
            pending = _Pending(CATCHUP_LANE, op, "", self._next_t(), self._reading())
            ticket = self._start(pending)
            try:
                result = await call()
            except BaseException as exc:
                self._finish(ticket, pending, Outcome.FAIL, None, type(exc).__name__)
                raise
            self._finish(ticket, pending, Outcome.OK, result, None)
            return result

        return recorded

    def _snapshot(
        self, view: Mapping[ItemRef, StateRecord | None] | None = None
    ) -> dict[str, RecordView | None]:
        assert self._state is not None and self.epoch is not None
        epoch = self.epoch
        view = self._state.view if view is None else view
        out: dict[str, RecordView | None] = {}
        for ref, record in view.items():
            seen = view_of(record, epoch)
            if record is not None and seen is not None:
                detail = record.error_detail
                seen = dataclasses.replace(
                    seen,
                    data=data_text(record.data),
                    audit=(
                        None if detail is None else detail[:DATA_WIDTH],
                        record.source_app_id,
                        record.entity_execution_id,
                    ),
                )
            out[key_of(ref.record_key)] = seen
        return out
