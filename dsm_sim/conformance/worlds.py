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
  key — which is a different key and must never share its record;
* the same text split differently between the item entity key and the item
  key (``line-2`` + ``INV-1`` vs ``line-2-INV`` + ``1``), which a store
  joining key parts with a separator mixes up;
* siblings under another tenant, scope and entity, whose names are near
  spellings of the hot item's;
* each item's node options, from seconds-long locks to the defaults and
  retention none (:data:`~dsm_sim.model.WORLD_CONFIGS`);
* the process time zone (``TZ``, set with :func:`time.tzset`): west and east
  of UTC, a half-hour offset, and zones whose daylight-saving change falls
  inside the run.

Each draw shrinks towards the plain world (``INV-1``, UTC, the standard
options), so a reproduction names a key, an option or a zone only when the
failure needs it.
"""

from __future__ import annotations

import enum
import os
import time
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from dsm_sim.model import ENTITY_ID, WORLD_CONFIGS, WORLD_ITEMS, ItemRef
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.scope import Scope

__all__ = [
    "DEFAULT_WORLD",
    "ROLES",
    "UTC_ZONE",
    "WORLDS",
    "ZONES",
    "Role",
    "World",
    "in_zone",
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


@dataclass(frozen=True, slots=True)
class World:
    """One test case's items (one per :class:`Role`) and time zone.

    The repr is a Python expression, so the printed reproduction runs.
    """

    refs: tuple[ItemRef, ...]
    zone: str = UTC_ZONE

    def __post_init__(self) -> None:
        if len(self.refs) != len(ROLES):
            raise ValueError(f"a world has one item per role ({len(ROLES)}), got {len(self.refs)}")

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
SEPARATORS = ("-", ":", "|", "/", "#", ".", "_", " ", "\x1f")


def _variants(key: str) -> list[tuple[str, str]]:
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


@st.composite
def _worlds(draw: st.DrawFn) -> World:
    head = draw(st.sampled_from(("INV", "inv", "Rechnung", "請求書", "x")))
    separator = draw(st.sampled_from(SEPARATORS))
    tail = draw(st.sampled_from(("1", "2026-0001"))) + draw(KEY_TAIL)
    base = head + separator + tail
    hot_key, near = draw(st.sampled_from(_variants(base)))
    # The split item cuts the hot key at its first separator (after the head,
    # which has none), whatever the near spelling did to the rest.
    at = hot_key.find(separator)
    split_head, split_tail = (hot_key[:at], hot_key[at + 1 :]) if at > 0 else ("", hot_key)
    entity_key = draw(st.sampled_from(("line-2", "L", "line")))
    if entity_key == "line":
        entity_key += draw(KEY_TAIL)
    tenant = draw(st.sampled_from(("t2", "T1", "t1 ", " t1", "t1\u200b")))
    entity = draw(st.sampled_from(("flow-2", "FLOW-1", ENTITY_ID + " ", "flow\u20101")))
    configs = [draw(st.sampled_from(tuple(WORLD_CONFIGS))) for _ in ROLES]
    # The neighbour is kept forever unless drawn otherwise: a retention sweep
    # that treats "no retain_until" as "past it" must meet such a record.
    neighbour_config = draw(st.sampled_from(("forever", *WORLD_CONFIGS)))
    zone = draw(st.sampled_from(ZONES))
    cfg = [WORLD_CONFIGS[name] for name in configs]
    split_key = split_tail if split_head and split_tail else hot_key + separator
    split_entity_key = entity_key + separator + split_head if split_head else entity_key
    refs: tuple[ItemRef, ...] = (
        ItemRef("t1", Scope.ELEMENT, hot_key, config=cfg[0]),
        ItemRef(tenant, Scope.ELEMENT, hot_key, config=cfg[1]),
        ItemRef("t1", Scope.WORKFLOW, hot_key, config=cfg[2]),
        ItemRef("t1", Scope.ELEMENT, hot_key, entity=entity, config=cfg[3]),
        ItemRef("t1", Scope.ELEMENT, hot_key, entity_key=entity_key, config=cfg[4]),
        ItemRef("t1", Scope.ELEMENT, "INV-2", config=WORLD_CONFIGS[neighbour_config]),
        ItemRef("t1", Scope.ELEMENT, near, config=cfg[6]),
        ItemRef("t1", Scope.ELEMENT, split_key, entity_key=split_entity_key, config=cfg[7]),
    )
    if len({ref.record_key for ref in refs}) < len(refs):
        # A drawn spelling happened to equal another item's: use the plain world's keys.
        refs = DEFAULT_WORLD.refs
    return World(refs, zone)


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
