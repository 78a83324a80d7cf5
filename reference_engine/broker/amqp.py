"""RabbitMQ (AMQP 0-9-1) through aio-pika: persistent messages, manual acks, prefetch.

A message is published persistent, with publisher confirms, to a direct
exchange bound to one durable queue.  Consumers set ``basic.qos`` to the
prefetch and acknowledge each delivery themselves; when a consumer's
connection drops (its process was killed), RabbitMQ puts every delivery it
had not acknowledged back in the queue, flagged ``redelivered``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions

from reference_engine.broker.base import DeliveryCallback, Topology, decode_message, encode_message
from reference_engine.broker.errors import (
    BrokerUnavailableError,
    InvalidBrokerMessageError,
    InvalidBrokerUrlError,
    QueueGoneError,
)
from reference_engine.engine.executor import Message

__all__ = ["AMQP_SCHEMES", "AmqpBroker", "AmqpDelivery", "check_amqp_url"]

AMQP_SCHEMES = ("amqp://", "amqps://")
_CONNECT_ERRORS = (OSError, aio_pika.exceptions.AMQPError, asyncio.TimeoutError)


def check_amqp_url(url: str) -> str:
    if not isinstance(url, str) or not url.lower().startswith(AMQP_SCHEMES):
        raise InvalidBrokerUrlError(str(url), AMQP_SCHEMES)
    return url


class AmqpDelivery:
    """One RabbitMQ delivery: the decoded message and the settle calls on its channel."""

    __slots__ = ("_incoming", "message")

    def __init__(self, incoming: aio_pika.abc.AbstractIncomingMessage, message: Message) -> None:
        self._incoming = incoming
        self.message = message

    @property
    def redelivered(self) -> bool:
        return bool(self._incoming.redelivered)

    async def ack(self) -> None:
        await self._incoming.ack()

    async def requeue(self) -> None:
        await self._incoming.nack(requeue=True)

    async def reject(self) -> None:
        await self._incoming.reject(requeue=False)


class AmqpBroker:
    """The :class:`~reference_engine.broker.base.Broker` contract on RabbitMQ."""

    def __init__(self, url: str, topology: Topology, *, timeout: float = 10.0) -> None:
        self.url = check_amqp_url(url)
        self.topology = topology
        self.timeout = timeout
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None

    async def connect(self) -> None:
        try:
            self._connection = await aio_pika.connect(self.url, timeout=self.timeout)
            self._channel = await self._connection.channel(publisher_confirms=True)
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(self.url, f"{type(exc).__name__}: {exc}") from exc

    @property
    def channel(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None:
            raise BrokerUnavailableError(self.url, "not connected; call connect() first")
        return self._channel

    async def declare(self) -> None:
        """The run's direct exchange and durable queue, bound by the routing key."""
        t = self.topology
        try:
            self._exchange = await self.channel.declare_exchange(
                t.exchange, aio_pika.ExchangeType.DIRECT, durable=True
            )
            queue = await self.channel.declare_queue(t.queue, durable=True)
            await queue.bind(self._exchange, routing_key=t.routing_key)
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(self.url, f"declaring {t.queue!r}: {exc}") from exc

    async def _exchange_or_passive(self) -> aio_pika.abc.AbstractExchange:
        if self._exchange is None:
            try:
                self._exchange = await self.channel.get_exchange(self.topology.exchange)
            except aio_pika.exceptions.ChannelNotFoundEntity as exc:
                raise QueueGoneError(self.topology.exchange, str(exc)) from exc
        return self._exchange

    async def publish(self, message: Message) -> None:
        """Publish persistent and wait for the broker's confirm."""
        exchange = await self._exchange_or_passive()
        body = aio_pika.Message(
            encode_message(message),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message.id,
            content_type="application/json",
        )
        try:
            confirm = await exchange.publish(body, routing_key=self.topology.routing_key)
        except aio_pika.exceptions.ChannelNotFoundEntity as exc:
            raise QueueGoneError(self.topology.exchange, str(exc)) from exc
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(self.url, f"publishing {message.id!r}: {exc}") from exc
        if confirm is not None and not isinstance(confirm, aiormq.spec.Basic.Ack):
            raise BrokerUnavailableError(
                self.url, f"the broker did not confirm message {message.id!r} ({confirm!r})"
            )

    async def consume(
        self, callback: DeliveryCallback, *, prefetch: int, stop: Awaitable[Any]
    ) -> None:
        """Run ``callback`` on each delivery, concurrently up to ``prefetch``, until ``stop``.

        Deliveries already handed to ``callback`` finish before this returns;
        a malformed body is rejected (never requeued, it would come back forever).
        """
        try:
            await self.channel.set_qos(prefetch_count=prefetch)
            queue = await self.channel.declare_queue(self.topology.queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity as exc:
            raise QueueGoneError(self.topology.queue, str(exc)) from exc
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(self.url, f"consuming: {exc}") from exc
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def one(incoming: aio_pika.abc.AbstractIncomingMessage) -> None:
            try:
                message = decode_message(incoming.body, redelivered=bool(incoming.redelivered))
            except InvalidBrokerMessageError:
                await incoming.reject(requeue=False)
                return
            await callback(AmqpDelivery(incoming, message))

        async with asyncio.TaskGroup() as group:

            async def on_message(incoming: aio_pika.abc.AbstractIncomingMessage) -> None:
                group.create_task(one(incoming))

            def closed(*_: object) -> None:
                if not gone.done():
                    gone.set_exception(
                        QueueGoneError(self.topology.queue, "the broker closed the channel")
                    )

            async def cancelled_by_broker(frame: Any) -> None:
                # A deleted queue does not close the channel: RabbitMQ cancels its
                # consumers instead, and without this the consumer would wait for
                # deliveries that can no longer come until it is told to stop.
                if getattr(frame, "consumer_tag", None) == tag and not gone.done():
                    gone.set_exception(
                        QueueGoneError(self.topology.queue, "the broker cancelled the consumer")
                    )

            channel = self.channel
            tag = await queue.consume(on_message, no_ack=False)
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(cancelled_by_broker)
            channel.close_callbacks.add(closed)
            stopping = asyncio.ensure_future(stop)
            try:
                await asyncio.wait({stopping, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                channel.close_callbacks.discard(closed)
                underlay.on_consumer_cancel_callbacks.discard(cancelled_by_broker)
                if not stopping.done():
                    stopping.cancel()
            if not gone.done():
                with contextlib.suppress(*_CONNECT_ERRORS):
                    await queue.cancel(tag)
        # Raised here, once the deliveries in hand have finished: inside the task
        # group it would reach the caller wrapped in an ExceptionGroup.
        if gone.done():
            gone.result()

    async def ready_count(self) -> int:
        try:
            channel = await self._side_channel()
            async with channel:
                queue = await channel.declare_queue(self.topology.queue, passive=True)
                result = queue.declaration_result
                return int(result.message_count or 0)
        except aio_pika.exceptions.ChannelNotFoundEntity as exc:
            raise QueueGoneError(self.topology.queue, str(exc)) from exc

    async def exists(self) -> tuple[bool, bool]:
        """Whether the run's queue and exchange still exist (a passive declare of each)."""
        found: list[bool] = []
        for kind in ("queue", "exchange"):
            channel = await self._side_channel()
            try:
                async with channel:
                    if kind == "queue":
                        await channel.declare_queue(self.topology.queue, passive=True)
                    else:
                        await channel.get_exchange(self.topology.exchange, ensure=True)
                found.append(True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                found.append(False)
        return found[0], found[1]

    async def delete(self) -> None:
        """Delete the run's queue (with any messages left in it) and its exchange."""
        channel = await self._side_channel()
        try:
            async with channel:
                await channel.queue_delete(self.topology.queue)
                await channel.exchange_delete(self.topology.exchange)
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(
                self.url, f"deleting {self.topology.queue!r} and its exchange: {exc}"
            ) from exc

    async def _side_channel(self) -> aio_pika.abc.AbstractChannel:
        """A throwaway channel: a passive declare of a missing name closes its channel."""
        if self._connection is None:
            raise BrokerUnavailableError(self.url, "not connected; call connect() first")
        try:
            return await self._connection.channel()
        except _CONNECT_ERRORS as exc:
            raise BrokerUnavailableError(self.url, str(exc)) from exc

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._exchange = None
        if connection is not None:
            with contextlib.suppress(*_CONNECT_ERRORS):
                await connection.close()
