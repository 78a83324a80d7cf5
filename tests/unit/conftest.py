"""The unit tests' share of the thorough tier (see ``tests/conftest.py``)."""

from __future__ import annotations

import pytest

#: Refusals decided before any store is reached, in code the three SQL backends share
#: (the context's key validation, the SQL handler's ``_storable``, the clock check):
#: every pull request runs them on the in-memory handler, SQLite and Redis, and the
#: thorough tier on PostgreSQL and MariaDB too.  Seventy cases a backend, each opening
#: and dropping a schema of its own, are most of what this file costs on a server.
_REFUSED_BEFORE_THE_STORE = {
    "test_bad_item_keys_are_refused_and_nothing_is_written",
    "test_bad_item_entity_keys_are_refused",
    "test_a_clock_that_returns_no_aware_datetime_is_refused_alike_on_every_store",
}
_SERVERS = ("postgres", "mariadb")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name != "test_bad_input.py":
            continue
        name = getattr(item, "originalname", item.name)
        callspec = getattr(item, "callspec", None)
        store = None if callspec is None else callspec.params.get("store")
        if name in _REFUSED_BEFORE_THE_STORE and store in _SERVERS:
            item.add_marker(pytest.mark.thorough)
