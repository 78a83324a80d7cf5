"""The handlers every installation knows by key, registered in one place.

``built-in`` is the SQL handler on the database named by ``DSM_DATABASE_URL``
(an embedded SQLite file by default), ``in-memory`` the reference handler,
``redis`` the Redis handler on ``DSM_REDIS_URL``.  Nodes name these keys in
their ``dataStateMachine`` block; third parties add their own with
``HandlerRegistry.register``.
"""

from __future__ import annotations

import os

from reference_engine.clock import Clock
from reference_engine.handlers.memory import in_memory_handler
from reference_engine.handlers.redis_factory import REDIS_KEY, builtin_redis_factory
from reference_engine.handlers.sql.factory import builtin_factory, database_url
from reference_engine.registry import HandlerRegistry

__all__ = [
    "BUILT_IN_KEY",
    "IN_MEMORY_KEY",
    "REDIS_KEY",
    "REDIS_URL_ENV",
    "default_registry",
]

BUILT_IN_KEY = "built-in"
IN_MEMORY_KEY = "in-memory"
REDIS_URL_ENV = "DSM_REDIS_URL"


def default_registry(
    clock: Clock, *, database: str | None = None, redis_url: str | None = None
) -> HandlerRegistry:
    """A registry with the three shipped handlers; nothing connects until a key is resolved."""
    registry = HandlerRegistry(clock)
    registry.register(BUILT_IN_KEY, builtin_factory(database or database_url()))
    registry.register(IN_MEMORY_KEY, in_memory_handler)
    redis = redis_url or os.environ.get(REDIS_URL_ENV, "").strip()
    if redis:
        registry.register(REDIS_KEY, builtin_redis_factory(redis))
    return registry
