"""Hypothesis settings profiles: ``dev`` (fast), ``ci`` and ``thorough``.

Chosen with ``HYPOTHESIS_PROFILE`` or ``dsm verify --profile``.  Deadlines are
off because handlers do real I/O whose latency is not what is under test.
Hypothesis ships a ``ci`` profile of its own (derandomized, 50 steps), so the
kit builds its profiles from the table below rather than looking them up by
name: ``dsm verify --profile ci`` and a test suite that registered the kit's
profiles then run the same settings.  Hypothesis is imported only when a
profile is built, so the ``dsm`` command can list the names without paying
for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypothesis import settings as Settings

__all__ = ["PROFILES", "active_profile", "profile_settings", "register_profiles"]

#: What sets the profiles apart; everything else is common to all three.
_BUDGETS: dict[str, tuple[int, int]] = {
    # name: (max_examples, stateful_step_count)
    "dev": (30, 25),
    "ci": (100, 40),
    "thorough": (1000, 80),
}
PROFILES = tuple(_BUDGETS)


def profile_settings(name: str) -> Settings:
    """The kit's settings for the profile ``name`` (one of :data:`PROFILES`)."""
    from hypothesis import HealthCheck, settings

    if name not in _BUDGETS:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    max_examples, step_count = _BUDGETS[name]
    return settings(
        max_examples=max_examples,
        stateful_step_count=step_count,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        print_blob=True,
        # A fresh seed per run: CI keeps looking at new interleavings.  The run
        # prints the seed (``dsm verify --seed``) and the failing program.
        derandomize=False,
    )


def register_profiles() -> None:
    """Register the three profiles and load the one ``HYPOTHESIS_PROFILE`` names (default dev)."""
    from hypothesis import settings

    for name in PROFILES:
        settings.register_profile(name, profile_settings(name))
    settings.load_profile(active_profile())


def active_profile() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise ValueError(
            f"unknown HYPOTHESIS_PROFILE {name!r}; choose one of {', '.join(PROFILES)}"
        )
    return name
