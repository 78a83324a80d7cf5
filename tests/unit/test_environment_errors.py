"""What is wrong with the environment is a named error (exit 2), never a verdict on the handler.

A store server that refuses the connection would fail every test case the
same way and read as FAILED (exit 1), as if the handler were wrong; a
schema that belongs to the database server itself is refused before any
connection is made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsm_sim import cli
from reference_engine.clock import ManualClock
from reference_engine.handlers.sql.engine import ReservedSchemaError, validate_schema_name
from reference_engine.handlers.sql.factory import POSTGRES_TEST_URL_ENV, sql_handler

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: Nothing listens on port 1.
UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/test"


def test_dsm_verify_against_an_unreachable_store_exits_2_with_the_connection_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(POSTGRES_TEST_URL_ENV, UNREACHABLE)
    code = cli.main(
        [
            "verify",
            "reference_engine.handlers.sql.factory:postgres_test_handler",
            "--profile",
            "dev",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    assert captured.out == ""
    assert captured.err.startswith("dsm verify: the handler's store cannot be reached")
    assert "Connect call failed ('127.0.0.1', 1)" in captured.err
    assert "FAILED" not in captured.err and "Traceback" not in captured.err


def test_dsm_run_against_an_unreachable_store_names_the_open_that_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The close that fails after it is a note, not the error said instead of it."""
    monkeypatch.setenv(POSTGRES_TEST_URL_ENV, UNREACHABLE)
    handler = "reference_engine.handlers.sql.factory:postgres_test_handler"
    code = cli.main(
        ["run", str(ROOT / "scenarios" / "slow-worker.toml"), "--seed", "1", "--handler", handler]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dsm run: open failed on the postgresql store"), err


SYSTEM = ["information_schema", "pg_catalog", "pg_toast", "pg_temp_3", "mysql"]
SYSTEM += ["performance_schema", "sys"]


@pytest.mark.parametrize("schema", SYSTEM)
def test_a_system_schema_is_refused_by_name(schema: str) -> None:
    with pytest.raises(ReservedSchemaError, match="belongs to the database server"):
        validate_schema_name(schema)
    with pytest.raises(ReservedSchemaError):
        sql_handler("postgresql+asyncpg://postgres@127.0.0.1:1/test", ManualClock(), schema=schema)
    with pytest.raises(ReservedSchemaError):
        sql_handler("mariadb+asyncmy://root@127.0.0.1:1/test", ManualClock(), schema=schema)


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "mysql"])
def test_dsm_demo_refuses_a_system_schema_before_connecting(
    capsys: pytest.CaptureFixture[str], schema: str
) -> None:
    code = cli.main(["demo", "--db", UNREACHABLE, "--schema", schema])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"ReservedSchemaError: schema {schema!r} belongs to the database server" in err, err


@pytest.mark.parametrize("schema", ["dsm", "public", "payments_idempotency", "sysadmin", "pgx"])
def test_a_schema_of_ones_own_is_taken(schema: str) -> None:
    assert validate_schema_name(schema) == schema
