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
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_engine.config import parse_node_settings
from reference_engine.engine.definitions import Element
from reference_engine.errors import ConfigurationError, InvalidSettingsError, clip, echo

__all__ = [
    "MAX_DEPTH",
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
#: How deeply objects and lists may nest in a definition, the definition itself being level 1
#: (a node's settings are level 4).  Far more than any settings need, far less than the stack.
MAX_DEPTH = 64


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


#: Unicode categories an id may not contain: controls (NUL, newlines), format characters
#: (zero-width spaces and joiners, direction marks, BOM) and surrogates (not UTF-8 text).
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})
_ID_RULE = (
    f"ids are 1 to {MAX_ID_LENGTH} characters of visible text, without leading or "
    "trailing whitespace, control, zero-width or format characters, or lone surrogates"
)


def _identifier(value: object, *, field: str) -> str:
    """An id as given, or refused at load time with what was wrong.

    Ids become entity ids in records and names in logs: one that looks like
    another (a trailing space, a zero-width character) would key records of
    its own that nobody can tell apart, and one that is not UTF-8 fails in
    the store on the first message instead of at deployment.
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidWorkflowError(
            f"workflow definition: {field!r} must be a non-empty string, got {echo(value)}; "
            f"{_ID_RULE}",
            field=field,
        )
    problem = ""
    if len(value) > MAX_ID_LENGTH:
        problem = f"is {len(value)} characters long"
    elif value != value.strip():
        problem = "has leading or trailing whitespace"
    else:
        bad = next((c for c in value if unicodedata.category(c) in _INVISIBLE_CATEGORIES), "")
        if bad:
            kind = "a lone surrogate" if unicodedata.category(bad) == "Cs" else "the character"
            problem = f"contains {kind} U+{ord(bad):04X}"
    if problem:
        raise InvalidWorkflowError(
            f"workflow definition: {field!r} {problem} (got {echo(value)}); {_ID_RULE}",
            field=field,
        )
    return value


def _check_depth(decoded: object) -> None:
    """Refuse a definition nested deeper than :data:`MAX_DEPTH`, without recursing.

    Copying or encoding such a definition later would exhaust the stack;
    a structure that contains itself always reaches the limit.
    """
    pending: list[tuple[object, int]] = [(decoded, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, Mapping | list | tuple):
            if depth > MAX_DEPTH:
                raise _too_deep()
            children = value.values() if isinstance(value, Mapping) else value
            pending.extend((child, depth + 1) for child in children)


def _too_deep() -> InvalidWorkflowError:
    return InvalidWorkflowError(
        f"workflow definition nests objects and lists deeper than {MAX_DEPTH} levels "
        "(or refers to itself); the limit counts the definition object as level 1",
        field="",
    )


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
        except RecursionError:
            raise _too_deep() from None
        except (UnicodeDecodeError, ValueError) as exc:  # ValueError: e.g. a 5,000-digit number
            raise InvalidWorkflowError(
                f"workflow definition is not valid JSON: {clip(str(exc), 200)}", field=""
            ) from exc
    else:
        decoded = source
    _check_depth(decoded)
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
