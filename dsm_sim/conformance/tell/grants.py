"""The handler's own tokens in a printed test of a counterexample found under ``--tokens ordered``.

Under ordered tokens the request lines carry the handler's tokens (a store
sequence, a rowversion), and the reference handler, which fences with attempt
numbers, would refuse every write that carries one.  :class:`OrderedGrants`
pairs each grant's token with the attempt the reference granted for the same
line, so the reference is sent its own tokens, and names each grant's token
as a variable of the printed test: a printer that keeps it asserts that the
grant exceeds the item's earlier ones, never its value, and passes it to the
writes made under it, as a caller would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Grant", "OrderedGrants", "item_of"]

#: The context fields that name an item's record.
_ITEM_FIELDS = ("tenant_id", "scope_id", "entity_id", "item_entity_key", "item_key")


def item_of(request: dict[str, Any]) -> str:
    """The item a request is about, as one comparable text."""
    ctx = request.get("context") or {}
    return json.dumps([ctx.get(name) for name in _ITEM_FIELDS])


@dataclass(frozen=True, slots=True)
class Grant:
    """A grant in the printed test: the variable that holds its token, and the item's one before."""

    variable: str
    previous: str | None


class OrderedGrants:
    """Per item: the handler's tokens, the reference's attempts, and the test's variables."""

    def __init__(self, answers: dict[int, dict[str, Any]]) -> None:
        #: The handler's answers by request id: where its tokens are read from.
        self.answers = answers
        self.attempts: dict[tuple[str, int], int] = {}
        self.variables: dict[tuple[str, int], str] = {}
        #: By request id: each grant both the handler and the reference made.
        self.grants: dict[int, Grant] = {}
        #: By request id: the variable of the grant whose token the request carries.
        self.carried: dict[int, str] = {}
        self._latest: dict[str, str] = {}

    def for_reference(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` with the handler's token replaced by the attempt it was paired with.

        Called in the order the lines were sent, so a token names the grant
        made before it (a later grant of the same value is a later variable).
        """
        ctx = request.get("context")
        if not isinstance(ctx, dict) or not isinstance(ctx.get("lock_token"), int):
            return request
        key = (item_of(request), ctx["lock_token"])
        attempt = self.attempts.get(key)
        if attempt is None:
            return request  # a token no grant issued: stale for both alike
        self.carried[request["id"]] = self.variables[key]
        return {**request, "context": {**ctx, "lock_token": attempt}}

    def answered(self, request: dict[str, Any], reference: dict[str, Any] | None) -> None:
        """After ``request`` went to the reference: pair a grant both made."""
        if request.get("op") != "try_acquire_lock" or reference is None:
            return
        own = self.answers.get(request["id"], {}).get("result")
        attempt = reference.get("result")
        if not isinstance(own, int) or not isinstance(attempt, int):
            return
        if isinstance(own, bool) or isinstance(attempt, bool):
            return
        item = item_of(request)
        variable = f"token{request['id']}"
        self.attempts[(item, own)] = attempt
        self.variables[(item, own)] = variable
        self.grants[request["id"]] = Grant(variable, self._latest.get(item))
        self._latest[item] = variable
