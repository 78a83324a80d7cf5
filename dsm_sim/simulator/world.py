"""The simulated world: environment, store clock, real handler, recorder and fault injector.

Every handler call made in the simulation goes through :meth:`World.call`, a
SimPy sub-process that records the invocation, waits the sampled latency,
maybe injects a store fault, runs the real call and records its outcome.
Keeping that in one place is what makes the history complete.  A call of an
operation the run's semantics profile says the library lacks is recorded and
refused here, without reaching the store.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile, UnsupportedOperationError
from dsm_sim.history import (
    CallOptions,
    EventKind,
    HistoryRecorder,
    KeyInfo,
    Observed,
    OpName,
    Outcome,
    RecordView,
    Scalar,
    key_of,
)
from dsm_sim.micros import Micros, micros_of
from dsm_sim.scenario import Scenario
from dsm_sim.simulator.bridge import (
    Done,
    HandlerCall,
    RunStoppedError,
    bound_for,
    handler_coroutine,
)
from dsm_sim.simulator.clock import ClockMirror, SimClock
from dsm_sim.simulator.driver import HandlerDriver, in_process
from dsm_sim.simulator.faults import FaultInjector, StoreFault, stream
from dsm_sim.simulator.views import Viewer, digest
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.engine.executor import Message
from reference_engine.errors import DsmError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.instances import peer_of
from reference_engine.record import StateRecord

__all__ = ["CallOutcome", "World"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What a simulated handler call came to: a value or an exception, and whether it crashed."""

    value: Any = None
    error: BaseException | None = None
    crashed: bool = False


