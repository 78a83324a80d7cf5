"""Handlers registered by key, built lazily from a factory or a dotted path."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from reference_engine.clock import Clock, SystemClock
from reference_engine.errors import (
    MAX_ECHO,
    ConfigurationError,
    DsmError,
    DuplicateElementError,
    FactoryError,
    UnknownHandlerError,
    clip,
    echo,
)
from reference_engine.handler import HandlerFactory, StateHandler

__all__ = [
    "HANDLER_METHODS",
    "HandlerRegistry",
    "build_handler",
    "check_factory",
    "check_handler",
    "factory_name",
    "load_callable",
    "load_factory",
]

#: The coroutine methods of the StateHandler protocol, which every handler must provide.
HANDLER_METHODS: tuple[str, ...] = tuple(
    name for name, value in vars(StateHandler).items() if inspect.iscoroutinefunction(value)
)
#: What every factory error says is allowed.
_FACTORY_SHAPE = (
    "a handler factory is a plain (not async) callable taking one argument, the Clock, "
    "and returning a StateHandler, whose methods are each an async def"
)


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


def factory_name(factory: object) -> str:
    """``module:qualname`` of a factory given as an object, for messages and reports."""
    module = getattr(factory, "__module__", None) or "?"
    return f"{module}:{getattr(factory, '__qualname__', type(factory).__name__)}"


def check_factory(
    factory: Callable[..., Any], name: str, arguments: tuple[Any, ...] = (None,)
) -> None:
    """Refuse, without calling it, a factory that is async or cannot take ``arguments``."""
    if inspect.iscoroutinefunction(factory) or inspect.isasyncgenfunction(factory):
        raise FactoryError(
            factory=name,
            problem="is an async function, so calling it gives a coroutine, not a handler",
            allowed=_FACTORY_SHAPE + " (do async set-up in the handler's open())",
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: calling it is the only test
        return
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise FactoryError(
            factory=name,
            problem=f"cannot be called with the Clock: its signature is {signature} ({exc})",
            allowed="it must take one argument, the Clock; " + _FACTORY_SHAPE,
        ) from None


def check_handler(handler: object, name: str) -> StateHandler:
    """``handler`` itself, once it has every StateHandler method as a coroutine function."""
    if inspect.isawaitable(handler):
        close = getattr(handler, "close", None)
        if inspect.iscoroutine(handler) and callable(close):
            close()  # never awaited: close it, or Python warns about it at exit
        raise FactoryError(
            factory=name,
            problem="returned an awaitable, not a handler (is it an async function?)",
            allowed=_FACTORY_SHAPE,
        )
    missing = [m for m in HANDLER_METHODS if not callable(getattr(handler, m, None))]
    if missing:
        raise FactoryError(
            factory=name,
            problem=f"returned {echo(handler)} which is not a StateHandler (it does not "
            f"implement the StateHandler protocol): missing methods {', '.join(missing)}",
            allowed=_FACTORY_SHAPE,
        )
    synchronous = [
        m for m in HANDLER_METHODS if not inspect.iscoroutinefunction(getattr(handler, m))
    ]
    if synchronous:
        raise FactoryError(
            factory=name,
            problem=f"returned {type(handler).__name__}, whose methods "
            f"{', '.join(synchronous)} are not async (def instead of async def)",
            allowed=_FACTORY_SHAPE,
        )
    assert isinstance(handler, StateHandler)
    return handler


def _said(exc: BaseException, limit: int = 300) -> str:
    """What an exception says, cut to ``limit`` characters; never raises itself."""
    try:
        text = str(exc)
    except Exception:  # a user's __str__ must not replace the error being reported
        return f"<{type(exc).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def build_handler(
    factory: Callable[..., Any], clock: Clock, *, name: str, arguments: tuple[Any, ...] = ()
) -> StateHandler:
    """Call ``factory(clock)`` (or ``factory(*arguments)``) and check what it gives back.

    A named error the factory raises (``ConfigurationError("set MY_URL")``)
    is already a message for the user and passes through; anything else it
    raises, and anything it returns that is not a handler, becomes a
    :class:`FactoryError` that names the factory.
    """
    arguments = arguments or (clock,)
    check_factory(factory, name, arguments)
    try:
        handler = factory(*arguments)
    except DsmError:
        raise
    except Exception as exc:
        raise FactoryError(
            factory=name,
            problem=f"raised {type(exc).__name__}: {_said(exc)}",
            allowed="fix the factory, or what it needs (a URL, a service, an environment "
            "variable) to build the handler",
        ) from exc
    return check_handler(handler, name)


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
        name = factory if isinstance(factory, str) else factory_name(factory)
        handler = build_handler(build, self.clock, name=name)
        await handler.open()
        self._instances[key] = handler
        return handler

    async def close(self) -> None:
        """Close every handler built so far."""
        instances, self._instances = self._instances, {}
        for handler in instances.values():
            await handler.close()
