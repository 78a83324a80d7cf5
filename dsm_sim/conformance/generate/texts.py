"""Text from the whole JSON domain: field names that mean something, values that look like
other types, and every line ending and whitespace form.

A payload whose fields are ``amount`` and ``note`` passes a store that merges
the payload into the record's own document (a field named ``status`` or
``attempt`` then overwrites the record's, or is overwritten by it), a store
that parses text that looks like a number back into a number, and one that
rewrites ``\\r\\n`` on the way.  So the kit draws:

* :data:`FIELD_NAMES`: the names the record gives meaning to (every field
  of :class:`~reference_engine.record.StateRecord` and
  :class:`~reference_engine.context.RecordKey`, as written and in camelCase,
  and the protocol's), the names document stores and JavaScript give meaning
  to (``_id``, ``$set``, ``__proto__``, ``constructor``...), paths
  (``a.b``, ``a[0]``, ``/a``), the empty name, a very long one, non-ASCII,
  and names that differ only by case, padding or Unicode normalisation, side
  by side in one object;
* :data:`LOOKALIKES`: text another JSON type parses from (numbers in every
  spelling, ``true``/``True``, ``null``, JSON fragments, padded forms), and
  :func:`lookalike_pairs`: a text and the value of another type a store's
  conversion reads it as (``"1"`` and ``1``, ``"true"`` and ``true``,
  ``"null"`` and ``null``), searched as
  :func:`~dsm_sim.conformance.generate.worlds.conversion_pairs` searches
  identifiers: every spelling through every conversion;
* :data:`LINE_FORMS`: every line ending (``\\n``, ``\\r\\n``, ``\\r``, NEL,
  ``\\u2028``, ``\\u2029``, vertical tab, form feed) and whitespace form (tabs,
  trailing and leading spaces, no-break and ideographic spaces, blank lines)
  that a text layer rewrites, for every free-text field a handler stores.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import json
import math
import unicodedata
from collections.abc import Callable

from reference_engine.context import RecordKey
from reference_engine.record import StateRecord

__all__ = [
    "FIELD_NAMES",
    "LINE_FORMS",
    "LOOKALIKES",
    "camel",
    "lookalike_pairs",
    "spellings",
]


def camel(name: str) -> str:
    """``locked_until`` as ``lockedUntil``: how a JSON document or an ORM may name a field."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


#: The record's own field names, and the key's: what a store that keeps the
#: payload beside (or merged into) the record's fields must keep apart.
_RECORD_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(
        name
        for cls in (StateRecord, RecordKey)
        for field in dataclasses.fields(cls)
        for name in (field.name, camel(field.name))
    )
)
#: Names the protocol, document stores and JavaScript objects give meaning to.
_MEANINGFUL: tuple[str, ...] = (
    "token",
    "lock_token",
    "data_json",
    "error",
    "id",
    "_id",
    "_rev",
    "_key",
    "_ttl",
    "ttl",
    "key",
    "value",
    "type",
    "$set",
    "$inc",
    "$where",
    "$ref",
    "@type",
    "__proto__",
    "constructor",
    "prototype",
    "toString",
    "hasOwnProperty",
    "__class__",
)
#: Names a path syntax reads as more than one name, and names at the edges.
_SHAPES: tuple[str, ...] = (
    "a.b",
    "data.status",
    "a..b",
    ".",
    "a[0]",
    "/a",
    "a/b",
    "~1",
    "",
    " ",
    "n" * 1000,
    "\u00e9t\u00e4t",
    "\u72b6\u614b",
    "\U0001f511",
    "nul\x00name",
)
#: Names that differ only by case, padding, width or Unicode normalisation:
#: distinct keys of one object, which a case-insensitive or normalising store merges.
_TWINS: tuple[str, ...] = (
    "status",
    "Status",
    "STATUS",
    "status ",
    "\uff53tatus",  # fullwidth s
    "caf\u00e9",
    "cafe\u0301",
    "\u212a",  # Kelvin sign, NFKC "K"
    "K",
    "k",
)
#: Every field name the payloads draw from, each once.
FIELD_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys((*_RECORD_NAMES, *_MEANINGFUL, *_SHAPES, *_TWINS))
)


