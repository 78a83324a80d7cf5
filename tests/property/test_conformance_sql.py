"""The kit against the built-in SQL handler: SQLite in memory and PostgreSQL.

Each PostgreSQL test case runs in a throw-away schema of its own (created on
open, dropped on close), so concurrent runs on the shared server never meet.
"""

from __future__ import annotations

import pytest

from dsm_sim.conformance.suite import ConformanceSuite
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.sql.factory import postgres_test_handler, sqlite_memory_handler

pytestmark = pytest.mark.property


class TestSqliteMemoryHandler(ConformanceSuite):
    @pytest.fixture
    def dsm_handler_factory(self) -> HandlerFactory:
        return sqlite_memory_handler


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
