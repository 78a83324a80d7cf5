"""The workflow engine: definition loading, node types, delivery, workers, retries, events."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsm_sim.teaching.demo import DEMO_WORKFLOW
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import (
    BaseNodeExecutor,
    Message,
    NodeExecutionResult,
    NodeOutcome,
)
from reference_engine.engine.loader import (
    DuplicateNodeError,
    InvalidWorkflowError,
    UnknownNodeTypeError,
    load_workflow,
    load_workflow_file,
)
from reference_engine.engine.runner import InvalidRunOptionError, run_queue
from reference_engine.engine.workflow import (
    DeliveryReport,
    EventLog,
    NodeAborted,
    NodeFinished,
    NodeStarted,
    NodeTypeRegistry,
    WorkflowEngine,
)
from reference_engine.errors import (
    ConfigurationError,
    DsmError,
    DuplicateElementError,
    InvalidOptionError,
    InvalidSettingsError,
    UnknownHandlerError,
    UnknownScopeError,
)
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.machine import NULL_MACHINE, DataStateMachine
from reference_engine.nodes.invoice import NODE_TYPE, FakeBillingApi, invoice_node
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "invoice_workflow.json"
DSM_BLOCK = {"handler": "built-in", "scope": "Element", "options": {"lockDuration": "30m"}}


def definition(*nodes: Mapping[str, Any], workflow_id: str = "wf") -> dict[str, Any]:
    return {"id": workflow_id, "nodes": [dict(n) for n in nodes]}


def invoice_spec(node_id: str = "dispatch", block: object = DSM_BLOCK) -> dict[str, Any]:
    settings = {} if block is None else {"dataStateMachine": copy.deepcopy(block)}
    return {"id": node_id, "type": NODE_TYPE, "settings": settings}


class Rig:
    """One engine over the in-memory handler, with its clock, billing API and event log."""

    def __init__(self, *nodes: Mapping[str, Any], extra: NodeTypeRegistry | None = None) -> None:
        self.clock = ManualClock(START)
        self.handler = InMemoryStateHandler(self.clock)
        self.handlers = HandlerRegistry(self.clock)
        self.handlers.register("built-in", lambda _clock: self.handler)
        self.billing = FakeBillingApi(self.clock)
        self.node_types = extra or NodeTypeRegistry()
        self.node_types.register(NODE_TYPE, invoice_node(self.billing, self.clock))
        self.engine = WorkflowEngine(
            load_workflow(definition(*(nodes or (invoice_spec(),)))),
            self.node_types,
            self.handlers,
            self.clock,
            instance_id="i1",
        )
        self.log = EventLog()
        self.engine.add_listener(self.log)

    def record(self, invoice_id: str, node_id: str = "dispatch") -> Any:
        for record in self.handler.model.current.values():
            if record.key.item_key == invoice_id and record.key.entity_id == node_id:
                return record
        return None


def invoice(invoice_id: str = "INV-1", amount: int = 1200, **kw: Any) -> Message:
    return Message(
        id=f"msg-{invoice_id}", payload={"invoiceId": invoice_id, "amount": amount}, **kw
    )


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ("{not json", ""),
        ("[1, 2]", ""),
        ({"nodes": [invoice_spec()]}, "id"),
        ({"id": "", "nodes": [invoice_spec()]}, "id"),
        ({"id": 7, "nodes": [invoice_spec()]}, "id"),
        ({"id": "wf", "nodes": []}, "nodes"),
        ({"id": "wf", "nodes": {"a": 1}}, "nodes"),
        ({"id": "wf"}, "nodes"),
        ({"id": "wf", "name": 3, "nodes": [invoice_spec()]}, "name"),
        ({"id": "wf", "nodez": [], "nodes": [invoice_spec()]}, "nodez"),
        ({"id": "wf", "nodes": ["dispatch"]}, "nodes[0]"),
        ({"id": "wf", "nodes": [{"type": NODE_TYPE}]}, "nodes[0].id"),
        ({"id": "wf", "nodes": [{"id": "a"}]}, "nodes[0].type"),
        ({"id": "wf", "nodes": [{"id": "a", "type": 5}]}, "nodes[0].type"),
        ({"id": "wf", "nodes": [{"id": "a", "type": "t", "name": []}]}, "nodes[0].name"),
        ({"id": "wf", "nodes": [{"id": "a\x00", "type": "t"}]}, "nodes[0].id"),
        ({"id": "wf", "nodes": [{"id": "a" * 257, "type": "t"}]}, "nodes[0].id"),
        ({"id": "wf", "nodes": [{"id": "a", "type": "t", "settings": []}]}, "nodes[0].settings"),
        ({"id": "wf", "nodes": [{"id": "a", "type": "t", "setting": {}}]}, "nodes[0].setting"),
    ],
)
def test_malformed_definitions_name_the_field(source: Any, field: str) -> None:
    with pytest.raises(InvalidWorkflowError) as info:
        load_workflow(source if isinstance(source, str) else json.dumps(source))
    assert info.value.field == field
    assert isinstance(info.value, InvalidSettingsError)
    assert isinstance(info.value, DsmError)


def test_duplicate_node_ids_are_refused_with_both_positions() -> None:
    source = definition(invoice_spec("a"), invoice_spec("b"), invoice_spec("a"))
    with pytest.raises(DuplicateNodeError) as info:
        load_workflow(source)
    assert (info.value.node_id, info.value.first, info.value.second) == ("a", 0, 2)
    assert info.value.field == "nodes[2].id"


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ({"scope": "Galaxy"}, UnknownScopeError),
        ({"options": {"lockDuration": "soon"}}, InvalidOptionError),
        ({"options": {"lockTime": "5m"}}, InvalidOptionError),
        ({"handler": ""}, InvalidSettingsError),
        ("built-in", InvalidSettingsError),
    ],
)
def test_bad_dsm_block_fails_at_load_and_names_the_node(
    block: object, error: type[ConfigurationError]
) -> None:
    source = definition(invoice_spec("ok"), invoice_spec("broken", block))
    with pytest.raises(error) as info:
        load_workflow(source)
    assert any("nodes[1]" in note and "'broken'" in note for note in info.value.__notes__)


def test_definition_is_decoupled_from_the_callers_dict() -> None:
    source = definition(invoice_spec())
    loaded = load_workflow(source)
    source["nodes"][0]["settings"]["dataStateMachine"]["scope"] = "Galaxy"
    assert loaded.elements[0].settings["dataStateMachine"]["scope"] == "Element"
    assert loaded.element("dispatch").workflow_id == "wf"
    with pytest.raises(InvalidWorkflowError, match="'dispatch'"):
        loaded.element("missing")


def test_example_file_loads(tmp_path: Path) -> None:
    loaded = load_workflow_file(EXAMPLE)
    assert loaded.id == "invoice-workflow"
    assert json.loads(EXAMPLE.read_text(encoding="utf-8")) == DEMO_WORKFLOW
    assert loaded.node_types == (NODE_TYPE,)
    with pytest.raises(InvalidWorkflowError, match="cannot read"):
        load_workflow_file(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"id": "x", "nodes": [{"id": "a"}]}', encoding="utf-8")
    with pytest.raises(InvalidWorkflowError) as info:
        load_workflow_file(broken)
    assert any("broken.json" in note for note in info.value.__notes__)


def test_unknown_node_type_fails_at_engine_construction_listing_registered() -> None:
    rig = Rig()
    loaded = load_workflow(definition({"id": "n", "type": "send-fax"}))
    with pytest.raises(UnknownNodeTypeError) as info:
        WorkflowEngine(loaded, rig.node_types, rig.handlers, rig.clock)
    assert info.value.node_type == "send-fax"
    assert info.value.registered == (NODE_TYPE,)
    assert NODE_TYPE in str(info.value)


def test_unknown_handler_key_fails_at_engine_construction() -> None:
    rig = Rig()
    block = {**DSM_BLOCK, "handler": "redis"}
    with pytest.raises(UnknownHandlerError) as info:
        WorkflowEngine.from_json(
            json.dumps(definition(invoice_spec("n", block))),
            rig.node_types,
            rig.handlers,
            rig.clock,
        )
    assert info.value.registered == ("built-in",)
    assert any("'n'" in note for note in info.value.__notes__)


# --- node types ------------------------------------------------------------------------------


class CountingNode(BaseNodeExecutor):
    """Does its work whenever the guard lets it; records the machine it was given."""

    node_type = "counting"

    def __init__(self, element: Element, factory: DataStateMachineFactory) -> None:
        super().__init__(element, factory)
        self.runs = 0
        self.machines: list[DataStateMachine] = []

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        self.machines.append(dsm)
        key = str(message.payload.get("invoiceId", message.id))
        if message.payload.get("fail"):
            raise RuntimeError(f"node failed on {key}")
        if await dsm.exists(key) or not await dsm.try_acquire_lock(key):
            return NodeExecutionResult.skip(f"{key} done")
        self.runs += 1
        await dsm.set(key, IdempotencyStatus.PROCESSED, {"n": self.runs})
        return NodeExecutionResult.success({"runs": self.runs})


def counting_types() -> tuple[NodeTypeRegistry, list[CountingNode]]:
    built: list[CountingNode] = []
    registry = NodeTypeRegistry()

    def build(element: Element, factory: DataStateMachineFactory) -> CountingNode:
        node = CountingNode(element, factory)
        built.append(node)
        return node

    registry.register("counting", build)
    return registry, built


def test_registry_builds_the_registered_executor_for_any_node_type() -> None:
    types, built = counting_types()
    rig = Rig(invoice_spec("dispatch"), {"id": "count", "type": "counting"}, extra=types)
    assert rig.node_types.keys == ("counting", NODE_TYPE)
    assert "counting" in rig.node_types
    assert [type(e).__name__ for e in rig.engine.executors] == [
        "InvoiceDispatchExecutor",
        "CountingNode",
    ]
    assert built == [rig.engine.executors[1]]


def test_registry_refuses_bad_registrations_and_bad_constructors() -> None:
    registry = NodeTypeRegistry()
    with pytest.raises(ConfigurationError, match="non-empty"):
        registry.register(" ", lambda e, f: CountingNode(e, f))
    registry.register("wrong", lambda e, f: "not an executor")  # type: ignore[arg-type,return-value]
    rig = Rig()
    with pytest.raises(ConfigurationError, match="must return a BaseNodeExecutor"):
        WorkflowEngine(
            load_workflow(definition({"id": "w", "type": "wrong"})),
            registry,
            rig.handlers,
            rig.clock,
        )


def test_node_without_block_gets_the_null_machine_and_is_unguarded() -> None:
    types, built = counting_types()
    rig = Rig({"id": "count", "type": "counting"}, extra=types)

    async def scenario() -> None:
        await rig.engine.deliver(invoice("A"))
        await rig.engine.deliver(invoice("A"))

    asyncio.run(scenario())
    assert built[0].runs == 2
    assert built[0].machines == [NULL_MACHINE, NULL_MACHINE]
    assert not rig.handler.model.current


# --- delivery --------------------------------------------------------------------------------


def test_delivery_charges_once_and_a_duplicate_is_skipped_by_exists() -> None:
    rig = Rig()

    async def scenario() -> tuple[list[NodeExecutionResult], list[NodeExecutionResult]]:
        first = await rig.engine.deliver(invoice("A"))
        second = await rig.engine.deliver(invoice("A").redelivered())
        return first, second

    first, second = asyncio.run(scenario())
    assert [r.outcome for r in first] == [NodeOutcome.SUCCESS]
    assert [r.outcome for r in second] == [NodeOutcome.SKIP]
    assert "already dispatched" in second[0].reason
    assert len(rig.billing.charges_for("A")) == 1
    assert rig.record("A").status is IdempotencyStatus.PROCESSED


def test_execution_ids_are_deterministic_and_never_reused() -> None:
    def ids() -> list[str]:
        rig = Rig()

        async def scenario() -> list[str]:
            reports = [await rig.engine.deliver_report(invoice("A")) for _ in range(3)]
            return [r.execution_id for r in reports]

        return asyncio.run(scenario())

    first, second = ids(), ids()
    assert first == second == ["wf/i1/exec-0001", "wf/i1/exec-0002", "wf/i1/exec-0003"]


def test_id_prefix_separates_engines_sharing_a_store() -> None:
    rig = Rig()
    other = WorkflowEngine(
        rig.engine.definition,
        rig.node_types,
        rig.handlers,
        rig.clock,
        id_prefix="worker-2",
        instance_id="i1",
    )
    assert other.new_thread(invoice()).execution_id == "worker-2/i1/exec-0001"
    assert rig.engine.new_thread(invoice()).execution_id == "wf/i1/exec-0001"


def test_a_restarted_engine_on_the_same_store_never_reuses_an_execution_id() -> None:
    """Thread-scope records are keyed by execution id: a reused id reads an old run's records."""
    thread_scoped = {**DSM_BLOCK, "scope": "Thread"}
    rig = Rig(invoice_spec("dispatch", thread_scoped))

    def engine() -> WorkflowEngine:
        # Built as a deployment builds it: no instance id given, so each draws its own.
        return WorkflowEngine(rig.engine.definition, rig.node_types, rig.handlers, rig.clock)

    async def scenario() -> list[DeliveryReport]:
        reports = []
        for _ in range(2):  # a first engine, then its restart on the same store
            restarted = engine()
            reports.append(await restarted.deliver_report(invoice("A")))
        return reports

    first, second = asyncio.run(scenario())
    assert first.execution_id != second.execution_id
    assert [r.outcome for r in first.results] == [NodeOutcome.SUCCESS]
    # New Thread-scope work in the restarted engine is done, not skipped as the old run's.
    assert [r.outcome for r in second.results] == [NodeOutcome.SUCCESS], second.results
    assert len(rig.billing.charges_for("A")) == 2


