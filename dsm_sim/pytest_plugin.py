"""pytest plugin registered under ``pytest11``: kept light, it imports nothing heavy at load."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dsm", "DataStateMachine conformance kit")
    group.addoption(
        "--dsm-handler",
        action="store",
        default=None,
        metavar="MODULE:FACTORY",
        help="handler factory to verify, e.g. mypackage.store:make_handler",
    )
