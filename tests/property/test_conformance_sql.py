"""The kit against the built-in SQL handler: SQLite in memory, PostgreSQL and MariaDB.

Each PostgreSQL test case runs in a throw-away schema of its own, each
MariaDB one in a throw-away database (created on open, dropped on close),
so concurrent runs on the shared servers never meet.
"""

from __future__ import annotations

import pytest

from dsm_sim.conformance.suite import ConformanceSuite
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.sql.factory import (
    mariadb_test_handler,
    postgres_test_handler,
    sqlite_memory_handler,
)

pytestmark = pytest.mark.property


class TestSqliteMemoryHandler(ConformanceSuite):
    @pytest.fixture
    def dsm_handler_factory(self) -> HandlerFactory:
        return sqlite_memory_handler

    @pytest.fixture
    def dsm_seed(self) -> int:
        # Whether every property is reached must not be up to a drawn seed.
        return 0

    @pytest.fixture
    def dsm_profile(self) -> str:
        # The dev profile here keeps the suite inside CI's budget (the race matrix alone
        # is minutes on a store under ci); `nox -s conformance` runs the ci profile on
        # every backend, and docs/performance.md has its figures.
        return "dev"


@pytest.mark.postgres
class TestPostgresHandler(ConformanceSuite):
    @pytest.fixture
    def dsm_handler_factory(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> HandlerFactory:
        # postgres_test_handler reads the URL from the environment, which the
        # fixture has already checked (skip locally, fail under CI=true).
        monkeypatch.setenv("DSM_TEST_POSTGRES_URL", postgres_url)
        return postgres_test_handler

    @pytest.fixture
    def dsm_seed(self) -> int:
        return 0

    @pytest.fixture
    def dsm_profile(self) -> str:
        # The dev profile here keeps the suite inside CI's budget (the race matrix alone
        # is minutes on a store under ci); `nox -s conformance` runs the ci profile on
        # every backend, and docs/performance.md has its figures.
        return "dev"


# With the thorough tier (and `nox -s conformance`): every pull request verifies the same
# handler code on SQLite and PostgreSQL above, and meets MariaDB itself in the handler's
# integration tests (tests/integration/test_sql_handler.py, tests/unit/test_bad_input.py),
# the scenarios (tests/scenario/test_scenarios.py) and the stress runs; this class, the
# suite's longest (a database per test case), is the whole kit on it.
@pytest.mark.mariadb
@pytest.mark.thorough
class TestMariadbHandler(ConformanceSuite):
    @pytest.fixture
    def dsm_handler_factory(
        self, mariadb_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> HandlerFactory:
        monkeypatch.setenv("DSM_TEST_MARIADB_URL", mariadb_url)
        return mariadb_test_handler

    @pytest.fixture
    def dsm_seed(self) -> int:
        return 0

    @pytest.fixture
    def dsm_profile(self) -> str:
        # Every test case creates and drops a database: the ci profile takes about
        # 130 s here, dev about 21 s, and seed 0 exercises all properties under dev.
        # `dsm verify ...:mariadb_test_handler --profile ci --seed 0` is the full run
        # (docs/performance.md).
        return "dev"