@pytest.mark.parametrize("workers", [1, 4, 16])
def test_duplicates_across_workers_charge_exactly_once(workers: int) -> None:
    rig = Rig()
    messages = [invoice("A") for _ in range(12)] + [invoice("B") for _ in range(12)]

    reports = asyncio.run(rig.engine.run(messages, workers=workers))

    assert len(rig.billing.charges_for("A")) == 1
    assert len(rig.billing.charges_for("B")) == 1
    outcomes = [r.outcomes[0] for r in reports]
    assert outcomes.count(NodeOutcome.SUCCESS) == 2
    assert outcomes.count(NodeOutcome.SKIP) == 22
    assert [r.message.payload["invoiceId"] for r in reports] == ["A"] * 12 + ["B"] * 12
    reasons = {
        r.results[0].reason.split(" ", 2)[-1] for r in reports if r.outcomes[0] is NodeOutcome.SKIP
    }
    assert reasons <= {"already dispatched", "is being dispatched by another worker"}
    if workers > 1:  # the charge yields, so a concurrent duplicate meets the live lock
        assert "is being dispatched by another worker" in reasons
    else:
        assert reasons == {"already dispatched"}


def test_redelivery_after_a_billing_failure_charges_once_and_completes() -> None:
    rig = Rig()
    rig.billing.fail_next = 1

    async def scenario() -> tuple[list[NodeExecutionResult], list[NodeExecutionResult]]:
        failed = await rig.engine.deliver(invoice("A"))
        assert rig.record("A").status is IdempotencyStatus.FAILED
        assert "BillingError" in rig.record("A").error_detail
        retried = await rig.engine.deliver(invoice("A").redelivered())
        return failed, retried

    failed, retried = asyncio.run(scenario())
    assert failed[0].outcome is NodeOutcome.FAILURE
    assert "billing API unavailable" in (failed[0].error or "")
    assert retried[0].outcome is NodeOutcome.SUCCESS
    assert len(rig.billing.charges_for("A")) == 1
    assert (rig.record("A").status, rig.record("A").attempt) == (IdempotencyStatus.PROCESSED, 2)


