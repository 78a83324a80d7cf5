"""The payment-approval node: one payment per item, decided by whichever message gets there first.

Four kinds of message concern the same item, and they race:

* ``approve`` does the work: ``exists``, ``try_acquire_lock``, the payment
  (the side effect), ``set(Processed)``.  A payment the business declines is
  released as Failed with the reason the message gives, verbatim -- reasons
  are business text and may be empty; a failing payment API is released with
  ``str(exc)`` alone, which is ``""`` for many exceptions
  (``str(TimeoutError())``).
* ``waive`` decides without the lock: ``set(Skipped)`` with no token, which
  the store refuses with ``LockHeldError`` while another worker holds a live
  lock (the holder's decision stands).
* ``confirm`` records a payment another system reports.  Processed needs the
  lock, so the node first asks without one; the store refuses
  (``LockNotHeldError``, or ``LockHeldError`` while someone holds it) and the
  node takes the lock and records it.
* ``amend`` writes the item's current data with ``upsert`` and no token:
  over a missing, Failed or expired record it completes it in one step, over a
  Processed one it supersedes it.  An amendment marked ``merge`` reads the
  record first and adds its details to the data it read, in place -- a store
  must hand out a copy, not the object its later reads return.  Amendments of
  one item arrive together, so two of them can land at the same instant.

The dictionary recorded by ``approve`` is reused for the node's result after
the write: a store must keep what was written, not the caller's object.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import BaseNodeExecutor, Message, NodeExecutionResult
from reference_engine.errors import (
    ForbiddenTransitionError,
    InvalidItemError,
    LockHeldError,
    LockNotHeldError,
)
from reference_engine.factory import DataStateMachineFactory
from reference_engine.machine import DataStateMachine
from reference_engine.nodes.completion import record_completion
from reference_engine.status import IdempotencyStatus

__all__ = [
    "NODE_TYPE",
    "Action",
    "ApprovalExecutor",
    "ApprovalRequest",
    "PaymentApi",
    "approval_node",
]

#: The ``type`` of the approval node in workflow definitions.
NODE_TYPE = "payment-approval"


class PaymentApi(Protocol):
    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]: ...


class Action(enum.Enum):
    """What a message asks of the item."""

    APPROVE = "approve"
    WAIVE = "waive"
    CONFIRM = "confirm"
    AMEND = "amend"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A parsed approval message; ``decline`` is the business's reason to refuse, if any."""

    item: str
    action: Action
    amount: int
    details: Mapping[str, Any]
    decline: str | None
    merge: bool = False

    @classmethod
    def parse(cls, payload: Mapping[str, Any]) -> ApprovalRequest:
        """A malformed message fails before any record is touched."""
        item = payload.get("itemId")
        if not isinstance(item, str) or not item:
            raise InvalidItemError(
                f"approval message needs 'itemId' as a non-empty string, got {item!r}",
                field="itemId",
            )
        raw = payload.get("action")
        try:
            action = Action(raw)
        except ValueError:
            allowed = ", ".join(a.value for a in Action)
            raise InvalidItemError(
                f"approval message needs 'action' as one of {allowed}, got {raw!r}",
                field="action",
            ) from None
        amount = payload.get("amount", 0)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise InvalidItemError(
                f"approval message needs 'amount' as a non-negative integer, got {amount!r}",
                field="amount",
            )
        details = payload.get("details", {})
        if not isinstance(details, Mapping):
            raise InvalidItemError(
                f"approval message 'details' must be an object, got {details!r}",
                field="details",
            )
        decline = payload.get("decline")
        if decline is not None and not isinstance(decline, str):
            raise InvalidItemError(
                f"approval message 'decline' must be a string, got {decline!r}", field="decline"
            )
        merge = payload.get("merge", False)
        if not isinstance(merge, bool):
            raise InvalidItemError(
                f"approval message 'merge' must be true or false, got {merge!r}", field="merge"
            )
        return cls(item, action, amount, details, decline, merge)


