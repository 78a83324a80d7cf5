"""The protocol's JSON Schema, shipped as package data, and validation against it.

Every answer a handler process writes is checked against the schema before
the harness acts on it, so a wrong type or a missing field is reported where
it is (``result.attempt``: expected integer) instead of surfacing three
steps later as a model disagreement nobody can trace back to the wire.

Checking is done in two steps.  :func:`conforms` runs the schema compiled
into plain Python checks (the few keywords the document uses), which costs a
few microseconds where a ``jsonschema`` validator costs hundreds on every
record a ``get`` returns: the kit reads every item back after every step.
Only when that says no does ``jsonschema`` look again, to name the field
and what was expected.  The two are tested to agree on the same messages.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.exceptions import best_match as _best_match

from dsm_sim.protocol import versions

__all__ = [
    "PROTOCOL_VERSION",
    "SchemaProblem",
    "conforms",
    "load_schema",
    "problem",
    "validator",
]

#: The newest version this harness speaks (it speaks every one in :data:`versions.VERSIONS`,
#: and ``open`` offers them all).
PROTOCOL_VERSION = versions.NEWEST


@functools.cache
def load_schema() -> dict[str, Any]:
    """The schema document (``dsm_sim/protocol/schema.json``)."""
    text = resources.files("dsm_sim.protocol").joinpath("schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def validator(definition: str) -> Draft202012Validator:
    """A validator for one ``$defs`` entry, with the rest of the document for its ``$ref`` s."""
    root = load_schema()
    if definition not in root["$defs"]:
        raise KeyError(f"the protocol schema has no definition {definition!r}")
    return Draft202012Validator({**root, "$ref": f"#/$defs/{definition}"})


class SchemaProblem:
    """Where a value breaks the schema and what the schema wanted there."""

    __slots__ = ("expected", "field", "message")

    def __init__(self, field: str, expected: str, message: str) -> None:
        self.field = field
        self.expected = expected
        self.message = message


def _expected(error: ValidationError) -> str:
    value = error.validator_value
    if error.validator == "$ref":
        return f"a value matching {value}"
    if error.validator == "required":
        return "fields " + ", ".join(repr(v) for v in value)
    if error.validator == "additionalProperties":
        return "no fields beyond those the schema names"
    if error.validator in ("oneOf", "anyOf"):
        return "one of the shapes the schema allows"
    return f"{error.validator} {json.dumps(value)}"


def problem(definition: str, value: object, *, prefix: str = "") -> SchemaProblem | None:
    """The most telling violation of ``definition`` by ``value``, or None when it conforms."""
    if conforms(definition, value):
        return None
    errors = list(validator(definition).iter_errors(value))
    if not errors:
        # Stricter than jsonschema by design: 1.0 is not an integer here, since
        # a token or a count read back as a float is a handler bug.
        return SchemaProblem(
            prefix,
            "integers written without a fraction",
            f"{value!r} has a float where an integer belongs",
        )
    worst = _best_match(errors)
    path = ".".join(str(part) for part in worst.absolute_path)
    field = ".".join(part for part in (prefix, path) if part)
    return SchemaProblem(field, _expected(worst), worst.message)


Check = Callable[[object], bool]
_ANNOTATIONS = frozenset(
    {"description", "title", "$schema", "$id", "$defs", "protocol", "protocols"}
)
_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _same(a: object, b: object) -> bool:
    """JSON equality: ``True`` is not ``1``."""
    return type(a) is type(b) and a == b


def _keyword(
    keyword: str, arg: Any, node: dict[str, Any], checks: dict[str, Check]
) -> Check | None:
    """The check for one keyword of a schema node; None for keywords that only annotate."""
    if keyword in _ANNOTATIONS or keyword == "then":  # "then" is compiled with its "if"
        return None
    if keyword == "additionalProperties" and arg is not False:
        return None
    if keyword == "$ref":
        name = str(arg).removeprefix("#/$defs/")
        return lambda v: checks[name](v)
    if keyword == "type":
        kinds = [_TYPES[t] for t in ([arg] if isinstance(arg, str) else arg)]
        if len(kinds) == 1:
            return kinds[0]
        return lambda v: any(kind(v) for kind in kinds)
    if keyword == "enum":
        allowed = list(arg)
        return lambda v: any(_same(v, a) for a in allowed)
    if keyword == "const":
        return lambda v: _same(v, arg)
    if keyword == "required":
        names = list(arg)
        return lambda v: not isinstance(v, dict) or all(n in v for n in names)
    if keyword == "properties":
        props = {name: _compile(sub, checks) for name, sub in arg.items()}

        def each_property(v: object) -> bool:
            if not isinstance(v, dict):
                return True
            # A plain loop: this runs on every field of every answer.
            for name, check in props.items():  # noqa: SIM110
                if name in v and not check(v[name]):
                    return False
            return True

        return each_property
    if keyword == "additionalProperties":
        known = frozenset(node.get("properties", {}))
        return lambda v: not isinstance(v, dict) or v.keys() <= known
    if keyword == "items":
        item = _compile(arg, checks)
        return lambda v: not isinstance(v, list) or all(map(item, v))
    if keyword == "minItems":
        least = int(arg)
        return lambda v: not isinstance(v, list) or len(v) >= least
    if keyword == "uniqueItems":
        return lambda v: not arg or not isinstance(v, list) or len(set(map(repr, v))) == len(v)
    if keyword == "minimum":
        low = float(arg)
        return lambda v: not isinstance(v, int | float) or isinstance(v, bool) or v >= low
    if keyword == "pattern":
        regex = re.compile(str(arg))
        return lambda v: not isinstance(v, str) or regex.search(v) is not None
    if keyword == "oneOf":
        subs = [_compile(sub, checks) for sub in arg]
        return lambda v: sum(1 for sub in subs if sub(v)) == 1
    if keyword == "not":
        negated = _compile(arg, checks)
        return lambda v: not negated(v)
    if keyword == "if":
        cond = _compile(arg, checks)
        then = _compile(node.get("then", True), checks)
        return lambda v: not cond(v) or then(v)
    raise ValueError(f"the schema uses {keyword!r}, which the fast check does not know")


def _compile(node: object, checks: dict[str, Check]) -> Check:
    if node is True:
        return lambda v: True
    if not isinstance(node, dict):
        raise ValueError(f"unsupported schema node {node!r}")
    parts = [
        part
        for keyword, arg in node.items()
        if (part := _keyword(keyword, arg, node, checks)) is not None
    ]
    if len(parts) == 1:
        return parts[0]

    def every(v: object) -> bool:
        for part in parts:  # noqa: SIM110 (no generator per call)
            if not part(v):
                return False
        return True

    return every


@functools.cache
def _compiled() -> dict[str, Check]:
    checks: dict[str, Check] = {}
    for name, node in load_schema()["$defs"].items():
        checks[name] = _compile(node, checks)
    return checks


def conforms(definition: str, value: object) -> bool:
    """Whether ``value`` matches ``definition``, by the compiled schema (the fast path)."""
    return _compiled()[definition](value)
