"""Run one scenario with one seed against one handler factory, and check the history.

The run has two phases: faults are injected until ``faults_until``, then the
world settles (no new faults) until the broker is idle and the store clock
has passed the liveness deadline -- the last faulty acquisition plus lock
duration plus a sweep interval -- by at least one more sweep.  The final
record of every item is read, the history frozen, and the checker run.

A run is judged under a semantics profile (:mod:`dsm_sim.conformance.
semantics`), resolved as ``dsm verify`` resolves it: the one given, else the
one the factory declares (``dsm_semantics``), else the spec's own.  Under a
profile the simulator also leaves out what the library does not have: the
catch-up worker runs only the sweeps it has, and a node's call of an
operation (or a ``set`` of a status) it lacks is refused without reaching the
store, with :class:`~dsm_sim.conformance.judge.semantics.UnsupportedOperationError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import simpy

from dsm_sim.checker import InvariantResult, all_passed, check_history
from dsm_sim.checker.liveness import (
    CRASH_REASON,
    REASONS_META,
    REJECTED_REASON,
    UNSUPPORTED_REASON,
)
from dsm_sim.checker.safety import duplicate_effects
from dsm_sim.collector import frozen_heap
from dsm_sim.conformance.judge.semantics import (
    DSM,
    OPERATIONS,
    SEMANTICS,
    SemanticsProfile,
    resolve_semantics,
)
from dsm_sim.conformance.report import Gap
from dsm_sim.history import (
    MAX_HISTORY_ENTRIES,
    EventKind,
    History,
    HistoryRecorder,
    OpName,
    Outcome,
    Scalar,
)
from dsm_sim.micros import micros_of
from dsm_sim.scenario import Faults, NodeKind, NodeSpec, Scenario
from dsm_sim.simulator.bridge import (
    BillingProxy,
    HandlerProxy,
    RecordingFactory,
    bound_for,
    run_bounded,
)
from dsm_sim.simulator.broker import Broker
from dsm_sim.simulator.catchup import catchup_process, pause_markers
from dsm_sim.simulator.clock import (
    DEFAULT_EPOCH,
    ClockMirror,
    SimClock,
    SkewedClock,
    host_timezone,
)
from dsm_sim.simulator.deploy import Instance, redeployments
from dsm_sim.simulator.dimensions import dimension_gaps
from dsm_sim.simulator.faults import FaultInjector, active_faults, describe, stream
from dsm_sim.simulator.worker import Worker
from dsm_sim.simulator.workload import APP, Delivery, element_of, nodes_of, workload
from dsm_sim.simulator.world import World
from reference_engine.clock import Clock
from reference_engine.config import DataStateMachineConfig, parse_node_settings
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import BaseNodeExecutor
from reference_engine.errors import DsmError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handler import HandlerFactory
from reference_engine.nodes.approval import ApprovalExecutor
from reference_engine.nodes.correction import CorrectionExecutor
from reference_engine.nodes.invoice import InvoiceDispatchExecutor
from reference_engine.nodes.screening import ScreeningExecutor
from reference_engine.record import SETTABLE
from reference_engine.registry import HandlerRegistry, build_handler, load_factory
from reference_engine.status import IdempotencyStatus

__all__ = [
    "BUILDERS",
    "DEFAULT_HANDLER",
    "HistoryNotKeptError",
    "NodeBuilder",
    "RunResult",
    "allowed_dead_letters",
    "invoice_node",
    "replay_command",
    "run_scenario",
]

#: The handler a run uses when none is named.
DEFAULT_HANDLER = "reference_engine.handlers.memory:in_memory_handler"

#: Builds a node from the element, the engine's factory, the business APIs (the side
#: effects the checker counts) and the worker's clock.
NodeBuilder = Callable[[Element, DataStateMachineFactory, BillingProxy, Clock], BaseNodeExecutor]


def invoice_node(
    element: Element, factory: DataStateMachineFactory, apis: BillingProxy, clock: Clock
) -> BaseNodeExecutor:
    return InvoiceDispatchExecutor(element, factory, apis, clock)


def correction_node(
    element: Element, factory: DataStateMachineFactory, apis: BillingProxy, clock: Clock
) -> BaseNodeExecutor:
    return CorrectionExecutor(element, factory, apis)


def screening_node(
    element: Element, factory: DataStateMachineFactory, apis: BillingProxy, clock: Clock
) -> BaseNodeExecutor:
    return ScreeningExecutor(element, factory, apis)


def approval_node(
    element: Element, factory: DataStateMachineFactory, apis: BillingProxy, clock: Clock
) -> BaseNodeExecutor:
    return ApprovalExecutor(element, factory, apis)


#: The node each kind of ``[[nodes]]`` entry runs.
BUILDERS: Mapping[NodeKind, NodeBuilder] = {
    NodeKind.INVOICE: invoice_node,
    NodeKind.CORRECTION: correction_node,
    NodeKind.SCREENING: screening_node,
    NodeKind.APPROVAL: approval_node,
}


def allowed_dead_letters(
    scenario: Scenario, faults: Faults, lost_replies: bool, semantics: SemanticsProfile = DSM
) -> list[str]:
    """The reasons a delivery may fail for the last time, given the faults this run injects.

    Anything else that exhausts a message's deliveries (a handler raising on
    every call, a node bug) is a liveness violation, not bad luck.  Fencing
    and lock refusals follow from any fault that can end a lease early.  A
    library that lacks an operation or a status (``semantics``) fails every
    delivery whose node needs it.
    """
    store = faults.store.rate > 0 or lost_replies
    timing = (
        faults.crash.rate > 0
        or faults.slow.rate > 0
        or bool(faults.clock_jumps)
        or faults.skew.max > 0
        or bool(faults.catchup_pauses)
        or store
    )
    reasons = {
        CRASH_REASON: faults.crash.rate > 0,
        "StoreError": store,
        "BillingError": faults.effect.rate > 0,
        "StaleLockError": timing,
        "LockHeldError": timing,
        REJECTED_REASON: any(
            n.kind in (NodeKind.SCREENING, NodeKind.APPROVAL) for n in nodes_of(scenario)
        ),
        UNSUPPORTED_REASON: not (
            semantics.operations >= OPERATIONS and semantics.settable >= SETTABLE
        ),
    }
    return sorted(reason for reason, on in reasons.items() if on)


class HistoryNotKeptError(DsmError):
    """A report was asked of a run result whose history stayed in the process that ran it.

    ``run_plan(..., keep_history=False)`` sends back verdicts and stats only;
    a caller that writes reports must ask for the history.
    """

    def __init__(self, scenario: str, seed: int) -> None:
        self.scenario, self.seed = scenario, seed
        super().__init__(
            f"{scenario} seed {seed}: its history was left in the process that ran it "
            "(keep_history=False), so no report can be written from this result; "
            "run the plan with keep_history=True to write reports"
        )


def replay_command(
    scenario: Scenario,
    seed: int,
    handler: str,
    semantics: str | None = None,
    waived: tuple[str, ...] = (),
) -> str:
    """The command that replays a run; ``semantics``: the ``--semantics`` it was given, if any;
    ``waived``: the dimensions it waived that the run did not reach."""
    # Every word quoted for the shell: a pasted line must run dsm and nothing else,
    # whatever the scenario's file name or the ``exec:`` handler's command line holds.
    words = ["dsm", "run", scenario.path, "--seed", str(seed), "--handler", handler]
    if semantics is not None:
        words += ["--semantics", semantics]
    for name in waived:
        words += ["--waive", name]
    return shlex.join(words)


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
    #: The semantics profile the run was judged by.
    semantics: SemanticsProfile = DSM
    #: How the profile was named to ``run_scenario`` (``--semantics``), for the replay;
    #: ``None`` when the factory declared it or none was given.
    semantics_option: str | None = None
    #: The dimensions the scenario asked for that the run never reached.
    gaps: tuple[Gap, ...] = ()
    #: The gaps waived by name (``dsm run --waive NAME``): said, not failed.
    waived_gaps: frozenset[str] = frozenset()
    #: False when the run's operations and events stayed in the process that ran it
    #: (:meth:`without_history`): the verdict, stats and violations are all here, but
    #: no report can be written from it.
    history_kept: bool = True

    def without_history(self) -> RunResult:
        """This result with its history's operations, events and final states left out.

        What a worker process or a cluster sends back when the command will
        write no report: the history is most of a result's size (180 KB
        pickled on average over ``scenarios/``, up to about 1 MB), and nothing
        but the reports reads it once the run has been judged.
        """
        kept = History(
            epoch=self.history.epoch,
            lock_duration=self.history.lock_duration,
            sweep_interval=self.history.sweep_interval,
            faults_stop=self.history.faults_stop,
            meta=self.history.meta,
        )
        return dataclasses.replace(self, history=kept, history_kept=False)

    def whole_history(self) -> History:
        """The run's history; a :class:`HistoryNotKeptError` when it was left in its worker."""
        if not self.history_kept:
            raise HistoryNotKeptError(self.scenario.name, self.seed)
        return self.history

    @property
    def not_exercised(self) -> tuple[str, ...]:
        """Every NOT EXERCISED line: a dimension asked for, not reached, not waived."""
        return tuple(gap.render() for gap in self.gaps if gap.name not in self.waived_gaps)

    @property
    def passed(self) -> bool:
        """Every invariant held, and every dimension asked for was reached (or waived)."""
        return all_passed(self.results) and not self.not_exercised

    @property
    def replay(self) -> str:
        return replay_command(
            self.scenario,
            self.seed,
            self.handler,
            self.semantics_option,
            tuple(sorted(self.waived_gaps & {gap.name for gap in self.gaps})),
        )

    @property
    def waived(self) -> list[InvariantResult]:
        """The results the semantics profile waived (neither passed nor failed)."""
        return [r for r in self.results if r.waived is not None]

    @property
    def violated(self) -> list[str]:
        return [r.name for r in self.results if not r.passed]