def test_run_redelivers_failed_messages_up_to_the_limit() -> None:
    rig = Rig()
    rig.billing.fail_next = 2

    reports = asyncio.run(rig.engine.run([invoice("A"), invoice("B")], max_deliveries=3))

    assert [(r.deliveries, r.failed, r.message.delivery) for r in reports] == [
        (3, False, 3),
        (1, False, 1),
    ]
    assert [c.invoice_id for c in rig.billing.charges] == ["A", "B"]
    assert rig.record("A").attempt == 3

    rig.billing.fail_next = 5
    (gave_up,) = asyncio.run(rig.engine.run([invoice("C")], max_deliveries=2))
    assert (gave_up.deliveries, gave_up.failed) == (2, True)
    assert rig.record("C").status is IdempotencyStatus.FAILED


@pytest.mark.parametrize(
    ("option", "value"), [("workers", 0), ("workers", True), ("max_deliveries", 0)]
)
def test_run_refuses_bad_counts_before_any_work(option: str, value: object) -> None:
    rig = Rig()
    with pytest.raises(InvalidRunOptionError) as info:
        asyncio.run(rig.engine.run([invoice("A")], **{option: value}))  # type: ignore[arg-type]
    assert info.value.option == option
    assert not rig.billing.charges


def test_run_queue_keeps_input_order_and_handles_empty_input() -> None:
    async def double(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    assert asyncio.run(run_queue([3, 1, 2], double, workers=2)) == [6, 2, 4]
    assert asyncio.run(run_queue([], double, workers=3)) == []


def test_a_failing_node_stops_the_delivery_and_a_skipping_node_does_not() -> None:
    types, built = counting_types()
    rig = Rig(
        invoice_spec("dispatch"),
        {"id": "count", "type": "counting", "settings": {"dataStateMachine": DSM_BLOCK}},
        extra=types,
    )

    async def scenario() -> list[list[NodeOutcome]]:
        outcomes = []
        for message in (invoice("A"), invoice("A")):
            outcomes.append([r.outcome for r in await rig.engine.deliver(message)])
        rig.billing.fail_next = 1
        outcomes.append([r.outcome for r in await rig.engine.deliver(invoice("B"))])
        return outcomes

    assert asyncio.run(scenario()) == [
        [NodeOutcome.SUCCESS, NodeOutcome.SUCCESS],
        [NodeOutcome.SKIP, NodeOutcome.SKIP],
        [NodeOutcome.FAILURE],
    ]
    assert built[0].runs == 1


def test_an_exception_escaping_a_node_becomes_a_failure_result() -> None:
    types, _ = counting_types()
    rig = Rig({"id": "count", "type": "counting"}, extra=types)
    message = Message(id="m", payload={"fail": True})

    (result,) = asyncio.run(rig.engine.deliver(message))

    assert result.outcome is NodeOutcome.FAILURE
    assert result.error == "RuntimeError: node failed on m"
    assert rig.log.outcomes() == [("wf/i1/exec-0001", "count", NodeOutcome.FAILURE)]


def test_a_store_that_cannot_open_fails_the_node_not_the_engine() -> None:
    rig = Rig()

    class Unopenable(InMemoryStateHandler):
        async def open(self) -> None:
            raise OSError("disk on fire")

    rig.handlers.register("built-in", Unopenable)
    (result,) = asyncio.run(rig.engine.deliver(invoice("A")))
    assert result.outcome is NodeOutcome.FAILURE
    assert result.error == "OSError: disk on fire"
    assert not rig.billing.charges


# --- events ----------------------------------------------------------------------------------


def test_events_report_start_and_outcome_with_clock_time() -> None:
    rig = Rig()
    seen: list[str] = []
    unsubscribe = rig.engine.add_listener(lambda e: seen.append(type(e).__name__))

    async def scenario() -> None:
        await rig.engine.deliver(invoice("A"))
        rig.clock.advance(dt.timedelta(minutes=5))
        unsubscribe()
        await rig.engine.deliver(invoice("A"))

    asyncio.run(scenario())
    assert seen == ["NodeStarted", "NodeFinished"]
    started, finished, started2, finished2 = rig.log.events
    assert isinstance(started, NodeStarted)
    assert isinstance(finished, NodeFinished)
    assert (finished.execution_id, finished.message_id, finished.element_id) == (
        "wf/i1/exec-0001",
        "msg-A",
        "dispatch",
    )
    assert (finished.node_type, finished.outcome, finished.at) == (
        NODE_TYPE,
        NodeOutcome.SUCCESS,
        START,
    )
    assert isinstance(finished2, NodeFinished)
    assert (finished2.outcome, finished2.at) == (NodeOutcome.SKIP, START + dt.timedelta(minutes=5))
    assert isinstance(started2, NodeStarted)


def test_a_cancelled_delivery_is_reported_as_aborted_and_keeps_its_lock() -> None:
    rig = Rig()
    entered = asyncio.Event()

    class HangingBilling(FakeBillingApi):
        async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
            entered.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    rig.node_types.register(NODE_TYPE, invoice_node(HangingBilling(rig.clock), rig.clock))
    engine = WorkflowEngine(rig.engine.definition, rig.node_types, rig.handlers, rig.clock)
    engine.add_listener(rig.log)

    async def scenario() -> None:
        task = asyncio.create_task(engine.deliver(invoice("A")))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert [type(e) for e in rig.log.events] == [NodeStarted, NodeAborted]
    aborted = rig.log.events[-1]
    assert isinstance(aborted, NodeAborted)
    assert aborted.reason == "CancelledError"
    record = rig.record("A")
    assert (record.status, record.attempt) == (IdempotencyStatus.PROCESSING, 1)
    assert record.locked_until == START + dt.timedelta(minutes=30)


def test_run_opens_each_handler_once_before_workers_compete() -> None:
    rig = Rig()
    built: list[InMemoryStateHandler] = []

    class SlowToOpen(InMemoryStateHandler):
        async def open(self) -> None:
            await asyncio.sleep(0)  # a real store's connect yields to the loop

    def fresh_handler(clock: Clock) -> InMemoryStateHandler:
        handler = SlowToOpen(clock)
        built.append(handler)
        return handler

    rig.handlers.register("built-in", fresh_handler)
    reports = asyncio.run(rig.engine.run([invoice("A") for _ in range(8)], workers=8))

    assert len(built) == 1
    assert len(rig.billing.charges) == 1
    assert [r.outcomes[0] for r in reports].count(NodeOutcome.SUCCESS) == 1


# --- element ids across workflows ------------------------------------------------------------


def test_a_node_id_reused_by_another_workflow_with_element_scope_is_refused() -> None:
    """Element-scope records are keyed by node id: refunds/dispatch would skip billing's items."""
    rig = Rig(invoice_spec("dispatch"))

    with pytest.raises(DuplicateElementError) as info:
        WorkflowEngine(
            load_workflow(definition(invoice_spec("dispatch"), workflow_id="refunds")),
            rig.node_types,
            rig.handlers,
            rig.clock,
        )
    error = info.value
    assert (error.element_id, error.workflow_id, error.other_workflow_id) == (
        "dispatch",
        "refunds",
        "wf",
    )
    assert isinstance(error, ConfigurationError)
    assert "'refunds'" in str(error) and "'wf'" in str(error)


def test_workflows_with_distinct_element_ids_keep_separate_records() -> None:
    rig = Rig(invoice_spec("dispatch"))
    refunds = WorkflowEngine(
        load_workflow(definition(invoice_spec("refund-dispatch"), workflow_id="refunds")),
        rig.node_types,
        rig.handlers,
        rig.clock,
    )

    async def scenario() -> None:
        assert (await rig.engine.deliver(invoice("INV-1")))[0].outcome is NodeOutcome.SUCCESS
        assert (await refunds.deliver(invoice("INV-1")))[0].outcome is NodeOutcome.SUCCESS

    asyncio.run(scenario())
    assert [c.invoice_id for c in rig.billing.charges] == ["INV-1", "INV-1"]
    assert rig.record("INV-1", "dispatch") is not rig.record("INV-1", "refund-dispatch")
    assert rig.record("INV-1", "refund-dispatch") is not None


def test_a_refused_workflow_claims_none_of_its_ids() -> None:
    rig = Rig(invoice_spec("dispatch"))
    clashing = definition(invoice_spec("refund"), invoice_spec("dispatch"), workflow_id="refunds")
    with pytest.raises(DuplicateElementError):
        WorkflowEngine(load_workflow(clashing), rig.node_types, rig.handlers, rig.clock)
    # "refund" was not reserved by the refused workflow: a third one may use it.
    WorkflowEngine(
        load_workflow(definition(invoice_spec("refund"), workflow_id="credits")),
        rig.node_types,
        rig.handlers,
        rig.clock,
    )


def test_one_workflow_may_run_in_several_engines_and_other_scopes_may_share_ids() -> None:
    rig = Rig(invoice_spec("dispatch"))
    WorkflowEngine(rig.engine.definition, rig.node_types, rig.handlers, rig.clock, id_prefix="p2")
    workflow_scoped = {**DSM_BLOCK, "scope": "Workflow"}
    WorkflowEngine(
        load_workflow(definition(invoice_spec("dispatch", workflow_scoped), workflow_id="other")),
        rig.node_types,
        rig.handlers,
        rig.clock,
    )
