"""Driving the workflow engine from a broker: acknowledge only once the work is done.

The at-least-once contract is kept by the order of three things: the node
runs, the outcome is settled, and only then is the message acknowledged.  A
worker that dies anywhere before the ack leaves the message unacknowledged,
so the broker hands it to another worker, whose DataStateMachine guard then
skips the work if it was done or takes the item over once the dead worker's
lock has expired.

A node that skipped is not always done: "someone else holds the lock" may
mean a worker that is about to die.  :func:`ack_when_done` therefore asks the
store, and a message whose item is not yet done is put back after a pause
instead of being acknowledged and lost.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from reference_engine.broker.base import Broker, Delivery
from reference_engine.engine.executor import Message, NodeOutcome
from reference_engine.engine.workflow import DeliveryReport, WorkflowEngine
from reference_engine.errors import ConfigurationError

__all__ = [
    "MAX_PREFETCH",
    "ConsumerHooks",
    "EngineConsumer",
    "SettlePolicy",
    "Settlement",
    "ack_when_done",
    "settle_by_outcome",
]

#: A bound that catches a unit mix-up (a message count passed as the prefetch).
MAX_PREFETCH = 10_000


class Settlement(enum.Enum):
    """What becomes of a delivery once the engine has run it."""

    ACK = "ack"
    REQUEUE = "requeue"


SettlePolicy = Callable[[DeliveryReport], Awaitable[Settlement]]


async def settle_by_outcome(report: DeliveryReport) -> Settlement:
    """Acknowledge a success or a skip, put a failure back for a retry."""
    return Settlement.REQUEUE if report.failed else Settlement.ACK


def ack_when_done(is_done: Callable[[Message], Awaitable[bool]]) -> SettlePolicy:
    """Acknowledge a skip only when ``is_done`` confirms the item's work is recorded.

    A success has recorded it itself (its ``set`` landed); a failure is put
    back.  A skip is either "already done" (acknowledged) or "locked by
    another worker" (put back: that worker may be dead, and its lock will
    expire and be taken over by a later delivery).
    """

    async def settle(report: DeliveryReport) -> Settlement:
        if report.failed:
            return Settlement.REQUEUE
        if all(r.outcome is NodeOutcome.SUCCESS for r in report.results):
            return Settlement.ACK
        return Settlement.ACK if await is_done(report.message) else Settlement.REQUEUE

    return settle


@dataclass(slots=True)
class ConsumerHooks:
    """Observation points of a delivery, for tests and the stress runner.

    ``received`` runs before the engine, ``before_settle`` between the
    engine's return and the ack (or requeue), ``settled`` after it.  An
    exception they raise propagates, so a harness can stop a worker there.
    """

    received: Callable[[Delivery], Awaitable[None]] | None = None
    before_settle: Callable[[Delivery, DeliveryReport, Settlement], Awaitable[None]] | None = None
    settled: Callable[[Delivery, Settlement], Awaitable[None]] | None = None


@dataclass(slots=True)
class EngineConsumer:
    """Consumes a broker's queue through a workflow engine, ``prefetch`` deliveries at a time.

    ``requeue_delay`` is how long a delivery that is put back waits first, so
    a message whose item is locked by a dead worker does not spin through the
    queue until the lock expires.  ``ack_first`` acknowledges on receipt,
    before the engine runs: the at-most-once mistake, kept so a harness can
    show that its checks catch it.
    """

    engine: WorkflowEngine
    broker: Broker
    prefetch: int = 8
    settle: SettlePolicy = settle_by_outcome
    hooks: ConsumerHooks = field(default_factory=ConsumerHooks)
    requeue_delay: float = 0.2
    ack_first: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            isinstance(self.prefetch, bool)
            or not isinstance(self.prefetch, int)
            or not 1 <= self.prefetch <= MAX_PREFETCH
        ):
            raise ConfigurationError(
                f"prefetch must be an integer from 1 to {MAX_PREFETCH}, got {self.prefetch!r}"
            )
        if not self.requeue_delay >= 0:
            raise ConfigurationError(
                f"requeue_delay must be seconds, 0 or more, got {self.requeue_delay!r}"
            )

    async def run(self, stop: Awaitable[object]) -> None:
        """Open the engine's handlers, then consume until ``stop`` resolves."""
        await self.engine.open()
        await self.broker.consume(self.handle, prefetch=self.prefetch, stop=stop)

    async def _settle(self, report: DeliveryReport) -> Settlement:
        """The policy's verdict; a policy that cannot tell (its store is down) puts the message back.

        Putting back is always safe: the redelivery meets the same guard.
        Acknowledging on doubt could lose the message.
        """
        try:
            return await self.settle(report)
        except Exception:
            self.counts["settle_error"] = self.counts.get("settle_error", 0) + 1
            return Settlement.REQUEUE

    async def handle(self, delivery: Delivery) -> Settlement:
        """Run one delivery through the engine, then settle it (ack after the node returned)."""
        if self.hooks.received is not None:
            await self.hooks.received(delivery)
        if self.ack_first:
            await delivery.ack()
        report = await self.engine.deliver_report(delivery.message)
        settlement = Settlement.ACK if self.ack_first else await self._settle(report)
        if self.hooks.before_settle is not None:
            await self.hooks.before_settle(delivery, report, settlement)
        if not self.ack_first:
            if settlement is Settlement.ACK:
                await delivery.ack()
            else:
                await asyncio.sleep(self.requeue_delay)
                await delivery.requeue()
        self.counts[settlement.value] = self.counts.get(settlement.value, 0) + 1
        if self.hooks.settled is not None:
            await self.hooks.settled(delivery, settlement)
        return settlement
