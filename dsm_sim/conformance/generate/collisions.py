"""Distinct keys that collide under the 32-bit hashes stores place records by.

A store that places a record by a hash of its key (a hash table, a
partition or slot, a bucket file, an index on ``crc32(key)``) is right only
while it goes on to compare the keys themselves.  One that treats equal
hashes as the same item mixes up two items in 2**32 and passes every test
whose keys are drawn at random.  So the kit *constructs* colliding keys, for
the hashes stores use, in printable ASCII (valid UTF-8, and one UTF-16 unit
per character):

* **CRC-32** (``zlib.crc32``, Ethernet, gzip) and **CRC-16/XMODEM** (Redis
  Cluster's key slots): a CRC is affine over GF(2), so two strings of one
  length collide when their XOR lies in the kernel of its linear part.
  :func:`linear_collision` solves that system, with each character free in
  its five low bits (``@`` to ``_``), for any such hash;
* **Java's ``String.hashCode``** (and every ``31 * h + c`` hash): ``Aa`` and
  ``BB`` hash alike, and so do any two strings made of those blocks;
* **FNV-1a 32**: a birthday search on the top 24 bits of the state after
  three characters, and a fourth character that cancels the low byte;
* **MurmurHash3 (x86, 32 bit)**: two 4-byte blocks, the second chosen by
  inverting the block mix so that it cancels the first block's difference.

CRC and ``hashCode`` collisions survive any common prefix and suffix, so the
two keys collide as a key part alone and inside the joined key, whatever
the other parts and the separator.  The FNV-1a and MurmurHash3 ones hold from
the start of the hashed text (the key part alone) followed by any common
suffix.  Everything here is computed, deterministically and once
(:func:`hash_pairs`), except the FNV-1a pair, whose search is kept as its
result (:data:`FNV_PAIR`); all are checked by ``tests/unit/test_collisions.py``.
"""

from __future__ import annotations

import binascii
import functools
import itertools
import zlib
from collections.abc import Callable

__all__ = [
    "FNV_PAIR",
    "HASHES",
    "crc16",
    "crc32",
    "fnv1a32",
    "fnv_collision",
    "hash_pairs",
    "java_hash",
    "linear_collision",
    "murmur3_32",
    "murmur_collision",
]

