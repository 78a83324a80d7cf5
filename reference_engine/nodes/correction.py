"""The correction node: re-dispatches a corrected invoice and keeps its current totals.

Each revision of an invoice is a side effect of its own (a correction notice
to the customer), guarded by its own record: the item is the invoice and the
item entity key names the revision, so a redelivered revision is skipped and
a new one is not.  Once a revision's notice is recorded, the invoice's
current totals are written with ``upsert`` on the invoice's own key: the
first revision creates the record, every later one supersedes it (Processed
-> Superseded), which keeps the earlier totals as history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import BaseNodeExecutor, Message, NodeExecutionResult
from reference_engine.errors import InvalidItemError, StoreError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.machine import DataStateMachine
from reference_engine.nodes.completion import COMPLETE_ATTEMPTS, record_completion
from reference_engine.status import IdempotencyStatus

__all__ = [
    "NODE_TYPE",
    "CorrectionExecutor",
    "CorrectionRequest",
    "NoticeApi",
    "correction_node",
    "revision_key",
]

#: The ``type`` of the correction node in workflow definitions.
NODE_TYPE = "invoice-correction"


class NoticeApi(Protocol):
    async def send_correction(
        self, invoice_id: str, revision: int, amount: int
    ) -> Mapping[str, Any]: ...


def revision_key(revision: int) -> str:
    """The item entity key of one revision's guard record."""
    return f"revision-{revision}"


@dataclass(frozen=True, slots=True)
class CorrectionRequest:
    """A parsed correction message."""

    invoice_id: str
    revision: int
    amount: int
    details: Mapping[str, Any]

    @classmethod
    def parse(cls, payload: Mapping[str, Any]) -> CorrectionRequest:
        """A malformed message fails before any record is touched."""
        invoice_id = payload.get("invoiceId")
        if not isinstance(invoice_id, str) or not invoice_id:
            raise InvalidItemError(
                f"correction message needs 'invoiceId' as a non-empty string, got {invoice_id!r}",
                field="invoiceId",
            )
        revision = payload.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
            raise InvalidItemError(
                f"correction message needs 'revision' as an integer >= 1, got {revision!r}",
                field="revision",
            )
        amount = payload.get("amount", 0)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise InvalidItemError(
                f"correction message needs 'amount' as a non-negative integer, got {amount!r}",
                field="amount",
            )
        details = payload.get("details", {})
        if not isinstance(details, Mapping):
            raise InvalidItemError(
                f"correction message 'details' must be an object, got {details!r}",
                field="details",
            )
        return cls(invoice_id, revision, amount, details)


class CorrectionExecutor(BaseNodeExecutor):
    """Send each revision's correction notice once; keep the invoice's latest totals current.

    Message payload: ``{"invoiceId": str, "revision": int, "amount": int, "details": {...}}``.
    """

    node_type = NODE_TYPE
    # Each revision's notice goes to a customer once; its guard record is what keeps it so.
    requires_data_state_machine = True

    def __init__(
        self, element: Element, factory: DataStateMachineFactory, notices: NoticeApi
    ) -> None:
        super().__init__(element, factory)
        self.notices = notices

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        request = CorrectionRequest.parse(message.payload)
        guard = revision_key(request.revision)
        invoice = request.invoice_id
        if await dsm.exists(invoice, guard):
            # The notice went out; a delivery that died before the totals were
            # written must not leave them behind, so make sure they are current.
            await self.publish_totals(dsm, request)
            return NodeExecutionResult.skip(
                f"revision {request.revision} of {invoice} already sent"
            )
        if not await dsm.try_acquire_lock(invoice, guard):
            return NodeExecutionResult.skip(
                f"revision {request.revision} of {invoice} is being sent by another worker"
            )
        try:
            notice = await self.notices.send_correction(invoice, request.revision, request.amount)
        except Exception as exc:
            # Nothing was sent: give the revision back for a redelivery.
            await dsm.release_lock_as_failed(invoice, f"{type(exc).__name__}: {exc}", guard)
            raise
        await record_completion(
            dsm, invoice, {"revision": request.revision, "notice": dict(notice)}, guard
        )
        await self.publish_totals(dsm, request)
        return NodeExecutionResult.success({"invoiceId": invoice, "revision": request.revision})

    async def publish_totals(self, dsm: DataStateMachine, request: CorrectionRequest) -> None:
        """Upsert the invoice's totals unless a revision at least as new is already there.

        The upsert takes no lock: a correction supersedes a result, it does not
        start work.  After a store error the record is read back, since the
        upsert may have landed.
        """
        totals = {
            "revision": request.revision,
            "amount": request.amount,
            "details": dict(request.details),
        }
        invoice = request.invoice_id
        for attempt in range(1, COMPLETE_ATTEMPTS + 1):
            try:
                current = await dsm.get(invoice)
                if current is not None and current.status is IdempotencyStatus.PROCESSED:
                    stored = current.data or {}
                    seen = stored.get("revision", 0)
                    if isinstance(seen, int) and seen >= request.revision:
                        return
                await dsm.upsert(invoice, totals)
                return
            except StoreError:
                if attempt == COMPLETE_ATTEMPTS:
                    raise


def correction_node(
    notices: NoticeApi,
) -> Callable[[Element, DataStateMachineFactory], CorrectionExecutor]:
    """The constructor to register under :data:`NODE_TYPE` in a node-type registry."""

    def build(element: Element, factory: DataStateMachineFactory) -> CorrectionExecutor:
        return CorrectionExecutor(element, factory, notices)

    return build
