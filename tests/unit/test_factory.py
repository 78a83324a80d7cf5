"""Initialisation: the factory, the registry, the scopes and the null machine."""

from __future__ import annotations

import asyncio

import pytest

from reference_engine.clock import ManualClock
from reference_engine.config import parse_node_settings
from reference_engine.context import StateHandlerContext
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.errors import ConfigurationError, UnknownHandlerError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler
from reference_engine.machine import NULL_MACHINE, ContextualDataStateMachine
from reference_engine.registry import HandlerRegistry, load_factory
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit

ELEMENT = Element(id="el-dispatch", workflow_id="wf-billing", node_type="invoice-dispatch")
THREAD = ExecutionThread(execution_id="exec-7", tenant_id="tenant-a", source_app_id="erp")


def make_factory() -> tuple[DataStateMachineFactory, HandlerRegistry]:
    registry = HandlerRegistry(ManualClock())
    registry.register("in-memory", in_memory_handler)
    return DataStateMachineFactory(registry), registry


def create(scope: str = "Element", handler: str = "in-memory") -> ContextualDataStateMachine:
    factory, _ = make_factory()
    config = parse_node_settings({"dataStateMachine": {"handler": handler, "scope": scope}})
    machine = asyncio.run(factory.create(ELEMENT, THREAD, config))
    assert isinstance(machine, ContextualDataStateMachine)
    return machine


def test_base_context_fields() -> None:
    ctx = create().base_ctx
    assert ctx == StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="el-dispatch",
        entity_execution_id="exec-7",
        tenant_id="tenant-a",
        source_app_id="erp",
        handler_config=ctx.handler_config,
    )
    assert (ctx.item_key, ctx.item_entity_key, ctx.lock_token) == ("", "", None)


@pytest.mark.parametrize(
    ("scope", "entity"),
    [
        ("Tenant", "tenant-a"),
        ("Application", "erp"),
        ("Workflow", "wf-billing"),
        ("Element", "el-dispatch"),
        ("Thread", "exec-7"),
    ],
)
def test_scope_picks_the_entity(scope: str, entity: str) -> None:
    ctx = create(scope).base_ctx
    assert (ctx.scope_code, ctx.entity_id) == (scope, entity)
    assert ctx.scope_id == int(Scope[scope.upper()])


def test_unknown_handler_names_key_and_registered_keys() -> None:
    factory, _ = make_factory()
    config = parse_node_settings({"dataStateMachine": {"handler": "dynamo"}})
    with pytest.raises(UnknownHandlerError) as info:
        asyncio.run(factory.create(ELEMENT, THREAD, config))
    assert info.value.key == "dynamo"
    assert info.value.registered == ("in-memory",)
    assert "'in-memory'" in str(info.value)


def test_no_block_gives_the_shared_null_machine() -> None:
    factory, _ = make_factory()
    assert asyncio.run(factory.create(ELEMENT, THREAD, None)) is NULL_MACHINE


def test_null_machine_guards_nothing() -> None:
    async def scenario() -> tuple[object, ...]:
        await NULL_MACHINE.set("x", IdempotencyStatus.PROCESSED, {"a": 1})
        return (
            await NULL_MACHINE.exists("x"),
            await NULL_MACHINE.try_acquire_lock("x"),
            await NULL_MACHINE.try_acquire_lock("x"),
            await NULL_MACHINE.get("x"),
        )

    assert asyncio.run(scenario()) == (False, True, True, None)


def test_registry_builds_each_handler_once() -> None:
    registry = HandlerRegistry(ManualClock())
    built: list[InMemoryStateHandler] = []

    def factory(clock: ManualClock) -> InMemoryStateHandler:
        built.append(InMemoryStateHandler(clock))
        return built[-1]

    registry.register("m", factory)  # type: ignore[arg-type]

    async def twice() -> tuple[object, object]:
        return await registry.resolve("m"), await registry.resolve("m")

    first, second = asyncio.run(twice())
    assert first is second is built[0]
    assert len(built) == 1


def test_registry_accepts_dotted_path() -> None:
    registry = HandlerRegistry(ManualClock())
    registry.register("mem", "reference_engine.handlers.memory:in_memory_handler")
    handler = asyncio.run(registry.resolve("mem"))
    assert isinstance(handler, InMemoryStateHandler)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no_colon", "package.module:factory"),
        ("nonexistent_mod_xyz:f", "cannot import"),
        ("reference_engine.handlers.memory:nope", "no attribute"),
        ("reference_engine.handlers.memory:__doc__", "not callable"),
    ],
)
def test_bad_factory_paths(spec: str, needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_factory(spec)
    assert needle in str(info.value)


def test_factory_returning_non_handler_is_refused() -> None:
    registry = HandlerRegistry(ManualClock())
    registry.register("bad", lambda clock: object())  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="StateHandler protocol"):
        asyncio.run(registry.resolve("bad"))


def test_concurrent_first_resolves_share_one_handler() -> None:
    registry = HandlerRegistry(ManualClock())
    built: list[object] = []

    class SlowOpening(InMemoryStateHandler):
        async def open(self) -> None:
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    def factory(clock: ManualClock) -> InMemoryStateHandler:
        built.append(SlowOpening(clock))
        return built[-1]  # type: ignore[return-value]

    registry.register("m", factory)  # type: ignore[arg-type]

    async def many() -> list[object]:
        return list(await asyncio.gather(*(registry.resolve("m") for _ in range(10))))

    handlers = asyncio.run(many())
    assert len(built) == 1
    assert all(h is built[0] for h in handlers)