_MASK = 0xFFFFFFFF
#: Characters free in their five low bits: ``@ A-Z [ \ ] ^ _``, all printable.
_FREE_BASE, _FREE_BITS = 0x40, 5
_PRINTABLE = bytes(range(0x21, 0x7F))


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & _MASK


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the hash of Redis Cluster's key slots."""
    return binascii.crc_hqx(data, 0)


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` over UTF-16 code units, as an unsigned 32-bit value."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & _MASK
    return h


_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193


def _fnv_state(h: int, data: bytes) -> int:
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def fnv1a32(data: bytes) -> int:
    return _fnv_state(_FNV_OFFSET, data)


_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(k: int) -> int:
    return (_rotl((k * _C1) & _MASK, 15) * _C2) & _MASK


def _unmix(m: int) -> int:
    k = (m * pow(_C2, -1, 2**32)) & _MASK
    k = _rotl(k, 17)  # rotr 15
    return (k * pow(_C1, -1, 2**32)) & _MASK


def _murmur_block(h: int, k: int) -> int:
    return (_rotl(h ^ _mix(k), 13) * 5 + 0xE6546B64) & _MASK


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32."""
    h = seed
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        h = _murmur_block(h, int.from_bytes(data[i : i + 4], "little"))
    tail = data[whole:]
    if tail:
        h ^= _mix(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def linear_collision(hash_bytes: Callable[[bytes], int], width: int, start: str) -> str:
    """A string of ``len(start)`` characters (``@`` to ``_``) other than ``start`` with its hash.

    ``hash_bytes`` must be affine over GF(2) for a fixed length (every CRC
    is), with ``width`` bits.  Then ``hash(a) ^ hash(b)`` depends only on
    ``a ^ b``, and any difference in the kernel of the linear part is a
    collision, whatever comes before or after the two strings.  Needs
    ``5 * len(start) > width`` (7 characters for CRC-32, 4 for CRC-16).
    """
    size = len(start)
    if any(not _FREE_BASE <= ord(c) < _FREE_BASE + (1 << _FREE_BITS) for c in start):
        raise ValueError(f"characters of {start!r} must lie between '@' and '_'")
    if _FREE_BITS * size <= width:
        raise ValueError(f"{size} characters leave no free bits for a {width}-bit hash")
    zero = hash_bytes(bytes(size))
    columns = []
    for position in range(size):
        for bit in range(_FREE_BITS):
            unit = bytearray(size)
            unit[position] = 1 << bit
            columns.append(hash_bytes(bytes(unit)) ^ zero)
    difference = _kernel_vector(columns, width)
    flipped = bytearray(start.encode("ascii"))
    for index, chosen in enumerate(difference):
        if chosen:
            flipped[index // _FREE_BITS] ^= 1 << (index % _FREE_BITS)
    return flipped.decode("ascii")


def _kernel_vector(columns: list[int], width: int) -> list[bool]:
    """A nonzero choice of columns whose XOR is zero (Gaussian elimination over GF(2))."""
    pivots: dict[int, tuple[int, int]] = {}  # pivot bit -> (reduced column, set of columns used)
    for index, column in enumerate(columns):
        used = 1 << index
        for bit in range(width - 1, -1, -1):
            if not column >> bit & 1:
                continue
            if bit not in pivots:
                pivots[bit] = (column, used)
                break
            other, other_used = pivots[bit]
            column, used = column ^ other, used ^ other_used
        if column == 0:
            return [bool(used >> i & 1) for i in range(len(columns))]
    raise ValueError(
        "no collision among these columns"
    )  # pragma: no cover - more columns than bits


def fnv_collision(prefix: bytes = b"") -> tuple[str, str]:
    """Two printable 4-character strings whose FNV-1a states agree after ``prefix``.

    A birthday search on the top 24 bits of the state after three
    characters; the fourth characters cancel the low byte (the multiply only
    carries upwards, so the states agree from there on, for any suffix).
    """
    start = _fnv_state(_FNV_OFFSET, prefix)
    seen: dict[int, tuple[bytes, int]] = {}
    for triple in itertools.product(_PRINTABLE, repeat=3):
        chunk = bytes(triple)
        state = _fnv_state(start, chunk)
        top = state >> 8
        if top in seen and seen[top][0] != chunk:
            other, other_state = seen[top]
            delta = (state ^ other_state) & 0xFF
            for last in _PRINTABLE:
                if 0x21 <= last ^ delta < 0x7F:
                    one = other + bytes([last])
                    two = chunk + bytes([last ^ delta])
                    return one.decode("ascii"), two.decode("ascii")
        seen.setdefault(top, (chunk, state))
    raise ValueError("no FNV-1a collision among printable strings")  # pragma: no cover


def murmur_collision(seed: int = 0) -> tuple[str, str]:
    """Two printable 8-character strings (two blocks) whose MurmurHash3 states agree.

    The first blocks differ; the second block of the other string is the one
    whose mix cancels that difference (the mix is invertible), tried until it
    is printable.  From there the states are equal, for any common suffix.
    """
    first = int.from_bytes(b"AAAA", "little")
    other = int.from_bytes(b"BBBB", "little")
    # The two first blocks' states differ by this; the second blocks must cancel it.
    difference = _murmur_block(seed, first) ^ _murmur_block(seed, other)
    for chars in itertools.product(_PRINTABLE, repeat=4):
        second = bytes(chars)
        wanted = _unmix(_mix(int.from_bytes(second, "little")) ^ difference)
        block = wanted.to_bytes(4, "little")
        if all(0x21 <= byte < 0x7F for byte in block):
            return ("AAAA" + second.decode("ascii"), "BBBB" + block.decode("ascii"))
    raise ValueError("no MurmurHash3 collision among printable strings")  # pragma: no cover


#: What :func:`fnv_collision` finds with no prefix, kept rather than searched for
#: in every process (the search takes a fifth of a second, the kit's first draw
#: waited on it); ``tests/unit/test_collisions.py`` checks that the search
#: still finds these.  Spelled as code points: Hypothesis draws from the string
#: literals of the modules it runs beside, so a new literal would change
#: which test cases a seed gives.
FNV_PAIR: tuple[str, str] = (
    "".join(map(chr, (36, 48, 56, 33))),
    "".join(map(chr, (56, 33, 44, 40))),
)


def _utf8(function: Callable[[bytes], int]) -> Callable[[str], int]:
    return lambda text: function(text.encode("utf-8"))


#: The hashes the kit builds collisions for, each over the text as a store hashes it.
HASHES: dict[str, Callable[[str], int]] = {
    "crc32": _utf8(crc32),
    "crc16": _utf8(crc16),
    "java": java_hash,
    "fnv1a32": _utf8(fnv1a32),
    "murmur3_32": _utf8(murmur3_32),
}


@functools.cache
def _blocks() -> dict[str, tuple[str, str, bool]]:
    """Per hash: two colliding blocks, and whether they collide after any prefix."""
    return {
        "crc32": ("DSM@KEY", linear_collision(crc32, 32, "DSM@KEY"), True),
        "crc16": ("SLOT", linear_collision(crc16, 16, "SLOT"), True),
        "java": ("AaAa", "BBBB", True),
        "fnv1a32": (*FNV_PAIR, False),
        "murmur3_32": (*murmur_collision(), False),
    }


def hash_pairs(text: str, limit: int) -> tuple[tuple[str, str, str], ...]:
    """(hash name, key, other key): distinct keys of at most ``limit`` characters around
    ``text`` that the hash makes equal.

    Blocks that collide after any prefix go at the end of ``text`` (where
    a joined key puts the item key's last characters); the others at its
    start, which is where a key part's own hash begins.
    """
    pairs = []
    for name, (one, other, anywhere) in _blocks().items():
        room = max(limit - len(one), 0)
        if anywhere:
            pairs.append((name, text[:room] + one, text[:room] + other))
        else:
            pairs.append((name, one + text[:room], other + text[:room]))
    return tuple(pairs)
