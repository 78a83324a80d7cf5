"""Broken variants of the built-in SQL handler, for proving the harness catches real bugs.

:class:`CheckThenInsertSqlHandler` is the acquire most people write first:
read the record, decide in application code that it is free, then write the
lock in a second statement.  Every single call is correct on its own; only
two workers interleaving between the read and the write break it, both
believing they hold token ``attempt + 1``.  That is why it takes real
processes against a real database (the stress runner) or a simulated race
window to catch it, and why the built-in handler does the decision inside
one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` instead.

:class:`UnfencedSqlHandler` checks the lock nowhere in its ``set``: only a
worker whose write arrives after someone else took its expired lock over
breaks it, which takes a real network delay (``dsm stress --netfault``) or a
test that holds the write back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects.mysql import insert as mariadb_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError
from reference_engine.handlers.sql.engine import create_engine_for, create_pg_schema
from reference_engine.handlers.sql.factory import POSTGRES_TEST_URL_ENV, postgres_isolated_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.mariadb import create_database
from reference_engine.handlers.sql.prepared import conflict_target
from reference_engine.handlers.sql.schema import CURRENT_ROW, KEY_COLUMNS, process_state_logs
from reference_engine.model import effective_status
from reference_engine.record import encode_data
from reference_engine.status import ACQUIRABLE, IdempotencyStatus

__all__ = [
    "DEFAULT_RACE_WINDOW_S",
    "CheckThenInsertSqlHandler",
    "StatusCompareAndSetSqlHandler",
    "UnfencedSqlHandler",
    "check_then_insert_handler",
    "postgres_status_compare_and_set_handler",
    "unfenced_handler",
]

S = IdempotencyStatus
T = process_state_logs
#: Extra application work between the read and the write (logging, an ORM
#: flush).  None is needed: the round trip alone is window enough for
#: processes that receive the same message together to both get in.
DEFAULT_RACE_WINDOW_S = 0.0


class CheckThenInsertSqlHandler(SqlStateHandler):
    """The built-in handler with a racy acquire: SELECT, then INSERT/UPDATE separately.

    Everything else (fencing, sweeps, set) is the built-in handler's, so a
    run that catches it is catching the acquire and nothing else.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Clock,
        *,
        race_window: float = DEFAULT_RACE_WINDOW_S,
        **hooks: Any,
    ) -> None:
        super().__init__(engine, clock, **hooks)
        self.race_window = race_window

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        key = ctx.record_key
        async with self._store("try_acquire_lock"):
            current = await self.repository.get(key)  # statement 1, its own transaction
            if effective_status(current, now) not in ACQUIRABLE:
                return None
            if self.race_window > 0:
                await asyncio.sleep(self.race_window)
            token = 1 if current is None else current.attempt + 1
            stamp = _lock_stamp(ctx, token, now)
            row = _new_row(ctx, stamp, now)
            # The bug: "insert or overwrite" with no WHERE re-checking what was read.
            dialect = self.engine.dialect.name
            statement: Any
            if dialect == "mariadb":
                # The current row's unique generated key is where the duplicate lands.
                statement = mariadb_insert(T).values(**row).on_duplicate_key_update(**stamp)
            else:
                insert = (pg_insert(T) if dialect == "postgresql" else sqlite_insert(T)).values(
                    **row
                )
                statement = insert.on_conflict_do_update(
                    index_elements=conflict_target(dialect),
                    index_where=CURRENT_ROW,
                    set_=stamp,
                )
            async with self.engine.begin() as conn:  # statement 2, another transaction
                await conn.execute(statement)
            return token


def _lock_stamp(ctx: StateHandlerContext, token: int, now: dt.datetime) -> dict[str, Any]:
    """The columns an acquire writes: Processing under ``token`` until the lock's end."""
    config = ctx.handler_config
    return {
        "status": S.PROCESSING.value,
        "attempt": token,
        "locked_until": config.locked_until(now),
        "error_detail": None,
        "entity_execution_id": ctx.entity_execution_id,
        "source_app_id": ctx.source_app_id,
        "updated_at": now,
        "retain_until": config.retain_until(now),
    }