class World:
    """Shared state of one run; processes get it instead of globals."""

    def __init__(
        self,
        env: Any,
        scenario: Scenario,
        seed: int,
        clock: SimClock,
        handler: StateHandler,
        loop: asyncio.AbstractEventLoop,
        recorder: HistoryRecorder,
        faults: FaultInjector,
        clock_mirror: ClockMirror | None = None,
        semantics: SemanticsProfile = DSM,
    ) -> None:
        self.env = env
        self.scenario = scenario
        self.seed = seed
        self.clock = clock
        self.handler = handler
        self.loop = loop
        #: Real seconds one handler call may take (``dsm run --call-timeout``).
        self.call_bound = bound_for(handler)
        #: Runs every handler coroutine of the run (see :mod:`dsm_sim.simulator.driver`).
        self.driver = HandlerDriver(loop, self.call_bound, direct=in_process(handler))
        self.recorder = recorder
        self.faults = faults
        #: Moves a frozen system clock along with the store clock (``--clock system``).
        self.clock_mirror = clock_mirror or ClockMirror(clock)
        self.latency_rng: random.Random = stream(seed, "latency")
        #: key string -> a context for reading the item (no token); filled as items are seen.
        self.contexts: dict[str, StateHandlerContext] = {}
        #: (tenant, item key) -> history key of the invoice node's record.
        self.item_keys: dict[tuple[str, str], str] = {}
        #: message id -> the node it is delivered to, and the key it is mainly about.
        self.routes: dict[str, str] = {}
        self.message_keys: dict[str, str] = {}
        #: node id -> its lock duration (seconds).
        self.node_locks: dict[str, float] = {}
        self.charges = 0
        #: The last record read per key (around every call and sweep): every write the
        #: store makes goes through a call or a sweep the simulator reads around.
        self.known: dict[str, StateRecord | None] = {}
        #: key -> the node options its :class:`KeyInfo` was made from.
        self._configs: dict[str, HandlerConfig] = {}
        #: Turns what the reads around calls return into the checker's views.
        self.viewer = Viewer(clock.epoch)
        #: Keys some worker wrote to: the only ones a sweep can change.
        self.touched: set[str] = set()
        #: In-process handlers (no real I/O) get each internal ``await`` turned into a
        #: round trip of simulated latency, so races inside a call interleave with
        #: other workers; handlers doing real I/O run each call in one step.
        self.split_round_trips = isinstance(handler, InMemoryStateHandler)
        #: process -> the handler instance it calls through (see :meth:`handler_for`).
        self.instances: dict[str, StateHandler] = {}
        #: The library's semantics: which operations exist, which sweeps run.
        self.semantics = semantics
        #: id of a handler instance -> calls inside it now; instances replaced while a
        #: call was inside them, closed when the last one ends.
        self._busy: dict[int, int] = {}
        self._retired: list[StateHandler] = []
        #: The dimensions the run reached (see :mod:`dsm_sim.simulator.dimensions`).
        self.reached: set[str] = set()
        #: Most calls one worker instance held at once, per instance name.
        self.held: dict[str, int] = {}
        self._holding: dict[str, int] = {}

    @property
    def now(self) -> float:
        """Simulated seconds since the run began (SimPy's ``env.now``)."""
        return float(self.env.now)

    @property
    def micros(self) -> Micros:
        """:attr:`now` as the history records it: microseconds since the epoch."""
        return micros_of(self.env.now)

    def latency(self, mean: float) -> float:
        jitter = self.scenario.latency.jitter
        sample = mean * self.latency_rng.uniform(1.0 - jitter, 1.0 + jitter)
        grid = self.scenario.latency.grid
        return self.on_grid(sample, at_least=grid) if grid > 0 else round(sample, 6)

    def on_grid(self, seconds: float, *, at_least: float = 0.0) -> float:
        """``seconds`` rounded to the scenario's time grid (unchanged without one)."""
        grid = self.scenario.latency.grid
        if grid <= 0:
            return seconds
        return round(max(at_least, round(seconds / grid) * grid), 6)

    def key_for(self, tenant: str, item: str) -> str:
        return self.item_keys.get((tenant, item), "")

    def route(self, message: Message) -> str:
        """The node a message is delivered to (the only node, if the workflow has one)."""
        if message.id in self.routes:
            return self.routes[message.id]
        return next(iter(self.node_locks))

    def lock_duration_of(self, node: str) -> float:
        return self.node_locks.get(node, self.scenario.lock_duration)

    def remember(self, ctx: StateHandlerContext, node: str = "") -> str:
        if not ctx.item_key:
            key_of(ctx.record_key)  # raises: a context without an item has no record
        key = key_of(ctx)  # the record key's parts, without building one on every call
        if key not in self.contexts:
            self.contexts[key] = ctx.for_item(ctx.item_key, ctx.item_entity_key)
            config = ctx.handler_config
            retention = config.retention
            info = KeyInfo(
                node=node,
                tenant=ctx.tenant_id,
                scope=ctx.scope_id,
                entity=ctx.entity_id,
                item_entity_key=ctx.item_entity_key,
                item=ctx.item_key,
                lock_duration=config.lock_duration.total_seconds(),
                retention=None if retention is None else retention.total_seconds(),
            )
            self.recorder.key_info(key, info)
            if self.recorder.keys_info.get(key) is info:
                self._configs[key] = config
        return key

    def call(
        self,
        process: str,
        call: HandlerCall,
        *,
        crash_after: bool = False,
        node: str = "",
        instance: str = "",
    ) -> Generator[Any, Any, CallOutcome]:
        """Record, wait, (maybe) fail, run, record.  ``crash_after``: die once it returned.

        Right before and right after the store runs the call, at the same
        instant, the key is read outside the history (no latency, no faults),
        so the checker can judge each call against the reference model.
        ``instance``: the worker instance whose handler the call goes through
        (default: one of the process' own); several lanes of a worker that
        holds several items at once share it.
        """
        ctx = call.ctx
        key = self.remember(ctx, node)
        options = self._options(key, ctx)
        if call.op.is_write:
            self.touched.add(key)
        rec = self.recorder
        index = rec.invoke(
            process,
            call.op,
            key,
            self.micros,
            token=ctx.lock_token,
            status=None if call.status is None else call.status.value,
            execution=ctx.entity_execution_id,
            detail=call.error_detail if call.op is OpName.RELEASE_LOCK_AS_FAILED else None,
            app=ctx.source_app_id,
            options=options,
        )
        refused = self.unsupported(call)
        if refused is not None:
            # Never sent: the library has no such call, so there is no store round trip.
            rec.complete(index, Outcome.FAIL, self.micros, error=type(refused).__name__)
            return CallOutcome(error=refused)
        yield self.env.timeout(self.latency(self.scenario.latency.store))
        fault = self.faults.store_fault()
        if fault is StoreFault.BEFORE:
            rec.complete(
                index, Outcome.FAIL, self.micros, error="StoreError", store_time=self.clock.micros()
            )
            return CallOutcome(error=StoreError(f"injected store error before {call.op.value}"))
        if crash_after and not self.faults.apply_during_set():
            rec.complete(index, Outcome.INFO, self.micros, error="Crash")
            return CallOutcome(crashed=True)
        observe = call.op is not OpName.GET  # a get is itself the read
        mine = self.handler_for(instance or process)
        before = self.view(key, mine) if observe else None
        written = digest(call.data) if call.op in (OpName.SET, OpName.UPSERT) else None
        coro = handler_coroutine(mine, call)
        legs = 0
        self._busy[id(mine)] = self._busy.get(id(mine), 0) + 1
        try:
            try:
                while True:
                    store_time = self.clock.micros()
                    self.clock_mirror.follow()
                    legs += 1
                    leg = self.driver.leg(coro, split=self.split_round_trips)
                    if isinstance(leg, Done):
                        value = leg.value
                        break
                    # The handler made a round trip to its store: other workers run meanwhile.
                    yield self.env.timeout(self.latency(self.scenario.latency.store))
            except RunStoppedError:
                raise  # stops the run: every later call would wait out the bound again
            except DsmError as exc:
                seen = self._observe(observe and legs == 1, key, before, written, mine)
                outcome = Outcome.INFO if isinstance(exc, StoreError) else Outcome.FAIL
                error = type(exc).__name__
                rec.complete(
                    index, outcome, self.micros, error=error, store_time=store_time, observed=seen
                )
                return CallOutcome(error=exc)
            except Exception as exc:  # a broken third-party handler: outcome unknown
                seen = self._observe(observe and legs == 1, key, before, written, mine)
                error = type(exc).__name__
                rec.complete(
                    index,
                    Outcome.INFO,
                    self.micros,
                    error=error,
                    store_time=store_time,
                    observed=seen,
                )
                return CallOutcome(error=exc)
            seen = self._observe(observe and legs == 1, key, before, written, mine)
            if crash_after:
                rec.complete(
                    index,
                    Outcome.INFO,
                    self.micros,
                    error="Crash",
                    store_time=store_time,
                    observed=seen,
                )
                return CallOutcome(crashed=True)
            if fault is StoreFault.AFTER or (call.op.is_write and self.faults.lost_reply()):
                rec.complete(
                    index,
                    Outcome.INFO,
                    self.micros,
                    error="StoreError",
                    store_time=store_time,
                    observed=seen,
                )
                return CallOutcome(error=StoreError(f"injected store error after {call.op.value}"))
            token = value if call.op is OpName.TRY_ACQUIRE_LOCK and isinstance(value, int) else None
            rec.complete(
                index,
                Outcome.OK,
                self.micros,
                result=_scalar(value),
                store_time=store_time,
                token=token,
                observed=seen,
            )
            return CallOutcome(value=value)
        finally:
            self._release(mine)

    def unsupported(self, call: HandlerCall) -> UnsupportedOperationError | None:
        """The refusal of a call the library does not have (its profile's operations and statuses)."""
        semantics = self.semantics
        if semantics.strict:
            return None
        operation = call.op.value
        if semantics.supports(operation) and (
            call.op is not OpName.SET or call.status is None or semantics.can_set(call.status)
        ):
            return None
        if call.op is OpName.SET and call.status is not None:
            operation = f"set({call.status.label})"
        settable = ", ".join(sorted(f"set({s.label})" for s in semantics.settable))
        others = sorted(semantics.operations - {"set"})
        return UnsupportedOperationError(
            library=f"{semantics.name} (its semantics profile)",
            operation=operation,
            supported=", ".join([*others, settable] if "set" in semantics.operations else others),
        )

    def _options(self, key: str, ctx: StateHandlerContext) -> CallOptions | None:
        """The call's node options when they are not its key's (a node redeployed mid-run)."""
        config = ctx.handler_config
        made_from = self._configs.get(key)
        if made_from is not None and (made_from is config or made_from == config):
            return None  # the options the key's info was made from (each worker parses its own)
        info = self.recorder.keys_info.get(key)
        lock = config.lock_duration.total_seconds()
        retention = None if config.retention is None else config.retention.total_seconds()
        if info is None or (info.lock_duration == lock and info.retention == retention):
            return None
        return CallOptions(lock, retention)

    def _release(self, mine: StateHandler) -> None:
        """A call through ``mine`` ended; a retired instance closes once no call is in it."""
        left = self._busy.pop(id(mine), 1) - 1
        if left:
            self._busy[id(mine)] = left
        elif self._retired and any(old is mine for old in self._retired):
            self._retired = [old for old in self._retired if old is not mine]
            self.driver.complete(mine.close(), "close()")

    def hold(self, instance: str, change: int) -> None:
        """An instance took (+1) or let go of (-1) an item; remembers the most it held at once."""
        holding = self._holding.get(instance, 0) + change
        self._holding[instance] = holding
        if holding > self.held.get(instance, 0):
            self.held[instance] = holding

    def handler_for(self, process: str) -> StateHandler:
        """The worker's own handler instance on the run's store, opened on first use.

        Production runs each worker in its own process with its own handler:
        its own connections, caches and in-process locks.  A handler that can
        open another instance on its store (``peer()``) gives every worker
        one, so an instance's lock or cache cannot hide a race between
        workers; without ``peer()`` every worker shares the run's handler.
        The reads around a call go through the caller's instance (what its
        node sees); sweeps and the final reads go through the run's handler.
        """
        mine = self.instances.get(process)
        if mine is not None:
            return mine
        twin = peer_of(self.handler)
        if twin is None:
            mine = self.handler
        else:
            self._stopping_on_protocol_errors(twin.open(), "open()")
            mine = twin
        self.instances[process] = mine
        return mine

    def restart(self, process: str) -> None:
        """A worker restarted: its own instance is closed, the next call opens a new one.

        The new instance opens on the populated store, as a restarted process
        does, so a handler whose ``open`` or ``close`` changes records is
        caught by the calls that follow.  A shared run handler stays open.
        An instance another item's call is still inside (a worker holding
        several items, or redeployed) is closed when that call ends.
        """
        mine = self.instances.pop(process, None)
        if mine is None or mine is self.handler:
            return
        if self._busy.get(id(mine)):
            self._retired.append(mine)
        else:
            self.driver.complete(mine.close(), "close()")

    def close_instances(self) -> None:
        """Close every worker's own instance (before the run's handler is closed)."""
        retired, self._retired = self._retired, []
        for old in retired:
            self.driver.complete(old.close(), "close()", final=True)
        for process in sorted(self.instances):
            mine = self.instances.pop(process)
            if mine is not self.handler:
                self.driver.complete(mine.close(), "close()", final=True)

    def _observe(
        self,
        observe: bool,
        key: str,
        before: RecordView | None,
        written: str | None,
        handler: StateHandler | None = None,
    ) -> Observed | None:
        after = self.view(key, handler)  # read even when not recorded: it keeps ``known`` current
        # A call that took several round trips interleaved with other workers:
        # what was read before it is no longer its starting point.
        return Observed(before, after, written) if observe else None

    def view(self, key: str, handler: StateHandler | None = None) -> RecordView | None:
        """The key's record as the checker sees it, read now outside the history.

        ``handler``: the instance to read through (a worker's own, around its
        call: what that worker's instance returns is what its node sees).
        """
        self.clock_mirror.follow()
        record = self._reading((handler or self.handler).get(self.contexts[key]))
        self.known[key] = record
        return self.viewer.view(key, record)

    def probe(
        self, keys: Iterable[str] | None = None, through: StateHandler | None = None
    ) -> dict[str, StateRecord | None]:
        """Read keys now (default: every known key), outside the history: no latency, no faults.

        What is read is remembered in :attr:`known`, the last record seen per
        key.  ``through``: the instance to read with (default: the run's).
        """
        chosen = sorted(self.contexts) if keys is None else sorted(keys)
        self.clock_mirror.follow()
        handler, contexts = through or self.handler, self.contexts

        async def read() -> dict[str, StateRecord | None]:
            return {key: await handler.get(contexts[key]) for key in chosen}

        found = self._reading(read()) if chosen else {}
        self.known.update(found)
        return found

    def _reading(self, reads: Coroutine[Any, Any, T]) -> T:
        """Run a probe's reads; a handler process that broke the protocol stops the run."""
        return self._stopping_on_protocol_errors(reads, "get()")

    def _stopping_on_protocol_errors(self, call: Coroutine[Any, Any, T], what: str) -> T:
        """Run ``call`` to its end; a handler process that broke the protocol stops the run.

        For the calls the world makes itself (read-backs, a worker's peer opening
        on the run's store), outside the workers' own error handling.
        """
        try:
            return self.driver.complete(call, what)
        except DsmError as exc:
            # Imported here: the protocol package is not needed by in-process runs.
            from dsm_sim.protocol.errors import ProtocolError

            if not isinstance(exc, ProtocolError):
                raise
            # A handler process that broke the protocol answers nothing from here on, so
            # the run stops, as one ProtocolError that says so and keeps the original
            # as its cause.
            raise ProtocolError(
                f"the handler broke the protocol, so the run stopped: {type(exc).__name__}: {exc}",
                request=exc.request,
            ) from exc

    def known_where(self, test: Callable[[StateRecord], bool]) -> list[str]:
        """Keys whose last record seen passes ``test``: what a sweep can have to do with."""
        return sorted(k for k, r in self.known.items() if r is not None and test(r))

    def event(self, kind: EventKind, **fields: Any) -> None:
        self.recorder.event(kind, self.micros, **fields)


def _scalar(value: Any) -> Scalar:
    if isinstance(value, StateRecord):
        return value.status.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)
