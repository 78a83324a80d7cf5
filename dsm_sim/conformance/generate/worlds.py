"""The world one test case runs in: its items, their node options and the process time zone.

A world that never varies lets whole classes of bugs pass: a handler that
strips or case-folds keys, truncates long ones, joins key parts with a
separator, ignores the node's lock duration or computes expiry in local time
is indistinguishable from a correct one when every item is ``INV-1`` under the
default options on a UTC machine.  So every test case draws its world first:

* the hot item's key (``INV-1`` most often, so stories read naturally; else
  text with characters special to SQL, Redis, JSON and Unicode, or a key of
  the maximum length), and a *near spelling* of it — the same text with a
  space, another case, the other Unicode normal form, a compatibility
  character, a zero-width space, a different last character of a 256-character
  key, or one character of the same class (ASCII, Latin-1, beyond Latin-1,
  CJK, astral, a combining mark, a look-alike from another script) at the
  same position — which is a different key and must never share its record;
* sometimes the near spelling is of the entity key, the entity id or the
  tenant instead, up to the documented maximum length, where a store's
  columns may be narrower or its character set smaller than the item key's;
* the same text split differently between the item entity key and the item
  key (``line-2`` + ``INV-1`` vs ``line-2-INV`` + ``1``), which a store
  joining key parts with a separator mixes up;
* siblings under another tenant, scope and entity, whose names are near
  spellings of the hot item's;
* each item's node options, from sub-second locks to the documented maxima
  (a day's lock, 36500 days' retention, past 2038), with fractional seconds,
  the defaults and retention none (:data:`~dsm_sim.model.WORLD_CONFIGS`);
* the process time zone (``TZ``, set with :func:`time.tzset`): west and east
  of UTC, a half-hour offset, and zones whose daylight-saving change falls
  inside the run;
* the source app each worker runs in (one for all, one each, empty, of the
  maximum length, non-ASCII) and how execution ids are spelt (up to the
  maximum length), which every write must stamp from its own call.

Each draw shrinks towards the plain world (``INV-1``, UTC, the standard
options), so a reproduction names a key, an option or a zone only when the
failure needs it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import os
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from dsm_sim.conformance.generate.collisions import hash_pairs
from dsm_sim.conformance.generate.domains import STARTS, configs, key_text, wide_text
from dsm_sim.model import (
    ENTITY_ID,
    FOREVER_CONFIG,
    KEY_JOINERS,
    SOURCE_APP_ID,
    WORLD_CONFIGS,
    WORLD_ITEMS,
    WORLD_START,
    ItemRef,
)
from reference_engine.config import HandlerConfig
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.scope import Scope

__all__ = [
    "DEFAULT_WORLD",
    "ROLES",
    "UTC_ZONE",
    "WORLDS",
    "ZONES",
    "Role",
    "Spelt",
    "World",
    "in_zone",
    "near_spellings",
    "one_apart",
    "restore_zone",
]


class Role(enum.Enum):
    """What an item of the world is there to collide with."""

    HOT = "hot"  # where operations meet
    TENANT = "tenant"  # the hot item in another tenant
    SCOPE = "scope"  # ... in the Workflow scope
    ENTITY = "entity"  # ... under another node
    ENTITY_KEY = "entity_key"  # ... under an item entity key
    NEIGHBOUR = "neighbour"  # an unrelated item (kept forever unless drawn otherwise)
    VARIANT = "variant"  # a near spelling of the hot key: another key
    SPLIT = "split"  # the entity-key item's text split differently

    def __repr__(self) -> str:
        return f"Role.{self.name}"


ROLES: tuple[Role, ...] = tuple(Role)

#: POSIX TZ strings, so no tz database is needed and every machine agrees.
#: The world starts on Monday 2026-03-02 at 09:00 UTC; ``M3.1.1/h`` is "the
#: first Monday of March at h o'clock local", so those zones change to
#: daylight-saving time an hour or so into the run.
UTC_ZONE = "UTC0"
ZONES: tuple[str, ...] = (
    UTC_ZONE,
    "EST5EDT,M3.1.1/5,M11.1.0",  # west, DST starts 10:00 UTC
    "IST-5:30",  # east, half-hour offset
    "CET-1CEST,M3.1.1/11,M10.5.0/3",  # east, DST starts 10:00 UTC
    "HST10",  # far west
    "NZST-12NZDT,M9.5.0,M4.1.0/3",  # far east, in daylight-saving time
)


#: Every worker in the one source app: the plain world.
PLAIN_APPS: tuple[str, ...] = (SOURCE_APP_ID,) * 3


@dataclass(frozen=True, slots=True)
class World:
    """One test case's items (one per :class:`Role`) and time zone.

    The repr is a Python expression, so the printed reproduction runs.
    """

    refs: tuple[ItemRef, ...]
    zone: str = UTC_ZONE
    #: The source application each worker (1, 2, 3) runs in.
    apps: tuple[str, ...] = PLAIN_APPS
    #: What every execution id of the world starts with (a long one reaches
    #: the documented key length).
    executions: str = ""
    #: Where the clock stands when the test case starts.
    start: dt.datetime = WORLD_START

    def __post_init__(self) -> None:
        if len(self.refs) != len(ROLES):
            raise ValueError(f"a world has one item per role ({len(ROLES)}), got {len(self.refs)}")
        if len(self.apps) != len(PLAIN_APPS):
            raise ValueError(f"a world has one source app per worker, got {len(self.apps)}")

    def app(self, worker: int) -> str:
        """The source app worker ``worker`` writes under (the observer reads as worker 1)."""
        return self.apps[max(worker, 1) - 1]

    def execution(self, plain: str) -> str:
        """The world's spelling of the execution id ``plain`` (``run-1``, ``run-2.1``...)."""
        return self.executions + plain

    def __getitem__(self, role: Role) -> ItemRef:
        return self.refs[ROLES.index(role)]

    def __iter__(self) -> Iterator[ItemRef]:
        return iter(self.refs)

    @property
    def by_role(self) -> Mapping[Role, ItemRef]:
        return dict(zip(ROLES, self.refs, strict=True))

    def __repr__(self) -> str:
        refs = ", ".join(repr(ref) for ref in self.refs)
        zone = "" if self.zone == UTC_ZONE else f", zone={self.zone!r}"
        if self.apps != PLAIN_APPS:
            zone += f", apps={self.apps!r}"
        if self.executions:
            zone += f", executions={self.executions!r}"
        if self.start != WORLD_START:
            zone += f", start={self.start!r}"
        return f"World(({refs},){zone})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


