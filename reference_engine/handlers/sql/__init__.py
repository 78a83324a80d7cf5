"""The built-in SQL handler: SQLite (aiosqlite), PostgreSQL (asyncpg), MariaDB (asyncmy).

All three through SQLAlchemy 2.

See ``docs/sql-handler.md`` for the table, the statements and the guarantees.
"""

from reference_engine.handlers.sql.ddl import create_schema
from reference_engine.handlers.sql.engine import create_engine_for, normalize_url
from reference_engine.handlers.sql.factory import (
    DEFAULT_DATABASE_URL,
    builtin_factory,
    database_url,
    mariadb_isolated_handler,
    mariadb_test_handler,
    postgres_isolated_handler,
    postgres_test_handler,
    sql_handler,
    sqlite_file_handler,
    sqlite_memory_handler,
)
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.repository import ProcessStateLogRepository
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.handlers.sql.statements import StatementLog, count_statements

__all__ = [
    "DEFAULT_DATABASE_URL",
    "ProcessStateLogRepository",
    "SqlStateHandler",
    "StatementLog",
    "builtin_factory",
    "count_statements",
    "create_engine_for",
    "create_schema",
    "database_url",
    "mariadb_isolated_handler",
    "mariadb_test_handler",
    "normalize_url",
    "postgres_isolated_handler",
    "postgres_test_handler",
    "process_state_logs",
    "sql_handler",
    "sqlite_file_handler",
    "sqlite_memory_handler",
]
