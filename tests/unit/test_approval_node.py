"""The approval node refuses a malformed message before it touches any record."""

from __future__ import annotations

from typing import Any

import pytest

from reference_engine.errors import InvalidItemError
from reference_engine.nodes.approval import Action, ApprovalRequest


def test_a_well_formed_message_parses() -> None:
    payload = {"itemId": "inv-1", "action": "amend", "amount": 5, "details": {}, "merge": True}
    request = ApprovalRequest.parse(payload)
    assert (request.item, request.action, request.amount, request.merge) == (
        "inv-1",
        Action.AMEND,
        5,
        True,
    )
    assert request.decline is None


def test_an_empty_decline_reason_is_kept_verbatim() -> None:
    request = ApprovalRequest.parse({"itemId": "inv-1", "action": "approve", "decline": ""})
    assert request.decline == ""


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"action": "approve"}, "itemId"),
        ({"itemId": "i", "action": "pay"}, "action"),
        ({"itemId": "i", "action": "approve", "amount": -1}, "amount"),
        ({"itemId": "i", "action": "approve", "amount": True}, "amount"),
        ({"itemId": "i", "action": "approve", "details": []}, "details"),
        ({"itemId": "i", "action": "approve", "decline": 3}, "decline"),
        ({"itemId": "i", "action": "amend", "merge": "yes"}, "merge"),
    ],
)
def test_a_malformed_message_names_its_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidItemError) as caught:
        ApprovalRequest.parse(payload)
    assert caught.value.field == field
    assert field in str(caught.value)
