"""The invoice workflow on your handler: a redelivered message is charged once."""

import asyncio

from reference_engine.clock import SystemClock
from reference_engine.engine.executor import Message
from reference_engine.engine.workflow import NodeTypeRegistry, WorkflowEngine
from reference_engine.handlers.memory import in_memory_handler  # your factory here
from reference_engine.nodes.invoice import NODE_TYPE, FakeBillingApi, invoice_node
from reference_engine.registry import HandlerRegistry

WORKFLOW = {
    "id": "invoice-workflow",
    "nodes": [
        {
            "id": "dispatch-invoice",
            "type": NODE_TYPE,
            "settings": {
                "dataStateMachine": {
                    "handler": "my-store",
                    "scope": "Element",
                    "options": {"lockDuration": "30m", "retention": "30d"},
                }
            },
        }
    ],
}


async def main() -> None:
    clock = SystemClock()
    handlers = HandlerRegistry(clock)
    handlers.register("my-store", in_memory_handler)  # or "mystore:make_handler"
    billing = FakeBillingApi(clock)
    node_types = NodeTypeRegistry()
    node_types.register(NODE_TYPE, invoice_node(billing, clock))
    engine = WorkflowEngine.from_json(WORKFLOW, node_types, handlers, clock)
    message = Message(id="msg-1", payload={"invoiceId": "INV-1", "amount": 12500})
    try:
        await engine.open()  # builds and opens the handler: a bad factory fails here
        for delivery in (message, message.redelivered()):
            (result,) = await engine.deliver(delivery)
            said = result.reason or result.output  # why it skipped, or what it charged
            print(f"delivery {delivery.delivery}: {result.outcome.value}: {said}")
        print(f"charges for INV-1: {len(billing.charges_for('INV-1'))}")
    finally:
        await handlers.close()


if __name__ == "__main__":
    asyncio.run(main())
