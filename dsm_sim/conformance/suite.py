"""The pytest form of the kit: one test per property, for any handler factory.

Subclass :class:`ConformanceSuite` and provide a ``dsm_handler_factory``
fixture (or pass ``--dsm-handler`` and run ``pytest --pyargs
dsm_sim.conformance``).  The state machine runs once per factory, profile,
seed and clock mode; each ``test_<property>`` then reports its own verdict,
with the shrunk program and the plain-language story when it fails, and
the seed and ``dsm verify`` command that replay the run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTIES, Property
from dsm_sim.conformance.runner import ResultStatus, VerificationReport, verify
from reference_engine.handler import HandlerFactory

__all__ = ["ConformanceSuite", "cached_report", "replay_lines"]

_Key = tuple[object, str, int | None, ClockMode, str | None, str | None]
_REPORTS: dict[_Key, VerificationReport] = {}


def cached_report(
    factory: HandlerFactory,
    profile: str,
    seed: int | None,
    clock_mode: ClockMode,
    time_zone: str | None = None,
    factory_spec: str | None = None,
    jobs: int = 1,
    cluster: str | None = None,
) -> VerificationReport:
    """Verify once per (factory, profile, seed, clock mode, time zone) per process.

    ``factory_spec`` is the ``MODULE:FACTORY`` the factory was loaded from, for the
    replay lines (see :func:`~dsm_sim.conformance.runner.verify`).  ``jobs`` runs
    the race matrix in worker processes (``--dsm-jobs``); the report is the same,
    so it is not part of the key; nor is ``cluster``, which sends that work to a
    Dask cluster (``--dsm-cluster``).  A factory a worker cannot receive runs with
    one job in this process, and a warning says so.
    """
    key = (factory, profile, seed, clock_mode, time_zone, factory_spec)
    if key not in _REPORTS:
        if not _sendable(factory, factory_spec, jobs, cluster):
            jobs, cluster = 1, None
        _REPORTS[key] = verify(
            factory,
            profile,
            seed,
            clock_mode=clock_mode,
            time_zone=time_zone,
            factory_spec=factory_spec,
            jobs=jobs,
            cluster=cluster,
        )
    return _REPORTS[key]


def _sendable(
    factory: HandlerFactory, factory_spec: str | None, jobs: int, cluster: str | None
) -> bool:
    """False (with a warning) when work for other processes was asked for and cannot be sent."""
    if jobs == 1 and cluster is None:
        return True
    from dsm_sim.conformance.parallel import UnpicklableFactoryError, sendable

    try:
        sendable(factory, factory_spec)
    except UnpicklableFactoryError as exc:
        option = f"--dsm-cluster {cluster}" if cluster is not None else f"--dsm-jobs {jobs}"
        warnings.warn(f"{option} ignored, the kit runs in this process: {exc}", stacklevel=3)
        return False
    return True


def replay_lines(report: VerificationReport) -> str:
    """The seed and the command that replay a run, as ``dsm verify`` prints them."""
    zone = report.time_zone or "drawn per test case"
    return (
        f"seed {report.seed} (profile {report.profile}, clock {report.clock_mode.value}, "
        f"time zone {zone}; explored {report.explored()})\n"
        f"replay this run: {report.replay_command()}\n"
        f"  or: pytest ... --dsm-profile={report.profile} --dsm-seed={report.seed}"
        + (
            f" --dsm-clock={report.clock_mode.value}"
            if report.clock_mode.value != "injected"
            else ""
        )
        + (f" --dsm-tz={report.replay_zone}" if report.replay_zone not in (None, "UTC") else "")
    )


def _property_test(prop: Property) -> Callable[[ConformanceSuite, VerificationReport], None]:
    def test(self: ConformanceSuite, dsm_verification_report: VerificationReport) -> None:
        report = dsm_verification_report
        result = report.result(prop.name)
        if result.failed:
            pytest.fail(f"{result.render()}\n\n{replay_lines(report)}", pytrace=False)
        if report.error is not None:
            pytest.fail(
                f"the conformance run did not complete: {report.error}\n\n{replay_lines(report)}",
                pytrace=False,
            )
        if result.status is ResultStatus.WAIVED:
            # The handler's declared semantics say the property does not apply.
            pytest.skip(f"waived by the {report.semantics} semantics: {result.message}")
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
        dsm_time_zone: str | None,
        dsm_handler_spec: str | None,
        dsm_jobs: int,
        dsm_cluster: str | None,
    ) -> VerificationReport:
        return cached_report(
            dsm_handler_factory,
            dsm_profile,
            dsm_seed,
            dsm_clock_mode,
            dsm_time_zone,
            dsm_handler_spec,
            dsm_jobs,
            dsm_cluster,
        )


for _prop in PROPERTIES:
    setattr(ConformanceSuite, f"test_{_prop.name}", _property_test(_prop))