def run_scenario(
    scenario: Scenario,
    seed: int,
    handler: str | HandlerFactory = DEFAULT_HANDLER,
    *,
    handler_name: str | None = None,
    builders: Mapping[NodeKind, NodeBuilder] | None = None,
    system_clock: bool = False,
    semantics: SemanticsProfile | str | None = None,
) -> RunResult:
    """Simulate ``scenario`` with ``seed``; ``handler`` is a factory or ``"module:factory"``.

    ``builders`` replaces the node built for a kind (a test's own node);
    ``system_clock`` pins the system clock to the store clock for handlers
    that read ``datetime.now`` (``dsm run --clock system``); ``semantics``
    is the profile to judge by (a profile, a name or ``module:ATTRIBUTE``),
    by default the one the factory declares, else the spec's.
    """
    with host_timezone(scenario.host_timezone), frozen_heap():
        return _run(scenario, seed, handler, handler_name, builders, system_clock, semantics)


def _option(semantics: SemanticsProfile | str | None) -> str | None:
    """How the replay names an explicitly given profile (a profile only by its known name)."""
    if semantics is None or isinstance(semantics, str):
        return semantics
    return semantics.name if SEMANTICS.get(semantics.name) == semantics else None


def _run(
    scenario: Scenario,
    seed: int,
    handler: str | HandlerFactory,
    handler_name: str | None,
    builders: Mapping[NodeKind, NodeBuilder] | None,
    system_clock: bool,
    semantics_spec: SemanticsProfile | str | None = None,
) -> RunResult:
    loaded = load_factory(handler) if isinstance(handler, str) else handler
    semantics = resolve_semantics(semantics_spec, loaded)
    factory = _in_simulation(loaded)
    name = handler_name or (handler if isinstance(handler, str) else _qualname(handler))
    env = simpy.Environment()
    clock = SimClock(env, scenario.start_for(seed) or DEFAULT_EPOCH)
    faults = active_faults(scenario, seed)
    injector = FaultInjector(faults, seed, scenario.faults_until, env)
    recorder = HistoryRecorder(
        epoch=clock.epoch,
        lock_duration=scenario.lock_duration,
        sweep_interval=scenario.sweep_interval,
        meta={
            "scenario": scenario.name,
            "seed": seed,
            "handler": name,
            REASONS_META: ",".join(
                allowed_dead_letters(scenario, faults, injector.lost_replies, semantics)
            ),
        },
        store_order=True,
        limit=MAX_HISTORY_ENTRIES,
    )
    loop = asyncio.new_event_loop()
    mirror = ClockMirror(clock, system=system_clock)
    mirror.start()
    try:
        store = build_handler(factory, clock, name=name)
    except BaseException:
        mirror.stop()
        loop.close()
        raise
    world: World | None = None
    #: What stopped the run, if anything: a close that fails after it must not hide it.
    stopped: BaseException | None = None
    try:
        run_bounded(loop, store.open(), "open()", bound_for(store))
        world = World(
            env, scenario, seed, clock, store, loop, recorder, injector, mirror, semantics
        )
        broker = _build(world, scenario, seed, {**BUILDERS, **(builders or {})})
        env.run(until=scenario.faults_until)
        recorder.faults_stop = micros_of(scenario.faults_until)
        world.event(EventKind.FAULTS_STOP, detail="no faults from here on; the run settles")
        _settle(world, broker)
        for key, record in world.probe().items():
            recorder.final_state(
                key,
                "none" if record is None else record.status.value,
                None if record is None else record.attempt,
                world.micros,
                clock.micros(),
            )
        stats = _stats(world, broker)
        held = dict(world.held)
    except BaseException as exc:
        stopped = exc
        raise
    finally:
        try:
            try:
                if world is not None:
                    world.close_instances()  # the workers' own instances first
            finally:
                run_bounded(loop, store.close(), "close()", bound_for(store), final=True)
        except Exception as also:
            if stopped is None:
                raise
            # The first failure is the one to report (a store that refused to open
            # refuses to close too); the close's is a note on it.
            stopped.add_note(f"closing the handler also failed: {type(also).__name__}: {also}")
        finally:
            loop.close()
            mirror.stop()
    history = recorder.freeze(at=micros_of(env.now))
    return RunResult(
        scenario=scenario,
        seed=seed,
        handler=name,
        history=history,
        results=tuple(check_history(history, semantics)),
        stats=stats,
        faults=describe(faults),
        semantics=semantics,
        semantics_option=_option(semantics_spec),
        gaps=dimension_gaps(scenario, seed, history, held),
    )


