"""Broken variants of the built-in SQL handler, for proving the harness catches real bugs.

:class:`CheckThenInsertSqlHandler` is the acquire most people write first:
read the record, decide in application code that it is free, then write the
lock in a second statement.  Every single call is correct on its own; only
two workers interleaving between the read and the write break it, both
believing they hold token ``attempt + 1``.  That is why it takes real
processes against a real database (the stress runner) or a simulated race
window to catch it, and why the built-in handler does the decision inside
one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.dialects.mysql import insert as mariadb_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handlers.sql.engine import create_engine_for, create_pg_schema
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.mariadb import create_database
from reference_engine.handlers.sql.schema import CURRENT_ROW, KEY_COLUMNS, process_state_logs
from reference_engine.model import effective_status
from reference_engine.status import ACQUIRABLE, IdempotencyStatus

__all__ = [
    "DEFAULT_RACE_WINDOW_S",
    "CheckThenInsertSqlHandler",
    "check_then_insert_handler",
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
            locked_until = now + ctx.handler_config.lock_duration
            retention = ctx.handler_config.retention
            stamp: dict[str, Any] = {
                "status": S.PROCESSING.value,
                "attempt": token,
                "locked_until": locked_until,
                "error_detail": None,
                "entity_execution_id": ctx.entity_execution_id,
                "source_app_id": ctx.source_app_id,
                "updated_at": now,
                "retain_until": None if retention is None else now + retention,
            }
            row = {
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
                    index_elements=[column.name for column in KEY_COLUMNS],
                    index_where=CURRENT_ROW,
                    set_=stamp,
                )
            async with self.engine.begin() as conn:  # statement 2, another transaction
                await conn.execute(statement)
            return token


def check_then_insert_handler(
    url: str, clock: Clock, *, schema: str | None = None
) -> CheckThenInsertSqlHandler:
    """Factory with the stress runner's signature, usable as a spec string.

    ``dsm stress --handler dsm_sim.broken.sql:check_then_insert_handler``.
    """
    engine = create_engine_for(url, schema=schema)

    async def create_schema(_engine: AsyncEngine) -> None:
        if schema is None:
            return
        if _engine.dialect.name == "mariadb":
            await create_database(_engine, schema)
        else:
            await create_pg_schema(_engine, schema)

    return CheckThenInsertSqlHandler(engine, clock, on_open=create_schema)