def _new_row(ctx: StateHandlerContext, stamp: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """A first row for the item, stamped as ``stamp`` says."""
    key = ctx.record_key
    return {
        "tenant_id": key.tenant_id,
        "scope_id": key.scope_id,
        "scope_code": ctx.scope_code,
        "entity_id": key.entity_id,
        "item_entity_key": key.item_entity_key,
        "item_key": key.item_key,
        "data": None,
        "superseded": False,
        "created_at": now,
        **stamp,
    }


def check_then_insert_handler(
    url: str, clock: Clock, *, schema: str | None = None
) -> CheckThenInsertSqlHandler:
    """Factory with the stress runner's signature, usable as a spec string.

    ``dsm stress --handler dsm_sim.broken.sql:check_then_insert_handler``.
    """
    engine = create_engine_for(url, schema=schema)
    return CheckThenInsertSqlHandler(engine, clock, on_open=_schema_creator(schema))


class UnfencedSqlHandler(SqlStateHandler):
    """The built-in handler whose ``set`` with a token ignores it: the bug fencing prevents.

    It overwrites whatever current row the key has, which is what a handler
    that checks the lock in application code (or not at all) ends up doing
    once its request is delayed past someone else's take-over.
    """

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        if ctx.lock_token is None:
            await super().set(ctx, status, data)
            return
        key = ctx.record_key
        statement = (
            update(T)
            .where(*(T.c[c.name] == getattr(key, c.name) for c in KEY_COLUMNS), CURRENT_ROW)
            .values(
                status=status.value,
                data=encode_data(data),
                locked_until=None,
                updated_at=self.clock.now(),
            )
        )
        async with self._store("set"), self.engine.begin() as conn:
            await conn.execute(statement)


def unfenced_handler(url: str, clock: Clock, *, schema: str | None = None) -> UnfencedSqlHandler:
    """Factory with the stress runner's signature (see :func:`check_then_insert_handler`)."""
    engine = create_engine_for(url, schema=schema)
    return UnfencedSqlHandler(engine, clock, on_open=_schema_creator(schema))


class StatusCompareAndSetSqlHandler(SqlStateHandler):
    """Acquire in one transaction, ``SELECT`` then ``UPDATE ... WHERE status = :read``.

    Every statement runs in the same transaction, and the ``UPDATE`` is
    conditional, which reads as safe.  Under ``READ COMMITTED`` it is not: a
    second acquire whose ``SELECT`` ran while the first was between its
    ``UPDATE`` and its ``COMMIT`` saw the expired lock, its ``UPDATE`` waits
    for the first's row lock, and once the first commits PostgreSQL re-checks
    ``status = 'Processing'`` on the new row, which a take-over left as it
    was: both hold the item.  The condition had to compare the token.  The
    window is two round trips into the call, not at its first await.
    """

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        now = self.clock.now()
        key = ctx.record_key
        async with self._store("try_acquire_lock"), self.engine.begin() as conn:
            current = await self.repository.current(conn, key)
            if effective_status(current, now) not in ACQUIRABLE:
                return None
            token = 1 if current is None else current.attempt + 1
            stamp = _lock_stamp(ctx, token, now)
            statement: Any
            if current is None:
                dialect = self.engine.dialect.name
                if dialect == "mariadb":
                    statement = mariadb_insert(T).values(**_new_row(ctx, stamp, now))
                    statement = statement.prefix_with("IGNORE")
                else:
                    insert = pg_insert(T) if dialect == "postgresql" else sqlite_insert(T)
                    statement = insert.values(**_new_row(ctx, stamp, now)).on_conflict_do_nothing()
            else:
                statement = (
                    update(T)
                    .where(
                        *(T.c[c.name] == getattr(key, c.name) for c in KEY_COLUMNS),
                        CURRENT_ROW,
                        T.c.status == current.status.value,
                    )
                    .values(**stamp)
                )
            written = await conn.execute(statement)
            return token if written.rowcount == 1 else None


def postgres_status_compare_and_set_handler(clock: Clock) -> StatusCompareAndSetSqlHandler:
    """:class:`StatusCompareAndSetSqlHandler` in a fresh schema on ``DSM_TEST_POSTGRES_URL``.

    ``dsm verify dsm_sim.broken.sql:postgres_status_compare_and_set_handler``.
    """
    url = os.environ.get(POSTGRES_TEST_URL_ENV, "").strip()
    if not url:
        raise ConfigurationError(
            f"set {POSTGRES_TEST_URL_ENV} to a PostgreSQL URL, e.g. "
            "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
        )
    handler = postgres_isolated_handler(url, clock, cls=StatusCompareAndSetSqlHandler)
    assert isinstance(handler, StatusCompareAndSetSqlHandler)
    return handler


def _schema_creator(schema: str | None) -> Callable[[AsyncEngine], Awaitable[None]]:
    """The ``on_open`` hook creating the run's schema (MariaDB: database), if it has one."""

    async def create_schema(engine: AsyncEngine) -> None:
        if schema is None:
            return
        if engine.dialect.name == "mariadb":
            await create_database(engine, schema)
        else:
            await create_pg_schema(engine, schema)

    return create_schema
