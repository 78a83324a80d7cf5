"""A message broker that delivers at least once: duplicates, redelivery after failure or crash.

It behaves like a queue with a visibility timeout: a message that is not
acknowledged (the worker crashed) or is negatively acknowledged (the node
failed) comes back after ``redelivery_delay``, until ``max_deliveries``.
Duplicate-delivery faults publish extra copies of the same message id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

import simpy

from dsm_sim.history import EventKind
from dsm_sim.simulator.world import World
from reference_engine.engine.executor import Message

__all__ = ["Broker", "Settlement"]


class Settlement:
    """How a delivery ended, from the broker's point of view."""

    ACK = "ack"
    RETRY = "retry"
    CRASH = "crash"


class Broker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.env = world.env
        self.queue: simpy.Store = simpy.Store(world.env)
        #: Deliveries published and not yet finally settled; 0 means the broker is idle.
        self.outstanding = 0
        self.dead_letters: list[Message] = []
        self.deliveries = 0

    def publish(self, message: Message, delay: float = 0.0) -> None:
        self.outstanding += 1
        self.env.process(self._deliver(message, delay))

    def _deliver(self, message: Message, delay: float) -> Generator[Any, Any, None]:
        if delay > 0:
            yield self.env.timeout(delay)
        self.deliveries += 1
        self.world.event(
            EventKind.DELIVERY,
            process="broker",
            key=self.world.message_keys.get(message.id, ""),
            detail=f"{message.id} delivery {message.delivery}",
        )
        yield self.queue.put(message)

    def arrive(self, message: Message) -> None:
        """A new message: deliver it, plus any duplicate copies the faults call for."""
        self.publish(message)
        for copy, delay in enumerate(self.world.faults.duplicate_delays(), start=2):
            self.publish(dataclasses.replace(message, delivery=copy), self.world.on_grid(delay))

    def settle(self, message: Message, how: str, reason: str = "") -> None:
        """Acknowledge, redeliver, or give up; ``reason`` is why a failed delivery failed."""
        if how == Settlement.ACK:
            self.outstanding -= 1
            return
        if message.delivery >= self.world.scenario.max_deliveries:
            self.outstanding -= 1
            self.dead_letters.append(message)
            self.world.event(
                EventKind.DEAD_LETTER,
                process="broker",
                key=self.world.message_keys.get(message.id, ""),
                execution=message.id,
                detail=reason or how,
            )
            return
        # Same outstanding slot: the redelivery replaces this delivery.
        self.outstanding -= 1
        self.publish(
            dataclasses.replace(message, delivery=message.delivery + 1),
            self.world.scenario.redelivery_delay,
        )
