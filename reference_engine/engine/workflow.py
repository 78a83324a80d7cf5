"""The workflow engine: a loaded definition, its node executors, and message delivery.

Deliberately minimal, but real in the ways that matter to the DataStateMachine:
every delivery is a new execution thread with its own execution id, nodes are
built (and their ``dataStateMachine`` blocks parsed) once at load time, the
same message can be delivered again and again, and several workers can
process a queue concurrently.  An execution id is ``PREFIX/INSTANCE/exec-NNNN``:
the instance part is drawn once per engine (a random UUID), so a restarted or
second engine on the same store never reuses an id and never reads an old
run's Thread-scope records as its own; the counter then numbers the engine's
deliveries.  Where the store starts empty for one engine (the demo, tests),
the caller may give a fixed instance id, so the same inputs give the same ids.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reference_engine.clock import Clock
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import (
    BaseNodeExecutor,
    Message,
    NodeExecutionResult,
    NodeOutcome,
)
from reference_engine.engine.loader import UnknownNodeTypeError, WorkflowDefinition, load_workflow
from reference_engine.engine.runner import MAX_WORKERS, check_count, run_queue
from reference_engine.errors import ConfigurationError, UnknownHandlerError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.registry import HandlerRegistry
from reference_engine.scope import Scope

__all__ = [
    "MAX_DELIVERIES",
    "DeliveryReport",
    "EngineEvent",
    "EngineListener",
    "EventLog",
    "NodeAborted",
    "NodeConstructor",
    "NodeEvent",
    "NodeFinished",
    "NodeStarted",
    "NodeTypeRegistry",
    "WorkflowEngine",
    "new_instance_id",
]

#: Builds the executor of one element; closures carry the node's collaborators.
NodeConstructor = Callable[[Element, DataStateMachineFactory], BaseNodeExecutor]

#: Upper bound on deliveries of one message in :meth:`WorkflowEngine.run`.
MAX_DELIVERIES = 100


class NodeTypeRegistry:
    """Node type (the ``type`` field of a definition) -> executor constructor.

    The engine knows no node type itself; this is what lets it run the invoice
    node and any other node a test, the simulator or a user registers.
    """

    def __init__(self) -> None:
        self._constructors: dict[str, NodeConstructor] = {}

    def register(self, node_type: str, constructor: NodeConstructor) -> None:
        """Register (or replace) the constructor for ``node_type``."""
        if not isinstance(node_type, str) or not node_type.strip():
            raise ConfigurationError(f"node type must be a non-empty string, got {node_type!r}")
        if not callable(constructor):
            raise ConfigurationError(
                f"constructor for node type {node_type!r} must be callable "
                "(element, factory) -> BaseNodeExecutor"
            )
        self._constructors[node_type] = constructor

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self._constructors))

    def __contains__(self, node_type: object) -> bool:
        return node_type in self._constructors

    def build(self, element: Element, factory: DataStateMachineFactory) -> BaseNodeExecutor:
        """The executor for ``element``; an unknown type lists the registered ones."""
        constructor = self._constructors.get(element.node_type)
        if constructor is None:
            raise UnknownNodeTypeError(element.node_type, self.keys, node_id=element.id)
        executor = constructor(element, factory)
        if not isinstance(executor, BaseNodeExecutor):
            raise ConfigurationError(
                f"constructor for node type {element.node_type!r} returned "
                f"{type(executor).__name__}; it must return a BaseNodeExecutor"
            )
        return executor


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """Common fields of every engine event: which execution, message and node, and when."""

    execution_id: str
    message_id: str
    delivery: int
    element_id: str
    node_type: str
    at: dt.datetime


@dataclass(frozen=True, slots=True)
class NodeStarted(NodeEvent):
    """A node is about to run (its DataStateMachine is not built yet)."""


@dataclass(frozen=True, slots=True)
class NodeFinished(NodeEvent):
    """A node ran to an outcome: success, skip or failure."""

    result: NodeExecutionResult

    @property
    def outcome(self) -> NodeOutcome:
        return self.result.outcome


@dataclass(frozen=True, slots=True)
class NodeAborted(NodeEvent):
    """The execution died inside the node (cancelled, crashed): there is no outcome.

    Whatever locks the node took stay in place until they expire and are swept,
    exactly as after a real worker crash.
    """

    reason: str


EngineEvent = NodeStarted | NodeFinished | NodeAborted
#: Called synchronously, in order, for every event.  An exception it raises
#: propagates into the delivery, which lets a simulator model a crash at a
#: precise point; observers that must not interfere should not raise.
EngineListener = Callable[[EngineEvent], None]


class EventLog:
    """A listener that keeps every event, for tests, the demo and post-run reports."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)

    def finished(self) -> list[NodeFinished]:
        return [e for e in self.events if isinstance(e, NodeFinished)]

    def outcomes(self) -> list[tuple[str, str, NodeOutcome]]:
        """``(execution_id, element_id, outcome)`` for every finished node, in order."""
        return [(e.execution_id, e.element_id, e.outcome) for e in self.finished()]


# --- the engine ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What one message came to: the last delivery's execution id and node results."""

    message: Message
    execution_id: str
    results: tuple[NodeExecutionResult, ...]
    deliveries: int = 1

    @property
    def failed(self) -> bool:
        return any(r.outcome is NodeOutcome.FAILURE for r in self.results)

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        return tuple(r.outcome for r in self.results)


def new_instance_id() -> str:
    """A fresh engine instance id: 12 hex digits of a random UUID (48 bits)."""
    return uuid.uuid4().hex[:12]


