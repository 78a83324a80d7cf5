"""Run one scenario with one seed against one handler factory, and check the history.

The run has two phases: faults are injected until ``faults_until``, then the
world settles (no new faults) until the broker is idle and the store clock
has passed the liveness deadline -- the last faulty acquisition plus lock
duration plus a sweep interval -- by at least one more sweep.  The final
record of every item is read, the history frozen, and the checker run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import simpy

from dsm_sim.checker import InvariantResult, all_passed, check_history
from dsm_sim.history import EventKind, History, HistoryRecorder, OpName, Outcome, Scalar, key_of
from dsm_sim.scenario import Scenario
from dsm_sim.simulator.bridge import BillingProxy, HandlerProxy, RecordingFactory
from dsm_sim.simulator.broker import Broker
from dsm_sim.simulator.catchup import catchup_process, pause_markers
from dsm_sim.simulator.clock import SimClock, SkewedClock
from dsm_sim.simulator.faults import FaultInjector, active_faults, describe, stream
from dsm_sim.simulator.worker import Worker
from dsm_sim.simulator.world import World
from reference_engine.clock import Clock
from reference_engine.config import parse_node_settings
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import BaseNodeExecutor, Message
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handler import HandlerFactory
from reference_engine.nodes.invoice import BillingApi, InvoiceDispatchExecutor
from reference_engine.registry import HandlerRegistry, load_factory

__all__ = [
    "DEFAULT_HANDLER",
    "NodeBuilder",
    "RunResult",
    "invoice_node",
    "replay_command",
    "run_scenario",
]

#: The handler a run uses when none is named.
DEFAULT_HANDLER = "reference_engine.handlers.memory:in_memory_handler"
APP = "app-1"

#: Builds the node under test from the element, the engine's factory, the billing API
#: (the side effect the checker counts) and the worker's clock.
NodeBuilder = Callable[[Element, DataStateMachineFactory, BillingApi, Clock], BaseNodeExecutor]


def invoice_node(
    element: Element, factory: DataStateMachineFactory, billing: BillingApi, clock: Clock
) -> BaseNodeExecutor:
    return InvoiceDispatchExecutor(element, factory, billing, clock)


def replay_command(scenario: Scenario, seed: int, handler: str) -> str:
    return f"dsm run {scenario.path} --seed {seed} --handler {handler}"


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished, checked run."""

    scenario: Scenario
    seed: int
    handler: str
    history: History
    results: tuple[InvariantResult, ...]
    stats: Mapping[str, Scalar]
    faults: Mapping[str, Scalar]

    @property
    def passed(self) -> bool:
        return all_passed(self.results)

    @property
    def replay(self) -> str:
        return replay_command(self.scenario, self.seed, self.handler)

    @property
    def violated(self) -> list[str]:
        return [r.name for r in self.results if not r.passed]


def _element(scenario: Scenario) -> Element:
    settings = {
        "dataStateMachine": {
            "handler": "sim",
            "scope": "Element",
            "options": {"lockDuration": scenario.lock_duration, "retention": "30d"},
        }
    }
    return Element(
        id="invoice-dispatch-1",
        workflow_id="billing",
        node_type="invoice-dispatch",
        settings=settings,
    )


def run_scenario(
    scenario: Scenario,
    seed: int,
    handler: str | HandlerFactory = DEFAULT_HANDLER,
    *,
    handler_name: str | None = None,
    node: NodeBuilder = invoice_node,
) -> RunResult:
    """Simulate ``scenario`` with ``seed``; ``handler`` is a factory or ``"module:factory"``."""
    factory = load_factory(handler) if isinstance(handler, str) else handler
    name = handler_name or (handler if isinstance(handler, str) else _qualname(handler))
    env = simpy.Environment()
    clock = SimClock(env)
    faults = active_faults(scenario, seed)
    injector = FaultInjector(faults, seed, scenario.faults_until, env)
    recorder = HistoryRecorder(
        epoch=clock.epoch,
        lock_duration=scenario.lock_duration,
        sweep_interval=scenario.sweep_interval,
        meta={"scenario": scenario.name, "seed": seed, "handler": name},
    )
    loop = asyncio.new_event_loop()
    store = factory(clock)
    try:
        loop.run_until_complete(store.open())
        world = World(env, scenario, seed, clock, store, loop, recorder, injector)
        broker = _build(world, scenario, seed, node)
        env.run(until=scenario.faults_until)
        recorder.faults_stop = scenario.faults_until
        world.event(EventKind.FAULTS_STOP, detail="no faults from here on; the run settles")
        _settle(world, broker)
        for key, record in world.probe().items():
            recorder.final_state(
                key,
                "none" if record is None else record.status.value,
                None if record is None else record.attempt,
                world.now,
                clock.seconds(),
            )
        stats = _stats(world, broker)
    finally:
        try:
            loop.run_until_complete(store.close())
        finally:
            loop.close()
    history = recorder.freeze(at=float(env.now))
    return RunResult(
        scenario=scenario,
        seed=seed,
        handler=name,
        history=history,
        results=tuple(check_history(history)),
        stats=stats,
        faults=describe(faults),
    )


