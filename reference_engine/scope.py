"""The scope table: how wide an item key's idempotency reaches.

The scope decides which entity id a record is keyed under, so the same item
key can be "already processed" for one element and fresh for another.
"""

from __future__ import annotations

import enum

from reference_engine.errors import UnknownScopeError

__all__ = ["Scope", "resolve_scope"]


class Scope(enum.IntEnum):
    """Scope name -> the id stored in ``process_state_logs.scope_id``.

    ========== == ==================================================================
    name       id entity id the record is keyed under
    ========== == ==================================================================
    Tenant     1  the tenant: one record per item across the whole tenant
    Application 2 the source application that sent the message
    Workflow   3  the workflow: shared by every node of one workflow
    Element    4  the node (element): the default, one record per node and item
    Thread     5  the execution (thread): only dedupes within one run
    ========== == ==================================================================
    """

    TENANT = 1
    APPLICATION = 2
    WORKFLOW = 3
    ELEMENT = 4
    THREAD = 5

    @property
    def code(self) -> str:
        """The name used in node settings ("Element")."""
        return self.name.capitalize()

    def __repr__(self) -> str:
        return f"Scope.{self.name}"


def resolve_scope(name: str) -> Scope:
    """Resolve a settings name ("Element", case-insensitive) to its :class:`Scope`."""
    for scope in Scope:
        if isinstance(name, str) and scope.code.lower() == name.strip().lower():
            return scope
    raise UnknownScopeError(str(name), [s.code for s in Scope])