class WorkflowEngine:
    """Runs one workflow definition's nodes, in order, for each delivered message.

    A node that fails stops the delivery (later nodes depend on it); a node
    that skips does not, because a skip means its work is already done.  Each
    node receives the delivered message unchanged.
    """

    def __init__(
        self,
        definition: WorkflowDefinition,
        node_types: NodeTypeRegistry,
        handlers: HandlerRegistry,
        clock: Clock,
        *,
        id_prefix: str | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.definition = definition
        self.handlers = handlers
        self.clock = clock
        self.factory = DataStateMachineFactory(handlers)
        self.executors: tuple[BaseNodeExecutor, ...] = tuple(
            self._build(node_types, element) for element in definition.elements
        )
        handlers.claim_elements(
            definition.id,
            (
                e.element.id
                for e in self.executors
                if e.dsm_config is not None and e.dsm_config.scope is Scope.ELEMENT
            ),
        )
        self.id_prefix = id_prefix or definition.id
        #: This engine's part of every execution id: unique across instances and restarts.
        self.instance_id = new_instance_id() if instance_id is None else instance_id
        self._counter = itertools.count(1)
        self._listeners: list[EngineListener] = []

    @classmethod
    def from_json(
        cls,
        source: str | bytes | Mapping[str, Any],
        node_types: NodeTypeRegistry,
        handlers: HandlerRegistry,
        clock: Clock,
        *,
        id_prefix: str | None = None,
        instance_id: str | None = None,
    ) -> WorkflowEngine:
        """Load a definition and build its engine; every configuration error surfaces here."""
        return cls(
            load_workflow(source),
            node_types,
            handlers,
            clock,
            id_prefix=id_prefix,
            instance_id=instance_id,
        )

    def _build(self, node_types: NodeTypeRegistry, element: Element) -> BaseNodeExecutor:
        try:
            executor = node_types.build(element, self.factory)
            config = executor.dsm_config
            if config is not None and config.handler not in self.handlers:
                raise UnknownHandlerError(config.handler, self.handlers.keys)
        except ConfigurationError as exc:
            exc.add_note(f"in node {element.id!r} of workflow {self.definition.id!r}")
            raise
        return executor

    async def open(self) -> None:
        """Build and open every handler the nodes name, one after the other.

        Call it before delivering concurrently (``run`` does): the first
        delivery otherwise resolves the handler lazily, and concurrent first
        resolutions of one key would each build their own handler.  A store
        that cannot be opened fails here, before any message is taken.
        """
        keys = {e.dsm_config.handler for e in self.executors if e.dsm_config is not None}
        for key in sorted(keys):
            await self.handlers.resolve(key)

    # --- observation -------------------------------------------------------------------------

    def add_listener(self, listener: EngineListener) -> Callable[[], None]:
        """Subscribe to events; returns the function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, event: EngineEvent) -> None:
        for listener in tuple(self._listeners):
            listener(event)

    # --- delivery ----------------------------------------------------------------------------

    def new_thread(self, message: Message) -> ExecutionThread:
        """A fresh execution for ``message``: a redelivery never reuses an execution id."""
        return ExecutionThread(
            execution_id=f"{self.id_prefix}/{self.instance_id}/exec-{next(self._counter):04d}",
            tenant_id=message.tenant_id,
            source_app_id=message.source_app_id,
            message_id=message.id,
        )

    async def deliver(self, message: Message) -> list[NodeExecutionResult]:
        """Run the workflow once for ``message``; one result per node that ran."""
        return list((await self.deliver_report(message)).results)

    async def deliver_report(self, message: Message) -> DeliveryReport:
        """As :meth:`deliver`, with the execution id the delivery ran under."""
        thread = self.new_thread(message)
        results: list[NodeExecutionResult] = []
        for executor in self.executors:
            result = await self._run_node(executor, thread, message)
            results.append(result)
            if result.outcome is NodeOutcome.FAILURE:
                break
        return DeliveryReport(message, thread.execution_id, tuple(results))

    async def _run_node(
        self, executor: BaseNodeExecutor, thread: ExecutionThread, message: Message
    ) -> NodeExecutionResult:
        def fields() -> dict[str, Any]:
            return {
                "execution_id": thread.execution_id,
                "message_id": message.id,
                "delivery": message.delivery,
                "element_id": executor.element.id,
                "node_type": executor.element.node_type,
                "at": self.clock.now(),
            }

        self._emit(NodeStarted(**fields()))
        try:
            result = await executor.run(thread, message)
        except Exception as exc:
            # Pre-processing failed (e.g. the handler's store could not be opened).
            result = NodeExecutionResult.failure(exc)
        except BaseException as exc:
            self._emit(NodeAborted(**fields(), reason=type(exc).__name__))
            raise
        self._emit(NodeFinished(**fields(), result=result))
        return result

    async def run(
        self, messages: Iterable[Message], *, workers: int = 1, max_deliveries: int = 1
    ) -> list[DeliveryReport]:
        """Process a queue of messages with ``workers`` concurrent workers.

        A delivery that fails is redelivered (``delivery`` + 1) by the same
        worker until it does not fail or ``max_deliveries`` is reached; the
        report of each message's last delivery is returned, in input order.
        """
        limit = check_count("max_deliveries", max_deliveries, MAX_DELIVERIES)
        check_count("workers", workers, MAX_WORKERS)
        await self.open()

        async def process(message: Message) -> DeliveryReport:
            report = await self.deliver_report(message)
            while report.failed and report.deliveries < limit:
                deliveries = report.deliveries + 1
                message = message.redelivered()
                report = dataclasses.replace(
                    await self.deliver_report(message), deliveries=deliveries
                )
            return report

        return await run_queue(list(messages), process, workers=workers)