def _qualname(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    return f"{module}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _build(world: World, scenario: Scenario, seed: int, node: NodeBuilder) -> Broker:
    env = world.env
    registry = HandlerRegistry(world.clock)
    proxy = HandlerProxy()
    registry.register("sim", lambda _clock: proxy)
    factory = RecordingFactory(registry)
    element = _element(scenario)
    config = parse_node_settings(element.settings)
    assert config is not None
    # Tenants share invoice numbers, so a store that drops the tenant from its key collides.
    items = [
        (f"tenant-{i % scenario.tenants + 1}", f"inv-{i // scenario.tenants + 1:04d}")
        for i in range(scenario.items)
    ]
    for tenant, item in items:
        base = factory.base_context(element, ExecutionThread("setup", tenant, APP), config)
        ctx = base.for_item(item)
        key = key_of(ctx.record_key)
        world.contexts[key] = ctx
        world.item_keys[(tenant, item)] = key
    broker = Broker(world)
    for i, skew in enumerate(world.faults.worker_skews(scenario.workers), start=1):
        name = f"w{i}"
        world.recorder.meta[f"skew_{name}"] = skew
        executor = node(element, factory, BillingProxy(), SkewedClock(world.clock, skew))
        env.process(Worker(world, broker, name, executor, factory).process())
    env.process(catchup_process(world))
    env.process(pause_markers(world))
    env.process(_clock_jumps(world))
    rng = stream(seed, "arrivals")
    arrivals = sorted((round(rng.uniform(0, scenario.arrival_window), 6), item) for item in items)
    env.process(_arrivals(world, broker, arrivals))
    return broker


def _arrivals(
    world: World, broker: Broker, arrivals: list[tuple[float, tuple[str, str]]]
) -> Generator[Any, Any, None]:
    for n, (at, (tenant, item)) in enumerate(arrivals, start=1):
        if at > world.now:
            yield world.env.timeout(at - world.now)
        payload = {"invoiceId": item, "amount": 100 * n}
        broker.arrive(
            Message(id=f"msg-{tenant}-{item}", payload=payload, tenant_id=tenant, source_app_id=APP)
        )


def _clock_jumps(world: World) -> Generator[Any, Any, None]:
    for jump in world.faults.clock_jumps():
        if jump.at > world.now:
            yield world.env.timeout(jump.at - world.now)
        world.clock.jump(jump.by)
        world.event(
            EventKind.CLOCK_JUMP,
            process="clock",
            detail=f"store clock {jump.by:+g}s",
            value=jump.by,
        )


def _settle(world: World, broker: Broker) -> None:
    scenario = world.scenario
    stop = scenario.faults_until
    starts = [
        op.store_time
        for op in world.recorder.freeze(at=world.now).ops
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.invoke <= stop and op.store_time is not None
    ]
    base = max(starts, default=world.clock.seconds())
    deadline = base + scenario.lock_duration + 2 * scenario.sweep_interval
    cap = stop + 20 * (scenario.lock_duration + scenario.sweep_interval + scenario.redelivery_delay)
    while world.now < cap:
        if broker.outstanding == 0 and world.clock.seconds() >= deadline:
            break
        world.env.run(until=world.now + scenario.sweep_interval)


def _stats(world: World, broker: Broker) -> dict[str, Scalar]:
    frozen = world.recorder.freeze(at=world.now)
    history_ops = frozen.ops
    crashes = sum(1 for ev in frozen.events if ev.kind is EventKind.CRASH)
    finals = Counter(
        "none" if record is None else record.status.value for record in world.probe().values()
    )
    stats: dict[str, Scalar] = {
        "items": world.scenario.items,
        "deliveries": broker.deliveries,
        "dead_letters": len(broker.dead_letters),
        "operations": len(history_ops),
        "side_effects": world.charges,
        "crashes": crashes,
        "stale_writes_rejected": sum(1 for op in history_ops if op.error == "StaleLockError"),
        "store_errors": sum(1 for op in history_ops if op.error == "StoreError"),
        "unknown_outcomes": sum(1 for op in history_ops if op.outcome is Outcome.INFO),
        "sim_seconds": round(world.now, 3),
    }
    for status, count in sorted(finals.items()):
        stats[f"final_{status}"] = count
    return stats
