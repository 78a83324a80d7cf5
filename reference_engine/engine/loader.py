"""Loading a workflow definition (JSON) into frozen values, refusing bad ones with a named error.

A definition is checked completely before any node runs: a typo in a node id,
a missing ``type`` or a misconfigured ``dataStateMachine`` block must stop the
deployment, not surface on the first message hours later.  Every error names
the field (``nodes[2].settings``) and what would have been accepted.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_engine.config import parse_node_settings
from reference_engine.engine.definitions import Element
from reference_engine.errors import ConfigurationError, InvalidSettingsError

__all__ = [
    "MAX_ID_LENGTH",
    "NODE_FIELDS",
    "WORKFLOW_FIELDS",
    "DuplicateNodeError",
    "InvalidWorkflowError",
    "UnknownNodeTypeError",
    "WorkflowDefinition",
    "load_workflow",
    "load_workflow_file",
]

#: Fields a workflow object may carry; anything else is refused as a likely typo.
WORKFLOW_FIELDS = ("id", "name", "nodes")
#: Fields a node object may carry.
NODE_FIELDS = ("id", "type", "name", "settings")
#: Ids become entity ids in records (scope Element keys by node id), so they obey key limits.
MAX_ID_LENGTH = 256


class InvalidWorkflowError(InvalidSettingsError):
    """The workflow definition is malformed; ``field`` is the JSON path of the culprit."""


class DuplicateNodeError(InvalidWorkflowError):
    """Two nodes share an id; records are keyed by node id, so they would share state."""

    def __init__(self, node_id: str, *, first: int, second: int) -> None:
        self.node_id = node_id
        self.first = first
        self.second = second
        super().__init__(
            f"workflow definition: nodes[{first}] and nodes[{second}] both have id {node_id!r}; "
            "node ids must be unique within a workflow",
            field=f"nodes[{second}].id",
        )


class UnknownNodeTypeError(ConfigurationError):
    """A node's ``type`` has no registered executor constructor."""

    def __init__(self, node_type: str, registered: Sequence[str], *, node_id: str = "") -> None:
        self.node_type = node_type
        self.registered = tuple(registered)
        self.node_id = node_id
        where = f" (node {node_id!r})" if node_id else ""
        listing = ", ".join(repr(k) for k in self.registered) or "(none)"
        super().__init__(
            f"unknown node type {node_type!r}{where}; registered node types: {listing}. "
            "Register it with NodeTypeRegistry.register(node_type, constructor)"
        )


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A loaded workflow: its id and its nodes, in the order a message passes through them."""

    id: str
    elements: tuple[Element, ...]
    name: str = ""

    def element(self, node_id: str) -> Element:
        """The node with id ``node_id``; a missing id lists the ones that exist."""
        for element in self.elements:
            if element.id == node_id:
                return element
        known = ", ".join(repr(e.id) for e in self.elements) or "(none)"
        raise InvalidWorkflowError(
            f"workflow {self.id!r} has no node {node_id!r}; its nodes are: {known}", field="nodes"
        )

    @property
    def node_types(self) -> tuple[str, ...]:
        """The distinct node types used, in first-use order."""
        return tuple(dict.fromkeys(e.node_type for e in self.elements))


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _identifier(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidWorkflowError(
            f"workflow definition: {field!r} must be a non-empty string, got {value!r}",
            field=field,
        )
    if len(value) > MAX_ID_LENGTH or "\x00" in value:
        raise InvalidWorkflowError(
            f"workflow definition: {field!r} must be at most {MAX_ID_LENGTH} characters "
            "without NUL characters",
            field=field,
        )
    return value


def _check_fields(raw: Mapping[str, Any], allowed: Sequence[str], *, where: str) -> None:
    for name in raw:
        if name not in allowed:
            prefix = f"{where}." if where else ""
            raise InvalidWorkflowError(
                f"workflow definition: unknown field {prefix}{name}; allowed fields: "
                f"{', '.join(allowed)}",
                field=f"{prefix}{name}",
            )


def _load_node(raw: object, index: int, workflow_id: str) -> Element:
    where = f"nodes[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidWorkflowError(
            f"workflow definition: {where} must be an object with fields "
            f"{', '.join(NODE_FIELDS)}; got {_type_name(raw)}",
            field=where,
        )
    _check_fields(raw, NODE_FIELDS, where=where)
    for required in ("id", "type"):
        if required not in raw:
            raise InvalidWorkflowError(
                f"workflow definition: {where} is missing the required field {required!r}",
                field=f"{where}.{required}",
            )
    node_id = _identifier(raw["id"], field=f"{where}.id")
    node_type = _identifier(raw["type"], field=f"{where}.type")
    if not isinstance(raw.get("name", ""), str):
        raise InvalidWorkflowError(
            f"workflow definition: {where}.name must be a string, got {_type_name(raw['name'])}",
            field=f"{where}.name",
        )
    settings = raw.get("settings", {})
    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        raise InvalidWorkflowError(
            f"workflow definition: {where}.settings must be an object, got {_type_name(settings)}",
            field=f"{where}.settings",
        )
    try:
        parse_node_settings(settings)
    except ConfigurationError as exc:
        exc.add_note(f"in {where} (node {node_id!r}) of workflow {workflow_id!r}")
        raise
    # A private copy: the caller mutating its dict later must not change a loaded workflow.
    return Element(
        id=node_id,
        workflow_id=workflow_id,
        node_type=node_type,
        settings=copy.deepcopy(dict(settings)),
    )


def load_workflow(source: str | bytes | Mapping[str, Any]) -> WorkflowDefinition:
    """Parse and validate a definition given as JSON text or an already-decoded object."""
    decoded: object
    if isinstance(source, str | bytes):
        try:
            decoded = json.loads(source)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidWorkflowError(
                f"workflow definition is not valid JSON: {exc}", field=""
            ) from exc
    else:
        decoded = source
    if not isinstance(decoded, Mapping):
        raise InvalidWorkflowError(
            "workflow definition must be a JSON object with fields "
            f"{', '.join(WORKFLOW_FIELDS)}; got {_type_name(decoded)}",
            field="",
        )
    _check_fields(decoded, WORKFLOW_FIELDS, where="")
    if "id" not in decoded:
        raise InvalidWorkflowError(
            "workflow definition is missing the required field 'id'", field="id"
        )
    workflow_id = _identifier(decoded["id"], field="id")
    name = decoded.get("name", "")
    if not isinstance(name, str):
        raise InvalidWorkflowError(
            f"workflow definition: 'name' must be a string, got {_type_name(name)}", field="name"
        )
    nodes = decoded.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise InvalidWorkflowError(
            "workflow definition: 'nodes' must be a non-empty list of node objects, got "
            f"{_type_name(nodes) if not isinstance(nodes, list) else 'an empty list'}",
            field="nodes",
        )
    elements: list[Element] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(nodes):
        element = _load_node(raw, index, workflow_id)
        if element.id in seen:
            raise DuplicateNodeError(element.id, first=seen[element.id], second=index)
        seen[element.id] = index
        elements.append(element)
    return WorkflowDefinition(id=workflow_id, elements=tuple(elements), name=name)


def load_workflow_file(path: str | os.PathLike[str]) -> WorkflowDefinition:
    """Read a definition file (UTF-8 JSON); an unreadable file is a configuration error."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidWorkflowError(
            f"cannot read workflow definition {str(file)!r}: {exc.strerror or exc}", field=""
        ) from exc
    try:
        return load_workflow(text)
    except ConfigurationError as exc:
        exc.add_note(f"in workflow definition file {str(file)!r}")
        raise
