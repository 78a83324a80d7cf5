"""pytest plugin registered under ``pytest11``: kept light, it imports nothing heavy at load.

It adds the conformance kit's options and the fixtures its suite needs.
``dsm_handler_factory`` comes from ``--dsm-handler`` when given; otherwise a
project overrides the fixture; with neither, the error names both ways.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

__all__ = [
    "dsm_clock_mode",
    "dsm_handler_factory",
    "dsm_profile",
    "dsm_seed",
    "dsm_time_zone",
    "pytest_addoption",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dsm", "DataStateMachine conformance kit")
    group.addoption(
        "--dsm-handler",
        action="store",
        default=None,
        metavar="MODULE:FACTORY",
        help="handler factory to verify, e.g. mypackage.store:make_handler",
    )
    group.addoption(
        "--dsm-exec",
        action="store",
        default=None,
        metavar="COMMAND",
        help="verify a handler in another process over the handler protocol "
        "(docs/protocol.md), e.g. --dsm-exec='node handlers/node/memory.js'",
    )
    group.addoption(
        "--dsm-profile",
        action="store",
        default=None,
        choices=("dev", "ci", "thorough"),
        help="conformance search effort (default: HYPOTHESIS_PROFILE, else ci)",
    )
    group.addoption(
        "--dsm-seed", action="store", type=int, default=None, help="conformance run seed"
    )
    group.addoption(
        "--dsm-clock",
        action="store",
        default="injected",
        choices=("injected", "system"),
        help="'system' freezes the wall clock (freezegun) for handlers that read it",
    )
    group.addoption(
        "--dsm-tz",
        action="store",
        default=None,
        metavar="ZONE",
        help="run every conformance test case in this POSIX time zone (default: each "
        "test case draws its own)",
    )


@pytest.fixture
def dsm_handler_factory(request: pytest.FixtureRequest) -> Any:
    """The factory under test: ``--dsm-handler``, ``--dsm-exec``, or override this fixture."""
    spec = request.config.getoption("--dsm-handler")
    command = request.config.getoption("--dsm-exec")
    if spec and command:
        pytest.fail("give --dsm-handler or --dsm-exec, not both", pytrace=False)
    if command:
        from dsm_sim.protocol.client import exec_factory
        from reference_engine.errors import ConfigurationError

        try:
            return exec_factory(command)
        except ConfigurationError as exc:
            pytest.fail(f"--dsm-exec: {exc}", pytrace=False)
    if not spec:
        pytest.fail(
            "no handler to verify: pass --dsm-handler=package.module:factory (or "
            "--dsm-exec='COMMAND' for a handler in another process), or define a "
            "fixture named 'dsm_handler_factory' returning your factory (a callable taking "
            "a Clock and returning a StateHandler)",
            pytrace=False,
        )
    from reference_engine.errors import ConfigurationError
    from reference_engine.registry import load_factory

    try:
        return load_factory(spec)
    except ConfigurationError as exc:
        pytest.fail(f"--dsm-handler: {exc}", pytrace=False)


@pytest.fixture
def dsm_profile(request: pytest.FixtureRequest) -> str:
    chosen = request.config.getoption("--dsm-profile")
    return str(chosen or os.environ.get("HYPOTHESIS_PROFILE") or "ci")


@pytest.fixture
def dsm_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--dsm-seed")
    return None if seed is None else int(seed)


@pytest.fixture
def dsm_clock_mode(request: pytest.FixtureRequest) -> Any:
    from dsm_sim.conformance.clocks import parse_clock_mode

    return parse_clock_mode(request.config.getoption("--dsm-clock"))


@pytest.fixture
def dsm_time_zone(request: pytest.FixtureRequest) -> str | None:
    zone = request.config.getoption("--dsm-tz")
    return None if zone is None else str(zone)
