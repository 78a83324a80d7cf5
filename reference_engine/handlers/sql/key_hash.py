"""PostgreSQL: the record key as one 32-byte hash, which is what the unique index holds.

A key part may be 256 characters of any Unicode (``context.validate_key``),
up to 1,024 bytes in UTF-8, so the four text parts of a record key take up
to 4 KiB.  A B-tree index row of PostgreSQL holds at most 2,704 bytes, and
it compresses only what compresses: a unique index over the parts
themselves refuses such a row, and the item could never be acquired.  The
unique index (``WHERE NOT superseded``) is therefore on an expression, the
SHA-256 of the key: the ``ON CONFLICT`` target of every insert-or-update and
the index every per-item lookup uses.  The lookups compare the parts too,
so the hash only finds the row.

The hashed bytes are the parts in UTF-8 joined by NUL, which no part
contains, so two keys share a hash only through a SHA-256 collision; it is
the same hash as MariaDB's ``current_key`` (:func:`.mariadb.current_key_of`).
An index expression must be immutable, and PostgreSQL's text-to-bytes
conversions (``convert_to``, ``textsend``) are only stable, so the server
spells the bytes as ``decode(..., 'escape')`` of the parts with their
backslashes doubled, joined by ``\\000``: exactly the parts' bytes in the
database encoding, which is UTF-8 (:func:`check_key_hash` refuses others).

Why an index expression and not a stored generated column: the index
computes the hash from the row itself, so no writer can store a wrong one,
the table keeps its columns, and adding the index to a table of an earlier
version is one ``CREATE INDEX`` (no rewrite).  On PostgreSQL 15 a generated
column cost 20-40 microseconds of server CPU per insert over the index on
the parts, the index expression about 15 (per-statement set-up, whatever the
expression), which the flush of a committed write hides.  Lookups do not
hash on the server at all: the handler sends the hash of the key it looks
for (:func:`key_hash_of`), so a lookup costs what one over the parts did;
hashing the parameters on the server cost about 15 microseconds more.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, text

from reference_engine.context import RecordKey
from reference_engine.errors import ConfigurationError

__all__ = [
    "KEY_HASH_INDEX",
    "PARTS_INDEX",
    "check_key_hash",
    "key_hash_of",
    "key_hash_sql",
]

#: UNIQUE on :func:`key_hash_sql` of the key columns ``WHERE NOT superseded``.
KEY_HASH_INDEX = "ux_process_state_logs_key_hash"
#: The unique index over the key parts that earlier versions created on PostgreSQL;
#: opening such a table replaces it with :data:`KEY_HASH_INDEX` (see ``schema.py``).
PARTS_INDEX = "ux_process_state_logs_current_key"
#: Database encodings in which the text's bytes are its UTF-8, as :func:`key_hash_of` hashes.
_SAME_BYTES = ("UTF8", "SQL_ASCII")


def key_hash_sql(tenant_id: str, scope_id: str, entity_id: str, entity_key: str, key: str) -> str:
    """The SQL of the hash of the key whose parts are the SQL expressions given.

    ``scope_id`` is an integer expression; the others are text.  Column names
    give the index expression; a statement that names the index in ``ON
    CONFLICT`` or looks a key up repeats it over the same columns.
    Escape-string literals (``E'...'``) read the same whatever
    ``standard_conforming_strings`` says.
    """

    def escaped(part: str) -> str:
        return f"replace({part}, E'\\\\', E'\\\\\\\\')"

    parts = (
        escaped(tenant_id),
        f"CAST({scope_id} AS text)",
        escaped(entity_id),
        escaped(entity_key),
        escaped(key),
    )
    joined = " || E'\\\\000' || ".join(parts)
    return f"sha256(decode({joined}, 'escape'))"


def key_hash_of(key: RecordKey) -> bytes:
    """The hash the index holds for ``key``: SHA-256 of its parts in UTF-8, joined by NUL."""
    parts = (key.tenant_id, str(key.scope_id), key.entity_id, key.item_entity_key, key.item_key)
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()


def check_key_hash(conn: Connection) -> None:
    """Refuse a database whose index would hash other bytes than :func:`key_hash_of` does.

    Lookups send the hash computed here, so it must be the server's: it is
    when the database encoding is UTF-8, or SQL_ASCII, which keeps the bytes
    the client sent.  In any other encoding the two differ for every
    non-ASCII key, and such a database cannot store every key the docs allow
    anyway.  One read-only statement on every start.
    """
    encoding = conn.execute(text("SELECT current_setting('server_encoding')")).scalar_one()
    if encoding not in _SAME_BYTES:
        raise ConfigurationError(
            f"the PostgreSQL database uses the encoding {encoding}; the SQL handler needs a "
            "UTF8 database, since keys may be any Unicode text: create one with "
            "CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0"
        )
