"""``dsm demo invoice --handler MODULE:FACTORY``: the walk-through on a store of the user's own."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsm_sim import cli

pytestmark = pytest.mark.unit

IN_MEMORY = "reference_engine.handlers.memory:in_memory_handler"

#: What the run on the in-memory handler must say; the same story as on SQLite,
#: read back through the handler's own ``get``.
NARRATIVE = (
    f"Store: InMemoryStateHandler, built by {IN_MEMORY}; tenant 'demo-tenant'",
    '"handler": "my-store"',
    "handler key 'my-store' -> InMemoryStateHandler",
    "records, read back with get():",
    "msg-1001 (delivery 1) ran as invoices/demo/exec-0001: success: charged ch_0001 for 12500 cents",
    "msg-1001 (delivery 2) ran as invoices/demo/exec-0002: skip: invoice INV-1001 already dispatched",
    "msg-1002 (delivery 1) ran as invoices/demo/exec-0003: aborted (CancelledError)",
    "INV-1002  processing  1        09:35:00      09:05:00    invoices/demo/exec-0003",
    "catch-up run: 1 expired lock(s) reset to Failed",
    "INV-1002  failed     1        -             09:36:00    invoices/demo/exec-0003  "
    "lock expired; reset by the catch-up sweep",
    "rejected: StaleLockError: stale lock on item 'INV-1002'",
    "INV-1002  processed  2        -             09:37:00    invoices/demo/exec-0005",
    "Node executions: 5 (2 success, 2 skip, 0 failure, 1 aborted)",
    "All narrated claims held.",
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["demo", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory that is not yet on the import path, as for a user's project."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("demo_user_"):
            del sys.modules[name]


def write_module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")


def test_the_in_memory_factory_runs_every_step_and_is_byte_stable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = run_cli(capsys, "invoice", "--handler", IN_MEMORY)
    second = run_cli(capsys, "--handler", IN_MEMORY)

    assert first == second
    code, out, err = first
    assert (code, err) == (0, "")
    for line in NARRATIVE:
        assert line in out, line
    assert [n for n in range(1, 10) if f"Step {n}. " in out] == list(range(1, 10))
    assert "process_state_logs" not in out, "no SQL table is claimed for a foreign store"
    assert "built-in" not in out


def test_a_factory_in_the_current_directory_is_found_and_its_handler_closed(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    write_module(
        here,
        "demo_user_store",
        """
        from reference_engine.handlers.memory import InMemoryStateHandler

        BUILT = []


        class ClosingHandler(InMemoryStateHandler):
            closed = False

            async def close(self):
                self.closed = True


        def make_handler(clock):
            BUILT.append(ClosingHandler(clock))
            return BUILT[-1]
        """,
    )
    code, out, err = run_cli(capsys, "--handler", "demo_user_store:make_handler")

    assert (code, err) == (0, ""), err
    assert "handler key 'my-store' -> ClosingHandler" in out
    assert "All narrated claims held." in out
    built = sys.modules["demo_user_store"].BUILT
    assert len(built) == 1, "one handler, shared by every delivery"
    assert built[0].closed


def test_a_handler_that_does_not_sweep_is_caught_through_its_own_get(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    write_module(
        here,
        "demo_user_nosweep",
        """
        from reference_engine.handlers.memory import InMemoryStateHandler


        class NoSweep(InMemoryStateHandler):
            async def reset_expired_locks(self):
                return 0


        def make_handler(clock):
            return NoSweep(clock)
        """,
    )
    code, out, _ = run_cli(capsys, "--handler", "demo_user_nosweep:make_handler")

    assert code == 1
    assert "!! UNEXPECTED: the sweep resets exactly one lock" in out
    assert "!! UNEXPECTED: INV-1002 is Failed after the sweep" in out
    assert "narrated claim(s) did not hold" in out


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("in_memory_handler", "must look like 'package.module:factory'"),
        ("reference_engine.handlers.memory:", "must look like 'package.module:factory'"),
        ("demo_user_missing:make_handler", "cannot import module 'demo_user_missing'"),
        ("reference_engine.handlers.memory:no_such_factory", "has no attribute 'no_such_factory'"),
        ("reference_engine.handlers.memory:__name__", "is not callable"),
        ("demo_user_wrong:make_handler", "does not implement the StateHandler protocol"),
        ("demo_user_wrong:needs_a_url", "set DEMO_USER_URL to the store's URL"),
    ],
)
def test_a_bad_spec_exits_2_with_the_named_error_before_any_narration(
    capsys: pytest.CaptureFixture[str], here: Path, spec: str, reason: str
) -> None:
    write_module(
        here,
        "demo_user_wrong",
        """
        from reference_engine.errors import ConfigurationError


        def make_handler(clock):
            return object()


        def needs_a_url(clock):
            raise ConfigurationError("set DEMO_USER_URL to the store's URL")
        """,
    )

    code, out, err = run_cli(capsys, "--handler", spec)

    assert (code, out) == (2, "")
    assert re.match(r"dsm demo: (ConfigurationError|FactoryError): ", err), err
    assert reason in err
    assert err.count("\n") == 1, "one line, no traceback"


def test_a_module_that_cannot_be_imported_says_where_to_run_from(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    _, _, err = run_cli(capsys, "--handler", "demo_user_elsewhere:make_handler")
    assert "run dsm from the folder that holds the module" in err


@pytest.mark.parametrize(
    "extra", [["--db", "sqlite+aiosqlite:///x.db"], ["--schema", "s"], ["--keep"]]
)
def test_the_built_in_store_options_are_refused_with_a_handler(
    capsys: pytest.CaptureFixture[str], here: Path, extra: list[str]
) -> None:
    code, out, err = run_cli(capsys, "--handler", IN_MEMORY, *extra)
    assert (code, out) == (2, "")
    assert "ConfigurationError" in err
    assert "give one or the other" in err
    assert list(here.iterdir()) == [], "nothing was created"
