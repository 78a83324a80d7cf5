"""The pytest form of the kit: one test per property, for any handler factory.

Subclass :class:`ConformanceSuite` and provide a ``dsm_handler_factory``
fixture (or pass ``--dsm-handler`` and run ``pytest --pyargs
dsm_sim.conformance``).  The state machine runs once per factory, profile,
seed and clock mode; each ``test_<property>`` then reports its own verdict,
with the shrunk program and the plain-language story when it fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dsm_sim.conformance.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTIES, Property
from dsm_sim.conformance.runner import ResultStatus, VerificationReport, verify
from reference_engine.handler import HandlerFactory

__all__ = ["ConformanceSuite", "cached_report"]

_REPORTS: dict[tuple[object, str, int | None, ClockMode], VerificationReport] = {}


def cached_report(
    factory: HandlerFactory, profile: str, seed: int | None, clock_mode: ClockMode
) -> VerificationReport:
    """Verify once per (factory, profile, seed, clock mode) per process."""
    key = (factory, profile, seed, clock_mode)
    if key not in _REPORTS:
        _REPORTS[key] = verify(factory, profile, seed, clock_mode=clock_mode)
    return _REPORTS[key]


def _property_test(prop: Property) -> Callable[[ConformanceSuite, VerificationReport], None]:
    def test(self: ConformanceSuite, dsm_verification_report: VerificationReport) -> None:
        report = dsm_verification_report
        result = report.result(prop.name)
        if result.status is ResultStatus.FAILED:
            pytest.fail(result.render(), pytrace=False)
        if report.error is not None:
            pytest.fail(f"the conformance run did not complete: {report.error}", pytrace=False)
        if result.status is ResultStatus.NOT_EXERCISED:
            message = (
                f"{prop.name} was never exercised under profile {report.profile}; "
                "use a larger profile (--dsm-profile ci or thorough)"
            )
            if report.profile == "dev":
                pytest.skip(message)  # a quick local look, not a verdict
            # Under ci and thorough a check that never ran must not pass silently.
            pytest.fail(message, pytrace=False)
        assert result.status is ResultStatus.PASSED, result.render()

    test.__name__ = test.__qualname__ = f"test_{prop.name}"
    test.__doc__ = f"The handler keeps {prop.name}: {prop.summary}."
    return test


class ConformanceSuite:
    """Base class: every conformance property as a test method named after it.

    Not collected itself (no ``Test`` prefix); subclass it as ``TestMyHandler``.
    """

    @pytest.fixture
    def dsm_verification_report(
        self,
        dsm_handler_factory: HandlerFactory,
        dsm_profile: str,
        dsm_seed: int | None,
        dsm_clock_mode: ClockMode,
    ) -> VerificationReport:
        return cached_report(dsm_handler_factory, dsm_profile, dsm_seed, dsm_clock_mode)


for _prop in PROPERTIES:
    setattr(ConformanceSuite, f"test_{_prop.name}", _property_test(_prop))
