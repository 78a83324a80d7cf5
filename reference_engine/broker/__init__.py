"""Message brokers feeding the workflow engine: the contract, the consumer, RabbitMQ.

The engine itself takes messages from any iterable; this edge package is
what connects it to a real at-least-once broker.  ``aio_pika`` is imported
only by :mod:`reference_engine.broker.amqp`, so the contract and the
consumer load without it.
"""

from reference_engine.broker.base import Broker, Delivery, Topology, decode_message, encode_message
from reference_engine.broker.consumer import (
    ConsumerHooks,
    EngineConsumer,
    Settlement,
    ack_when_done,
    settle_by_outcome,
)
from reference_engine.broker.errors import (
    BrokerError,
    BrokerUnavailableError,
    InvalidBrokerMessageError,
    InvalidBrokerUrlError,
    InvalidTopologyError,
    QueueGoneError,
)

__all__ = [
    "Broker",
    "BrokerError",
    "BrokerUnavailableError",
    "ConsumerHooks",
    "Delivery",
    "EngineConsumer",
    "InvalidBrokerMessageError",
    "InvalidBrokerUrlError",
    "InvalidTopologyError",
    "QueueGoneError",
    "Settlement",
    "Topology",
    "ack_when_done",
    "decode_message",
    "encode_message",
    "settle_by_outcome",
]