class ApprovalExecutor(BaseNodeExecutor):
    """Pay each item at most once, whichever of approve, waive, confirm or amend comes first.

    Message payload: ``{"itemId": str, "action": str, "amount": int, "details": {...},
    "decline": str | None, "merge": bool}``.
    """

    node_type = NODE_TYPE
    # A payment repeated on redelivery is a double payment, and waive, confirm and amend
    # are decisions only the store can make: never run unguarded.
    requires_data_state_machine = True

    def __init__(
        self, element: Element, factory: DataStateMachineFactory, payments: PaymentApi
    ) -> None:
        super().__init__(element, factory)
        self.payments = payments

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        request = ApprovalRequest.parse(message.payload)
        if request.action is Action.AMEND:
            return await self.amend(dsm, request)
        if await dsm.exists(request.item):
            return NodeExecutionResult.skip(f"item {request.item} already decided")
        if request.action is Action.WAIVE:
            return await self.waive(dsm, request)
        if request.action is Action.CONFIRM:
            return await self.confirm(dsm, request)
        return await self.approve(dsm, request)

    async def approve(self, dsm: DataStateMachine, request: ApprovalRequest) -> NodeExecutionResult:
        item = request.item
        if not await dsm.try_acquire_lock(item):
            return NodeExecutionResult.skip(f"item {item} is being approved by another worker")
        if request.decline is not None:
            # Given back as Failed: a later delivery (or an amendment) may still settle it.
            await dsm.release_lock_as_failed(item, request.decline)
            return NodeExecutionResult.failure(f"item {item} declined ({request.decline!r})")
        try:
            response = await self.payments.charge(item, request.amount)
        except Exception as exc:
            await dsm.release_lock_as_failed(item, str(exc))
            raise
        data = dict(request.details)
        await record_completion(dsm, item, data)
        data["response"] = dict(response)
        return NodeExecutionResult.success(data)

    async def waive(self, dsm: DataStateMachine, request: ApprovalRequest) -> NodeExecutionResult:
        try:
            await dsm.set(request.item, IdempotencyStatus.SKIPPED, {"rule": "waived"})
        except LockHeldError:
            return NodeExecutionResult.skip(f"item {request.item} is held by another worker")
        return NodeExecutionResult.skip(f"item {request.item} waived")

    async def confirm(self, dsm: DataStateMachine, request: ApprovalRequest) -> NodeExecutionResult:
        item = request.item
        reported = {"confirmed": True, "details": dict(request.details)}
        try:
            await dsm.set(item, IdempotencyStatus.PROCESSED, reported)
        except LockHeldError:
            return NodeExecutionResult.skip(f"item {item} is held by another worker")
        except LockNotHeldError:
            pass  # Processed needs the lock: take it
        else:
            return NodeExecutionResult.success({"itemId": item, "confirmed": True})
        if not await dsm.try_acquire_lock(item):
            return NodeExecutionResult.skip(f"item {item} is held by another worker")
        await record_completion(dsm, item, reported)
        return NodeExecutionResult.success({"itemId": item, "confirmed": True})

    async def amend(self, dsm: DataStateMachine, request: ApprovalRequest) -> NodeExecutionResult:
        data = dict(request.details)
        if request.merge:
            current = await dsm.get(request.item)
            if current is not None and isinstance(current.data, dict):
                current.data.update(data)
                data = current.data
        try:
            await dsm.upsert(request.item, data)
        except LockHeldError:
            return NodeExecutionResult.skip(f"item {request.item} is held by another worker")
        except ForbiddenTransitionError:
            return NodeExecutionResult.skip(f"item {request.item} was waived: nothing to amend")
        return NodeExecutionResult.success({"itemId": request.item, "amended": True})


def approval_node(
    payments: PaymentApi,
) -> Callable[[Element, DataStateMachineFactory], ApprovalExecutor]:
    """The constructor to register under :data:`NODE_TYPE` in a node-type registry."""

    def build(element: Element, factory: DataStateMachineFactory) -> ApprovalExecutor:
        return ApprovalExecutor(element, factory, payments)

    return build
