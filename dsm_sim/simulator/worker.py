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

from dsm_sim.history import EventKind, OpName
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

__all__ = ["Worker"]

_LOCK_ENDING = (OpName.SET, OpName.RELEASE_LOCK_AS_FAILED, OpName.UPSERT)


class Worker:
    """One worker process; ``name`` is its lane in the report."""

    def __init__(
        self,
        world: World,
        broker: Broker,
        name: str,
        executor: BaseNodeExecutor,
        factory: RecordingFactory,
    ) -> None:
        self.world = world
        self.broker = broker
        self.name = name
        self.executor = executor
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
            how = yield from self._execute(message, execution, plan)
            self.factory.forget(execution)
            self.broker.settle(message, how)
            if how == Settlement.CRASH:
                yield env.timeout(self.world.scenario.faults.crash.restart_delay)

    def _execute(
        self, message: Message, execution: str, plan: ExecutionPlan
    ) -> Generator[Any, Any, str]:
        thread = ExecutionThread(
            execution_id=execution,
            tenant_id=message.tenant_id,
            source_app_id=message.source_app_id,
            message_id=message.id,
        )
        coro = self.executor.run(thread, message)
        request: Request | Done = step(coro)
        effect_done = False
        while not isinstance(request, Done):
            if self._crash_now(plan, request, effect_done):
                self._crash(coro, message, execution, plan)
                return Settlement.CRASH
            if isinstance(request, HandlerCall):
                crash_after = plan.crash is CrashPoint.DURING_SET and request.op is OpName.SET
                outcome = yield from self.world.call(self.name, request, crash_after=crash_after)
                if outcome.crashed:
                    self._crash(coro, message, execution, plan)
                    return Settlement.CRASH
                request = step(coro, outcome.value, outcome.error)
            elif plan.effect_fails:
                yield self.world.env.timeout(self.world.latency(self.world.scenario.latency.effect))
                error = BillingError(f"billing API refused the charge of {request.invoice_id}")
                request = step(coro, None, error)
            else:
                response = yield from self._charge(request, message, execution, plan)
                effect_done = True
                request = step(coro, response)
        result = request.value
        if isinstance(result, NodeExecutionResult) and result.outcome is NodeOutcome.FAILURE:
            return Settlement.RETRY
        return Settlement.ACK

    @staticmethod
    def _crash_now(plan: ExecutionPlan, request: Request, effect_done: bool) -> bool:
        match plan.crash:
            case CrashPoint.BEFORE_ACQUIRE:
                return isinstance(request, HandlerCall) and request.op is OpName.TRY_ACQUIRE_LOCK
            case CrashPoint.AFTER_ACQUIRE:
                return isinstance(request, EffectCall)
            case CrashPoint.AFTER_EFFECT:
                return (
                    effect_done and isinstance(request, HandlerCall) and request.op in _LOCK_ENDING
                )
            case _:
                return False

    def _crash(
        self,
        coro: Coroutine[Any, Any, Any],
        message: Message,
        execution: str,
        plan: ExecutionPlan,
    ) -> None:
        coro.close()
        self.crashes += 1
        invoice = str(message.payload.get("invoiceId", ""))
        machine = self.factory.machines.get(execution)
        self.world.event(
            EventKind.CRASH,
            process=self.name,
            key=self.world.key_for(message.tenant_id, invoice),
            token=None if machine is None else machine.token_for(invoice),
            execution=execution,
            detail=plan.crash.value if plan.crash else "crash",
        )

    def _charge(
        self, call: EffectCall, message: Message, execution: str, plan: ExecutionPlan
    ) -> Generator[Any, Any, Mapping[str, Any]]:
        world = self.world
        machine = self.factory.machines.get(execution)
        token = None if machine is None else machine.token_for(call.invoice_id)
        if plan.slow:
            duration = round(world.scenario.lock_duration * world.scenario.faults.slow.factor, 6)
        else:
            duration = world.latency(world.scenario.latency.effect)
        yield world.env.timeout(duration)
        world.charges += 1
        world.event(
            EventKind.SIDE_EFFECT,
            process=self.name,
            key=world.key_for(message.tenant_id, call.invoice_id),
            token=token,
            execution=execution,
            detail=f"charge {call.invoice_id} amount {call.amount}"
            + (" (slow)" if plan.slow else ""),
            value=duration,
        )
        return {"chargeId": f"ch_{world.charges:05d}", "amount": call.amount, "status": "succeeded"}
