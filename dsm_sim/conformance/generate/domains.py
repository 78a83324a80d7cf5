"""Values from their whole documented domain, biased to its boundaries.

A list of telling values finds the bugs its author thought of; the domain
finds the others.  Each strategy here draws from everything the contract
allows for one kind of field, with the boundaries weighted up (empty, one,
the maximum, one under it; the widest characters; the smallest and largest
durations; the instants where calendars turn), and shrinks towards the
plain value a story reads best with.

* :func:`key_text` — a key part (tenant, entity, entity key, item key) or an
  execution or app id: any Unicode text a key may hold, up to
  :data:`~reference_engine.context.MAX_KEY_LENGTH` characters, and at the
  limit in one-, two-, three- and four-byte characters drawn at random, so
  the bytes do not compress;
* :data:`LOCK_DURATIONS`, :func:`retentions` — a node's options, from one
  microsecond to a day's lock and 36500 days' retention, and none;
* :data:`STARTS` — the instant a world starts: plain Monday morning most
  often, else a few seconds before midnight, a month's end, a leap day, a
  year's end, 2038-01-19 03:14:08 UTC, where a 32-bit epoch ends, or the
  far end of time (:data:`FAR_END`); else any microsecond of twenty years;
* :data:`TOKENS` — fencing tokens no acquisition issued: the next one, zero,
  the 32- and 53-bit edges, the largest 64-bit one.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
from typing import Literal

from hypothesis import strategies as st

from dsm_sim.model import WORLD_START
from reference_engine.config import MAX_LOCK_DURATION, MAX_RETENTION, HandlerConfig
from reference_engine.context import MAX_KEY_LENGTH

__all__ = [
    "FAR_END",
    "LOCK_DURATIONS",
    "STARTS",
    "TOKENS",
    "WIDTHS",
    "configs",
    "key_text",
    "retentions",
    "wide_text",
]

#: Code point ranges whose characters take 1, 2, 3 and 4 bytes in UTF-8.  The
#: 2-byte range skips combining marks (they join their neighbour), the 3-byte
#: one is CJK, the 4-byte one emoji and the CJK extension B plane.
WIDTHS: dict[int, tuple[tuple[int, int], ...]] = {
    1: ((0x21, 0x7E),),
    2: ((0xC0, 0x2FF), (0x370, 0x3FF), (0x400, 0x4FF)),
    3: ((0x4E00, 0x9FFF), (0xAC00, 0xD7A3)),
    4: ((0x1F300, 0x1F5FF), (0x20000, 0x2A6DF)),
}

#: What a key never holds: NUL (refused), lone surrogates (not UTF-8).
_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_ANY = st.characters(exclude_categories=_SURROGATES, exclude_characters="\x00")


@functools.lru_cache(maxsize=64)
def wide_text(width: int, length: int) -> st.SearchStrategy[str]:
    """``length`` characters of exactly ``width`` UTF-8 bytes each, drawn at random.

    Drawn as one seed, not character by character: a 256-character key costs one
    draw, and its characters are as random (as incompressible) as a draw each.
    One strategy per (width, length), as for every strategy built here with
    arguments: Hypothesis validates a strategy, and works out its label and
    whether it can be empty, once per strategy object, so a strategy built
    again for every draw pays that at every draw (a world draws dozens).
    """
    ranges = WIDTHS[width]

    def text(seed: int) -> str:
        rng = random.Random(seed)
        chars = []
        for _ in range(length):
            low, high = ranges[rng.randrange(len(ranges))]
            chars.append(chr(rng.randint(low, high)))
        return "".join(chars)

    return st.integers(0, 2**32 - 1).map(text)


@functools.lru_cache(maxsize=64)
def key_text(
    plain: str = "x", *, max_chars: int = MAX_KEY_LENGTH, blank: bool = True
) -> st.SearchStrategy[str]:
    """A key part from the whole domain, ``plain`` when it shrinks.

    ``blank`` allows text of spaces only (an item key may be; a tenant may not).
    """
    return _key_text(plain, max_chars=max_chars, blank=blank)


@st.composite
def _key_text(draw: st.DrawFn, plain: str, *, max_chars: int, blank: bool) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return plain
    if kind == 1:
        text = draw(st.text(alphabet=_ANY, min_size=1, max_size=max_chars))
    elif kind in (2, 3):
        # At the limit, or one under it, in one width: the bytes a column must hold.
        width = draw(st.sampled_from((4, 3, 2, 1)))
        length = max_chars - draw(st.sampled_from((0, 1)))
        text = draw(wide_text(width, length))
    elif kind == 4:
        # At the limit in mixed widths.
        text = "".join(
            draw(wide_text(draw(st.sampled_from((1, 2, 3, 4))), max_chars // 4)) for _ in range(4)
        )
    else:
        text = plain + draw(st.text(alphabet=_ANY, max_size=3))
    text = text[:max_chars]
    if not blank and not text.strip():
        return plain
    return text


_MICRO = dt.timedelta(microseconds=1)
_SECOND = dt.timedelta(seconds=1)
#: A lock's duration: its edges (one microsecond, a second either side of a
#: whole one, a day), fractions, and anything between.
LOCK_DURATIONS: st.SearchStrategy[dt.timedelta] = st.one_of(
    st.sampled_from(
        (
            dt.timedelta(minutes=30),
            _MICRO,
            dt.timedelta(microseconds=999_999),
            _SECOND,
            dt.timedelta(seconds=1, microseconds=1),
            dt.timedelta(seconds=59, microseconds=999_999),
            MAX_LOCK_DURATION - _MICRO,
            MAX_LOCK_DURATION,
        )
    ),
    st.integers(1, MAX_LOCK_DURATION // _MICRO).map(lambda n: n * _MICRO),
)


@functools.lru_cache(maxsize=256)
def retentions(lock: dt.timedelta) -> st.SearchStrategy[dt.timedelta | None]:
    """How long records of a node with ``lock`` are kept: just past the lock up to the maximum."""
    longest = MAX_RETENTION // _MICRO
    shortest = lock // _MICRO + 1
    return st.one_of(
        st.sampled_from(
            (
                lock + dt.timedelta(days=1),
                None,
                lock + _MICRO,
                lock + _SECOND,
                MAX_RETENTION,
                dt.timedelta(days=24855),  # past 2^31 seconds from 1970, for any start
            )
        ).filter(lambda r: r is None or lock < r <= MAX_RETENTION),
        st.integers(shortest, longest).map(lambda n: n * _MICRO),
    )


@functools.cache
def configs() -> st.SearchStrategy[HandlerConfig]:
    """A node's options from the whole domain the options block accepts."""
    return _configs()


