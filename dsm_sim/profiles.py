"""Hypothesis settings profiles: ``dev`` (fast), ``ci`` and ``thorough``.

Chosen with ``HYPOTHESIS_PROFILE`` or ``dsm verify --profile``.  Deadlines are
off because handlers do real I/O whose latency is not what is under test.
Hypothesis ships a ``ci`` profile of its own (derandomized, 50 steps), so the
kit builds its profiles from the table below rather than looking them up by
name: ``dsm verify --profile ci`` and a test suite that registered the kit's
profiles then run the same settings.  Hypothesis is imported only when a
profile is built, so the ``dsm`` command can list the names without paying
for it.

A profile's budget is split over several seeds: Hypothesis starts every run
with small, simple test cases and grows them, so a few short runs from
different seeds meet more distinct interleavings than one long run of the
same number of test cases (see ``docs/conformance.md`` for the figures).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypothesis import settings as Settings

__all__ = [
    "PROFILES",
    "Budget",
    "active_profile",
    "budget",
    "profile_settings",
    "register_profiles",
]


@dataclass(frozen=True, slots=True)
class Budget:
    """How hard a profile searches: ``seeds`` runs of ``max_examples`` test cases each."""

    max_examples: int
    stateful_step_count: int
    seeds: int = 1

    @property
    def test_cases(self) -> int:
        return self.max_examples * self.seeds


#: What sets the profiles apart; everything else is common to all three.
_BUDGETS: dict[str, Budget] = {
    "dev": Budget(max_examples=30, stateful_step_count=25),
    "ci": Budget(max_examples=20, stateful_step_count=45, seeds=4),
    "thorough": Budget(max_examples=250, stateful_step_count=80, seeds=4),
}
PROFILES = tuple(_BUDGETS)


def budget(name: str) -> Budget:
    """The budget of the profile ``name`` (one of :data:`PROFILES`)."""
    if name not in _BUDGETS:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    return _BUDGETS[name]


def profile_settings(name: str) -> Settings:
    """The settings of the profile ``name`` for a test suite's own ``@given`` tests.

    Such a test runs once, so it gets the profile's whole budget of test cases
    (``seeds x max_examples``); the kit's runner splits that budget over its
    seeds itself.
    """
    from hypothesis import HealthCheck, settings

    chosen = budget(name)
    return settings(
        max_examples=chosen.test_cases,
        stateful_step_count=chosen.stateful_step_count,
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
