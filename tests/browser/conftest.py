"""One headless Chromium for the browser tests, and a screenshot of every failure.

The browser is Debian's ``chromium`` driven through its own ``chromedriver``
(never a driver or browser that downloads itself).  Without them the tests
are skipped on a developer's machine and fail under ``CI=true``, like the
service-backed tests.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

CHROMIUM = ("chromium", "chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"


def _missing(what: str, fix: str = "apt-get install -y chromium chromium-driver") -> NoReturn:
    message = f"{what} ({fix})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI=true: a missing browser is a failure, not a skip")
    pytest.skip(message)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report: Any = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium shared by a module's tests (starting one costs about a second)."""
    try:
        from selenium import webdriver
    except ImportError:
        _missing("selenium is not installed", "pip install -e '.[dev]'")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = next((found for name in CHROMIUM if (found := shutil.which(name))), None)
    if binary is None:
        _missing("chromium is not installed")
    if not Path(CHROMEDRIVER).exists():
        _missing(f"{CHROMEDRIVER} is missing")
    options = Options()
    options.binary_location = str(binary)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1400",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The shared browser; if the test fails, its screen is saved under the test's tmp_path."""
    yield browser
    if request.node.stash.get(_FAILED, False):
        shot = tmp_path / "failure.png"
        browser.save_screenshot(str(shot))
        print(f"screenshot of the failure: {shot}")
