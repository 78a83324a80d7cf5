"""Node executors: the automatic DataStateMachine initialisation, then the node's own work.

A node author subclasses :class:`BaseNodeExecutor` and writes ``execute``;
the pre-process step that parses the ``dataStateMachine`` block and asks the
factory for a machine is done here, once, for every node.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from reference_engine.config import DataStateMachineConfig, parse_node_settings
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.errors import MissingDataStateMachineError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.machine import DataStateMachine

__all__ = ["BaseNodeExecutor", "Message", "NodeExecutionResult", "NodeOutcome"]


@dataclass(frozen=True, slots=True)
class Message:
    """A message delivered to a workflow; a redelivery carries the same ``id``."""

    id: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    tenant_id: str = "tenant-1"
    source_app_id: str = "app-1"
    delivery: int = 1

    def redelivered(self) -> Message:
        """The same message delivered once more, as a broker does after a failure or timeout."""
        return dataclasses.replace(self, delivery=self.delivery + 1)


class NodeOutcome(enum.Enum):
    SUCCESS = "success"
    SKIP = "skip"
    FAILURE = "failure"


@dataclass(frozen=True, slots=True)
class NodeExecutionResult:
    """What a node run came to: success, a deliberate skip, or a failure with its error."""

    outcome: NodeOutcome
    reason: str = ""
    output: Mapping[str, Any] | None = None
    error: str | None = None

    @classmethod
    def success(
        cls, output: Mapping[str, Any] | None = None, reason: str = ""
    ) -> NodeExecutionResult:
        return cls(NodeOutcome.SUCCESS, reason=reason, output=output)

    @classmethod
    def skip(cls, reason: str) -> NodeExecutionResult:
        return cls(NodeOutcome.SKIP, reason=reason)

    @classmethod
    def failure(cls, error: BaseException | str, reason: str = "") -> NodeExecutionResult:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return cls(NodeOutcome.FAILURE, reason=reason or text, error=text)


class BaseNodeExecutor(abc.ABC):
    """Runs one element: pre-process (build the DataStateMachine), then ``execute``.

    The settings are parsed when the executor is built, so a misconfigured node
    fails at workflow load time, before any message is processed.
    """

    node_type: ClassVar[str] = ""
    #: A node whose side effect must not repeat (a charge, a dispatch) sets this,
    #: so a configuration without the guard is refused instead of run unprotected.
    requires_data_state_machine: ClassVar[bool] = False

    def __init__(self, element: Element, factory: DataStateMachineFactory) -> None:
        self.element = element
        self.factory = factory
        self.dsm_config: DataStateMachineConfig | None = parse_node_settings(element.settings)
        if self.dsm_config is None and self.requires_data_state_machine:
            raise MissingDataStateMachineError(
                node_type=self.node_type or element.node_type, node_id=element.id
            )

    async def pre_process(self, thread: ExecutionThread) -> DataStateMachine:
        """Build this execution's machine (the null machine if the node has no block)."""
        return await self.factory.create(self.element, thread, self.dsm_config)

    async def run(self, thread: ExecutionThread, message: Message) -> NodeExecutionResult:
        """Pre-process, then execute; an exception escaping the node becomes a failure."""
        dsm = await self.pre_process(thread)
        try:
            return await self.execute(message, dsm)
        except Exception as exc:  # the engine reports it; the node already released its lock
            return NodeExecutionResult.failure(exc)

    @abc.abstractmethod
    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        """The node's business logic, guarded by ``dsm``."""
