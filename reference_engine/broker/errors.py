"""Errors of the broker edge: each says what was wrong and what to do about it."""

from __future__ import annotations

from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "InvalidBrokerMessageError",
    "InvalidBrokerUrlError",
    "InvalidTopologyError",
    "QueueGoneError",
]


def redact(url: str) -> str:
    """The URL without its password, fit for an error message or a log."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


class BrokerError(DsmError):
    """Root of the broker edge's errors."""


class InvalidBrokerUrlError(BrokerError, ConfigurationError):
    """The broker URL names no broker this engine can consume from."""

    def __init__(self, url: str, allowed: tuple[str, ...]) -> None:
        self.url = redact(url)
        self.allowed = allowed
        super().__init__(
            f"unsupported broker URL {self.url!r}; use one of: {', '.join(allowed)} "
            "(e.g. amqp://guest:guest@127.0.0.1:5672/)"
        )


class InvalidTopologyError(BrokerError, ConfigurationError):
    """A queue, exchange or routing key name the broker would refuse or that is reserved."""

    def __init__(self, field: str, value: object) -> None:
        self.field = field
        self.value = value
        super().__init__(
            f"broker topology: {field} must be a non-empty name of at most 255 bytes not "
            f"starting with 'amq.' (reserved by AMQP), got {value!r}"
        )


class BrokerUnavailableError(BrokerError):
    """The broker could not be reached, refused the credentials, or dropped the connection."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        self.reason = reason
        super().__init__(
            f"the message broker at {self.url} is unavailable: {reason}. Start it (RabbitMQ: "
            "rabbitmq-server -detached) or pass the URL of a running one"
        )


class QueueGoneError(BrokerError):
    """The run's queue or exchange vanished while the run used it (deleted by someone else)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"queue/exchange {name!r} is gone: {reason}. Messages in it are lost to this run; "
            "do not delete a run's queue while the run is going, and start the run again"
        )


class InvalidBrokerMessageError(BrokerError):
    """A message body that is not a message of this engine; it is rejected, never retried."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"broker message refused: {problem}. Expected a JSON object with 'id' (string), "
            "'payload' (object) and optional 'tenantId', 'sourceAppId' (strings)"
        )
