"""Recording a completed side effect: the one write a node must not give up on.

After the side effect, a ``StoreError`` leaves the outcome of ``set`` unknown:
the write may have landed.  Releasing the lock then would hand finished work
to the next delivery, so the write is retried with the token still held,
after reading the record back in case it already holds this result.  Shared
by every node that records a side effect (``docs/semantics.md``, "The node
pattern around a side effect").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reference_engine.errors import StoreError
from reference_engine.machine import DataStateMachine
from reference_engine.status import IdempotencyStatus

__all__ = ["COMPLETE_ATTEMPTS", "record_completion"]

#: How many times a completed effect is written before the lock is left to expire
#: (a store that fails this often is down, not flaky).
COMPLETE_ATTEMPTS = 3


async def record_completion(
    dsm: DataStateMachine, item_key: str, data: Mapping[str, Any], item_entity_key: str = ""
) -> None:
    """``set(Processed, data)``, retried on store errors; a fenced write (``LockError``) is final."""
    expected = json.loads(json.dumps(data))
    for attempt in range(1, COMPLETE_ATTEMPTS + 1):
        try:
            await dsm.set(item_key, IdempotencyStatus.PROCESSED, data, item_entity_key)
            return
        except StoreError:
            if attempt == COMPLETE_ATTEMPTS:
                raise
        try:
            record = await dsm.get(item_key, item_entity_key)
        except StoreError:
            continue
        if (
            record is not None
            and record.status is IdempotencyStatus.PROCESSED
            and record.data == expected
        ):
            return
