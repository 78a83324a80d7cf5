"""The operation rules of the conformance state machine, and its bookkeeping.

Rules are synchronous (Hypothesis has no async state machines): each drives
the handler's coroutines on the test case's own event loop, asks the model
the same question at the same instant, and hands both answers to a judge in
:mod:`dsm_sim.conformance.judge.judges`.  After every rule that writes, the
whole world is read back through ``get`` and compared, inside the rule itself
rather than in an ``@invariant``, so the program Hypothesis prints reproduces
the failure when pasted.  Rules cannot take pytest fixtures, so a machine class is built
per handler factory with :func:`build_machine`.

Every test case first draws its world (:mod:`dsm_sim.conformance.generate.worlds`):
the items, their node options and the process time zone.  Rules then draw a
:class:`~dsm_sim.conformance.generate.worlds.Role` and act on that role's item.

No rule has a precondition: who wins a race is up to the store, so what a
rule draws must never depend on it, or Hypothesis cannot replay a run.  A
rule with nothing to act on (no lock held, nothing processing) does nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute import bookkeeping as K
from dsm_sim.conformance.execute.clocks import ClockMode, ConformanceClock
from dsm_sim.conformance.execute.instances import HandlerInstances
from dsm_sim.conformance.execute.loop import LoopDriver
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.execute.tokens import TokenTable
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.worlds import (
    DEFAULT_WORLD,
    UTC_ZONE,
    WORLDS,
    Role,
    World,
    in_zone,
    restore_zone,
)
from dsm_sim.conformance.judge import judges as J
from dsm_sim.conformance.judge.doubt import HistoryDoubt
from dsm_sim.conformance.judge.semantics import DSM, ProfiledModel, Retention, SemanticsProfile
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.reading import at
from dsm_sim.conformance.tell.shrink_budget import note_failing_run
from dsm_sim.conformance.tell.story import Step, render_steps
from dsm_sim.model import (
    WORLD_START,
    ItemRef,
    ModelRecord,
    Outcome,
    ReferenceModel,
    execution_id,
    outcome_of,
)
from reference_engine.context import StateHandlerContext
from reference_engine.errors import LockError, StaleLockError
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["OperationRules"]

S = IdempotencyStatus
_NO_ZONE = object()
#: After a call on one item, every item is read back once in this many calls.
FULL_READ_EVERY = 4


def _status_of(record: StateRecord | None) -> str:
    return "no record" if record is None else f"{record.status.label} (token {record.attempt})"


class OperationRules(RuleBasedStateMachine):
    """Workers 1-3 call the handler's operations; the model says what each must come to.

    The plain operations, clock moves and sweeps, plus the bookkeeping that
    compares the world after every step.  Races and faults are added by
    :class:`~dsm_sim.conformance.execute.machine.ConformanceMachine`.
    """

    factory: ClassVar[HandlerFactory]
    clock_mode: ClassVar[ClockMode] = ClockMode.INJECTED
    stats: ClassVar[K.RunStats]
    #: When set, every test case runs in this ``TZ`` instead of the one it drew.
    time_zone: ClassVar[str | None] = None
    #: The semantics the handler is judged by (``dsm_sim.conformance.judge.semantics``).
    semantics: ClassVar[SemanticsProfile] = DSM
    #: How fencing tokens are judged (``dsm verify --tokens``): ``attempts`` or ``ordered``.
    tokens: ClassVar[str] = "attempts"

    def __init__(self) -> None:
        super().__init__()
        stats = type(self).stats
        stats.test_cases += 1
        if stats.on_test_case is not None:
            stats.on_test_case(stats.test_cases)
        self.clock = ConformanceClock(WORLD_START, self.clock_mode)
        self.driver = LoopDriver()
        self.model: ReferenceModel = ProfiledModel(type(self).semantics)
        #: History rows whose end of retention a race left undecided.
        self.doubt = HistoryDoubt()
        self.world: World = DEFAULT_WORLD
        self.observers = {ref: ref.context(W.OBSERVER) for ref in self.world}
        #: Fresh executions each worker started (a redelivery is a new execution).
        self.deliveries: dict[int, int] = dict.fromkeys(W.WORKERS, 0)
        #: Every lock some execution believes it holds, oldest first.
        self.holds: list[K.Hold] = []
        #: Holds whose completing write landed while the caller saw no reply:
        #: the write that landed, by hold.
        self.spent: dict[K.Hold, str] = {}
        #: The landed write of each spent hold, to be made again exactly as it was.
        self.landed: dict[K.Hold, tuple[str, Callable[..., Any], Callable[..., Any]]] = {}
        self.holder: dict[ItemRef, int] = {}
        self.steps: list[Step] = []
        #: Every step taken so far, as data: the program a violation carries.
        self.trace: list[Call] = []
        self.trace_instants: list[dt.datetime] = []
        self.step_depth = 0
        self.entered = False
        #: The one item steps act on, when the others cannot change (the race matrix).
        self.focus: ItemRef | None = None
        #: Calls on one item so far (every FULL_READ_EVERY-th reads every item back).
        self.partial_reads = 0
        self.view: dict[ItemRef, StateRecord | None] = dict.fromkeys(self.world)
        #: The world's items each item could be mixed up with (_siblings), for ``_sibling_refs``.
        self._sibling_refs: tuple[ItemRef, ...] | None = None
        self._sibling_map: dict[ItemRef, dict[ItemRef, str]] = {}
        self.diverged = False
        self.failed = False
        #: Keys of the worlds entered so far, each read once before any call wrote it.
        self.checked_keys: set[Any] = set()
        self.zone = UTC_ZONE
        self._saved_zone: object = _NO_ZONE
        self._torn_down = False
        self.clock.start()
        try:
            self.handler: StateHandler = type(self).factory(self.clock)
            # The in-memory handlers never wait on I/O: their calls are sent to directly.
            self.driver.direct = isinstance(self.handler, InMemoryStateHandler)
            #: A handler process the kit starts (``--exec``) runs in the test case's
            #: time zone: it is opened by ``setup``, once the world has drawn one.
            self.zoned = getattr(self.handler, "opens_in_zone", False) is True
            if not self.zoned:
                self.driver.run(self.handler.open())
            #: The instances racing workers call (peers on the same store, when offered).
            self.instances = HandlerInstances(self.handler, self.driver, stats)
            self.instances.watcher = self
        except BaseException:
            self.driver.close()
            self.clock.stop()
            raise

    # --- the world ---------------------------------------------------------------------------

    @initialize(world=WORLDS)
    @step
    def setup(self, world: World) -> None:
        """Enter the test case's world: its items, and its time zone for the whole process."""
        zone = type(self).time_zone or world.zone
        if self.zoned and self.entered:
            # A handler process keeps the zone it was started in (the test case's).
            zone = self.zone
        self.world = dataclasses.replace(world, zone=zone)
        self.zone = zone
        self.observers = {ref: ref.context(W.OBSERVER) for ref in self.world}
        self.view = dict.fromkeys(self.world)
        if self._saved_zone is _NO_ZONE:
            self._saved_zone = in_zone(zone)
        else:
            in_zone(zone)
        if not self.entered:
            # The first world a test case enters says where its clock starts;
            # a world entered later (a probe's next) carries on from where it is.
            self.entered = True
            self.clock.set(world.start)
            if self.zoned:
                # The process (and each peer after it) starts with TZ set to the zone.
                self.handler.zone = zone  # type: ignore[attr-defined]  # an ExecHandler field
                self.driver.run(self.handler.open())
        self._check_empty_store()

    def _check_empty_store(self) -> None:
        """Every item reads back as missing before the first call: each open starts empty.

        A factory that hands every test case one store (a fixed database file, a
        static dictionary) shows the records of earlier test cases here.
        """
        fresh = [ref for ref in self.world if ref.record_key not in self.checked_keys]
        if not fresh:
            return
        self.checked_keys.update(ref.record_key for ref in fresh)
        if len(fresh) == len(self.observers):
            observed = self._observe()
        else:
            observed = {ref: self._observe_one(ref) for ref in fresh if ref in self.observers}
        for ref, outcome in observed.items():
            record = outcome.value
            if outcome.error is not None or record is None:
                continue
            self._step("kit", f"get({ref.label}) before any call", record.status.label)
            self._report(
                P.Finding(
                    "record_agrees_with_model",
                    f"get({ref.label}) returned a {record.status.label} record (attempt "
                    f"{record.attempt}, written by {record.entity_execution_id!r}) before the test "
                    "case wrote anything: the store was not empty when the test case opened "
                    "it: each open must start from an empty store (a factory that reuses one "
                    "store, a file or a static dictionary, leaks records between test cases)",
                )
            )

    def _ref(self, item: Role) -> ItemRef:
        return self.world[item]

    def _execution(self, worker: int) -> str:
        return self.world.execution(execution_id(worker, self.deliveries[worker]))

    def _hold(self, worker: int, ref: ItemRef) -> K.Hold | None:
        """The newest lock the worker's current execution holds on ``ref``."""
        execution = self._execution(worker)
        for hold in reversed(self.holds):
            if hold.worker == worker and hold.ref == ref and hold.execution == execution:
                return hold
        return None

    def _pick_hold(self, pick: int, *, spent: bool = False) -> K.Hold | None:
        holds = [h for h in self.holds if h in self.spent] if spent else self.holds
        return holds[pick % len(holds)] if holds else None

    def _ctx(self, ref: ItemRef, worker: int, hold: K.Hold | None) -> StateHandlerContext:
        app = self.world.app(worker)
        if hold is not None:
            return K.context_for(ref, worker, hold.token, hold.execution, app)
        return K.context_for(ref, worker, None, self._execution(worker), app)

    # --- bookkeeping -------------------------------------------------------------------------

    def _step(self, actor: str, action: str, outcome: str = "") -> None:
        self.steps.append(Step(len(self.steps) + 1, self.clock.now(), actor, action, outcome))

    def _checked(self, *names: str) -> None:
        for name in names:
            self.stats.checks[name] += 1

    def _story(self, message: str) -> str:
        story = render_steps(self.steps, message)
        if self.zone != UTC_ZONE:
            story = f"  (process time zone TZ={self.zone})\n{story}"
        return story

    def _report(self, finding: P.Finding | None) -> None:
        if finding is None or self.diverged:
            return
        hazard = self.semantics.hazards.get(finding.property)
        if hazard is not None:
            # What the interface cannot prevent: named, with its story, and this test
            # case is judged no further (the handler and the spec have parted ways).
            self.stats.note_hazard(hazard, finding, self._story(finding.message))
            self.diverged = True
            return
        self.stats.checks[finding.property] += 1  # a violation is a check that failed
        if finding.property in self.stats.disabled:
            # Already reported in an earlier run; stop judging this one, whose
            # handler and model have parted ways.
            self.diverged = True
            self.stats.suppressed[finding.property] += 1
            return
        if self.stats.first_failure_case is None:
            self.stats.first_failure_case = self.stats.test_cases
            self.stats.first_failure_property = finding.property
        self.failed = True
        violation = P.PropertyViolation(finding, self._story(finding.message))
        violation.time_zone = self.zone
        violation.program = Program(tuple(self.trace), tuple(self.trace_instants))
        note_failing_run(len(self.steps))
        raise violation

    def _observe(self) -> dict[ItemRef, Outcome]:
        """Every item's record as the handler reads it, in one pass on the loop.

        A handler in another process that takes requests while earlier ones
        are in flight (``pipelines_requests``) gets every read at once: the
        reads of a quiet store answer the same in any order, and one round
        trip for the lot instead of one per item is most of what the
        protocol costs a verification.  An in-process handler is read one
        item after the other, as before.
        """

        async def read(ctx: StateHandlerContext) -> Outcome:
            try:
                return Outcome(value=await self.handler.get(ctx))
            except Exception as exc:
                return Outcome(error=exc)

        async def read_all() -> dict[ItemRef, Outcome]:
            if getattr(self.handler, "pipelines_requests", False):
                outcomes = await asyncio.gather(*(read(ctx) for ctx in self.observers.values()))
                return dict(zip(self.observers, outcomes, strict=True))
            return {ref: await read(ctx) for ref, ctx in self.observers.items()}

        return self.driver.run(read_all())

    def _in_world(self, ref: ItemRef) -> ItemRef | None:
        """The world's item with ``ref``'s key (a redeploy changed its options), or None."""
        if ref in self.observers:
            return ref
        key = ref.record_key
        return next((r for r in self.world if r.record_key == key), None)

    def _observe_one(self, ref: ItemRef) -> Outcome:
        """One item's record as the handler reads it."""
        ctx = self.observers[ref]

        async def read() -> Outcome:
            try:
                return Outcome(value=await self.handler.get(ctx))
            except Exception as exc:
                return Outcome(error=exc)

        return self.driver.run(read())

    def _model_view(self, model: ReferenceModel | None = None) -> dict[ItemRef, ModelRecord | None]:
        model = model or self.model
        if isinstance(model, ProfiledModel):
            model.settle(self.clock.now())  # records a TTL dropped are gone from every view
        current = model.current
        return {ref: current.get(ref.record_key) for ref in self.world}

    def _diagnose(self, ref: ItemRef, finding: P.Finding | None) -> P.Finding | None:
        """A wrong answer for one item may be another tenant's, scope's or key's record showing."""
        if finding is None:
            return None
        observed = self._observe()
        view = {r: o.value for r, o in observed.items() if o.error is None}
        return J.judge_isolation(ref, view, self._model_view()) or finding

    def _after_step(
        self,
        operation: str,
        observed: Mapping[ItemRef, Outcome] | None = None,
        *,
        steps: int = 1,
        item: ItemRef | None = None,
    ) -> None:
        """Read the items back and compare them with the model (``steps`` calls were made).

        Every item is read, unless ``observed`` holds only some (or an item is
        in :attr:`focus`): then those are judged, and the others keep their
        last reading until a step reads them again.
        """
        if self.diverged:
            return
        now = self.clock.now()
        if observed is None and self.focus is not None:
            # Only the item in focus can have changed (the race matrix's cells, one
            # item each): the others keep their last reading.
            observed = {self.focus: self._observe_one(self.focus)}
        elif observed is None and item is not None and (item := self._in_world(item)) is not None:
            # A call on one item: that item is read after it, every item after
            # every FULL_READ_EVERY-th such call (a store that mixes items up
            # shows there, at most a few steps late).
            self.partial_reads += 1
            if self.partial_reads % FULL_READ_EVERY:
                observed = {item: self._observe_one(item)}
        observed = observed if observed is not None else self._observe()
        for ref, outcome in observed.items():
            if outcome.error is not None and not self.diverged:
                self._report(
                    P.Finding(
                        "errors_agree_with_model",
                        f"get({ref.label}) raised {outcome.describe()}: {outcome.error}",
                    )
                )
        for ref, outcome in observed.items():
            if outcome.error is None and outcome.value is not None and not self.diverged:
                self._report(J.malformed_finding(ref, outcome.value))
        if self.diverged:
            return
        view: dict[ItemRef, StateRecord | None] = {
            **self.view,
            **{r: o.value for r, o in observed.items()},
        }
        model_view = self._model_view()
        history = {record.key for record in self.model.superseded}
        for ref in self.world:
            if ref not in observed:
                continue
            before, after = self.view[ref], view[ref]
            if before is not None and not self._retained(before, now):
                before = None  # dropped by the store's TTL since it was read: no transition
            if before is not None:
                self._checked("allowed_transitions_only")
            vanishes = self.semantics.records_vanish
            self._report(
                J.judge_transition(
                    ref,
                    before,
                    after,
                    now,
                    operation,
                    steps,
                    may_vanish=vanishes and model_view[ref] is None,
                    kept=model_view[ref] if vanishes else None,
                )
            )
            self._checked(*J.record_checks(ref, model_view, self._siblings(ref)))
            self._report(J.judge_isolation(ref, view, model_view))
            self._report(
                J.judge_record(
                    ref,
                    after,
                    model_view[ref],
                    now,
                    has_history=ref.record_key in history,
                    semantics=self.semantics,
                    tokens=self.tokens,
                )
            )
            if self.diverged:
                return
        self.view = view

    # --- instances that open on the store -----------------------------------------------------

    def before_open(self) -> object:
        """The store as the factory's instance reads it, before a peer opens on it."""
        if self.diverged or not self.entered:
            return None
        return self._observe()

    def after_open(self, worker: int, before: object) -> None:
        """A peer opened: when its ``open()`` changed a record, that is a step of the story.

        An instance opening on the store (another worker process starting)
        must change nothing; the records it changed are judged as after any
        call that writes, so the finding is the open's, not that of the call
        that next meets the item.
        """
        if self.diverged or not isinstance(before, dict):
            return
        after = self._observe()
        changed = [
            ref
            for ref, outcome in after.items()
            if ref in before
            and outcome.error is None
            and before[ref].error is None
            and outcome.value != before[ref].value
        ]
        if not changed:
            return
        shown = "; ".join(
            f"{ref.label}: {_status_of(before[ref].value)} -> {_status_of(after[ref].value)}"
            for ref in changed
        )
        actor = "sweep worker" if worker == 0 else f"worker {worker}"
        self._step(actor, "open() of its own handler instance on the same store", shown)
        self._after_step("open", after)

    def _siblings(self, ref: ItemRef) -> Mapping[ItemRef, str]:
        """The items of the world a store could mix ``ref`` up with, kept until the world changes."""
        refs = self.world.refs
        if self._sibling_refs is not refs:
            self._sibling_refs, self._sibling_map = refs, {}
        found = self._sibling_map.get(ref)
        if found is None:
            found = self._sibling_map[ref] = J.isolation_siblings(ref, refs)
        return found

    def _retained(self, record: StateRecord, now: dt.datetime) -> bool:
        """Is a record read earlier still there by a TTL's rule (always, under a sweep)?"""
        semantics = self.semantics
        return semantics.retention is not Retention.TTL or semantics.retained(
            record.retain_until, now
        )

    # --- reads -------------------------------------------------------------------------------

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def exists(self, worker: int, item: Role) -> None:
        if self.diverged:
            return
        ref = self._ref(item)
        got, finding = self._judged_exists(self.handler, ref, worker, self._hold(worker, ref))
        self._step(f"worker {worker}", f"exists({ref.label})", got.describe())
        self._report(self._diagnose(ref, finding))

    def _judged_exists(
        self, instance: StateHandler, ref: ItemRef, worker: int, hold: K.Hold | None
    ) -> tuple[Outcome, P.Finding | None]:
        """``worker``'s ``exists`` on ``ref`` through ``instance``, and what the judge finds."""
        ctx = self._ctx(ref, worker, hold)
        now = self.clock.now()
        record = K.copy_record(self.model.current.get(ref.record_key))
        want = outcome_of(lambda: self.model.exists(ctx, now))
        got = self.driver.outcome(lambda: instance.exists(ctx))
        self._checked("exists_agrees_with_model")
        return got, J.judge_exists(ref, worker, got, want, record, now)

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def get(self, worker: int, item: Role) -> None:
        if self.diverged:
            return
        ref = self._ref(item)
        got = self.driver.outcome(lambda: self.handler.get(self._ctx(ref, worker, None)))
        if got.error is not None:
            shown = got.describe()
        else:
            shown = "no record" if got.value is None else got.value.status.label
        self._step(f"worker {worker}", f"get({ref.label})", shown)
        # Reads change nothing, so the other items' last readings still stand,
        # unless the store drops records as time passes (a TTL): then read all.
        if self.semantics.retention is Retention.TTL:
            self._after_step("get")
        else:
            self._after_step("get", {ref: got})

    # --- the lock ----------------------------------------------------------------------------

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def try_acquire_lock(self, worker: int, item: Role) -> None:
        self._acquire(worker, self._ref(item))

    def _acquire(self, worker: int, ref: ItemRef, *, reply_lost: bool = False) -> None:
        if self.diverged:
            return
        ctx = self._ctx(ref, worker, self._hold(worker, ref))
        now = self.clock.now()
        record = K.copy_record(self.model.current.get(ref.record_key))
        holder = self.holder.get(ref)
        want = outcome_of(lambda: self.model.try_acquire_lock(ctx, now))
        got = self.driver.outcome(lambda: self.handler.try_acquire_lock(ctx))
        self._acquired(ref, worker, want, learns=not reply_lost)
        shown = self._grant_shown(ref, got)
        if reply_lost:
            shown += ", but the reply is lost: the worker does not learn the token"
        self._step(f"worker {worker}", f"try_acquire_lock({ref.label})", shown)
        self._checked("acquire_agrees_with_model")
        if K.is_live(record, now):
            self._checked("at_most_one_live_lock")
        finding = J.judge_acquire(ref, worker, got, want, record, holder, now, tokens=self.tokens)
        self._report(self._diagnose(ref, finding))
        self._after_step("acquire", item=ref)

    def _grant_shown(self, ref: ItemRef, got: Outcome) -> str:
        """An acquisition's outcome for the story; under ordered tokens with the handler's own.

        The story counts in attempt numbers, as the model does; a finding about
        token order names the handler's tokens, so the story shows both.
        """
        shown = got.describe_grant()
        table = getattr(self.handler, "table", None)
        if self.tokens == "attempts" or not isinstance(table, TokenTable):
            return shown
        if got.error is not None or not isinstance(got.value, int):
            return shown
        own = table.wire.get((ref.record_key, got.value))
        return shown if own is None or own == got.value else f"{shown} (the handler's {own})"

    def _acquired(self, ref: ItemRef, worker: int, want: Outcome, *, learns: bool = True) -> None:
        """Book a granted acquisition.  An older hold of the same execution stays: it is
        a coroutine that may still wake with the older token."""
        if want.error is None and want.value is not None:
            self.holder[ref] = worker
            if learns:
                self.holds.append(K.Hold(worker, ref, want.value, self._execution(worker)))

    # --- writes ------------------------------------------------------------------------------

    def _write(
        self,
        operation: str,
        worker: int,
        ref: ItemRef,
        call: Callable[[StateHandlerContext], Any],
        model_call: Callable[[StateHandlerContext, dt.datetime], Any],
        *,
        hold: K.Hold | bool | None = True,
        reply_lost: bool = False,
    ) -> None:
        """One write by ``worker`` on ``ref``, under ``hold`` (True: its current hold, if any).

        With ``reply_lost`` the write lands but the caller never hears so: it
        keeps its token, now spent, and may retry or release with it.
        """
        held = self._hold(worker, ref) if hold is True else hold or None
        # A library whose flow never retries a completion: the reply arrives.
        reply_lost = reply_lost and self.semantics.completion_retries
        token = None if held is None else held.token
        ctx = self._ctx(ref, worker, held)
        now = self.clock.now()
        record = K.copy_record(self.model.current.get(ref.record_key))
        superseded = len(self.model.superseded)
        want = outcome_of(lambda: model_call(ctx, now))
        got = self.driver.outcome(lambda: call(ctx))
        spent_by = None if held is None else self.spent.get(held)
        if held is not None and (want.error is None or isinstance(want.error, LockError)):
            if reply_lost and want.error is None:
                self.spent[held] = operation.split(",")[0] + (")" if "," in operation else "")
                self.landed[held] = (operation, call, model_call)
            else:
                self.holds.remove(held)
                self.spent.pop(held, None)
        if want.error is None and self.holder.get(ref) == worker and not reply_lost:
            del self.holder[ref]
        actor = f"worker {worker}" if held is None else held.who
        with_token = f" with token {token}" if token is not None else ""
        if spent_by is not None:
            with_token += " (spent)"
        shown = "ok" if got.error is None and got.value is None else got.describe()
        if reply_lost:
            shown += ", but the reply is lost: the worker still holds its token"
        self._step(actor, f"{operation} on {ref.label}{with_token}", shown)
        self._checked("errors_agree_with_model")
        if isinstance(want.error, StaleLockError):
            self._checked("spent_token_rejected" if spent_by else "stale_write_rejected")
        elif spent_by is not None and want.error is None:
            self._checked("spent_token_rejected")  # the landed write, made again
        if len(self.model.superseded) > superseded:
            self._checked("upsert_keeps_history")
        finding = J.judge_write(
            operation,
            ref,
            worker,
            token,
            got,
            want,
            record,
            now,
            spent_by=spent_by,
            fenced=self.semantics.fenced,
        )
        refusal = getattr(self.model, "spec_refusal", None)
        if refusal is not None and finding is None:
            # The interface carries no token: the write landed where the spec refuses it.
            hazard = self.semantics.hazards.get("stale_write_rejected")
            shown_as = J.judge_write(
                operation,
                ref,
                worker,
                token,
                got,
                Outcome(error=refusal),
                record,
                now,
                fenced=False,
            )
            if hazard is not None and shown_as is not None:
                self.stats.note_hazard(hazard, shown_as, self._story(shown_as.message))
        elif refusal is not None and isinstance(got.error, LockError):
            # Refused as the spec refuses it, where the interface's reading lets it land:
            # stricter than the seed asks, and the model went the other way; judge no further.
            self.diverged = True
            return
        self._report(self._diagnose(ref, finding))
        self._after_step(operation.split("(")[0], item=ref)

    def _set(
        self,
        worker: int,
        ref: ItemRef,
        status: IdempotencyStatus,
        data: dict[str, Any] | None,
        **how: Any,
    ) -> None:
        if not self.semantics.can_set(status):
            return  # the library has no such write
        self._write(
            f"set({status.label}, data={J.short_data(data)})",
            worker,
            ref,
            lambda ctx: self.handler.set(ctx, status, data),
            lambda ctx, now: self.model.set(ctx, status, data, now),
            **how,
        )

    def _release(self, worker: int, ref: ItemRef, error: str, **how: Any) -> None:
        if not self.semantics.supports("release_lock_as_failed"):
            return  # the library has no release
        self._write(
            f"release_lock_as_failed({J.short_data(error)})",
            worker,
            ref,
            lambda ctx: self.handler.release_lock_as_failed(ctx, error),
            lambda ctx, now: self.model.release_lock_as_failed(ctx, error, now),
            **how,
        )

    def _upsert(self, worker: int, ref: ItemRef, data: dict[str, Any] | None, **how: Any) -> None:
        if not self.semantics.supports("upsert"):
            return  # the library has no upsert
        self._write(
            f"upsert(data={J.short_data(data)})",
            worker,
            ref,
            lambda ctx: self.handler.upsert(ctx, data),
            lambda ctx, now: self.model.upsert(ctx, data, now),
            **how,
        )

    @rule(worker=W.WORKER, item=W.ITEMS, status=W.STATUSES, data=W.DATA)
    @step
    def set(
        self, worker: int, item: Role, status: IdempotencyStatus, data: dict[str, Any] | None
    ) -> None:
        if not self.diverged:
            self._set(worker, self._ref(item), status, data)

    @rule(worker=W.WORKER, item=W.ITEMS, error=W.ERRORS)
    @step
    def release_lock_as_failed(self, worker: int, item: Role, error: str) -> None:
        if not self.diverged:
            self._release(worker, self._ref(item), error)

    @rule(worker=W.WORKER, item=W.ITEMS, data=W.DATA)
    @step
    def upsert(self, worker: int, item: Role, data: dict[str, Any] | None) -> None:
        if not self.diverged:
            self._upsert(worker, self._ref(item), data)

    # --- time --------------------------------------------------------------------------------

    def _move(self, description: str, delta: dt.timedelta | None = None) -> None:
        if delta is not None:
            try:
                self.clock.now() + delta
            except OverflowError:
                # A world may start at the far end of time a store must hold
                # (FAR_END): a second jump past a century's retention from there
                # leaves the calendar, so the clock stays where it is.
                self._step("clock", description, f"stays at {at(self.clock.now())}: past year 9999")
                return
            self.clock.advance(delta)
        self._step("clock", description, f"now {at(self.clock.now())}")

    @rule(seconds=W.TICKS)
    @step
    def tick(self, seconds: int) -> None:
        if not self.diverged:
            self._move(f"advances {seconds}s", dt.timedelta(seconds=seconds))

    @rule(seconds=W.JUMPS_BACK)
    @step
    def clock_jumps_back(self, seconds: int) -> None:
        if not self.diverged:
            self._move(f"jumps back {seconds}s", dt.timedelta(seconds=-seconds))

    @rule(item=W.ITEMS)
    @step
    def clock_jumps_past_lock_duration(self, item: Role) -> None:
        """Jump one second past the lock duration of ``item``'s node: nodes differ."""
        if not self.diverged:
            ref = self._ref(item)
            delta = ref.config.lock_duration + dt.timedelta(seconds=1)
            self._move(f"jumps past {ref.name}'s lock duration", delta)

    @rule(item=W.ITEMS)
    @step
    def clock_jumps_past_retention(self, item: Role) -> None:
        if not self.diverged:
            ref = self._ref(item)
            retention = ref.config.retention or dt.timedelta(days=1)
            self._move(f"jumps past {ref.name}'s retention", retention + dt.timedelta(seconds=1))

    # --- sweeps ------------------------------------------------------------------------------

    @rule()
    @step
    def reset_expired_locks(self) -> None:
        if self.diverged:
            return
        now = self.clock.now()
        before = dict(self.view)
        got = self.driver.outcome(self.handler.reset_expired_locks)
        want = outcome_of(lambda: self.model.reset_expired_locks(now))
        observed = self._observe()
        after = {r: o.value for r, o in observed.items() if o.error is None}
        self._step("catch-up worker", "reset_expired_locks()", got.describe())
        self._checked("sweep_only_expired")
        if want.value:
            self._checked("sweep_resets_expired")
        swept = {r: (before[r], after.get(r)) for r in self.world}
        if self.semantics.lock_sweep:  # without one, the records are judged as after any step
            self._report(J.judge_sweep(swept, got, want, now))
        self._after_step("sweep", observed)

    @rule()
    @step
    def expire_past_retention(self) -> None:
        if self.diverged:
            return
        now = self.clock.now()
        history = [r.status for r in self.model.superseded]
        got = self.driver.outcome(self.handler.expire_past_retention)
        self.doubt.settle(self.model, got.value, lambda model: model.expire_past_retention(now))
        want = outcome_of(lambda: self.model.expire_past_retention(now))
        self.doubt.prune(self.model, now)
        history_expired = sum(
            1 for old, r in zip(history, self.model.superseded, strict=True) if old is not r.status
        )
        self._step("retention worker", "expire_past_retention()", got.describe())
        self._checked("retention_sweep_agrees_with_model")
        self._report(J.judge_retention_sweep(got, want, history_expired, now))
        self._after_step("sweep", self._observe())

    # --- the end -----------------------------------------------------------------------------

    def teardown(self) -> None:
        if self._torn_down:
            return  # a pasted reproduction tears down in ``finally`` as well
        self._torn_down = True
        self.stats.steps += max(0, len(self.trace) - 1)
        # Torn down while a stop unwinds the test case (Ctrl-C, SIGTERM, the deadline):
        # close what it opened, judge nothing, so no finding here takes the stop's place.
        stopping = not isinstance(sys.exc_info()[1], Exception | None)
        try:
            try:
                peers_closed = self.instances.close_peers()
                closed = self.driver.outcome(self.handler.close)
            finally:
                leaked = self.driver.close()
        finally:
            self.clock.stop()
            if self._saved_zone is not _NO_ZONE:
                restore_zone(self._saved_zone)
                self._saved_zone = _NO_ZONE
        if self.failed or stopping:
            return
        self._checked("closes_cleanly")
        if closed.error is not None:
            self._report(
                P.Finding("closes_cleanly", f"close() raised {closed.describe()}: {closed.error}")
            )
        for worker, peer_closed in peers_closed:
            if peer_closed.error is not None:
                self._report(
                    P.Finding(
                        "closes_cleanly",
                        f"close() of worker {worker}'s instance (a peer on the same store) "
                        f"raised {peer_closed.describe()}: {peer_closed.error}",
                    )
                )
        if leaked:
            self._report(
                P.Finding(
                    "closes_cleanly",
                    f"close() left {len(leaked)} task(s) running: {'; '.join(leaked)[:300]}",
                )
            )
