"""The durable record of business side effects: one row per effect, in its own table.

Duplicates are counted from these rows, not from any process's memory, so an
effect committed by a process that was then killed still counts, and an
effect whose transaction was killed before its commit does not.  A row is
keyed by ``(item_key, execution)``: retrying the same execution's effect
after a dropped connection is idempotent, while two executions doing the
effect for one key are two rows, which is the duplicate the checker looks for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from dsm_sim.stress.settings import DatabaseKind, StressSettings
from reference_engine.handlers.sql.mariadb import create_database, drop_database

__all__ = ["EFFECTS_TABLE", "EffectLedger", "EffectRow", "ledger_url"]

EFFECTS_TABLE = "stress_side_effects"


@dataclass(frozen=True, slots=True)
class EffectRow:
    item_key: str
    execution: str
    token: int | None
    process: int
    worker: int
    at_ns: int


def ledger_url(settings: StressSettings) -> str:
    """Where the effects live: the run's schema on a server, a sibling file for SQLite.

    On SQLite the effects get their own file so their writes never compete
    with the handler's for the database lock: the ledger must not be the
    source of the ``database is locked`` errors a run is meant to provoke.
    """
    if settings.kind.server:
        return settings.db_url
    url = make_url(settings.db_url)
    database = Path(url.database or "")
    sibling = database.with_name(f"{database.name}.{settings.run_id}.effects")
    return url.set(database=str(sibling)).render_as_string(hide_password=False)


def _remove_sqlite_files(database: str | None) -> None:
    if database:
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(database + suffix).unlink(missing_ok=True)


class EffectLedger:
    """Writes and reads the effects of one run."""

    def __init__(self, settings: StressSettings, *, pool_size: int = 4) -> None:
        self.settings = settings
        self.mariadb = settings.kind is DatabaseKind.MARIADB
        quote = "`" if self.mariadb else '"'
        self.table = (
            f"{quote}{settings.schema}{quote}.{EFFECTS_TABLE}"
            if settings.schema is not None
            else EFFECTS_TABLE
        )
        url = ledger_url(settings)
        if settings.kind.server:
            self.engine: AsyncEngine = create_async_engine(
                url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
            )
        else:
            self.engine = create_async_engine(url, connect_args={"timeout": 60})

    async def free_connections(self) -> int | None:
        """Connections the database server can still accept (None on SQLite)."""
        if self.settings.schema is None:
            return None
        query = (
            "SELECT @@max_connections - (SELECT COUNT(*) FROM information_schema.PROCESSLIST)"
            if self.mariadb
            else "SELECT current_setting('max_connections')::int "
            "- current_setting('superuser_reserved_connections')::int "
            "- (SELECT count(*) FROM pg_stat_activity)"
        )
        async with self.engine.connect() as conn:
            free = await conn.scalar(text(query))
        return int(free)

    async def create(self) -> None:
        """Create the table; called once by the parent before any worker starts."""
        # MariaDB keys no TEXT column whole: the key columns are bounded there
        # (item keys are k00000-style, executions a process, worker and counter).
        key_type = "VARCHAR(255)" if self.mariadb else "TEXT"
        if self.mariadb and self.settings.schema is not None:
            await create_database(self.engine, self.settings.schema)
        async with self.engine.begin() as conn:
            if self.settings.schema is not None and not self.mariadb:
                await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.settings.schema}"'))
            await conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {self.table} ("
                    f"item_key {key_type} NOT NULL, execution {key_type} NOT NULL, token BIGINT, "
                    "process INTEGER NOT NULL, worker INTEGER NOT NULL, at_ns BIGINT NOT NULL, "
                    "PRIMARY KEY (item_key, execution))"
                )
            )

    async def record(
        self,
        row: EffectRow,
        *,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Do the side effect: insert its row and commit.

        ``before_commit`` runs inside the open transaction; a process killed
        there leaves no row, since the database rolls the transaction back.
        """
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    f"INSERT INTO {self.table} "
                    "(item_key, execution, token, process, worker, at_ns) "
                    "VALUES (:item_key, :execution, :token, :process, :worker, :at_ns) "
                    + (
                        "ON DUPLICATE KEY UPDATE item_key = item_key"
                        if self.mariadb
                        else "ON CONFLICT (item_key, execution) DO NOTHING"
                    )
                ),
                {
                    "item_key": row.item_key,
                    "execution": row.execution,
                    "token": row.token,
                    "process": row.process,
                    "worker": row.worker,
                    "at_ns": row.at_ns,
                },
            )
            if before_commit is not None:
                await before_commit()

    async def rows(self) -> list[EffectRow]:
        async with self.engine.connect() as conn:
            result = await conn.execute(
                text(
                    "SELECT item_key, execution, token, process, worker, at_ns "
                    f"FROM {self.table} ORDER BY at_ns"
                )
            )
            return [
                EffectRow(
                    item_key=str(r[0]),
                    execution=str(r[1]),
                    token=None if r[2] is None else int(r[2]),
                    process=int(r[3]),
                    worker=int(r[4]),
                    at_ns=int(r[5]),
                )
                for r in result
            ]

    async def tally(self) -> tuple[int, tuple[str, ...]]:
        """How many effects the ledger holds, and the keys charged more than once.

        Counted by the database, so a run whose effects are too many to read
        into memory is still judged for duplicates (at most one key per item).
        """
        async with self.engine.connect() as conn:
            total = int(await conn.scalar(text(f"SELECT COUNT(*) FROM {self.table}")) or 0)
            twice = await conn.execute(
                text(
                    f"SELECT item_key FROM {self.table} GROUP BY item_key "
                    "HAVING COUNT(*) > 1 ORDER BY item_key"
                )
            )
            return total, tuple(str(r[0]) for r in twice)

    async def drop(self) -> None:
        """Remove what the run created: its schema (MariaDB: database), or the SQLite file."""
        if self.settings.schema is not None and self.mariadb:
            await drop_database(self.engine, self.settings.schema)
            return
        if self.settings.schema is not None:
            async with self.engine.begin() as conn:
                await conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.settings.schema}" CASCADE'))
            return
        await self.engine.dispose()
        _remove_sqlite_files(make_url(ledger_url(self.settings)).database)

    async def close(self) -> None:
        await self.engine.dispose()
