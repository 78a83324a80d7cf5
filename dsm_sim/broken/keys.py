"""Broken handlers whose keys are not the keys they were given.

Each matches records by a key that a real store changes on the way: a
collation that ignores case or trailing spaces, Unicode normalisation, a
column too short for the documented maximum, key parts joined with a
separator that may occur inside them.  Two distinct keys then share one
record, which only shows when the world has keys that differ that way.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from dsm_sim.broken.handlers import _KeyCollapsingHandler
from reference_engine.context import RecordKey

__all__ = [
    "AccentInsensitiveKeys",
    "CaseInsensitiveKeys",
    "EntityIdTruncated",
    "JoinsKeyPartsWithColon",
    "NormalisesUnicodeKeys",
    "StripsKeys",
    "TenantCaseFolded",
    "TruncatesLongKeys",
]


class StripsKeys(_KeyCollapsingHandler):
    """Item keys are trimmed before lookup, so ``"INV-1 "`` finds the record of ``"INV-1"``."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, item_key=key.item_key.strip())


class CaseInsensitiveKeys(_KeyCollapsingHandler):
    """The key column has a case-insensitive collation: ``inv-1`` and ``INV-1`` share a record."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, item_key=key.item_key.casefold())


class NormalisesUnicodeKeys(_KeyCollapsingHandler):
    """Keys are NFKC-normalised before lookup, so composed and decomposed spellings collide."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, item_key=unicodedata.normalize("NFKC", key.item_key))


class TruncatesLongKeys(_KeyCollapsingHandler):
    """The key column is ``VARCHAR(255)``, one short of the documented 256 characters."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, item_key=key.item_key[:255])


class JoinsKeyPartsWithColon(_KeyCollapsingHandler):
    """Entity, item entity key and item key are joined with ``:``, which keys may contain."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        joined = f"{key.entity_id}:{key.item_entity_key}:{key.item_key}"
        return dataclasses.replace(key, entity_id="", item_entity_key="", item_key=joined)


class TenantCaseFolded(_KeyCollapsingHandler):
    """Tenant ids are lower-cased and trimmed on the way in, so ``T1`` reads tenant ``t1``."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, tenant_id=key.tenant_id.strip().lower())


class AccentInsensitiveKeys(_KeyCollapsingHandler):
    """The key column's collation ignores accents (an ``_ai`` collation): ``é`` and ``è`` share a record."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        decomposed = unicodedata.normalize("NFD", key.item_key)
        bare = "".join(char for char in decomposed if not unicodedata.combining(char))
        return dataclasses.replace(key, item_key=bare)


class EntityIdTruncated(_KeyCollapsingHandler):
    """The entity id lives in a ``VARCHAR(128)`` column that truncates: ids alike for 128 characters collide."""

    def _collapse(self, key: RecordKey) -> RecordKey:
        return dataclasses.replace(key, entity_id=key.entity_id[:128])
