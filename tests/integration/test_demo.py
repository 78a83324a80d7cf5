"""``dsm demo invoice``: runs on real stores, tells the story, prints the same bytes every time."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from dsm_sim import cli
from dsm_sim.teaching import demo
from dsm_sim.teaching.demo_render import abbreviate, flatten_data, render_table
from reference_engine.clock import Clock
from reference_engine.handlers.sql.engine import create_engine_for, drop_pg_schema
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler

pytestmark = pytest.mark.integration

NARRATIVE = (
    "Step 1. Configuration",
    '"lockDuration": "30m"',
    "scope         Element (scope_id 4)",
    "Step 2. Initialisation",
    "handler key 'built-in' -> SqlStateHandler",
    "scope Element -> scope_id 4",
    "entity_id            dispatch-invoice",
    "msg-1001 (delivery 1) ran as invoices/demo/exec-0001: success: charged ch_0001 for 12500 cents",
    "msg-1001 (delivery 2) ran as invoices/demo/exec-0002: skip: invoice INV-1001 already dispatched",
    "msg-1002 (delivery 1) ran as invoices/demo/exec-0003: aborted (CancelledError)",
    "INV-1002  processing  1        09:35:00      09:05:00    invoices/demo/exec-0003",
    "skip: invoice INV-1002 is being dispatched by another worker",
    "catch-up run: 1 expired lock(s) reset to Failed",
    "INV-1002  failed     1        -             09:36:00    invoices/demo/exec-0003  "
    "lock expired; reset by the catch-up sweep",
    "msg-1002 (delivery 3) ran as invoices/demo/exec-0005: success: charged ch_0002 for 4900 cents",
    "rejected: StaleLockError: stale lock on item 'INV-1002': this execution holds fencing",
    "INV-1002  processed  2        -             09:37:00    invoices/demo/exec-0005",
    "INV-1001: 1 charge(s) (ch_0001)",
    "INV-1002: 1 charge(s) (ch_0002)",
    "Node executions: 5 (2 success, 2 skip, 0 failure, 1 aborted)",
    "All narrated claims held.",
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["demo", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_default_run_narrates_every_step_and_is_byte_stable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    first = run_cli(capsys, "invoice")
    second = run_cli(capsys)

    assert first == second
    code, out, err = first
    assert (code, err) == (0, "")
    for line in NARRATIVE:
        assert line in out, line
    assert [n for n in range(1, 10) if f"Step {n}. " in out] == list(range(1, 10))
    assert str(tmp_path) not in out
    assert list(tmp_path.iterdir()) == [], "the temporary database is removed"


def test_keep_leaves_the_temporary_database_and_says_where(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, _, err = run_cli(capsys, "--keep")
    assert code == 0
    (kept,) = tmp_path.glob("dsm-demo-*/demo.db")
    assert str(kept) in err
    assert demo_rows(kept) == [("INV-1001", "processed", 1), ("INV-1002", "processed", 2)]


def demo_rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT item_key, status, attempt FROM process_state_logs "
            "WHERE tenant_id = ? ORDER BY id",
            (demo.DEMO_TENANT,),
        ).fetchall()


def test_a_given_sqlite_file_is_cleaned_so_reruns_match(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mine.db'}"
    kept = run_cli(capsys, "--db", url, "--keep")
    assert demo_rows(tmp_path / "mine.db") == [
        ("INV-1001", "processed", 1),
        ("INV-1002", "processed", 2),
    ]
    again = run_cli(capsys, "--db", url)
    assert kept == again
    assert kept[0] == 0
    assert f"Store: {url};" in kept[1]
    assert demo_rows(tmp_path / "mine.db") == [], "without --keep the demo's rows are removed"


def test_a_bad_database_url_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--db", "oracle://somewhere/db")
    assert (code, out) == (2, "")
    assert "ConfigurationError" in err
    assert "sqlite, postgresql" in err


def test_a_store_that_does_not_sweep_is_reported_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo checks what it narrates: a handler whose sweep does nothing is caught."""

    class NoSweep(SqlStateHandler):
        async def reset_expired_locks(self) -> int:
            return 0

    real = sql_handler

    def lazy_handler(url: str, clock: Clock, *, schema: str | None = None) -> SqlStateHandler:
        built = real(url, clock, schema=schema)
        return NoSweep(built.engine, clock)

    monkeypatch.setattr(demo, "sql_handler", lazy_handler)
    code, out, _ = run_cli(capsys, "--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    assert code == 1
    assert "!! UNEXPECTED: the sweep resets exactly one lock" in out
    assert "!! UNEXPECTED: INV-1002 is Failed after the sweep" in out
    assert "narrated claim(s) did not hold" in out


@pytest.mark.postgres
def test_postgresql_run_in_its_own_schema_is_byte_stable(
    capsys: pytest.CaptureFixture[str], postgres_url: str
) -> None:
    schema = f"dsm_demo_{uuid.uuid4().hex[:12]}"
    try:
        first = run_cli(capsys, "--db", postgres_url, "--schema", schema)
        second = run_cli(capsys, "--db", postgres_url, "--schema", schema)
    finally:
        asyncio.run(drop_schema(postgres_url, schema))
    assert first == second
    code, out, err = first
    assert (code, err) == (0, "")
    assert "SqlStateHandler on postgresql" in out
    assert f"(schema {schema})" in out
    for line in NARRATIVE:
        assert line in out, line


async def drop_schema(url: str, schema: str) -> None:
    engine = create_engine_for(url)
    try:
        await drop_pg_schema(engine, schema)
    finally:
        await engine.dispose()


def test_rendering_keeps_values_unambiguous_and_columns_aligned() -> None:
    assert flatten_data('{"b": {"id": 2}, "a": {"id": 1}}') == "a.id=1 b.id=2"
    assert flatten_data('{"at": "09:00", "r": {"n": 3}}') == "at=09:00 n=3"
    assert flatten_data(None) is None
    assert abbreviate("x" * 10, 8) == "xxxxx..."
    assert abbreviate("a  b\nc", 8) == "a b c"
    assert render_table(["k", "value"], [["long-key", "v"]]) == [
        "k         value",
        "--------  -----",
        "long-key  v",
    ]
