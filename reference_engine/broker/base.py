"""The broker contract the engine consumes through, and how a message travels on the wire.

The engine must not know which broker feeds it: RabbitMQ today, NATS
JetStream or another at-least-once broker tomorrow.  What the consumer needs
is small, so the contract is small: connect, declare the run's topology,
publish, hand over deliveries that are acknowledged (or put back) only when
the consumer says so, and delete what was declared.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from reference_engine.broker.errors import InvalidBrokerMessageError, InvalidTopologyError
from reference_engine.engine.executor import Message

__all__ = [
    "Broker",
    "Delivery",
    "DeliveryCallback",
    "Topology",
    "decode_message",
    "encode_message",
]

#: Longest queue or exchange name AMQP 0-9-1 allows (a short string).
MAX_NAME_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Topology:
    """Where messages go: one exchange, one queue bound to it under one routing key.

    A stress run declares its own pair, named with the run id, so two runs on
    one broker never consume each other's messages and cleanup can delete
    exactly what the run made.
    """

    exchange: str
    queue: str
    routing_key: str = "invoice"

    def __post_init__(self) -> None:
        for name in ("exchange", "queue", "routing_key"):
            value = getattr(self, name)
            if (
                not isinstance(value, str)
                or not value
                or len(value.encode()) > MAX_NAME_LENGTH
                or value.startswith("amq.")
            ):
                raise InvalidTopologyError(name, value)

    @classmethod
    def for_run(cls, run_id: str) -> Topology:
        return cls(exchange=f"dsm-stress-{run_id}", queue=f"dsm-stress-{run_id}")


class Delivery(Protocol):
    """One message handed to a consumer, still owned by the broker until settled.

    ``redelivered`` is the broker's own flag: the message was handed out before
    and not acknowledged (its consumer died, or put it back).
    """

    @property
    def message(self) -> Message: ...

    @property
    def redelivered(self) -> bool: ...

    async def ack(self) -> None:
        """The work is done: the broker forgets the message."""

    async def requeue(self) -> None:
        """Not done: the broker hands the message out again."""

    async def reject(self) -> None:
        """Never processable (malformed): dropped, or dead-lettered if the queue says so."""


DeliveryCallback = Callable[[Delivery], Awaitable[object]]


@runtime_checkable
class Broker(Protocol):
    """An at-least-once broker with manual acknowledgement.

    ``consume`` calls ``callback`` for each delivery, at most ``prefetch``
    unsettled at a time, until ``stop`` resolves; deliveries left unsettled
    when the connection drops (the process died) go back to the queue.
    """

    async def connect(self) -> None: ...

    async def declare(self) -> None: ...

    async def publish(self, message: Message) -> None: ...

    async def consume(
        self, callback: DeliveryCallback, *, prefetch: int, stop: Awaitable[Any]
    ) -> None: ...

    async def ready_count(self) -> int:
        """Messages waiting in the queue (unsettled deliveries of live consumers excluded)."""
        ...

    async def delete(self) -> None: ...

    async def close(self) -> None: ...


def encode_message(message: Message) -> bytes:
    """The JSON body of a message; the delivery count is the broker's business, not the body's."""
    return json.dumps(
        {
            "id": message.id,
            "payload": dict(message.payload),
            "tenantId": message.tenant_id,
            "sourceAppId": message.source_app_id,
        },
        separators=(",", ":"),
    ).encode()


def decode_message(body: bytes, *, redelivered: bool = False) -> Message:
    """The message a body carries; a body another producer got wrong is a named error."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidBrokerMessageError(f"the body is not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise InvalidBrokerMessageError(f"the body is a JSON {type(raw).__name__}, not an object")
    message_id, payload = raw.get("id"), raw.get("payload", {})
    tenant, app = raw.get("tenantId", "tenant-1"), raw.get("sourceAppId", "app-1")
    if not isinstance(message_id, str) or not message_id:
        raise InvalidBrokerMessageError(f"'id' must be a non-empty string, got {message_id!r}")
    if not isinstance(payload, dict):
        raise InvalidBrokerMessageError(f"'payload' must be an object, got {payload!r}")
    if not isinstance(tenant, str) or not isinstance(app, str):
        raise InvalidBrokerMessageError("'tenantId' and 'sourceAppId' must be strings")
    return Message(
        id=message_id,
        payload=payload,
        tenant_id=tenant,
        source_app_id=app,
        delivery=2 if redelivered else 1,
    )
