"""A worker: takes messages from the broker and runs the real node executor on each.

The node's coroutine is driven by hand (see :mod:`dsm_sim.simulator.bridge`);
every request it makes becomes a recorded, latency-delayed call.  A crash is
decided per execution at one of the crash points: the coroutine is closed,
its fencing tokens vanish with it, the message is not acknowledged, and the
worker restarts after a delay.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator, Mapping
from typing import Any

from dsm_sim.checker.leases import HOLDER_WRITES
from dsm_sim.checker.liveness import CRASH_REASON, REJECTED_REASON
from dsm_sim.history import EventKind, OpName, key_of
from dsm_sim.scenario import CrashPoint
from dsm_sim.simulator.bridge import Done, EffectCall, HandlerCall, RecordingFactory, Request, step
from dsm_sim.simulator.broker import Broker, Settlement
from dsm_sim.simulator.faults import ExecutionPlan
from dsm_sim.simulator.world import World
from reference_engine.engine.definitions import ExecutionThread
from reference_engine.engine.executor import (
    BaseNodeExecutor,
    Message,
    NodeExecutionResult,
    NodeOutcome,
)
from reference_engine.nodes.invoice import BillingError

__all__ = ["Worker", "failure_reason"]


def failure_reason(result: NodeExecutionResult) -> str:
    """The exception class a failed node run reported, or :data:`REJECTED_REASON`.

    An exception escaping a node becomes ``"Name: message"``; a node that
    fails on purpose returns its own text, which is a business rejection.
    """
    text = result.error or result.reason or ""
    name = text.split(":", 1)[0].strip()
    return name if ":" in text and name.isidentifier() else REJECTED_REASON


class Worker:
    """One lane of a worker process; ``name`` is its lane in the report.

    A worker instance that holds several items at once (``run.instance_items``)
    runs one lane per item, named ``w1``, ``w1.2``, ...: each takes its own
    messages, all share the instance's executors and handler instance
    (``instance``).
    """

    def __init__(
        self,
        world: World,
        broker: Broker,
        name: str,
        executors: Mapping[str, BaseNodeExecutor],
        factory: RecordingFactory,
        instance: str = "",
    ) -> None:
        self.world = world
        self.broker = broker
        self.name = name
        #: The worker instance this lane belongs to (its handler instance's name).
        self.instance = instance or name
        #: node id -> this worker's executor of that node (replaced by a redeployment)
        self.executors = executors
        self.factory = factory
        self.executions = 0
        self.crashes = 0

    def process(self) -> Generator[Any, Any, None]:
        env = self.world.env
        while True:
            message = yield self.broker.queue.get()
            self.executions += 1
            execution = f"{self.name}-x{self.executions:03d}"
            plan = self.world.faults.execution_plan()
            self.world.hold(self.instance, +1)
            try:
                how, reason = yield from self._execute(message, execution, plan)
            finally:
                self.world.hold(self.instance, -1)
            self.factory.forget(execution)
            self.broker.settle(message, how, reason)
            if how == Settlement.CRASH:
                self.world.restart(self.instance)  # a new process opens a new handler
                yield env.timeout(self.world.scenario.faults.crash.restart_delay)

    def _execute(
        self, message: Message, execution: str, plan: ExecutionPlan
    ) -> Generator[Any, Any, tuple[str, str]]:
        """Run one delivery; the settlement and, for a failed one, the error class that ended it.

        The reason travels to the broker so a dead letter says why, which is
        what lets the checker tell an injected fault from a handler that fails
        every call.
        """
        thread = ExecutionThread(
            execution_id=execution,
            tenant_id=message.tenant_id,
            source_app_id=message.source_app_id,
            message_id=message.id,
        )
        node = self.world.route(message)
        executor = self.executors[node]
        coro = executor.run(thread, message)
        request: Request | Done = step(coro)
        effect_done = False
        #: The item this execution touched last, and the one it locked last (with the token).
        touched: HandlerCall | None = None
        locked: tuple[HandlerCall, int] | None = None
        while not isinstance(request, Done):
            if self._crash_now(plan, request, effect_done):
                self._crash(coro, execution, plan, touched)
                return Settlement.CRASH, CRASH_REASON
            if isinstance(request, HandlerCall):
                touched = request
                crash_after = plan.crash is CrashPoint.DURING_SET and request.op is OpName.SET
                outcome = yield from self.world.call(
                    self.name, request, crash_after=crash_after, node=node, instance=self.instance
                )
                if outcome.crashed:
                    self._crash(coro, execution, plan, touched)
                    return Settlement.CRASH, CRASH_REASON
                if request.op is OpName.TRY_ACQUIRE_LOCK and isinstance(outcome.value, int):
                    locked = (request, outcome.value)
                request = step(coro, outcome.value, outcome.error)
            elif plan.effect_fails:
                yield self.world.env.timeout(self.world.latency(self.world.scenario.latency.effect))
                error = BillingError(f"{request.action} of {request.item_key} refused")
                request = step(coro, None, error)
            else:
                response = yield from self._effect(request, node, execution, plan, locked)
                effect_done = True
                request = step(coro, response)
        result = request.value
        if isinstance(result, NodeExecutionResult) and result.outcome is NodeOutcome.FAILURE:
            return Settlement.RETRY, failure_reason(result)
        return Settlement.ACK, ""

    @staticmethod
    def _crash_now(plan: ExecutionPlan, request: Request, effect_done: bool) -> bool:
        if plan.crash is None:
            return False  # most executions: asked before every request
        match plan.crash:
            case CrashPoint.BEFORE_ACQUIRE:
                return isinstance(request, HandlerCall) and request.op is OpName.TRY_ACQUIRE_LOCK
            case CrashPoint.AFTER_ACQUIRE:
                return isinstance(request, EffectCall)
            case CrashPoint.AFTER_EFFECT:
                return (
                    effect_done and isinstance(request, HandlerCall) and request.op in HOLDER_WRITES
                )
            case _:
                return False

    def _crash(
        self,
        coro: Coroutine[Any, Any, Any],
        execution: str,
        plan: ExecutionPlan,
        touched: HandlerCall | None,
    ) -> None:
        coro.close()
        self.crashes += 1
        machine = self.factory.machines.get(execution)
        token = None
        key = ""
        if touched is not None:
            key = key_of(touched.ctx.record_key)
            if machine is not None:
                token = machine.token_for(touched.ctx.item_key, touched.ctx.item_entity_key)
        self.world.event(
            EventKind.CRASH,
            process=self.name,
            key=key,
            token=token,
            execution=execution,
            detail=plan.crash.value if plan.crash else "crash",
        )

    def _effect(
        self,
        call: EffectCall,
        node: str,
        execution: str,
        plan: ExecutionPlan,
        locked: tuple[HandlerCall, int] | None,
    ) -> Generator[Any, Any, Mapping[str, Any]]:
        """The business effect, entered in the ledger under the item and token locked last."""
        world = self.world
        key, token = ("", None) if locked is None else (key_of(locked[0].ctx.record_key), locked[1])
        if plan.slow:
            lock = world.lock_duration_of(node)
            duration = round(lock * world.scenario.faults.slow.factor, 6)
        else:
            duration = world.latency(world.scenario.latency.effect)
        yield world.env.timeout(duration)
        world.charges += 1
        world.event(
            EventKind.SIDE_EFFECT,
            process=self.name,
            key=key,
            token=token,
            execution=execution,
            detail=f"{call.action} {call.item_key} amount {call.amount}"
            + (" (slow)" if plan.slow else ""),
            value=duration,
            node=node,
        )
        return {"chargeId": f"ch_{world.charges:05d}", "amount": call.amount, "status": "succeeded"}