#: The world before a test case draws its own: the fixed items of
#: :data:`dsm_sim.model.WORLD_ITEMS` plus a trailing-space spelling and a
#: split of the hot key.
DEFAULT_WORLD = World(
    (
        *WORLD_ITEMS[:3],
        WORLD_ITEMS[4],
        WORLD_ITEMS[5],
        WORLD_ITEMS[3],
        ItemRef("t1", Scope.ELEMENT, "INV-1 "),
        ItemRef("t1", Scope.ELEMENT, "1", entity_key="line-2-INV"),
    )
)

# --- keys ------------------------------------------------------------------------------------

#: Characters that mean something to SQL (quotes, LIKE wildcards, comments),
#: Redis (key-pattern and hash-tag characters, the usual separators) or JSON
#: (escapes), and Unicode that normalisation, case folding or byte-length
#: limits change: combining marks, a ligature, the Kelvin and Angstrom signs,
#: dotted and dotless i, an astral emoji, zero-width and BOM characters.
SPECIAL = "'\"\\%_:;*?[]{}|/#.@$`-\t\n "
UNICODE = (
    "\u00e9\u0301\u00df\u0130\u0131\u03a9\u212a\u212b\ufb01\U0001f600\U0001d11e\u200b\ufeff\u2028"
)
KEY_TAIL = st.text(alphabet=SPECIAL + UNICODE + "aZ09", max_size=6)
#: Separators a store might join key parts with.
SEPARATORS = KEY_JOINERS[1:]


#: Pairs of characters of one class that a lossy store makes equal: a
#: Latin-1 column turns the non-Latin-1 ones into ``?``, utf8mb3 the astral
#: ones, an ASCII folding the accented ones; combining marks, look-alikes
#: from another script.  Keys built from a pair have the same length and
#: differ in one position only.
NEAR_CHARACTERS: tuple[tuple[str, str], ...] = (
    ("a", "b"),  # ASCII
    ("\u00e9", "\u00e8"),  # Latin-1
    ("\u0101", "\u0113"),  # Latin Extended-A: both '?' in Latin-1
    ("\u8acb", "\u6c42"),  # CJK
    ("\U0001f600", "\U0001f601"),  # astral (emoji): both '?' in utf8mb3, surrogates in UTF-16
    ("\u0301", "\u0300"),  # combining marks
    ("a", "\u0430"),  # Latin and Cyrillic look-alikes
)


