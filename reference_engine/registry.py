"""Handlers registered by key, built lazily from a factory or a dotted path."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from reference_engine.clock import Clock, SystemClock
from reference_engine.errors import (
    MAX_ECHO,
    ConfigurationError,
    DuplicateElementError,
    UnknownHandlerError,
    clip,
    echo,
)
from reference_engine.handler import HandlerFactory, StateHandler

__all__ = ["HandlerRegistry", "load_callable", "load_factory"]


def load_callable(spec: str, *, expects: str, example: str = "") -> Callable[..., Any]:
    """Import ``"package.module:attr"`` and return the callable it names.

    ``expects`` says what the callable must do, for the error a wrong spec gets.
    Every part of the spec a message repeats is cut to a few dozen
    characters: a spec read from a file or a command line can be any size.
    """
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"handler factory must be a 'package.module:factory' string, got {echo(spec)}"
        )
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        hint = f", e.g. {example!r}" if example else ""
        raise ConfigurationError(
            f"handler factory {echo(spec)} must look like 'package.module:factory'{hint}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a missing module, a relative name, or the module's own failure
        raise ConfigurationError(
            f"cannot import module {echo(module_name)} for handler {echo(spec)}: "
            f"{type(exc).__name__}: {clip(str(exc), MAX_ECHO * 2)}"
        ) from exc
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(
                f"module {echo(module_name)} has no attribute {echo(attr)} (handler {echo(spec)})"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigurationError(f"{echo(spec)} is not callable; it must {expects}")
    return target


def load_factory(spec: str) -> HandlerFactory:
    """Import ``"package.module:factory"``: a callable building a handler from a clock."""
    factory: Callable[[Clock], StateHandler] = load_callable(
        spec, expects="build a handler from a clock"
    )
    return factory


class HandlerRegistry:
    """Key -> factory, with one shared handler instance per key once resolved.

    Handlers own connection pools, so the registry builds each once and hands
    the same instance to every node that names its key.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._factories: dict[str, HandlerFactory | str] = {}
        self._instances: dict[str, StateHandler] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._element_owners: dict[str, str] = {}

    def register(self, key: str, factory: HandlerFactory | str) -> None:
        """Register a factory (or its dotted path); re-registering replaces it."""
        if not isinstance(key, str) or not key.strip():
            raise ConfigurationError(f"handler key must be a non-empty string, got {echo(key)}")
        self._factories[key] = factory
        self._instances.pop(key, None)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))

    def __contains__(self, key: object) -> bool:
        return key in self._factories

    def claim_elements(self, workflow_id: str, element_ids: Iterable[str]) -> None:
        """Reserve Element-scope node ids for ``workflow_id``, or refuse them all.

        Element-scope records are keyed by node id, not by workflow, so the
        stored keys stay what they are; the price is that a node id may serve
        only one workflow among those sharing these handlers.  The same
        workflow may claim its ids again (several engines, one definition).
        """
        wanted = tuple(dict.fromkeys(element_ids))
        for element_id in wanted:
            owner = self._element_owners.get(element_id, workflow_id)
            if owner != workflow_id:
                raise DuplicateElementError(
                    element_id=element_id, workflow_id=workflow_id, other_workflow_id=owner
                )
        for element_id in wanted:
            self._element_owners[element_id] = workflow_id

    async def resolve(self, key: str) -> StateHandler:
        """The handler for ``key``, opened on first use.

        Concurrent first calls wait for one build: two handlers for one key
        would mean two stores, and two stores mean no idempotency at all.
        """
        if key in self._instances:
            return self._instances[key]
        if key not in self._factories:
            raise UnknownHandlerError(key, self.keys)
        async with self._opening.setdefault(key, asyncio.Lock()):
            if key in self._instances:
                return self._instances[key]
            return await self._build(key)

    async def _build(self, key: str) -> StateHandler:
        factory = self._factories[key]
        build = load_factory(factory) if isinstance(factory, str) else factory
        handler = build(self.clock)
        if not isinstance(handler, StateHandler):
            raise ConfigurationError(
                f"factory for handler {echo(key)} returned {type(handler).__name__}, "
                "which does not implement the StateHandler protocol"
            )
        await handler.open()
        self._instances[key] = handler
        return handler

    async def close(self) -> None:
        """Close every handler built so far."""
        instances, self._instances = self._instances, {}
        for handler in instances.values():
            await handler.close()
