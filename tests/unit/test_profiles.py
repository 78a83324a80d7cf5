"""The kit's Hypothesis profiles are its own, whatever Hypothesis has registered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from dsm_sim import profiles
from dsm_sim.conformance.runner import profile_settings
from reference_engine.errors import ConfigurationError


@pytest.fixture
def foreign_ci_profile() -> Iterator[None]:
    """Hypothesis' own ``ci`` profile (derandomized, 50 steps), as a bare process has it."""
    settings.register_profile(
        "ci", max_examples=100, stateful_step_count=50, derandomize=True, deadline=None
    )
    try:
        yield
    finally:
        profiles.register_profiles()


@pytest.mark.parametrize(
    ("name", "examples", "steps", "seeds"),
    [("dev", 30, 25, 1), ("ci", 20, 45, 4), ("thorough", 250, 80, 4)],
)
def test_each_profile_has_its_budget(name: str, examples: int, steps: int, seeds: int) -> None:
    assert profiles.budget(name) == profiles.Budget(examples, steps, seeds)
    chosen = profile_settings(name)  # one run, one seed
    assert (chosen.max_examples, chosen.stateful_step_count) == (examples, steps)
    assert chosen.deadline is None and chosen.database is None
    assert not chosen.derandomize  # a fresh seed per run; the run prints it


@pytest.mark.parametrize("name", profiles.PROFILES)
def test_a_suites_own_given_tests_get_the_whole_budget(name: str) -> None:
    # A @given test runs once: splitting over seeds is the kit runner's business.
    assert profiles.profile_settings(name).max_examples == profiles.budget(name).test_cases


@pytest.mark.usefixtures("foreign_ci_profile")
def test_the_kits_ci_profile_is_used_even_where_hypothesis_registered_its_own() -> None:
    assert settings.get_profile("ci").stateful_step_count == 50
    chosen = profile_settings("ci")
    assert (chosen.stateful_step_count, chosen.derandomize) == (45, False)
    assert settings.get_profile("ci").max_examples == 100  # Hypothesis' own, untouched


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"'nightly'.*dev, ci, thorough"):
        profile_settings("nightly")
    with pytest.raises(ValueError, match="dev, ci, thorough"):
        profiles.profile_settings("nightly")
