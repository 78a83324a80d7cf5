"""A record of the wrong shape is a finding, never a crash of the kit.

A store that keeps the record and its payload in one document lets a payload
field named ``status`` or ``key`` stand for the record's own: ``get`` then
returns a record whose status is a text, or whose key is a number.  The judges
compare records field by field; such a record must be reported as what it is.
"""

from __future__ import annotations

import dataclasses

import pytest

from dsm_sim.conformance.runner import ResultStatus, verify
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import StateRecord

pytestmark = pytest.mark.property


class StatusAsText(InMemoryStateHandler):
    """``get`` answers the status as the text it stores, not as the enum."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = await super().get(ctx)
        if record is None:
            return None
        return dataclasses.replace(record, status=record.status.value)  # type: ignore[arg-type]


class KeyFromPayload(InMemoryStateHandler):
    """``get`` answers a key a payload field overwrote."""

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        record = await super().get(ctx)
        if record is None or not record.data or "key" not in record.data:
            return record
        return dataclasses.replace(record, key=record.data["key"])


@pytest.mark.parametrize("factory", [StatusAsText, KeyFromPayload])
def test_a_record_of_the_wrong_shape_is_a_finding(factory: type[InMemoryStateHandler]) -> None:
    report = verify(factory, "ci", seed=0, stop_on_first=True)
    assert report.error is None, report.error
    (caught,) = report.violations
    assert caught.status is ResultStatus.FAILED
    assert caught.name == "record_agrees_with_model", caught.render()
    assert "returned a record whose" in caught.message
