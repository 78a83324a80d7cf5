"""Payloads and error details from the whole documented domain, and an exact comparison.

A world whose data is ``{"amount": 0..9}`` passes a handler that stores data
in a ``jsonb`` column: then a NUL in a string makes ``set`` fail after the
charge, and ``1.5e300`` reads back as another number.  So the kit draws JSON
objects with NUL and escapes in strings, astral and combining characters,
floats such as ``1e300``, ``-0.0`` and ``5e-324``, big integers, nesting, and
sizes near the limit; error details likewise, after the cleaning the node API
applies (:func:`reference_engine.record.clean_error_detail`).

Field names and text values come from the whole domain too
(:mod:`dsm_sim.conformance.generate.texts`): names the record and document
stores give meaning to (``status``, ``_id``, ``$set``, ``__proto__``), text
that parses as another JSON type beside the value it looks like (``"1"`` and
``1``), and every line ending and whitespace form, in error details as well.

"Reads back as written" is decided by :func:`data_difference`, which tells
``-0.0`` from ``0.0``, ``1`` from ``1.0``, ``True`` from ``1`` and ``"1"``
from ``1`` (Python's ``==`` does not tell the first three), and names the
first place where two payloads differ.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from dsm_sim.conformance.generate.texts import FIELD_NAMES, LINE_FORMS, LOOKALIKES, lookalike_pairs
from reference_engine.record import (
    MAX_DATA_BYTES,
    MAX_ERROR_DETAIL,
    MAX_INT_DIGITS,
    clean_error_detail,
)

T = TypeVar("T")

__all__ = [
    "DATA",
    "EMPTIES",
    "ERRORS",
    "ERROR_DETAILS",
    "FIELD_NAMES",
    "LINE_FORMS",
    "LOOKALIKES",
    "NUMBERS",
    "OBJECTS",
    "PLAIN_DATA",
    "STRINGS",
    "data_difference",
    "lookalike_payload",
    "named_payload",
    "nested",
]

#: Strings that stores get wrong: NUL (PostgreSQL text and jsonb refuse it),
#: JSON's escapes, line and paragraph separators, a BOM, combining and astral
#: characters, quotes and backslashes.
STRINGS: tuple[str, ...] = (
    "",
    "a\x00b",
    "\x00",
    "\\u0000",
    '"quoted" \\ back\\slash',
    "line\nbreak\r\ttab\b\f\x1f",
    "\u2028\u2029",
    "\ufeffbom",
    "cafe\u0301",
    "caf\u00e9",
    "\U0001f600\U0001d11e",
    "\u00df\u03a9",
    "'; DROP TABLE process_state_logs; --",
    " ",
    "  padded\t",
)
#: Numbers at the edges of IEEE doubles and of 64-bit integers, and the
#: ones whose type or sign a store's numeric conversion loses.
NUMBERS: tuple[object, ...] = (
    1e300,
    1.5e300,
    -0.0,
    0.0,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    0.1,
    0.30000000000000004,
    1.0,
    1,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    # Past 38 significant digits (NUMBER(38), DynamoDB, DECIMAL(38)), past
    # DECIMAL(65), and the documented limit of MAX_INT_DIGITS digits.
    10**38 + 1,
    -(10**39) - 7,
    10**65 + 3,
    10**MAX_INT_DIGITS - 1,
    -(10**MAX_INT_DIGITS) + 1,
    -1,
    0,
    # Doubles that need all 17 significant digits.
    2.718281828459045,
    -1.2345678901234567e-300,
    9007199254740993.0,
    True,
    False,
    None,
)
#: Empty values a store confuses with "nothing": ``if data:`` where ``if data
#: is not None:`` belongs, an ORM dropping empty lists, a mapper removing empty
#: objects.  (Sampled values are shared between draws; the kit never mutates
#: a drawn value, it mutates copies.)
EMPTIES: tuple[object, ...] = ({}, [], [[]], [{}], {"": {}}, {"list": []})
#: Any text, short: beside the telling strings, what nobody thought of.
_TEXT = st.text(max_size=6)
_SCALARS = (
    st.sampled_from((*STRINGS, *NUMBERS, *EMPTIES))
    | st.sampled_from((*LOOKALIKES, *LINE_FORMS))
    | _TEXT
)
#: A field name: the telling strings, the names the record, the protocol and
#: document stores give meaning to (:data:`FIELD_NAMES`), or any text.
_NAMES = st.sampled_from(STRINGS) | st.sampled_from(FIELD_NAMES) | _TEXT
#: A value is a scalar, or a short list or object of scalars: two or three
#: draws each, so a payload costs the search little.
_VALUES = _SCALARS | st.lists(_SCALARS, max_size=3) | st.dictionaries(_NAMES, _SCALARS, max_size=2)
#: Nested as deep as a result plausibly is, and beyond what a recursive
#: decoder with a small stack handles.
_DEEP = st.sampled_from((20, 40)).map(lambda depth: {"deep": nested(depth)})
#: Just under and just over the size limit once serialised, in one-, two- and
#: four-byte characters: a limit counted in characters instead of bytes, or a
#: column sized in characters, shows here.
_NEAR_LIMIT = st.builds(
    lambda char, over: {"blob": char * ((MAX_DATA_BYTES + over) // len(char.encode("utf-8")))},
    st.sampled_from(("x", "\u00e9", "\U0001f600")),
    st.sampled_from((-16, 64)),
)
_SMALL = st.fixed_dictionaries(
    {"amount": st.integers(0, 9)}, optional={"note": st.sampled_from(("a", "b'", "\u00e9\u2713"))}
)
_DOMAIN = st.dictionaries(_NAMES, _VALUES, min_size=1, max_size=3)


def named_payload(names: tuple[str, ...], value: Callable[[int, str], Any]) -> dict[str, Any]:
    """One field per name, holding ``value(index, name)``."""
    return {name: value(index, name) for index, name in enumerate(names)}


def lookalike_payload(pairs: tuple[tuple[str, object], ...]) -> dict[str, Any]:
    """Each text beside the value of another type it looks like, in one object and one list.

    ``{"text0": "1", "value0": 1, "pairs": [["1", 1], ...]}``: a store that
    types a column by its first value, or converts one field by its neighbour's
    type, meets both in the same payload.
    """
    payload: dict[str, Any] = {}
    for index, (text, value) in enumerate(pairs):
        payload[f"text{index}"] = text
        payload[f"value{index}"] = value
    payload["pairs"] = [[text, value] for text, value in pairs]
    return payload


@st.composite
def _lookalikes(draw: st.DrawFn) -> dict[str, Any]:
    """A few look-alike pairs around a drawn number, side by side."""
    pairs = lookalike_pairs(draw(st.integers(0, 99)))
    chosen = draw(st.lists(st.integers(0, len(pairs) - 1), min_size=1, max_size=3, unique=True))
    return lookalike_payload(tuple(pairs[index] for index in chosen))


#: Fields named as the record's, the protocol's or a document store's own,
#: and twins that differ by case or normalisation, in one object.
_NAMED = st.dictionaries(st.sampled_from(FIELD_NAMES), _SCALARS, min_size=1, max_size=4)
#: The empty object itself, and objects of nothing but empty, zero, false and
#: null values: each must read back as written, not as None or without its keys.
_EMPTY: st.SearchStrategy[dict[str, Any]] = st.just({}) | st.dictionaries(
    st.sampled_from(("items", "meta", "", "note")),
    st.sampled_from((*EMPTIES, "", 0, 0.0, False, None)),
    min_size=1,
    max_size=3,
)


@st.composite
def _fresh(draw: st.DrawFn, values: st.SearchStrategy[T]) -> T:
    """A deep copy of the drawn value.

    Drawn in a composite rather than by ``.map(copy.deepcopy)``: Hypothesis
    prints a mapped value as the call that made it (``deepcopy(...)``), which
    a pasted reproduction cannot run; a composite's value prints as itself.
    """
    return copy.deepcopy(draw(values))


#: The small, readable payloads first (what a shrunk story shows), then the
#: domain; the deep and near-limit ones are rarer, as they are costly to store.
#: Every draw is a fresh object (sampled lists and objects are copied): a
#: handler that keeps the caller's dict, and a caller that changes it, must
#: never change a value Hypothesis replays.
DATA: st.SearchStrategy[dict[str, Any] | None] = _fresh(
    st.one_of(
        st.none(), _SMALL, _DOMAIN, _NAMED | _lookalikes(), _EMPTY, _DOMAIN, _DEEP | _NEAR_LIMIT
    )
)

#: Payloads a caller holds on to after passing them (never None): see
#: :mod:`dsm_sim.conformance.execute.lifecycle`.
OBJECTS: st.SearchStrategy[dict[str, Any]] = _fresh(
    st.one_of(_SMALL, _EMPTY, _DOMAIN, _NAMED | _lookalikes())
)

#: For rules where the payload is beside the point (a race, a retry): cheap to draw.
PLAIN_DATA: st.SearchStrategy[dict[str, Any] | None] = st.none() | _SMALL

#: Error details as the node API passes them on: cleaned (no NUL, valid
#: UTF-8) and at most :data:`MAX_ERROR_DETAIL` characters, which in astral
#: characters is four times as many bytes.  The empty detail is a detail
#: (not NULL, as Oracle's ``'' IS NULL`` or ``detail or None`` make it), and
#: so is one of only whitespace, or one with whitespace at either end (which
#: a ``CHAR`` column or a ``strip()`` changes).
ERROR_DETAILS: tuple[str, ...] = tuple(
    clean_error_detail(detail)
    for detail in (
        "card declined",
        "timeout after 30s",
        *STRINGS,
        "\t\n \r",
        " card declined ",
        "Zahlung abgelehnt: Karte ung\u00fcltig",
        "\u652f\u6255\u3044\u304c\u62d2\u5426\u3055\u308c\u307e\u3057\u305f",
        *(char * MAX_ERROR_DETAIL for char in ("x", "\u00e9", "\U0001f600")),
        "x" * (MAX_ERROR_DETAIL - 1) + " ",
        "x" * (MAX_ERROR_DETAIL + 10),
        # Every line ending and whitespace form a text layer rewrites, and
        # details that read as another type (a store may keep "null" as NULL).
        *LINE_FORMS,
        "null",
        "1",
        "true",
        '{"error": 1}',
    )
)
ERRORS: st.SearchStrategy[str] = st.sampled_from(ERROR_DETAILS)


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


def data_difference(written: object, read: object, path: str = "data") -> str | None:
    """Where ``read`` differs from ``written`` as JSON, or None when they are the same.

    Types count (``1`` is not ``1.0``, ``True`` is not ``1``, ``"1"`` is not
    ``1``), and so do the sign of zero, the order of a list and every
    character of every string and name; an object's member order does not
    (JSON gives it no meaning, and the model keeps canonical JSON, its names
    sorted).
    """
    if type(written) is not type(read):
        if isinstance(written, Mapping) and isinstance(read, Mapping):
            pass  # any mapping reads back as a JSON object
        elif _is_list(written) and _is_list(read):
            pass
        else:
            return f"{path} is {_short(read)} ({type(read).__name__}); written {_short(written)} ({type(written).__name__})"
    if isinstance(written, Mapping):
        assert isinstance(read, Mapping)
        if set(written) != set(read):
            # Sorted by repr: a store may hand back keys that are not text (1 for "1").
            missing = sorted(set(written) - set(read), key=repr)
            extra = sorted(set(read) - set(written), key=repr)
            return (
                f"{path} has keys {sorted(read, key=repr)!r}; written "
                f"{sorted(written, key=repr)!r} (missing {missing!r}, extra {extra!r})"
            )
        for key in sorted(written):
            if (found := data_difference(written[key], read[key], f"{path}[{key!r}]")) is not None:
                return found
        return None
    if _is_list(written):
        assert isinstance(read, Sequence)
        assert isinstance(written, Sequence)
        if len(written) != len(read):
            return f"{path} has {len(read)} elements; written {len(written)}"
        for index, (one, other) in enumerate(zip(written, read, strict=True)):
            if (found := data_difference(one, other, f"{path}[{index}]")) is not None:
                return found
        return None
    if isinstance(written, float) and isinstance(read, float):
        same = written == read and math.copysign(1.0, written) == math.copysign(1.0, read)
        return None if same else f"{path} is {read!r}; written {written!r}"
    return None if written == read else f"{path} is {_short(read)}; written {_short(written)}"


def _is_list(value: object) -> bool:
    return isinstance(value, list | tuple)


def _short(value: object) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text)} characters)"