_ARABIC_INDIC = str.maketrans(
    "0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
)
_FULLWIDTH = str.maketrans(
    "0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19"
)


def convertible(number: int) -> tuple[str, ...]:
    """Identifiers that a store's type conversion may read as one value, around ``number``.

    Text of digits (leading zeros, a sign, a trailing space, other scripts'
    digits), the number in other notations, boolean and NULL spellings,
    compatibility forms and case variants.
    """
    digits = str(number)
    return (
        f"00{digits}", digits, f"+{digits}", f"{digits} ", digits.translate(_ARABIC_INDIC),
        digits.translate(_FULLWIDTH), f"{digits}.0", f"{digits}e0", f"{digits}e3",
        f"{digits}000", f"{digits}000.00", "true", "True", "TRUE", "NULL", "null",
        "Stra\u00dfe", "strasse", f"\u212a{digits}", f"k{digits}",
    )  # fmt: skip


def _as_decimal(text: str) -> object:
    return decimal.Decimal(text).normalize()


#: The conversions stores apply to identifiers: a column of a numeric type, a
#: driver that parses numbers, a case-insensitive or compatibility collation.
CONVERSIONS: tuple[Callable[[str], object], ...] = (
    int,
    float,
    _as_decimal,
    str.casefold,
    lambda text: unicodedata.normalize("NFKC", text),
    lambda text: unicodedata.normalize("NFKC", text).casefold(),
)


def conversion_pairs(number: int = 7) -> tuple[tuple[str, str], ...]:
    """Distinct identifiers one of :data:`CONVERSIONS` makes equal, each pair once.

    Searched, not listed: every text of :func:`convertible` goes through every
    conversion, and two texts that come out as one value are a pair.
    """
    pairs: dict[frozenset[str], tuple[str, str]] = {}
    for convert in CONVERSIONS:
        first: dict[object, str] = {}
        for text in convertible(number):
            try:
                value = convert(text)
            except (ValueError, ArithmeticError):
                continue
            if value in first and first[value] != text:
                pairs.setdefault(frozenset((first[value], text)), (first[value], text))
            first.setdefault(value, text)
    return tuple(pairs.values())


