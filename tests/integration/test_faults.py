"""Fault tolerance of the built-in SQL handler against real failures.

Each fault must surface as a named error (``StoreError``) or be retried, and
once it is over, nothing is lost and no side effect happened twice: the
connection killed mid-statement, a PostgreSQL server (the test's own) restarted under load,
a worker process SIGKILLed with its transaction open, and SQLite writers
that give up on ``database is locked``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from private_servers import PrivateServer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from dsm_sim.stress import StressReport, StressRun, StressSettings
from dsm_sim.stress.journal import read_marks, read_operations
from dsm_sim.stress.ledger import EffectRow
from dsm_sim.stress.worker import base_context
from reference_engine.clock import SystemClock
from reference_engine.config import HandlerConfig
from reference_engine.context import StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.schema import TABLE_NAME
from reference_engine.record import StateRecord
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.integration

S = IdempotencyStatus


def context(execution: str) -> StateHandlerContext:
    return StateHandlerContext(
        scope_id=int(Scope.ELEMENT),
        scope_code=Scope.ELEMENT.code,
        entity_id="fault-node",
        entity_execution_id=execution,
        tenant_id="fault-tenant",
        source_app_id="fault-app",
        handler_config=HandlerConfig(lock_duration=dt.timedelta(minutes=5)),
    )


# --- a connection dropped mid-operation ------------------------------------------------------


class Blocker:
    """Holds an exclusive lock on the handler's table, and kills whoever waits on it."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def kill_waiter(self, within_s: float = 10.0) -> int:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            result = await self.conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
                )
            )
            pids = [int(row[0]) for row in result]
            if pids:
                for pid in pids:
                    await self.conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                return len(pids)
            await asyncio.sleep(0.02)
        raise AssertionError("no backend ever waited on the locked table")


async def _drop_mid_operation(postgres_url: str) -> None:
    schema = f"dsm_fault_{uuid.uuid4().hex[:12]}"
    handler = sql_handler(postgres_url, SystemClock(), schema=schema)
    admin = create_async_engine(postgres_url)
    effects: list[int] = []
    try:
        await handler.open()
        ctx = context("run-1").for_item("invoice-1")

        async def blocked(operation: Callable[[], Awaitable[object]]) -> BaseException | None:
            """Lock the table, start ``operation``, kill its backend while it waits."""
            async with admin.connect() as conn:
                await conn.begin()
                await conn.execute(
                    text(f'LOCK TABLE "{schema}".{TABLE_NAME} IN ACCESS EXCLUSIVE MODE')
                )
                step = asyncio.ensure_future(operation())
                killed = await Blocker(conn).kill_waiter()
                assert killed >= 1
                outcome = await asyncio.gather(step, return_exceptions=True)
                await conn.rollback()
            error = outcome[0]
            return error if isinstance(error, BaseException) else None

        # The acquire is killed while it waits: a named error, and nothing was written.
        error = await blocked(lambda: handler.try_acquire_lock(ctx))
        assert isinstance(error, StoreError), error
        assert await handler.get(ctx) is None
        token = await handler.try_acquire_lock(ctx)
        assert token == 1
        effects.append(token)  # the business side effect, once

        held = ctx.for_item("invoice-1", lock_token=token)
        # The completing write is killed while it waits: named error, lock still ours.
        error = await blocked(lambda: handler.set(held, S.PROCESSED, {"charge": "ch_1"}))
        assert isinstance(error, StoreError), error
        record = await handler.get(ctx)
        assert record is not None
        assert (record.status, record.attempt) == (S.PROCESSING, 1)

        # Retrying the same write with the same token lands; nothing lost, nothing twice.
        await handler.set(held, S.PROCESSED, {"charge": "ch_1"})
        record = await handler.get(ctx)
        assert record is not None
        assert (record.status, record.attempt, record.data) == (S.PROCESSED, 1, {"charge": "ch_1"})
        assert await handler.exists(ctx)
        assert await handler.try_acquire_lock(ctx) is None
        assert effects == [1]
    finally:
        await handler.close()
        async with admin.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        await admin.dispose()


@pytest.mark.postgres
def test_a_connection_killed_mid_operation_is_a_store_error_and_a_retry_succeeds(
    postgres_url: str,
) -> None:
    asyncio.run(_drop_mid_operation(postgres_url))


# --- runs with faults --------------------------------------------------------------------------


