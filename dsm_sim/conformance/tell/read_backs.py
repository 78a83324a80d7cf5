"""Which of the kit's read-backs a printed test keeps: the one that showed the failure.

After each step the kit reads the items back (``get`` as the observer,
execution ``run-0``) to compare the store with its model.  A printed test is
the program's own steps: those reads are left out, but for the one that
showed the failure.  Given the handler's answers, that is the first call
whose answer is not the reference's, when it is a read; without them, the
reads after the program's last step, where the run stopped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dsm_sim.conformance.generate.draws import OBSERVER
from dsm_sim.model import execution_id

__all__ = ["failing_read_backs", "is_read_back"]


def is_read_back(request: dict[str, Any]) -> bool:
    """A ``get`` the kit made to compare the store with its model, not a step of the program."""
    ctx = request.get("context") or {}
    return request.get("op") == "get" and ctx.get("entity_execution_id") == execution_id(OBSERVER)


def _observed(answer: dict[str, Any] | None, grant: bool = False) -> object:
    """What an answer says, key order aside: the result, or the error's kind.

    ``grant`` (under ``--tokens ordered``): a grant's token says only that it
    is a grant (its order is the test's to assert; its value is the store's own).
    """
    if answer is None:
        return None
    if "error" in answer:
        error = answer["error"]
        return ("error", error.get("kind") if isinstance(error, dict) else error)
    result = answer.get("result")
    if grant and isinstance(result, int) and not isinstance(result, bool):
        return ("grant",)
    return ("result", result)


def failing_read_backs(
    calls: Sequence[dict[str, Any]],
    expected: dict[int, Any],
    answers: dict[int, dict[str, Any]] | None,
    *,
    ordered: bool = False,
) -> set[int]:
    """The ids of the kit's reads among ``calls`` that a printed test keeps.

    ``calls`` are the requests made through the contract, in order;
    ``expected`` the reference's answers and ``answers`` the handler's, by
    request id.  With ``answers``, the first call whose answer is not the
    reference's is the breaking step; it is kept if it is a read (a step of
    the program is kept anyway).  Without them, the reads after the program's
    last step: the run stops at its first finding, so one of them showed it,
    unless the step's own answer did.  ``ordered``: grants compared as grants.
    """
    if answers is not None:
        for request in calls:
            got = answers.get(request["id"])
            grant = ordered and request.get("op") == "try_acquire_lock"
            if got is not None and _observed(got, grant) != _observed(
                expected.get(request["id"]), grant
            ):
                return {request["id"]} if is_read_back(request) else set()
        return set()
    kept: dict[str, int] = {}
    for request in reversed(calls):
        if not is_read_back(request):
            break
        kept[json.dumps(request.get("context"), sort_keys=True)] = request["id"]
    return set(kept.values())