def near_spellings(key: str) -> list[tuple[str, str]]:
    """(hot key, near spelling) pairs built from ``key``: distinct keys that stores confuse."""
    nfc = unicodedata.normalize("NFC", key + "é")
    pairs = [
        (key, key + " "),
        (key, " " + key),
        (key + "x", key + "X"),
        (nfc, unicodedata.normalize("NFD", nfc)),
        (key + "ﬁ", key + "fi"),
        (key, key + "\u200b"),
        (key, key + "\n"),
        (key + "_", key + "x"),  # a LIKE wildcard that matches the neighbour
        (key, key + "0"),  # a prefix of the neighbour
        (key.upper() + "i", key.upper() + "I"),
    ]
    long_key = (key * (MAX_KEY_LENGTH // max(len(key), 1) + 1))[: MAX_KEY_LENGTH - 1]
    pairs.append((long_key + "0", long_key + "1"))
    return [(hot, near) for hot, near in pairs if hot != near and len(near) <= MAX_KEY_LENGTH]


def one_apart(key: str, pair: tuple[str, str], where: int) -> tuple[str, str]:
    """``key`` with one character of ``pair`` at the start, middle or end (``where`` 0-2)."""
    at = (0, len(key) // 2, len(key))[where]
    one, other = pair
    return key[:at] + one + key[at:], key[:at] + other + key[at:]


@st.composite
def _spelling(draw: st.DrawFn, key: str, *, other_field: bool = False) -> tuple[str, str]:
    """A (spelling, near spelling) pair of ``key``: a variant, or a one-character difference.

    For a field other than the item key (``other_field``), whose store is
    more often narrower, two in five pairs are a one-character difference and
    one in five are of the maximum length, differing only in the last
    character.  One pair in five (in seven for the item key) is two
    identifiers a type conversion makes equal (:func:`conversion_pairs`), or
    two whose 32-bit hash is equal
    (:func:`~dsm_sim.conformance.generate.collisions.hash_pairs`).
    """
    variants = near_spellings(key)
    choice = draw(st.integers(0, 4 if other_field else 6))
    if choice == (4 if other_field else 6):
        # Not a variant of ``key``: two identifiers a store's conversion makes
        # one, or two whose hash is one (a store that places records by it).
        if draw(st.booleans()):
            return draw(st.sampled_from(conversion_pairs(draw(st.integers(0, 99)))))
        _, one, other = draw(st.sampled_from(hash_pairs(key, MAX_KEY_LENGTH)))
        return one, other
    if choice == 2 and other_field:
        return variants[-1]  # the maximum length
    if choice == 3 or choice == 5:
        pair = draw(st.sampled_from(NEAR_CHARACTERS))
        return one_apart(key, pair, draw(st.integers(0, 2)))
    return draw(st.sampled_from(variants))


class Spelt(enum.Enum):
    """Which identifier of the world the near spelling (the VARIANT item) changes."""

    ITEM_KEY = "item_key"
    ENTITY_KEY = "entity_key"
    ENTITY = "entity"
    TENANT = "tenant"


#: Source apps per worker: one app, one each, the empty id, one of the
#: maximum length, non-ASCII, near spellings of each other, line endings.
APPS: tuple[tuple[str, ...], ...] = (
    PLAIN_APPS,
    ("app-1", "app-2", "app-3"),
    ("app-1", "", "a" * MAX_KEY_LENGTH),
    ("app-1", "app-1 ", "\u30a2\u30d7\u30ea"),
    # Free text a text layer rewrites: line endings and whitespace (LINE_FORMS).
    ("app\r\n1", "app\r1", "app\u2028\t1 "),
)
#: Execution-id prefixes: none, non-ASCII, one that leaves room for the
#: longest suffix (``run-3.123``) under the documented key length, and one
#: with a CRLF and a tab.
EXECUTIONS: tuple[str, ...] = (
    "",
    "\u5b9f\u884c/",
    "e" * (MAX_KEY_LENGTH - 12) + ":",
    "exec\r\n\t",
)


@st.composite
def _names(draw: st.DrawFn) -> tuple[bool, str, str, str | None, str]:
    """Whether the names are the plain ones; the hot item's tenant, entity, entity key
    (None: drawn later, as the plain world's is) and key head.

    Most often the plain names (stories read ``t1``, ``flow-1``, ``INV-1``);
    else each part drawn on its own; else every part at its documented limit
    at once, in characters drawn at random from one width (what a store's
    index must hold all together, in bytes).
    """
    how = draw(st.sampled_from(("plain", "plain", "plain", "drawn", "drawn", "limits")))
    if how == "plain":
        head = draw(st.sampled_from(("INV", "inv", "Rechnung", "請求書", "x")))
        return True, "t1", ENTITY_ID, None, head
    if how == "drawn":
        return (
            False,
            draw(key_text("t1", blank=False)),
            draw(key_text(ENTITY_ID, blank=False)),
            None,
            draw(key_text("INV")),
        )
    width = draw(st.sampled_from((4, 3, 2)))
    parts = [draw(wide_text(width, MAX_KEY_LENGTH)) for _ in range(4)]
    return False, parts[0], parts[1], parts[2], parts[3]


def _apart(text: str, draw: st.DrawFn) -> str:
    """A near spelling of ``text`` that stays within the key length: its last character changed."""
    pair = draw(st.sampled_from(NEAR_CHARACTERS))
    cut = text[: MAX_KEY_LENGTH - 1] if len(text) >= MAX_KEY_LENGTH else text
    one, other = one_apart(cut, pair, 2)
    return other if one == text or other != text else one


def _config(draw: st.DrawFn, names: tuple[str, ...] = tuple(WORLD_CONFIGS)) -> HandlerConfig:
    """A node's options: one of the world's named ones most often, else from the whole domain."""
    if draw(st.integers(0, 3)):
        return WORLD_CONFIGS[draw(st.sampled_from(names))]
    return draw(configs())


@st.composite
def _worlds(draw: st.DrawFn) -> World:
    plain, base_tenant, base_entity, limit_entity_key, head = draw(_names())
    separator = draw(st.sampled_from(SEPARATORS))
    tail = draw(st.sampled_from(("1", "2026-0001"))) + draw(KEY_TAIL)
    base = (head + separator + tail)[:MAX_KEY_LENGTH] if plain else head
    # Most often the near spelling is of the item key; else of the entity
    # key, the entity id or the tenant, whose stores may be narrower.
    spelt = draw(st.sampled_from((Spelt.ITEM_KEY, Spelt.ITEM_KEY, *Spelt)))
    hot_key, near = base, base
    if spelt is Spelt.ITEM_KEY:
        hot_key, near = draw(_spelling(base)) if plain else (base, _apart(base, draw))
    # The split item cuts the hot key at its first separator (after the head,
    # which has none), whatever the near spelling did to the rest.
    at = hot_key.find(separator)
    split_head, split_tail = (hot_key[:at], hot_key[at + 1 :]) if at > 0 else ("", hot_key)
    entity_key = draw(st.sampled_from(("line-2", "L", "line")))
    if entity_key == "line":
        entity_key += draw(KEY_TAIL)
    if not plain:
        entity_key = limit_entity_key or draw(key_text("line-2"))
    if plain:
        tenant = draw(st.sampled_from(("t2", "T1", "t1 ", " t1", "t1\u200b")))
        entity = draw(st.sampled_from(("flow-2", "FLOW-1", ENTITY_ID + " ", "flow\u20101")))
    else:
        tenant, entity = _apart(base_tenant, draw), _apart(base_entity, draw)
    variant = ItemRef(base_tenant, Scope.ELEMENT, near, entity=base_entity)
    if spelt is Spelt.ENTITY_KEY:
        entity_key, other = (
            draw(_spelling(entity_key, other_field=True))
            if plain
            else (entity_key, _apart(entity_key or "line", draw))
        )
        variant = ItemRef(base_tenant, Scope.ELEMENT, hot_key, base_entity, entity_key=other)
    elif spelt is Spelt.ENTITY:
        entity, other = (
            draw(_spelling("flow-2", other_field=True)) if plain else (entity, _apart(entity, draw))
        )
        variant = ItemRef(base_tenant, Scope.ELEMENT, hot_key, entity=other)
    elif spelt is Spelt.TENANT:
        tenant, other = (
            draw(_spelling("t2", other_field=True)) if plain else (tenant, _apart(tenant, draw))
        )
        variant = ItemRef(other, Scope.ELEMENT, hot_key, entity=base_entity)
    cfg = [_config(draw) for _ in ROLES]
    # The neighbour is kept forever unless drawn otherwise: a retention sweep
    # that treats "no retain_until" as "past it" must meet such a record.
    neighbour_config = (
        FOREVER_CONFIG if draw(st.booleans()) else _config(draw, ("forever", *WORLD_CONFIGS))
    )
    zone = draw(st.sampled_from(ZONES))
    apps = draw(st.sampled_from(APPS))
    executions = draw(st.sampled_from(EXECUTIONS))
    start = draw(STARTS)
    split_key = split_tail if split_head and split_tail else (hot_key + separator)
    split_key = split_key[-MAX_KEY_LENGTH:]
    split_entity_key = entity_key + separator + split_head if split_head else entity_key
    if len(split_entity_key) > MAX_KEY_LENGTH:  # a long entity key: keep the split's end
        split_entity_key = split_entity_key[-MAX_KEY_LENGTH:]

    def item(tenant_id: str, scope: Scope, key: str, **extra: Any) -> ItemRef:
        extra.setdefault("entity", base_entity)
        return ItemRef(tenant_id, scope, key, **extra)

    refs: tuple[ItemRef, ...] = (
        item(base_tenant, Scope.ELEMENT, hot_key, config=cfg[0]),
        item(tenant, Scope.ELEMENT, hot_key, config=cfg[1]),
        item(base_tenant, Scope.WORKFLOW, hot_key, config=cfg[2]),
        item(base_tenant, Scope.ELEMENT, hot_key, entity=entity, config=cfg[3]),
        item(base_tenant, Scope.ELEMENT, hot_key, entity_key=entity_key, config=cfg[4]),
        item(base_tenant, Scope.ELEMENT, "INV-2", config=neighbour_config),
        dataclasses.replace(variant, config=cfg[6]),
        item(base_tenant, Scope.ELEMENT, split_key, entity_key=split_entity_key, config=cfg[7]),
    )
    if len({ref.record_key for ref in refs}) < len(refs) or len({ref.tenant for ref in refs}) > 3:
        # A drawn spelling happened to equal another item's: use the plain world's keys.
        refs = DEFAULT_WORLD.refs
    return World(refs, zone, apps, executions, start)


WORLDS: st.SearchStrategy[World] = _worlds()

# --- the process time zone -------------------------------------------------------------------

_UNSET = object()


def in_zone(zone: str) -> object:
    """Switch the process to ``zone``; return what :func:`restore_zone` needs."""
    saved = os.environ.get("TZ", _UNSET)
    os.environ["TZ"] = zone
    time.tzset()
    return saved


def restore_zone(saved: object) -> None:
    if saved is _UNSET:
        os.environ.pop("TZ", None)
    else:
        assert isinstance(saved, str)
        os.environ["TZ"] = saved
    time.tzset()