def _in_simulation(factory: HandlerFactory) -> HandlerFactory:
    """The factory to build the run's handler with: SQLite's run on the loop thread here.

    Results are the same either way (one call runs at a time); see
    :mod:`dsm_sim.simulator.sqlite`.  A SQLite factory has imported the SQL
    factories, so without them nothing needs swapping.
    """
    if "reference_engine.handlers.sql.factory" not in sys.modules:
        return factory
    from dsm_sim.simulator.sqlite import for_simulation

    return for_simulation(factory)


def _qualname(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    return f"{module}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _build(
    world: World, scenario: Scenario, seed: int, builders: Mapping[NodeKind, NodeBuilder]
) -> Broker:
    env = world.env
    registry = HandlerRegistry(world.clock)
    proxy = HandlerProxy()
    registry.register("sim", lambda _clock: proxy)
    factory = RecordingFactory(registry)
    nodes = nodes_of(scenario)
    elements = {node.id: element_of(node) for node in nodes}
    world.node_locks = {node.id: node.lock_duration for node in nodes}
    deliveries = workload(scenario, seed, stream(seed, "arrivals"))
    by_id = {node.id: node for node in reversed(nodes)}  # the first node of an id wins
    configs: dict[str, DataStateMachineConfig | None] = {}  # each node's parsed once
    for _, delivery in deliveries:
        node = by_id[delivery.node]
        world.routes[delivery.message.id] = node.id
        if node.scope == "Thread":
            continue  # keyed by the execution: known once it runs
        element = elements[node.id]
        if node.id not in configs:
            configs[node.id] = parse_node_settings(element.settings)
        config = configs[node.id]
        assert config is not None
        tenant, item, entity_key = delivery.item
        base = factory.base_context(element, ExecutionThread("setup", tenant, APP), config)
        key = world.remember(base.for_item(item, entity_key), node.id)
        world.message_keys[delivery.message.id] = key
        if node.kind is NodeKind.INVOICE:
            world.item_keys[(tenant, item)] = key
    broker = Broker(world)
    instances: list[Instance] = []
    for i, skew in enumerate(world.faults.worker_skews(scenario.workers), start=1):
        name = f"w{i}"
        world.recorder.meta[f"skew_{name}"] = skew
        clock = SkewedClock(world.clock, skew)
        executors = {
            node.id: builders[node.kind](elements[node.id], factory, BillingProxy(), clock)
            for node in nodes
        }
        instances.append(Instance(name, clock, executors))
        for slot in range(1, scenario.items_per_instance(seed) + 1):
            lane = name if slot == 1 else f"{name}.{slot}"
            env.process(Worker(world, broker, lane, executors, factory, name).process())
    if scenario.deployments:

        def build(node: NodeSpec, clock: Clock) -> BaseNodeExecutor:
            return builders[node.kind](element_of(node), factory, BillingProxy(), clock)

        env.process(redeployments(world, instances, build))
    env.process(catchup_process(world))
    env.process(pause_markers(world))
    env.process(_clock_jumps(world))
    env.process(_arrivals(world, broker, deliveries))
    return broker


