"""The screening node: screens each line of an invoice once, deciding some lines without a lock.

A line whose amount is zero needs no screening: the node records the
decision directly with ``set(Skipped)``, which takes no lock (a skip is a
decision, not work).  A line with a negative amount is invalid: the node has
taken the lock by then, and releases it as Failed (nothing was screened, so a
later delivery may try again).  Every other line is screened (the side
effect) and recorded Processed.

Lines are items keyed under their invoice (the invoice is the item entity
key).  A store error part-way through a pass repeats the pass inside the same
execution; lines already done answer ``exists`` and are skipped.  A release
whose reply was lost is retried with the same token: when the first release
landed, the retry finds it stored and succeeds without a second write; a
``StaleLockError`` on the retry means the lock was swept meanwhile, which
leaves the line Failed all the same.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import BaseNodeExecutor, Message, NodeExecutionResult
from reference_engine.errors import InvalidItemError, LockHeldError, StaleLockError, StoreError
from reference_engine.factory import DataStateMachineFactory
from reference_engine.machine import DataStateMachine
from reference_engine.nodes.completion import record_completion
from reference_engine.status import IdempotencyStatus

__all__ = [
    "NODE_TYPE",
    "PASS_ATTEMPTS",
    "Line",
    "LineOutcome",
    "ScreeningApi",
    "ScreeningExecutor",
    "screening_node",
]

#: The ``type`` of the screening node in workflow definitions.
NODE_TYPE = "invoice-screening"
#: Passes over the lines within one execution when the store fails part-way.
PASS_ATTEMPTS = 2


class ScreeningApi(Protocol):
    async def screen(self, line_id: str, amount: int) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Line:
    id: str
    amount: int


class LineOutcome(enum.Enum):
    """What happened to one line in a pass."""

    DONE = "done"
    SKIPPED = "skipped"
    INVALID = "invalid"


def _lines(payload: Mapping[str, Any]) -> tuple[str, tuple[Line, ...], Mapping[str, Any]]:
    invoice_id = payload.get("invoiceId")
    if not isinstance(invoice_id, str) or not invoice_id:
        raise InvalidItemError(
            f"screening message needs 'invoiceId' as a non-empty string, got {invoice_id!r}",
            field="invoiceId",
        )
    raw = payload.get("lines")
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise InvalidItemError(
            f"screening message needs 'lines' as a non-empty list, got {raw!r}", field="lines"
        )
    lines = []
    for i, entry in enumerate(raw):
        line_id = entry.get("id") if isinstance(entry, Mapping) else None
        amount = entry.get("amount") if isinstance(entry, Mapping) else None
        if not isinstance(line_id, str) or not line_id:
            raise InvalidItemError(
                f"lines[{i}] needs 'id' as a non-empty string, got {line_id!r}",
                field=f"lines[{i}].id",
            )
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidItemError(
                f"lines[{i}] needs 'amount' as an integer, got {amount!r}",
                field=f"lines[{i}].amount",
            )
        lines.append(Line(line_id, amount))
    details = payload.get("details", {})
    return invoice_id, tuple(lines), details if isinstance(details, Mapping) else {}


class ScreeningExecutor(BaseNodeExecutor):
    """Screen every line of an invoice once (per scope), skipping zero lines by rule.

    Message payload: ``{"invoiceId": str, "lines": [{"id": str, "amount": int}], "details": {}}``.
    """

    node_type = NODE_TYPE
    # Lines already screened are recognised only through their records: without them every
    # pass and every redelivery screens every line again.
    requires_data_state_machine = True

    def __init__(
        self, element: Element, factory: DataStateMachineFactory, screening: ScreeningApi
    ) -> None:
        super().__init__(element, factory)
        self.screening = screening

    async def execute(self, message: Message, dsm: DataStateMachine) -> NodeExecutionResult:
        invoice, lines, details = _lines(message.payload)
        for attempt in range(1, PASS_ATTEMPTS + 1):
            try:
                outcomes = [await self.line(dsm, invoice, line, details) for line in lines]
                break
            except StoreError:
                if attempt == PASS_ATTEMPTS:
                    raise
        invalid = [
            line.id for line, o in zip(lines, outcomes, strict=True) if o is LineOutcome.INVALID
        ]
        if invalid:
            return NodeExecutionResult.failure(
                f"invoice {invoice}: invalid lines {', '.join(invalid)} (negative amount)"
            )
        return NodeExecutionResult.success({"invoiceId": invoice, "lines": len(lines)})

    async def line(
        self, dsm: DataStateMachine, invoice: str, line: Line, details: Mapping[str, Any]
    ) -> LineOutcome:
        if await dsm.exists(line.id, invoice):
            return LineOutcome.SKIPPED
        if line.amount == 0:
            # A live lock of another worker raises LockHeldError: its decision stands.
            with contextlib.suppress(LockHeldError):
                await dsm.set(line.id, IdempotencyStatus.SKIPPED, {"rule": "zero amount"}, invoice)
            return LineOutcome.SKIPPED
        if not await dsm.try_acquire_lock(line.id, invoice):
            return LineOutcome.SKIPPED
        if line.amount < 0:
            await self.release(dsm, invoice, line, "validation failed: negative amount")
            return LineOutcome.INVALID
        try:
            verdict = await self.screening.screen(line.id, line.amount)
        except Exception as exc:
            await self.release(dsm, invoice, line, f"{type(exc).__name__}: {exc}")
            raise
        data = {"verdict": dict(verdict), "details": dict(details)}
        await record_completion(dsm, line.id, data, invoice)
        return LineOutcome.DONE

    @staticmethod
    async def release(dsm: DataStateMachine, invoice: str, line: Line, why: str) -> None:
        """Release as Failed; once more after a store error, since the first may have landed."""
        try:
            await dsm.release_lock_as_failed(line.id, why, invoice)
        except StoreError:
            try:
                await dsm.release_lock_as_failed(line.id, why, invoice)
            except StaleLockError:
                return  # swept meanwhile: the line is Failed all the same


def screening_node(
    screening: ScreeningApi,
) -> Callable[[Element, DataStateMachineFactory], ScreeningExecutor]:
    """The constructor to register under :data:`NODE_TYPE` in a node-type registry."""

    def build(element: Element, factory: DataStateMachineFactory) -> ScreeningExecutor:
        return ScreeningExecutor(element, factory, screening)

    return build
