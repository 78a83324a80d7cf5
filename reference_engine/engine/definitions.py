"""The engine's nouns: an element (a configured node) and a thread (one execution)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Element", "ExecutionThread"]


@dataclass(frozen=True, slots=True)
class Element:
    """A node of a workflow definition: its id, type and raw settings (JSON object)."""

    id: str
    workflow_id: str
    node_type: str
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExecutionThread:
    """One execution of a workflow for one message; a redelivery is a new thread."""

    execution_id: str
    tenant_id: str
    source_app_id: str
    message_id: str = ""
