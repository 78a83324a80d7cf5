"""How instants and differences read in findings and stories.

Every stage words what it saw the same way: the judges in their findings,
the rules in their steps, the stories at the end.
"""

from __future__ import annotations

import datetime as dt

from dsm_sim.model import WORLD_START

__all__ = ["at", "offset"]


def at(instant: dt.datetime | None) -> str:
    """A short, unambiguous time: ``10:30:00`` or, across days, ``2026-03-03 10:30:00``."""
    if instant is None:
        return "never"
    if instant.tzinfo is None or instant.utcoffset() is None:
        return f"{instant:%Y-%m-%d %H:%M:%S} (naive)"
    utc = instant.astimezone(dt.UTC)
    text = f"{utc:%H:%M:%S}" if utc.date() == WORLD_START.date() else f"{utc:%Y-%m-%d %H:%M:%S}"
    return text + (f".{utc.microsecond:06d}" if utc.microsecond else "")


def offset(delta: dt.timedelta) -> str:
    """A signed difference as people write zone offsets: ``-5:00``, ``+0:00:01``, ``+5:30``.

    ``str(timedelta)`` writes minus five hours as ``-1 day, 19:00:00``.
    """
    sign = "-" if delta < dt.timedelta(0) else "+"
    micros = abs(delta) // dt.timedelta(microseconds=1)
    seconds, micro = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours}:{minutes:02d}"
    if secs or micro:
        text += f":{secs:02d}"
    if micro:
        text += f".{micro:06d}"
    return text
