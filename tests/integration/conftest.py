"""Fixtures of the integration tests that start servers of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from private_servers import PrivateServer, private_postgres_server


@pytest.fixture
def private_postgres() -> Iterator[PrivateServer]:
    """A fresh PostgreSQL server on a free port, stopped and deleted after the test."""
    with private_postgres_server() as server:
        yield server
