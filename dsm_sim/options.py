"""Argument types for the numeric options of ``dsm run``, ``dsm verify`` and ``dsm stress``.

``argparse`` accepts ``nan``, ``inf`` and ``-5`` for a ``float`` option, and
such a value does not fail where it is given: a negative ``--timeout``
kills every worker and the run is reported as a verdict.  These types refuse
it while the command line is parsed, so argparse prints the option, the value
and the allowed range, and exits with status 2 before anything runs.

A number read from an environment variable (``DSM_EXEC_TIMEOUT``,
``DSM_CALL_TIMEOUT``) stands in for its flag, so it gets the same bounds:
:func:`seconds_from_env` refuses ``inf``, ``1e300``, ``nan`` and ``-5`` with
:class:`EnvironmentValueError`, naming the variable and the allowed range.
An unbounded wait would otherwise enter through the environment where the
flag refuses it.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

from reference_engine.errors import ConfigurationError, echo

__all__ = [
    "EnvironmentValueError",
    "bounded_int",
    "job_count",
    "positive_seconds",
    "rate",
    "seconds_from_env",
    "usable_cores",
]


class EnvironmentValueError(ConfigurationError):
    """An environment variable holds a value its flag would refuse; names both and the range."""

    def __init__(self, variable: str, value: str, allowed: str, flag: str) -> None:
        self.variable, self.value, self.allowed, self.flag = variable, value, allowed, flag
        super().__init__(
            f"{variable}={echo(value, 40)}: give {allowed} (the bounds of {flag}), or unset "
            f"{variable} for the default"
        )


def seconds_from_env(variable: str, default: float, high: float, *, flag: str) -> float:
    """``$variable`` as finite seconds above 0 and at most ``high``; ``default`` when unset."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= high:
        allowed = f"a finite number of seconds above 0 and at most {high:g}"
        raise EnvironmentValueError(variable, raw, allowed, flag)
    return value


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


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a container's CPU quota.

    A CI runner's container limited to 2 CPUs on a 64-core host sees 64
    cores in its affinity; its cgroup's quota (``cpu.max``, or cgroup v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``) says 2.
    """
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores)


def _cgroup_quota() -> int | None:
    """The CPU quota of this process's cgroup, in whole cores rounded up; None if unlimited."""
    v2 = _read("/sys/fs/cgroup/cpu.max")  # "max 100000" or "200000 100000"
    if v2 is not None:
        quota, _, period = v2.strip().partition(" ")
    else:
        quota = (_read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or "-1").strip()
        period = (_read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or "100000").strip()
    if quota in ("max", "-1"):
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except OSError:
        return None


def job_count(high: int) -> Callable[[str], int]:
    """``--jobs``: an integer from 1 to ``high``, or ``auto`` for the usable cores (at most ``high``).

    ``auto`` lets one CI configuration use what each runner gives it.
    """
    number = bounded_int(1, high)

    def parse(text: str) -> int:
        if text.strip().lower() == "auto":
            return min(usable_cores(), high)
        try:
            return number(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, or 'auto'") from None

    parse.__name__ = "job count"
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