def _arrivals(
    world: World, broker: Broker, deliveries: list[tuple[float, Delivery]]
) -> Generator[Any, Any, None]:
    for arrival, delivery in deliveries:
        at = world.on_grid(arrival)
        if at > world.now:
            yield world.env.timeout(at - world.now)
        broker.arrive(delivery.message)


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
    last = micros_of(stop)
    starts = [
        op.store_time
        for op in world.recorder.freeze(at=world.micros).ops
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.invoke <= last and op.store_time is not None
    ]
    base = max(starts, default=world.clock.micros())
    lock = scenario.longest_lock
    deadline = base + micros_of(lock + 2 * scenario.sweep_interval)
    cap = stop + 20 * (lock + scenario.sweep_interval + scenario.redelivery_delay)
    while world.now < cap:
        if broker.outstanding == 0 and (world.clock.micros() >= deadline or _all_settled(world)):
            break
        world.env.run(until=world.now + scenario.sweep_interval)


def _all_settled(world: World) -> bool:
    """No record is Processing: no lock is left to expire, so waiting shows nothing more.

    Spares a run whose nodes take long locks from simulating their whole
    duration when every item already reached a terminal state.
    """
    processing = world.known_where(lambda r: r.status is IdempotencyStatus.PROCESSING)
    return all(
        record is None or record.status is not IdempotencyStatus.PROCESSING
        for record in world.probe(processing).values()
    )


def _stats(world: World, broker: Broker) -> dict[str, Scalar]:
    frozen = world.recorder.freeze(at=world.micros)
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
        "duplicate_effects": duplicate_effects(frozen),
        "crashes": crashes,
        "stale_writes_rejected": sum(1 for op in history_ops if op.error == "StaleLockError"),
        "store_errors": sum(1 for op in history_ops if op.error == "StoreError"),
        "unknown_outcomes": sum(1 for op in history_ops if op.outcome is Outcome.INFO),
        "lost_replies_on": world.faults.lost_replies,
        "most_items_held": max(world.held.values(), default=0),
        "sim_seconds": round(world.now, 3),
    }
    for status, count in sorted(finals.items()):
        stats[f"final_{status}"] = count
    return stats