async def _wait_for(predicate: Callable[[], object], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {within_s}s")
        await asyncio.sleep(0.05)


def assert_recovered(report: StressReport) -> None:
    print(report.summary())  # shown with -s, and in the log of a failing run
    assert report.duplicate_keys == (), report.summary()
    assert report.unfinished_keys == (), report.summary()
    assert report.unnamed_errors == {}, report.summary()
    assert report.effects == report.settings.keys
    assert report.passed, report.summary()


@dataclass(frozen=True, slots=True)
class KillOutcome:
    report: StressReport
    killed_execution: str
    record: StateRecord | None
    effects: list[EffectRow]


async def _killed_mid_transaction(postgres_url: str) -> KillOutcome:
    settings = StressSettings(
        db_url=postgres_url,
        processes=3,
        workers=1,  # p0's only worker stalls: nothing else of p0 is in flight at the kill
        keys=30,
        duplicates=2,
        fail_rate=0.0,
        lock_duration=dt.timedelta(seconds=2),
        stall_after_acquire=60.0,
        recovery_seconds=30.0,
    )
    run = StressRun(settings)
    try:
        await run.prepare()
        run.start()
        p0 = run.journal_paths[:1]
        await _wait_for(lambda: read_marks(p0, "stalled"), within_s=60)
        (stalled,) = read_marks(p0, "stalled")
        run.kill(0)  # SIGKILL, its effect transaction still open
        await run.wait(60)
        await run.recover()
        report = await run.report()
        record = await run.handler.get(base_context(settings).for_item(stalled["key"]))
        rows = [r for r in await run.ledger.rows() if r.item_key == stalled["key"]]
        return KillOutcome(report, str(stalled["execution"]), record, rows)
    finally:
        await run.close()


@pytest.mark.postgres
def test_a_worker_killed_mid_transaction_is_swept_and_retried_once(postgres_url: str) -> None:
    outcome = asyncio.run(_killed_mid_transaction(postgres_url))
    report = outcome.report
    assert report.exit_codes[0] == -9
    assert_recovered(report)
    # The killed attempt held token 1 and its effect never committed; the sweep
    # reset the lock and the redelivery took token 2 and did the effect once.
    assert outcome.record is not None
    assert (outcome.record.status, outcome.record.attempt) == (S.PROCESSED, 2)
    (effect,) = outcome.effects
    assert effect.execution != outcome.killed_execution
    assert effect.token == 2
    assert report.outcomes.get("recovery_processed", 0) >= 1


# --- the PostgreSQL server restarted during a run ---------------------------------------------
#
# Restarting the shared test server would break every PostgreSQL test running beside this
# one (the suite runs on two workers), so the test creates a PostgreSQL server of its own
# with the machine's binaries, restarts that one, and removes it.


async def _restarted_during_run(server: PrivateServer) -> tuple[StressReport, int]:
    settings = StressSettings(
        db_url=server.url,
        processes=2,
        workers=2,
        keys=200,
        duplicates=2,
        fail_rate=0.0,
        lock_duration=dt.timedelta(seconds=8),
        retry_seconds=20.0,
        recovery_seconds=30.0,
    )
    run = StressRun(settings)
    try:
        await run.prepare()
        run.start()
        paths = run.journal_paths[:-1]
        await _wait_for(
            lambda: len(read_operations(p for p in paths if p.exists())) > 60, within_s=60
        )
        await asyncio.to_thread(server.restart)
        await run.wait(90)
        errors = sum(
            1
            for op in read_operations(p for p in paths if p.exists())
            if op.error == StoreError.__name__
        )
        await run.recover()
        return await run.report(), errors
    finally:
        await run.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_a_postgres_restart_during_a_run_loses_nothing_and_charges_once(
    private_postgres: PrivateServer,
) -> None:
    report, errors_during_run = asyncio.run(_restarted_during_run(private_postgres))
    assert errors_during_run > 0, "the restart never reached the workers"
    assert report.exit_codes == (0, 0)
    assert_recovered(report)


# --- SQLite: database is locked -----------------------------------------------------------------


async def _locked_sqlite(path: Path) -> StressReport:
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{path}",
        handler_spec="dsm_sim.stress.factories:sqlite_short_busy_timeout_handler",
        processes=6,
        workers=4,
        keys=80,
        duplicates=3,
        fail_rate=0.0,
        retry_seconds=10.0,
        recovery_seconds=30.0,
    )
    run = StressRun(settings)
    try:
        await run.prepare()
        run.start()
        await run.wait(120)
        await run.recover()
        return await run.report()
    finally:
        await run.close()


def test_sqlite_database_is_locked_is_a_store_error_never_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "contended.sqlite3"
    report = asyncio.run(_locked_sqlite(path))
    assert report.store_errors > 0, "no writer ever hit 'database is locked'"
    assert report.exit_codes == (0,) * 6
    assert_recovered(report)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        tenant = f"stress-{report.settings.run_id}"  # the run's records, not its store probe
        assert conn.execute(
            f"SELECT count(*) FROM {TABLE_NAME} WHERE status = 'processed' AND tenant_id = ?",
            (tenant,),
        ).fetchone() == (80,)
