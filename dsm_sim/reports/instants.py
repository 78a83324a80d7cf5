"""How a report writes time: instants of the run's clock, and one evenly labelled axis.

A history counts microseconds since its epoch (:attr:`dsm_sim.history.History.epoch`);
a reader thinks in the clock the run showed them, the one the demo narrates
("09:36") and the store stamps on its records.  So a page writes every
instant as that wall time, ``HH:MM:SS.mmm`` (the date too when it is not the
epoch's day), and has one time axis, labelled at evenly spaced, round
instants.  The explorer's script writes instants with the same rule
(``wall`` in ``assets/explorer.js``), from the epoch and ``digits`` the page
data carries.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from dsm_sim.micros import Micros, instant_at, micros_of, seconds_of

__all__ = ["STEPS", "Axis", "axis", "tick_step", "wall"]

#: Round tick spacings, in seconds: 1-2-5 below a second, then the clock's own units.
STEPS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200,
    86400, 172800, 604800,
)  # fmt: skip


def wall(epoch: dt.datetime, micros: Micros, digits: int = 3) -> str:
    """``micros`` after ``epoch`` as the clock showed it: ``09:36:00.250`` (``digits`` 3) or
    ``09:36:00`` (0), with the date in front when it is not the epoch's day.

    Rounded to the millisecond first (half up, as the page's script rounds the
    seconds the page holds), then cut to ``digits``.  In the last half
    millisecond of year 9999, which rounds past the last ``datetime``, the
    millisecond is cut instead.
    """
    millis = math.floor(seconds_of(micros) * 1000 + 0.5)
    try:
        instant = epoch + dt.timedelta(milliseconds=millis)
    except OverflowError:
        instant = instant_at(epoch, micros)
    text = instant.strftime("%H:%M:%S")
    if digits:
        text += f".{instant.microsecond // 1000:03d}"
    if instant.date() != epoch.date():
        text = f"{instant:%Y-%m-%d} {text}"
    return text


def tick_step(span: float, most: int = 10) -> float:
    """The smallest round spacing that puts at most ``most`` ticks on ``span`` seconds."""
    for step in STEPS:
        if span / step <= most:
            return step
    return STEPS[-1] * math.ceil(span / (STEPS[-1] * most))


@dataclass(frozen=True, slots=True)
class Axis:
    """The ticks of a time axis over ``[0, end]``: seconds since the epoch, and their labels."""

    end: float
    step: float
    ticks: tuple[tuple[float, str], ...]


def axis(epoch: dt.datetime, end: float, most: int = 10) -> Axis:
    """Ticks every :func:`tick_step` from 0 to ``end``, labelled with :func:`wall` instants.

    Whole-second steps are labelled to the second; shorter ones to the millisecond.
    """
    end = max(end, 1e-6)
    step = tick_step(end, most)
    digits = 0 if step >= 1 else 3
    count = math.floor(end / step + 1e-9)
    ticks = tuple(
        (round(i * step, 6), wall(epoch, micros_of(i * step), digits)) for i in range(count + 1)
    )
    return Axis(end, step, ticks)
