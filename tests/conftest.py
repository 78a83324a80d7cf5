"""Shared fixtures: service URLs that skip locally and fail under CI=true; the thorough tier."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest

from dsm_sim import profiles

profiles.register_profiles()

#: Tests marked ``thorough`` run only with ``--thorough`` (``nox -s thorough``, nightly): the
#: same checks on more combinations than the pull-request suite has minutes for.
THOROUGH_OPTION = "--thorough"

POSTGRES_ENV = "DSM_TEST_POSTGRES_URL"
REDIS_ENV = "DSM_TEST_REDIS_URL"
AMQP_ENV = "DSM_TEST_AMQP_URL"
MARIADB_ENV = "DSM_TEST_MARIADB_URL"


def service_url(env_var: str, what: str) -> str:
    """The URL of a real service, or a skip; under CI=true a missing service fails."""
    url = os.environ.get(env_var, "").strip()
    if url:
        return url
    message = f"{what} not configured: set {env_var}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing service is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of the test PostgreSQL, e.g. postgresql+asyncpg://postgres@127.0.0.1/test."""
    return service_url(POSTGRES_ENV, "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis, e.g. redis://127.0.0.1:6379/0."""
    return service_url(REDIS_ENV, "Redis")


@pytest.fixture(scope="session")
def mariadb_url() -> str:
    """SQLAlchemy URL of the test MariaDB, e.g. mariadb+asyncmy://root@127.0.0.1:3306/test."""
    return service_url(MARIADB_ENV, "MariaDB")


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of the test RabbitMQ, e.g. amqp://guest:guest@127.0.0.1:5672/."""
    return service_url(AMQP_ENV, "RabbitMQ")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        THOROUGH_OPTION,
        action="store_true",
        default=False,
        help="also run the tests marked thorough (nox -s thorough, nightly)",
    )


#: The project's own Python code; the installed packages were byte-compiled by pip.
_OWN_CODE = ("reference_engine", "dsm_sim", "tests", "bench", "examples")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the project's code once, before any test starts a process.

    The suite starts a few thousand Python processes (``dsm`` commands, handler
    processes, workers), and each imports the project.  Where
    ``PYTHONDONTWRITEBYTECODE`` is set, as on the CI machines, no import writes
    its ``.pyc``, so every one of those processes compiled every module it
    imported again: ``tests/integration/test_cross_process_race.py`` alone took
    206 s of CPU without the files and 125 s with them (docs/performance.md).
    ``compileall`` writes them whatever that variable says; an edited module is
    compiled again by its first import, as always.  Only the controlling
    process does this, before xdist's workers start.
    """
    if hasattr(session.config, "workerinput"):
        return
    root = Path(__file__).resolve().parent.parent
    for folder in _OWN_CODE:
        if (root / folder).is_dir():
            compileall.compile_dir(root / folder, quiet=2)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores this process may use.

    About a fifth of the suite's time is spent waiting (on the database
    servers, on handler processes, on deadlines); with one worker per core
    ``vmstat`` showed the cores 17 % idle, and a third worker on two cores cut
    the suite from 9 min 13 s to 7 min 48 s (docs/performance.md).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still wins.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the thorough tier unless asked: deselected (counted), never a silent skip."""
    if config.getoption(THOROUGH_OPTION):
        return
    thorough = [item for item in items if item.get_closest_marker("thorough") is not None]
    if thorough:
        config.hook.pytest_deselected(items=thorough)
        items[:] = [item for item in items if item.get_closest_marker("thorough") is None]
