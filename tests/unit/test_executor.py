"""BaseNodeExecutor: settings parsed at construction, machine built per execution, failures kept."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import (
    BaseNodeExecutor,
    Message,
    NodeExecutionResult,
    NodeOutcome,
)
from reference_engine.errors import (
    ConfigurationError,
    InvalidOptionError,
    InvalidSettingsError,
    MissingDataStateMachineError,
    UnknownScopeError,
)
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.machine import NULL_MACHINE, ContextualDataStateMachine, DataStateMachine
from reference_engine.registry import HandlerRegistry
from reference_engine.scope import Scope

pytestmark = pytest.mark.unit

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
THREAD = ExecutionThread(
    execution_id="wf/exec-0007", tenant_id="acme", source_app_id="erp", message_id="m-1"
)


class Probe(BaseNodeExecutor):
    """Returns what it is told to, or raises it; remembers the machine it got."""

    node_type = "probe"

    def __init__(self, element: Element, factory: DataStateMachineFactory) -> None:
        super().__init__(element, factory)
        self.seen: list[DataStateMachine] = []

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        self.seen.append(dsm)
        behaviour = message.payload.get("raise")
        if isinstance(behaviour, BaseException):
            raise behaviour
        return NodeExecutionResult.success({"echo": dict(message.payload)})


def factory() -> tuple[DataStateMachineFactory, InMemoryStateHandler]:
    clock = ManualClock(START)
    handler = InMemoryStateHandler(clock)
    registry = HandlerRegistry(clock)
    registry.register("built-in", lambda _clock: handler)
    return DataStateMachineFactory(registry), handler


def element(settings: dict[str, Any]) -> Element:
    return Element(id="node-1", workflow_id="wf", node_type="probe", settings=settings)


def test_settings_are_parsed_when_the_executor_is_built() -> None:
    built = Probe(
        element({"dataStateMachine": {"scope": "Workflow", "options": {"lockDuration": 90}}}),
        factory()[0],
    )
    assert built.dsm_config is not None
    assert built.dsm_config.scope is Scope.WORKFLOW
    assert built.dsm_config.handler_config == HandlerConfig(lock_duration=dt.timedelta(seconds=90))


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"dataStateMachine": {"scope": "Planet"}}, UnknownScopeError),
        ({"dataStateMachine": {"options": {"lockDuration": -1}}}, InvalidOptionError),
        ({"dataStateMachine": []}, InvalidSettingsError),
    ],
)
def test_a_misconfigured_block_fails_construction(
    settings: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Probe(element(settings), factory()[0])


def test_pre_process_builds_a_contextual_machine_keyed_by_scope() -> None:
    node = Probe(element({"dataStateMachine": {"scope": "Element"}}), factory()[0])

    machine = asyncio.run(node.pre_process(THREAD))

    assert isinstance(machine, ContextualDataStateMachine)
    ctx = machine.base_ctx
    assert (ctx.scope_id, ctx.scope_code, ctx.entity_id) == (4, "Element", "node-1")
    assert (ctx.tenant_id, ctx.source_app_id, ctx.entity_execution_id) == (
        "acme",
        "erp",
        "wf/exec-0007",
    )


def test_pre_process_without_a_block_gives_the_null_machine() -> None:
    node = Probe(element({"other": 1}), factory()[0])
    assert node.dsm_config is None
    assert asyncio.run(node.pre_process(THREAD)) is NULL_MACHINE


def test_run_passes_the_machine_and_returns_the_nodes_result() -> None:
    node = Probe(element({"dataStateMachine": {}}), factory()[0])

    result = asyncio.run(node.run(THREAD, Message(id="m-1", payload={"a": 1})))

    assert result == NodeExecutionResult.success({"echo": {"a": 1}})
    assert isinstance(node.seen[0], ContextualDataStateMachine)


def test_run_turns_an_escaping_exception_into_a_failure() -> None:
    node = Probe(element({}), factory()[0])

    result = asyncio.run(node.run(THREAD, Message(id="m", payload={"raise": KeyError("x")})))

    assert result.outcome is NodeOutcome.FAILURE
    assert result.error == "KeyError: 'x'"
    assert result.reason == result.error


def test_run_lets_a_crash_through() -> None:
    node = Probe(element({}), factory()[0])
    crash = Message(id="m", payload={"raise": asyncio.CancelledError()})
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(node.run(THREAD, crash))


def test_result_constructors_and_redelivery() -> None:
    assert NodeExecutionResult.skip("done") == NodeExecutionResult(NodeOutcome.SKIP, reason="done")
    failure = NodeExecutionResult.failure("plain text", reason="why")
    assert (failure.error, failure.reason) == ("plain text", "why")
    message = Message(id="m", payload={"k": 1}, delivery=2)
    again = message.redelivered()
    assert (again.id, again.payload, again.delivery) == ("m", {"k": 1}, 3)
    assert message.delivery == 2


class GuardedProbe(Probe):
    """A node type whose side effect must not repeat: it declares that it needs the guard."""

    node_type = "guarded-probe"
    requires_data_state_machine = True


@pytest.mark.parametrize("settings", [{}, {"other": 1}, {"dataStateMachine": None}])
def test_a_node_that_needs_the_guard_refuses_to_be_built_without_it(
    settings: dict[str, Any],
) -> None:
    with pytest.raises(MissingDataStateMachineError) as info:
        GuardedProbe(element(settings), factory()[0])
    assert isinstance(info.value, ConfigurationError)
    assert (info.value.node_type, info.value.node_id) == ("guarded-probe", "node-1")
    assert "needs a 'dataStateMachine' block" in str(info.value)


def test_a_node_that_needs_the_guard_is_built_with_it() -> None:
    node = GuardedProbe(element({"dataStateMachine": {"scope": "Element"}}), factory()[0])
    assert node.dsm_config is not None
    assert isinstance(asyncio.run(node.pre_process(THREAD)), ContextualDataStateMachine)


def test_a_misspelled_block_fails_construction_instead_of_running_unguarded() -> None:
    with pytest.raises(InvalidSettingsError, match="'dataStateMachine' was expected"):
        Probe(element({"DataStateMachine": {"scope": "Element"}}), factory()[0])
