"""Every wait of the SQL handler on its store ends: a held row lock is a StoreError, not a hang.

A second session holds the record's row lock (``SELECT ... FOR UPDATE`` in an
open transaction, as an operator's console or a stuck worker would).  Before
the statement timeout existed, ``set`` and ``try_acquire_lock`` on PostgreSQL
and MariaDB waited for it forever.  With a short ``statement_timeout`` each
call must raise ``StoreError`` naming the limit and how to change it, and the
handler must work normally once the lock is released.

Every handler call runs under a generous ``asyncio.wait_for`` of the test's
own, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import sqlite3
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import text

from reference_engine.clock import UTC, ManualClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError, StoreError
from reference_engine.handlers.sql.engine import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    create_engine_for,
    statement_timeout_of,
    validate_statement_timeout,
)
from reference_engine.handlers.sql.factory import (
    builtin_factory,
    mariadb_isolated_handler,
    postgres_isolated_handler,
    sql_handler,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus
T = TypeVar("T")
START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
CONFIG = HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=dt.timedelta(days=2))
#: The statement timeout under test; short, so a blocked call fails quickly.
SHORT = 0.5
#: The test's own bound on one call: far above SHORT, only there to turn a hang into a failure.
GUARD = 20.0


def ctx(item: str, token: int | None = None) -> StateHandlerContext:
    base = StateHandlerContext(
        scope_id=4,
        scope_code="Element",
        entity_id="invoice-dispatch",
        entity_execution_id="run-1",
        tenant_id="tenant-1",
        source_app_id="app-1",
        handler_config=CONFIG,
    )
    return base.for_item(item, lock_token=token)


async def bounded(call: Awaitable[T]) -> T:
    """The call, or a test failure if it is still waiting after GUARD seconds."""
    try:
        return await asyncio.wait_for(call, GUARD)
    except TimeoutError:
        pytest.fail(f"the handler call still waited after {GUARD:g}s: the timeout did not fire")


def _schema_sql(handler: SqlStateHandler) -> str:
    """The table name as the blocking session must spell it (schema or database first)."""
    return f"{handler.schema_name}.process_state_logs"


@asynccontextmanager
async def held_row(handler: SqlStateHandler, item: str) -> AsyncIterator[None]:
    other = create_engine_for(handler.engine.url)
    try:
        async with other.connect() as conn:
            await conn.begin()
            locked = await conn.execute(
                text(
                    f"SELECT id FROM {_schema_sql(handler)} WHERE item_key = :item "
                    "AND NOT superseded FOR UPDATE"
                ),
                {"item": item},
            )
            assert locked.first() is not None, "the record to lock was not written"
            try:
                yield
            finally:
                await conn.rollback()
    finally:
        await other.dispose()


async def _blocked_calls_fail_then_recover(handler: SqlStateHandler, limit_name: str) -> None:
    clock = handler.clock
    assert isinstance(clock, ManualClock)
    await bounded(handler.open())
    try:
        token = await bounded(handler.try_acquire_lock(ctx("inv-1")))
        assert token == 1
        async with held_row(handler, "inv-1"):
            with pytest.raises(StoreError) as set_error:
                await bounded(handler.set(ctx("inv-1", token), S.PROCESSED, {"n": 1}))
            clock.advance(dt.timedelta(hours=1))  # the lock expired: acquiring must wait too
            with pytest.raises(StoreError) as acquire_error:
                await bounded(handler.try_acquire_lock(ctx("inv-1")))
            # Reads do not wait for row locks: the store still answers them.
            record = await bounded(handler.get(ctx("inv-1")))
            assert record is not None and record.status is S.PROCESSING
        for error, call in ((set_error, "set(Processed)"), (acquire_error, "try_acquire_lock")):
            message = str(error.value)
            assert message.startswith(f"{call} failed"), message
            assert limit_name in message, message
            assert f"statement_timeout of {SHORT:g} s" in message, message
            assert "statement_timeout=SECONDS" in message, message
        # Released: the handler works again, on the same connections' pool.
        assert await bounded(handler.try_acquire_lock(ctx("inv-1"))) == 2
        await bounded(handler.set(ctx("inv-1", 2), S.PROCESSED, {"n": 2}))
        assert await bounded(handler.exists(ctx("inv-1"))) is True
        done = await bounded(handler.get(ctx("inv-1")))
        assert done is not None and done.data == {"n": 2}
    finally:
        await bounded(handler.close())


# --- PostgreSQL and MariaDB -----------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_row_lock_held_elsewhere_is_a_store_error_not_a_hang(postgres_url: str) -> None:
    handler = postgres_isolated_handler(postgres_url, ManualClock(START), statement_timeout=SHORT)
    asyncio.run(_blocked_calls_fail_then_recover(handler, "PostgreSQL's"))


@pytest.mark.postgres
def test_postgres_sessions_carry_the_timeouts(postgres_url: str) -> None:
    async def scenario() -> dict[str, str]:
        handler = sql_handler(postgres_url, ManualClock(START), statement_timeout=1.25)
        try:
            async with handler.engine.connect() as conn:
                shown = {
                    name: str((await conn.execute(text(f"SHOW {name}"))).scalar())
                    for name in ("statement_timeout", "lock_timeout")
                }
        finally:
            await handler.close()
        return shown

    assert asyncio.run(scenario()) == {"statement_timeout": "1250ms", "lock_timeout": "1250ms"}


@pytest.mark.mariadb
def test_mariadb_row_lock_held_elsewhere_is_a_store_error_not_a_hang(mariadb_url: str) -> None:
    handler = mariadb_isolated_handler(mariadb_url, ManualClock(START), statement_timeout=SHORT)
    asyncio.run(_blocked_calls_fail_then_recover(handler, "MariaDB's max_statement_time"))


# --- SQLite: the busy timeout is the same option ----------------------------------------------


def test_sqlite_write_lock_held_elsewhere_is_a_store_error_naming_the_option(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dsm.db"

    async def scenario() -> str:
        handler = sql_handler(
            f"sqlite+aiosqlite:///{path}", ManualClock(START), statement_timeout=0.2
        )
        await bounded(handler.open())
        try:
            blocker = sqlite3.connect(path, isolation_level=None)
            try:
                blocker.execute("BEGIN IMMEDIATE")  # another process's write transaction
                with pytest.raises(StoreError) as error:
                    await bounded(handler.try_acquire_lock(ctx("inv-1")))
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            assert await bounded(handler.try_acquire_lock(ctx("inv-1"))) == 1
            return str(error.value)
        finally:
            await bounded(handler.close())

    message = asyncio.run(scenario())
    assert "SQLite's busy timeout fired" in message, message
    assert "statement_timeout of 0.2 s" in message, message


def test_sqlite_busy_timeout_follows_the_option(tmp_path: Path) -> None:
    async def scenario() -> int:
        handler = sql_handler(
            f"sqlite+aiosqlite:///{tmp_path / 'dsm.db'}", ManualClock(START), statement_timeout=2.5
        )
        try:
            async with handler.engine.connect() as conn:
                return int((await conn.execute(text("PRAGMA busy_timeout"))).scalar_one())
        finally:
            await handler.close()

    assert asyncio.run(scenario()) == 2500


# --- the option itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [0, -1, 0.0, math.nan, math.inf, -math.inf, 1e12, 10**400, True, "30", None, [1]]
)
def test_a_bad_statement_timeout_is_a_configuration_error_saying_what_is_allowed(
    bad: Any,
) -> None:
    with pytest.raises(ConfigurationError, match="statement_timeout must be") as error:
        validate_statement_timeout(bad)
    assert "above 0 and at most 3600" in str(error.value)
    with pytest.raises(ConfigurationError, match="statement_timeout"):
        builtin_factory("sqlite+aiosqlite:///:memory:", statement_timeout=bad)
    with pytest.raises(ConfigurationError, match="statement_timeout"):
        sql_handler("sqlite+aiosqlite:///:memory:", ManualClock(START), statement_timeout=bad)


def test_the_default_statement_timeout_is_thirty_seconds_and_reaches_the_engine() -> None:
    assert DEFAULT_STATEMENT_TIMEOUT_S == 30.0
    handler = builtin_factory("sqlite+aiosqlite:///:memory:")(ManualClock(START))
    assert statement_timeout_of(handler.engine) == 30.0
    assert validate_statement_timeout(3) == 3.0