@st.composite
def _configs(draw: st.DrawFn) -> HandlerConfig:
    lock = draw(LOCK_DURATIONS)
    return HandlerConfig(lock_duration=lock, retention=draw(retentions(lock)))


#: The far end of time a store must hold: just before a month's last midnight
#: in the last year whose records the longest options (a century's retention)
#: still keep before 9999-12-31, with every microsecond digit set.  A double
#: of epoch seconds keeps about 30 µs there, milliseconds none of them.
FAR_END = dt.datetime(9899, 11, 30, 23, 59, 58, 999_999, tzinfo=dt.UTC)

#: Instants just before the calendar turns: midnight, a month's end, a leap
#: day, a year's end, the end of 32-bit epoch seconds; and the far end of time.
_TURNS: tuple[dt.datetime, ...] = (
    dt.datetime(2026, 3, 2, 23, 59, 30, tzinfo=dt.UTC),
    dt.datetime(2026, 1, 31, 23, 58, tzinfo=dt.UTC),
    dt.datetime(2028, 2, 28, 23, 59, 59, 999_999, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 31, 23, 59, 59, tzinfo=dt.UTC),
    dt.datetime(2038, 1, 19, 3, 14, 7, tzinfo=dt.UTC),
    dt.datetime(2026, 10, 31, 23, 55, tzinfo=dt.UTC),
    FAR_END,
)

#: Where a world's clock starts.
STARTS: st.SearchStrategy[dt.datetime] = st.one_of(
    st.just(WORLD_START),
    st.sampled_from(_TURNS),
    st.integers(0, 86_400 * 366 * 20 * 10**6).map(
        lambda micros: dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    ),
)

#: Fencing tokens no acquisition of the test case issued (added to the newest one's).
TOKENS: st.SearchStrategy[int] = st.sampled_from((1, 2**31, 2**53 + 1, 2**63 - 1))
