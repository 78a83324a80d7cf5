"""MariaDB keeps keys exact, and the kit notices when a collation makes them inexact.

The shipped table uses ``utf8mb4_nopad_bin``.  The broken variant here is the
same handler with the table converted to ``utf8mb4_bin``, the collation most
people reach for to make text "binary": it is PAD SPACE, so ``'INV-1'`` and
``'INV-1 '`` compare equal and one item's record answers for the other.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from dsm_sim.conformance.runner import verify
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.handlers.sql.factory import mariadb_isolated_handler, mariadb_test_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.mariadb import current_key_of
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.status import IdempotencyStatus

pytestmark = [pytest.mark.integration, pytest.mark.mariadb]

S = IdempotencyStatus
START = dt.datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
KEY_PROPERTIES = ("key_identity", "entity_isolation", "tenant_isolation")
#: Keys a case-folding, accent-folding or PAD SPACE comparison would merge.
NEAR_KEYS = (
    "inv-1",
    "INV-1",
    "inv-1 ",
    "inv-1  ",
    "caf\u00e9",
    "cafe\u0301",
    "stra\u00dfe",
    "strasse",
)


def base() -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="element-1",
        entity_execution_id="run-A",
        tenant_id="tenant-1",
        source_app_id="app-A",
        handler_config=HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=None),
    )


def pad_space_handler(clock: Clock) -> SqlStateHandler:
    """The broken variant: :func:`mariadb_test_handler` with a PAD SPACE collation."""
    handler = mariadb_test_handler(clock)
    open_table = handler.open

    async def open_with_pad_space() -> None:
        await open_table()
        async with handler.engine.begin() as conn:
            await conn.exec_driver_sql(
                f"ALTER TABLE `{handler.schema_name}`.{process_state_logs.name} "
                "CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )

    handler.open = open_with_pad_space  # type: ignore[method-assign]
    return handler


def test_near_spelled_keys_are_separate_records(mariadb_url: str) -> None:
    async def main() -> None:
        handler = mariadb_isolated_handler(mariadb_url, ManualClock(START))
        await handler.open()
        try:
            tokens = [await handler.try_acquire_lock(base().for_item(key)) for key in NEAR_KEYS]
            assert tokens == [1] * len(NEAR_KEYS)
            first = base().for_item(NEAR_KEYS[0], lock_token=1)
            await handler.set(first, S.PROCESSED, {"key": NEAR_KEYS[0]})
            for key in NEAR_KEYS[1:]:
                assert not await handler.exists(base().for_item(key)), key
                record = await handler.get(base().for_item(key))
                assert record is not None and record.key.item_key == key
                assert record.status is S.PROCESSING
        finally:
            await handler.close()

    asyncio.run(main())


def test_current_key_is_the_hash_the_server_computes(mariadb_url: str) -> None:
    async def main() -> None:
        handler = mariadb_isolated_handler(mariadb_url, ManualClock(START))
        await handler.open()
        try:
            ctx = base().for_item("caf\u00e9 \U0001f600", "line 2")
            await handler.upsert(ctx, {"v": 1})
            await handler.upsert(ctx, {"v": 2})
            async with handler.engine.connect() as conn:
                rows = (
                    await conn.exec_driver_sql(
                        f"SELECT current_key, superseded FROM `{handler.schema_name}`."
                        f"{process_state_logs.name} ORDER BY id"
                    )
                ).all()
            key = RecordKey("tenant-1", 4, "element-1", "line 2", "caf\u00e9 \U0001f600")
            assert [(row[0], bool(row[1])) for row in rows] == [
                (None, True),
                (current_key_of(key), False),
            ]
        finally:
            await handler.close()

    asyncio.run(main())


def test_the_kit_catches_a_pad_space_collation(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSM_TEST_MARIADB_URL", mariadb_url)
    report = verify(pad_space_handler, "dev", seed=0, stop_on_first=True)
    assert report.error is None, report.error
    # Trailing spaces merge in every key part: the first property to meet it may be
    # the item key's or the entity's or tenant's (whose variants the kit spells too).
    assert len(report.violations) == 1, "a PAD SPACE collation was not caught"
    assert report.violations[0].name in KEY_PROPERTIES, report.violations[0].render()
