"""The invoice dispatcher: the design's sample node, and the fake billing API it charges.

The billing API records every charge so "no duplicate charge" is a count a
test can make, not a log line someone has to read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from reference_engine.begin import Completed, Locked
from reference_engine.clock import Clock
from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import BaseNodeExecutor, Message, NodeExecutionResult
from reference_engine.errors import InvalidItemError, StoreError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.machine import DataStateMachine
from reference_engine.status import IdempotencyStatus

__all__ = [
    "NODE_TYPE",
    "BillingApi",
    "BillingError",
    "Charge",
    "FakeBillingApi",
    "InvoiceDispatchExecutor",
    "invoice_node",
]

#: The ``type`` of the invoice node in workflow definitions.
NODE_TYPE = "invoice-dispatch"


#: How many times the node tries to record a completed charge before leaving
#: the lock to expire (a store that fails this often is down, not flaky).
COMPLETE_ATTEMPTS = 3


class BillingError(Exception):
    """The billing API refused or failed a charge."""


@dataclass(frozen=True, slots=True)
class Charge:
    invoice_id: str
    amount: int
    charge_id: str
    charged_at: str


class BillingApi(Protocol):
    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]: ...


@dataclass
class FakeBillingApi:
    """Records every charge; can be told to fail the next N charges."""

    clock: Clock
    charges: list[Charge] = field(default_factory=list)
    fail_next: int = 0

    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
        # A real API call yields to the event loop; so does this one, which is
        # what lets concurrent workers interleave between lock and charge.
        await asyncio.sleep(0)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise BillingError(f"billing API unavailable while charging {invoice_id}")
        charge = Charge(
            invoice_id=invoice_id,
            amount=amount,
            charge_id=f"ch_{len(self.charges) + 1:04d}",
            charged_at=self.clock.now().isoformat(),
        )
        self.charges.append(charge)
        return {"chargeId": charge.charge_id, "amount": amount, "status": "succeeded"}

    def charges_for(self, invoice_id: str) -> list[Charge]:
        return [c for c in self.charges if c.invoice_id == invoice_id]


class InvoiceDispatchExecutor(BaseNodeExecutor):
    """Dispatch an invoice exactly once per invoice id, whatever the redeliveries.

    Message payload: ``{"invoiceId": str, "amount": int}``.
    """

    node_type = NODE_TYPE
    # A charge repeated on redelivery is a double charge: never run unguarded.
    requires_data_state_machine = True

    def __init__(
        self, element: Element, factory: DataStateMachineFactory, billing: BillingApi, clock: Clock
    ) -> None:
        super().__init__(element, factory)
        self.billing = billing
        self.clock = clock

    @staticmethod
    def parse_payload(payload: Mapping[str, Any]) -> tuple[str, int]:
        """The invoice id and amount; a malformed message fails before any record is touched."""
        invoice_id = payload.get("invoiceId")
        if not isinstance(invoice_id, str) or not invoice_id:
            raise InvalidItemError(
                f"invoice message needs 'invoiceId' as a non-empty string, got {invoice_id!r}",
                field="invoiceId",
            )
        amount = payload.get("amount", 0)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise InvalidItemError(
                f"invoice message needs 'amount' as a non-negative integer (cents), got {amount!r}",
                field="amount",
            )
        return invoice_id, amount

    async def record_dispatch(
        self, dsm: DataStateMachine, invoice_id: str, data: Mapping[str, Any]
    ) -> None:
        """``set(Processed)`` after the charge, retried on store errors.

        A store error leaves the outcome unknown: the write may have landed.
        Before retrying, read the record back; if it already holds this
        dispatch, the work is done. A fenced write (``LockError``) is final.
        """
        expected = json.loads(json.dumps(data))
        for attempt in range(1, COMPLETE_ATTEMPTS + 1):
            try:
                await dsm.set(invoice_id, IdempotencyStatus.PROCESSED, data)
                return
            except StoreError:
                if attempt == COMPLETE_ATTEMPTS:
                    raise
            try:
                record = await dsm.get(invoice_id)
            except StoreError:
                continue
            if (
                record is not None
                and record.status is IdempotencyStatus.PROCESSED
                and record.data == expected
            ):
                return

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        invoice_id, amount = self.parse_payload(message.payload)
        # One call asks "already dispatched?" and "may I dispatch it?": one round
        # trip on stores that implement begin, exists + try_acquire_lock elsewhere.
        started = await dsm.begin(invoice_id)
        if isinstance(started, Completed):
            return NodeExecutionResult.skip(f"invoice {invoice_id} already dispatched")
        if isinstance(started, Locked):
            return NodeExecutionResult.skip(
                f"invoice {invoice_id} is being dispatched by another worker"
            )
        try:
            response = await self.billing.charge(invoice_id, amount)
        except Exception as exc:
            # Nothing was charged: give the item back so a redelivery can retry it.
            await dsm.release_lock_as_failed(invoice_id, f"{type(exc).__name__}: {exc}")
            raise
        # The charge happened. From here on, releasing the lock would invite a
        # second charge on redelivery, so a store error is retried with the
        # token still held, and if it persists the lock is left to expire.
        data = {"dispatchedAt": self.clock.now().isoformat(), "response": dict(response)}
        await self.record_dispatch(dsm, invoice_id, data)
        return NodeExecutionResult.success({"invoiceId": invoice_id, "response": dict(response)})


def invoice_node(
    billing: BillingApi, clock: Clock
) -> Callable[[Element, DataStateMachineFactory], InvoiceDispatchExecutor]:
    """The constructor to register under :data:`NODE_TYPE` in a node-type registry."""

    def build(element: Element, factory: DataStateMachineFactory) -> InvoiceDispatchExecutor:
        return InvoiceDispatchExecutor(element, factory, billing, clock)

    return build
