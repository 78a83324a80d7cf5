"""Hypothesis settings profiles: ``dev`` (fast), ``ci`` and ``thorough``.

Chosen with ``HYPOTHESIS_PROFILE`` or ``dsm verify --profile``.  Deadlines are
off because handlers do real I/O whose latency is not what is under test.
Hypothesis is imported only when the profiles are registered, so the ``dsm``
command can list the profile names without paying for it.
"""

from __future__ import annotations

import os

__all__ = ["PROFILES", "active_profile", "register_profiles"]

PROFILES = ("dev", "ci", "thorough")


def register_profiles() -> None:
    """Register the three profiles and load the one ``HYPOTHESIS_PROFILE`` names (default dev)."""
    from hypothesis import HealthCheck, settings

    suppressed = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile(
        "dev",
        max_examples=30,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=suppressed,
        print_blob=True,
    )
    settings.register_profile(
        "ci",
        max_examples=100,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=suppressed,
        print_blob=True,
        derandomize=False,
    )
    settings.register_profile(
        "thorough",
        max_examples=1000,
        stateful_step_count=80,
        deadline=None,
        suppress_health_check=suppressed,
        print_blob=True,
    )
    settings.load_profile(active_profile())


def active_profile() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise ValueError(
            f"unknown HYPOTHESIS_PROFILE {name!r}; choose one of {', '.join(PROFILES)}"
        )
    return name
