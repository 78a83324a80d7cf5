"""Argument types for the numeric options of ``dsm run``, ``dsm verify`` and ``dsm stress``.

``argparse`` accepts ``nan``, ``inf`` and ``-5`` for a ``float`` option, and
such a value does not fail where it is given: a negative ``--timeout``
kills every worker and the run is reported as a verdict.  These types refuse
it while the command line is parsed, so argparse prints the option, the value
and the allowed range, and exits with status 2 before anything runs.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["bounded_int", "positive_seconds", "rate"]


def positive_seconds(high: float) -> Callable[[str], float]:
    """Finite seconds above zero and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {text!r}"
            ) from None
        if not math.isfinite(value) or not 0 < value <= high:
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds above 0 and at most {high:g}, got {text!r}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """A decimal integer from ``low`` to ``high``; digits are counted before converting."""

    def parse(text: str) -> int:
        stripped = text.strip()
        if len(stripped) > 20 or not stripped.lstrip("+-").isascii():
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}")
        try:
            value = int(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {low} to {high}, got {value}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def rate(text: str) -> float:
    """A share in ``[0, 1)``: a rate of 1 would fail every side effect and process nothing."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(
            f"must be a number from 0 up to (not including) 1, got {text!r}"
        )
    return value
