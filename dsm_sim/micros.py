"""Instants as whole microseconds since an epoch: exact over the whole range a record can hold.

A history counts time from its epoch (:attr:`dsm_sim.history.History.epoch`).
Every instant it holds -- the timeline's ``invoke``, ``complete`` and event
times, the store clock's ``store_time``, a record's ``locked_until``,
``created_at``, ``updated_at`` and ``retain_until`` -- is a :data:`Micros`:
an ``int`` of microseconds, the resolution of every store and of Python's
``datetime``.  A float of seconds would not do: it cannot tell two instants
a microsecond apart beyond 2**33 seconds (about 272 years) from the epoch,
loses the microsecond digits sooner once rounded, and rounds the last
instant a record can hold, 9999-12-31 23:59:59.999999, up to year 10000,
which no ``datetime`` holds.  An ``int`` holds every instant from year 1 to
9999 exactly, and converts back to the very ``datetime`` it came from.

Durations (a node's lock duration and retention, a clock jump) stay float
seconds where the history keeps them (their values are whole microseconds
well within a double); :func:`micros_of` turns one into microseconds where
it is added to an instant.  So does SimPy's simulated time, ``env.now``,
which the simulator records through :func:`micros_of` too.

Files and pages write an instant as float seconds (:func:`seconds_of`), the
same number they always did.  Past :data:`EXACT_LIMIT` a double no longer
holds the microsecond, so the history's JSON writes such an instant as a
string of its exact decimal seconds (:func:`seconds_json`), which
:func:`from_json` reads back to the same microsecond.
"""

from __future__ import annotations

import datetime as dt

__all__ = [
    "EXACT_LIMIT",
    "MICROSECOND",
    "Micros",
    "from_json",
    "instant_at",
    "micros_in",
    "micros_of",
    "micros_since",
    "seconds_json",
    "seconds_of",
]

#: Whole microseconds: an instant since a history's epoch, or a span between two instants.
Micros = int

#: One microsecond, the resolution of every instant a history holds.
MICROSECOND = dt.timedelta(microseconds=1)

_PER_SECOND = 1_000_000
_PER_DAY = 86_400 * _PER_SECOND

#: Instants closer to the epoch than this (2**32 s, about 136 years) are exact as float
#: seconds: a double's spacing there is at most half a microsecond, so ``m / 10**6``
#: prints as the decimal of ``m`` itself.
EXACT_LIMIT: Micros = 2**32 * _PER_SECOND


def micros_in(span: dt.timedelta) -> Micros:
    """``span`` in whole microseconds (exact: a ``timedelta`` counts them)."""
    return span.days * _PER_DAY + span.seconds * _PER_SECOND + span.microseconds


def micros_since(
    instant: dt.datetime | None,
    epoch: dt.datetime,
    memo: dict[dt.datetime, Micros] | None = None,
) -> Micros | None:
    """``instant`` as microseconds since ``epoch`` (a naive instant read as UTC wall time).

    ``memo`` (one per epoch) remembers the microseconds of naive and UTC
    instants: records are read and modelled many times with the same stamps.
    Two such instants that are equal are one instant (a naive one never
    equals an aware one), where in a zone with folds two equal wall times
    can be an hour apart, so those are converted every time.
    """
    if instant is None:
        return None
    zone = instant.tzinfo
    if memo is None or (zone is not None and zone is not dt.UTC):
        memo = None
    else:
        known = memo.get(instant)
        if known is not None:
            return known
    key = instant
    if zone is None:
        instant = instant.replace(tzinfo=dt.UTC)
    span = instant - epoch
    micros = span.days * _PER_DAY + span.seconds * _PER_SECOND + span.microseconds
    if memo is not None:
        memo[key] = micros
    return micros


def micros_of(seconds: float) -> Micros:
    """Float ``seconds`` (simulated time, a duration) to the nearest microsecond."""
    return round(seconds * _PER_SECOND)


def instant_at(epoch: dt.datetime, micros: Micros) -> dt.datetime:
    """The instant ``micros`` after ``epoch``, exactly.

    ``OverflowError`` past year 9999 or before year 1, as ``datetime`` itself.
    """
    return epoch + dt.timedelta(microseconds=micros)


def seconds_of(micros: Micros) -> float:
    """``micros`` as float seconds: what a page draws and a message prints.

    Exact within :data:`EXACT_LIMIT` of the epoch; beyond, the nearest double.
    """
    return micros / _PER_SECOND


def seconds_json(micros: Micros | None) -> float | str | None:
    """``micros`` as a JSON value of seconds that reads back to the same microsecond.

    Float seconds within :data:`EXACT_LIMIT` of the epoch (the number written
    to the microsecond, as histories always were), else the exact decimal as
    a string (``"253402300799.999999"``).
    """
    if micros is None:
        return None
    if -EXACT_LIMIT < micros < EXACT_LIMIT:
        return micros / _PER_SECOND
    whole, part = divmod(abs(micros), _PER_SECOND)
    return f"{'-' if micros < 0 else ''}{whole}.{part:06d}"


def from_json(value: object) -> Micros:
    """A value :func:`seconds_json` wrote (or any JSON number of seconds) back to microseconds."""
    if isinstance(value, str):
        sign = -1 if value.startswith("-") else 1
        whole, _, part = value.lstrip("-").partition(".")
        if len(part) > 6 or not whole.isdigit() or not (part.isdigit() or part == ""):
            raise ValueError(f"not seconds to the microsecond: {value!r}")
        return sign * (int(whole) * _PER_SECOND + int(part.ljust(6, "0")))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number of seconds: {value!r}")
    return round(round(value, 6) * _PER_SECOND)
