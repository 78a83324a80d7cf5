"""The simulated world: environment, store clock, real handler, recorder and fault injector.

Every handler call made in the simulation goes through :meth:`World.call`, a
SimPy sub-process that records the invocation, waits the sampled latency,
maybe injects a store fault, runs the real call and records its outcome.
Keeping that in one place is what makes the history complete.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

from dsm_sim.history import EventKind, HistoryRecorder, OpName, Outcome, Scalar, key_of
from dsm_sim.scenario import Scenario
from dsm_sim.simulator.bridge import Done, HandlerCall, advance, handler_coroutine
from dsm_sim.simulator.clock import SimClock
from dsm_sim.simulator.faults import FaultInjector, StoreFault, stream
from reference_engine.context import StateHandlerContext
from reference_engine.errors import DsmError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord

__all__ = ["CallOutcome", "World"]


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
    ) -> None:
        self.env = env
        self.scenario = scenario
        self.seed = seed
        self.clock = clock
        self.handler = handler
        self.loop = loop
        self.recorder = recorder
        self.faults = faults
        self.latency_rng: random.Random = stream(seed, "latency")
        #: key string -> a context for reading the item (no token); filled as items are seen.
        self.contexts: dict[str, StateHandlerContext] = {}
        #: (tenant, item key) -> history key.
        self.item_keys: dict[tuple[str, str], str] = {}
        self.charges = 0
        #: Keys some worker tried to lock: the only ones a sweep can find Processing.
        self.touched: set[str] = set()
        #: In-process handlers (no real I/O) get each internal ``await`` turned into a
        #: round trip of simulated latency, so races inside a call interleave with
        #: other workers; handlers doing real I/O run each call in one step.
        self.split_round_trips = isinstance(handler, InMemoryStateHandler)

    @property
    def now(self) -> float:
        return float(self.env.now)

    def latency(self, mean: float) -> float:
        jitter = self.scenario.latency.jitter
        return round(mean * self.latency_rng.uniform(1.0 - jitter, 1.0 + jitter), 6)

    def key_for(self, tenant: str, item: str) -> str:
        return self.item_keys.get((tenant, item), "")

    def remember(self, ctx: StateHandlerContext) -> str:
        key = key_of(ctx.record_key)
        if key not in self.contexts:
            self.contexts[key] = ctx.for_item(ctx.item_key, ctx.item_entity_key)
        return key

    def call(
        self,
        process: str,
        call: HandlerCall,
        *,
        crash_after: bool = False,
    ) -> Generator[Any, Any, CallOutcome]:
        """Record, wait, (maybe) fail, run, record.  ``crash_after``: die once it returned."""
        ctx = call.ctx
        key = self.remember(ctx)
        if call.op is OpName.TRY_ACQUIRE_LOCK:
            self.touched.add(key)
        rec = self.recorder
        index = rec.invoke(
            process,
            call.op,
            key,
            self.now,
            token=ctx.lock_token,
            status=None if call.status is None else call.status.value,
            execution=ctx.entity_execution_id,
        )
        yield self.env.timeout(self.latency(self.scenario.latency.store))
        fault = self.faults.store_fault()
        if fault is StoreFault.BEFORE:
            rec.complete(
                index, Outcome.FAIL, self.now, error="StoreError", store_time=self.clock.seconds()
            )
            return CallOutcome(error=StoreError(f"injected store error before {call.op.value}"))
        if crash_after and not self.faults.apply_during_set():
            rec.complete(index, Outcome.INFO, self.now, error="Crash")
            return CallOutcome(crashed=True)
        coro = handler_coroutine(self.handler, call)
        try:
            while True:
                store_time = self.clock.seconds()
                leg = advance(self.loop, coro, split=self.split_round_trips)
                if isinstance(leg, Done):
                    value = leg.value
                    break
                # The handler made a round trip to its store: other workers run meanwhile.
                yield self.env.timeout(self.latency(self.scenario.latency.store))
        except DsmError as exc:
            outcome = Outcome.INFO if isinstance(exc, StoreError) else Outcome.FAIL
            rec.complete(index, outcome, self.now, error=type(exc).__name__, store_time=store_time)
            return CallOutcome(error=exc)
        except Exception as exc:  # a broken third-party handler: outcome unknown
            rec.complete(
                index, Outcome.INFO, self.now, error=type(exc).__name__, store_time=store_time
            )
            return CallOutcome(error=exc)
        if crash_after:
            rec.complete(index, Outcome.INFO, self.now, error="Crash", store_time=store_time)
            return CallOutcome(crashed=True)
        if fault is StoreFault.AFTER:
            rec.complete(index, Outcome.INFO, self.now, error="StoreError", store_time=store_time)
            return CallOutcome(error=StoreError(f"injected store error after {call.op.value}"))
        token = value if call.op is OpName.TRY_ACQUIRE_LOCK and isinstance(value, int) else None
        rec.complete(
            index,
            Outcome.OK,
            self.now,
            result=_scalar(value),
            store_time=store_time,
            token=token,
        )
        return CallOutcome(value=value)

    def probe(self, keys: Iterable[str] | None = None) -> dict[str, StateRecord | None]:
        """Read keys now (default: every known key), outside the history: no latency, no faults."""
        chosen = sorted(self.contexts) if keys is None else sorted(keys)
        return {
            key: self.loop.run_until_complete(self.handler.get(self.contexts[key]))
            for key in chosen
        }

    def event(self, kind: EventKind, **fields: Any) -> None:
        self.recorder.event(kind, self.now, **fields)


def _scalar(value: Any) -> Scalar:
    if isinstance(value, StateRecord):
        return value.status.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)