def spellings(number: int) -> tuple[str, ...]:
    """Text that another JSON type (or a lenient reader) parses, around ``number``.

    The number in every spelling (sign, fraction, exponent, hex, leading
    zeros, padding, digits of other scripts), the non-finite floats, the
    boolean and null spellings, and JSON fragments of each type.
    """
    n = str(number)
    return (
        n, f"-{n}", f"+{n}", f"{n}.0", f"{n}.50", f"{n}e3", f"{n}E-2", f"0{n}",
        f"0x{number:X}", f"0b{number:b}", f" {n}", f"{n} ", f"\t{n}\n", f"{n}_000",
        "-0", "0.0", "-0.0", "1e400", "NaN", "Infinity", "-Infinity", "inf",
        "true", "false", "True", "FALSE", "null", "None", "NULL", "undefined",
        f'{{"a":{n}}}', f"[{n}]", '"q"', "{}", "[]", '""', f" [{n}, true] ",
        n.translate(_ARABIC_INDIC),
    )  # fmt: skip


_ARABIC_INDIC = str.maketrans(
    "0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
)

_WORDS: dict[str, object] = {"true": True, "false": False, "null": None, "none": None}


def _word(text: str) -> object:
    """A boolean or null word, in any case (YAML, a form decoder, a lenient driver)."""
    word = text.strip().lower()
    if word in _WORDS:
        return _WORDS[word]
    raise ValueError(text)


def _number(text: str) -> object:
    """A number in any notation Python's ``int(x, 0)``, ``int`` or ``float`` reads."""
    for parse in (lambda t: int(t, 0), int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    raise ValueError(text)


def _decimal(text: str) -> object:
    value = decimal.Decimal(text.strip())
    return int(value) if value == value.to_integral_value() and "." not in text else float(value)


#: How stores turn text back into other types: a JSON decode of every string,
#: a numeric or boolean column, a lenient driver.
_CONVERSIONS: tuple[Callable[[str], object], ...] = (json.loads, _number, _decimal, _word)


def _json_value(value: object) -> bool:
    """Whether ``value`` is a JSON value a payload may hold (finite floats, bounded ints)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int):
        return abs(value) < 10**100
    if isinstance(value, list):
        return all(_json_value(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_value(v) for k, v in value.items())
    return value is None or isinstance(value, str | bool)


@functools.lru_cache(maxsize=128)
def lookalike_pairs(number: int = 1) -> tuple[tuple[str, object], ...]:
    """(text, value): each text of :func:`spellings` and the value of another type (or a
    different text) one of the conversions reads it as, each pair once.

    Searched, not listed: every spelling goes through every conversion; a
    result that is a JSON value and not the text itself is a pair.
    """
    pairs: dict[tuple[str, str], tuple[str, object]] = {}
    for text in spellings(number):
        for convert in _CONVERSIONS:
            try:
                value = convert(text)
            except (ValueError, ArithmeticError, TypeError):
                continue
            if value == text and type(value) is str:
                continue
            if not _json_value(value):
                continue
            shown = json.dumps(value, sort_keys=True)
            pairs.setdefault((text, shown), (text, value))
    return tuple(pairs.values())


#: Every look-alike text, for one number: what a payload holds as text and must read back as text.
LOOKALIKES: tuple[str, ...] = spellings(1)

#: Line endings and whitespace a text layer rewrites (universal newlines,
#: CRLF conversion, an XML parser's end-of-line handling, a trim, tab
#: expansion, whitespace collapsing), each inside text so the rest of it
#: shows where it moved.  No NUL: free-text fields other than the payload are
#: cleaned of it before they reach a handler.
LINE_FORMS: tuple[str, ...] = (
    "first line\r\nsecond line",
    "first line\rsecond line",
    "first line\n\nsecond after a blank line",
    "ends with a line break\n",
    "ends with CRLF\r\n",
    "\r\nstarts with CRLF",
    "mixed\r\nline\nendings\rhere",
    "next line\x85here",
    "line\u2028separator and paragraph\u2029separator",
    "vertical\x0btab and form\x0cfeed",
    "\ttab\tseparated\t",
    "trailing spaces   ",
    "   leading spaces",
    "double  space",
    "no-break\u00a0space and ideographic\u3000space",
    "zero\u200bwidth",
    "caf\u00e9 / cafe\u0301",
    unicodedata.normalize("NFD", "\u00c5ngstr\u00f6m"),
)
