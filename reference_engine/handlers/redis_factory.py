"""Factories for the Redis handler: for an application, for the registry and for tests.

A handler factory is ``(clock) -> handler``; these functions bind the rest
(URL, key prefix) so the registry, the conformance kit (``dsm verify
reference_engine.handlers.redis_factory:redis_test_handler``) and the simulator
can all build a Redis handler from nothing but a clock.
"""

from __future__ import annotations

import os
import uuid

from reference_engine.clock import Clock
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.redis_handler import (
    DEFAULT_PREFIX,
    RedisKeyspace,
    RedisStateHandler,
    check_redis_url,
)

__all__ = [
    "REDIS_KEY",
    "TEST_REDIS_ENV",
    "builtin_redis_factory",
    "redis_handler",
    "redis_test_handler",
    "redis_test_url",
]

#: The key a node's ``dataStateMachine.handler`` names to use Redis.
REDIS_KEY = "redis"
#: Where tests, the conformance kit and the simulator find their Redis.
TEST_REDIS_ENV = "DSM_TEST_REDIS_URL"


def redis_handler(url: str, clock: Clock, *, prefix: str | None = None) -> RedisStateHandler:
    """A handler on the Redis at ``url``, its keys under ``{prefix}`` (default ``dsm``)."""
    return RedisStateHandler(url, clock, prefix=DEFAULT_PREFIX if prefix is None else prefix)


def builtin_redis_factory(url: str, *, prefix: str | None = None) -> HandlerFactory:
    """A registry factory: ``registry.register(REDIS_KEY, builtin_redis_factory(url))``."""
    check_redis_url(url)
    RedisKeyspace(DEFAULT_PREFIX if prefix is None else prefix)  # refuse a bad prefix now

    def build(clock: Clock) -> RedisStateHandler:
        return redis_handler(url, clock, prefix=prefix)

    return build


def redis_test_url() -> str:
    """The test Redis URL from :data:`TEST_REDIS_ENV`, or an error saying how to set it."""
    url = os.environ.get(TEST_REDIS_ENV, "").strip()
    if not url:
        raise ConfigurationError(
            f"{TEST_REDIS_ENV} is not set; export it to a Redis the tests may write to, "
            "e.g. redis://127.0.0.1:6379/0 (each handler uses its own key prefix)"
        )
    return url


def redis_test_handler(clock: Clock) -> RedisStateHandler:
    """A handler on the test Redis under a fresh key prefix, whose keys ``close()`` deletes.

    Each call gets its own namespace, so concurrent test runs and the cases of
    one run never see each other's records.  One connection per handler keeps
    the order of racing calls the event loop's, so the conformance kit's
    shrinking and the simulator's seeds replay exactly; concurrency across
    connections is what ``tests/integration/test_redis_handler.py`` races.
    """
    return RedisStateHandler(
        redis_test_url(),
        clock,
        prefix=f"dsm-test-{uuid.uuid4().hex}",
        delete_on_close=True,
        single_connection=True,
    )
