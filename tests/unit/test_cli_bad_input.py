"""Bad input at the command line: one named error and exit status 2, never a traceback.

Factories that cannot build a handler, output paths that cannot be written,
database URLs a stress run cannot use, a run that outlives ``--max-wall``,
reports that would overwrite each other, and what every command does with an
error no command named.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsm_sim import cli
from dsm_sim.stress.settings import StressSettings
from dsm_sim.stress.verdict import exit_code
from reference_engine.errors import StoreError

pytestmark = pytest.mark.unit

MODULE = "cli_bad_factories"
FACTORIES = '''
    import asyncio

    from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler


    def raises(clock):
        raise RuntimeError("no store here")


    def not_a_handler(clock):
        return object()


    async def async_factory(clock):
        return in_memory_handler(clock)


    def returns_coroutine(clock):
        return async_factory(clock)


    def no_argument():
        return in_memory_handler(None)


    class SyncHandler(InMemoryStateHandler):
        def exists(self, ctx):
            return False


    def sync_methods(clock):
        return SyncHandler(clock)


    OPENED = []


    class SlowAfterFirstRun(InMemoryStateHandler):
        """Fast for the first run (which opens two instances: the run's and its worker's
        own), then every exists() takes two seconds of real time."""

        async def open(self):
            OPENED.append(1)
            await super().open()

        async def exists(self, ctx):
            if len(OPENED) > 2:
                await asyncio.sleep(2.0)
            return await super().exists(ctx)


    def slow_after_first_run(clock):
        return SlowAfterFirstRun(clock)
'''
TINY = """\
name = "tiny"
[run]
items = 2
workers = 1
arrival_window = "10s"
faults_until = "20s"
seeds = 2
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory holding the factories module and a two-item scenario."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(FACTORIES), encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield tmp_path
    sys.modules.pop(MODULE, None)


def dsm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_named_line(err: str, command: str) -> None:
    assert err.startswith(f"dsm {command}: "), err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err


# --- factories -------------------------------------------------------------------------------

BAD_FACTORIES = [
    ("raises", "raised RuntimeError: no store here"),
    ("not_a_handler", "which is not a StateHandler"),
    ("async_factory", "is an async function"),
    ("returns_coroutine", "returned an awaitable"),
    ("no_argument", "it must take one argument, the Clock"),
    ("sync_methods", "whose methods exists are not async"),
]


def _command(name: str, spec: str, tmp: Path) -> list[str]:
    if name == "verify":
        return ["verify", spec, "--profile", "dev"]
    if name == "run":
        return ["run", "tiny.toml", "--seed", "1", "--handler", spec]
    return [
        "stress",
        "--db",
        f"sqlite+aiosqlite:///{tmp / 'stress.db'}",
        "--handler",
        spec,
        "--processes",
        "1",
        "--keys",
        "1",
    ]


@pytest.mark.parametrize("command", ["verify", "run", "stress"])
@pytest.mark.parametrize(("factory", "problem"), BAD_FACTORIES)
def test_a_bad_factory_is_one_named_error_before_any_run(
    capsys: pytest.CaptureFixture[str], here: Path, command: str, factory: str, problem: str
) -> None:
    code, out, err = dsm(capsys, *_command(command, f"{MODULE}:{factory}", here))
    assert (code, out) == (2, "")
    _one_named_line(err, command)
    assert f"the factory '{MODULE}:{factory}'" in err
    assert problem in err
    assert not (here / "stress.db").exists(), "nothing is created for a factory that fails"


def test_a_missing_method_is_named(capsys: pytest.CaptureFixture[str], here: Path) -> None:
    code, _, err = dsm(capsys, *_command("run", f"{MODULE}:not_a_handler", here))
    assert code == 2
    assert "returned <object object at" in err
    assert "missing methods open, close, exists, get, try_acquire_lock, set" in err


# --- the top of every command ----------------------------------------------------------------


def test_an_unnamed_exception_is_a_bug_with_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dsm_sim.teaching.diagram

    def crash(args: object) -> int:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(dsm_sim.teaching.diagram, "main", crash)
    code, out, err = dsm(capsys, "diagram")
    assert (code, out) == (cli.EXIT_BUG, "")
    assert "Traceback" in err and "RuntimeError: unexpected" in err
    assert "dsm diagram: this is a bug in dsm" in err and "report it" in err


def test_a_named_error_escaping_a_command_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dsm_sim.teaching.diagram

    def refuse(args: object) -> int:
        raise StoreError("the store went away")

    monkeypatch.setattr(dsm_sim.teaching.diagram, "main", refuse)
    assert dsm(capsys, "diagram") == (2, "", "dsm diagram: the store went away\n")


def test_ctrl_c_exits_130_quietly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dsm_sim.teaching.diagram

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(dsm_sim.teaching.diagram, "main", interrupted)
    assert dsm(capsys, "diagram") == (130, "", "")


def test_a_bad_scenario_file_through_dsm_run_is_one_line(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    (here / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000, encoding="utf-8")
    code, out, err = dsm(capsys, "run", "deep.toml")
    assert (code, out) == (2, "")
    _one_named_line(err, "run")
    assert "deep.toml" in err and "nested at most 10 levels deep" in err


# --- output paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "make", "problem"),
    [
        ("--junit", lambda tmp: tmp, "is a directory"),
        ("--junit", lambda tmp: tmp / "tiny.toml" / "junit.xml", "is a file, not a directory"),
        ("--report", lambda tmp: tmp / "tiny.toml", "is a file, not a directory"),
        ("--report", lambda tmp: tmp / "tiny.toml" / "reports", "is a file, not a directory"),
    ],
)
def test_an_unwritable_output_path_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
    here: Path,
    option: str,
    make: object,
    problem: str,
) -> None:
    assert callable(make)
    path = make(here)
    code, out, err = dsm(capsys, "run", "tiny.toml", option, str(path))
    assert (code, out) == (2, ""), "refused before any run"
    _one_named_line(err, "run")
    assert f"{option} {str(path)!r}" in err and problem in err


def test_missing_report_directories_are_still_created(tmp_path: Path) -> None:
    from dsm_sim.outputs import OutputKind, check_output

    check_output("--report", tmp_path / "a" / "b", OutputKind.DIRECTORY)
    check_output("--junit", tmp_path / "a" / "junit.xml", OutputKind.FILE)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any directory")
def test_a_directory_without_write_permission_is_refused(tmp_path: Path) -> None:
    from dsm_sim.outputs import OutputKind, OutputPathError, check_output

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputPathError, match="is not writable"):
        check_output("--junit", locked / "junit.xml", OutputKind.FILE)


def test_a_write_that_fails_after_the_run_keeps_the_verdict(
    capsys: pytest.CaptureFixture[str], here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path passes every check and the disk fills up during the run (ENOSPC).
    import errno

    from dsm_sim.reports import junit

    def full_disk(runs: object, path: Path) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(junit, "write_junit", full_disk)
    code, out, err = dsm(capsys, "run", "tiny.toml", "--seed", "1", "--junit", "junit.xml")
    assert "1/1 runs kept every invariant" in out
    assert code == 2
    assert "dsm run: could not write the --junit output to 'junit.xml'" in err
    assert "the verdict above stands" in err and "Traceback" not in err


def test_a_device_named_as_an_output_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    code, out, err = dsm(capsys, "run", "tiny.toml", "--seed", "1", "--junit", "/dev/full")
    assert (code, out) == (2, "")
    assert "--junit '/dev/full': is a character device, not a regular file" in err


def test_dsm_stress_refuses_an_unwritable_json_path_before_the_run(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    code, out, err = dsm(
        capsys, "stress", "--db", f"sqlite+aiosqlite:///{here / 's.db'}", "--json", str(here)
    )
    assert (code, out) == (2, "")
    assert "--json" in err and "is a directory" in err
    assert not (here / "s.db").exists()


def _run_page() -> str:
    """The file name ``dsm run tiny.toml --seed 1`` gives its run's HTML page."""
    from dsm_sim.reports.json_report import report_stem
    from dsm_sim.simulator.run import DEFAULT_HANDLER

    return f"{report_stem('tiny', 1, DEFAULT_HANDLER)}.html"


_CLASHES = [
    (("--junit", "R/index.html"), ("--report", "R")),
    (("--junit", "R/../R/./index.html"), ("--report", "R/")),  # the same file, spelt apart
    (("--junit", "link/index.html"), ("--report", "R")),  # through a symlinked directory
    (("--junit", "new"), ("--report", "new")),
    (("--junit", "new"), ("--report", "new/sub")),
    (("--junit", "R/{page}"), ("--report", "R")),
]
_CLASH_IDS = ["index", "spelt-apart", "symlink", "file-is-dir", "file-above", "page"]


@pytest.mark.parametrize(
    ("command", "first", "second"),
    [
        pytest.param("verify", ("--json", "out.xml"), ("--junit", "out.xml"), id="verify-files"),
        pytest.param("verify", ("--json", "R/index.html"), ("--report", "R"), id="verify-json"),
        *[
            pytest.param(c, f, s, id=f"{c}-{i}")
            for c in ("verify", "run")
            for (f, s), i in zip(_CLASHES, _CLASH_IDS, strict=True)
        ],
    ],
)
def test_two_outputs_writing_one_file_are_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
    here: Path,
    command: str,
    first: tuple[str, str],
    second: tuple[str, str],
) -> None:
    (here / "R").mkdir()
    (here / "link").symlink_to(here / "R")
    page = _run_page() if command == "run" else "tenant_isolation.html"
    first = (first[0], first[1].format(page=page))
    argv = ["verify", "reference_engine.handlers.memory:in_memory_handler", "--profile", "dev"]
    if command == "run":
        argv = ["run", "tiny.toml", "--seed", "1"]
    code, out, err = dsm(capsys, *argv, *first, *second)
    assert (code, out) == (2, ""), "refused before any run"
    _one_named_line(err, command)
    for option, path in (first, second):
        assert f"{option} {str(Path(path))!r}" in err, err
    assert list((here / "R").iterdir()) == [], "nothing was written"
    assert not (here / "out.xml").exists() and not (here / "new").exists()


def test_outputs_side_by_side_in_the_report_directory_are_fine(here: Path) -> None:
    from dsm_sim.outputs import Output, OutputKind, check_distinct

    report = Output("--report", here / "R", OutputKind.DIRECTORY, frozenset({"index.html"}))
    check_distinct([Output("--junit", here / "R" / "junit.xml", OutputKind.FILE), report])
    check_distinct([Output("--junit", here / "R" / "sub" / "index.html", OutputKind.FILE), report])
    check_distinct(
        [
            Output("--json", here / "R" / "v.json", OutputKind.FILE),
            Output("--junit", here / "R" / "v.xml", OutputKind.FILE),
        ]
    )


CLOSURE_MODULE = """\
from dsm_sim.broken import CATALOGUE


def _factory(base):
    def make(clock):
        return base(clock)

    return make


build = _factory(CATALOGUE["no_fencing"].factory)
"""


def test_verify_names_a_closure_factory_as_it_was_given(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    """The replay line and the reproduction import ``build``, not ``_factory.<locals>.make``."""
    import json

    (here / "closures.py").write_text(CLOSURE_MODULE, encoding="utf-8")
    argv = ["verify", "closures:build", "--profile", "dev", "--seed", "0", "--stop-on-first"]
    try:
        code, _out, err = dsm(capsys, *argv, "--json", "v.json")
    finally:
        sys.modules.pop("closures", None)
    assert code == 1
    assert "replay this run: dsm verify closures:build --profile dev --seed 0" in err, err
    report = json.loads((here / "v.json").read_text(encoding="utf-8"))
    assert report["factory"] == "closures:build"
    (violated,) = [p for p in report["properties"] if p["status"] == "failed"]
    assert "from closures import build\n" in violated["reproduction"]
    assert "<locals>" not in json.dumps(report)


class _Report:
    passed = True

    def summary(self) -> str:
        return "PASSED"

    def to_json(self) -> dict[str, object]:
        return {"passed": True}


def test_a_stress_json_file_that_cannot_be_written_is_named_after_the_summaries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert exit_code([_Report()], json_path=Path("/dev/full"), expect_violation=False) == 2
    err = capsys.readouterr().err
    assert "dsm stress: could not write the --json output to '/dev/full'" in err


# --- database URLs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "meant"),
    [
        ("postgresql://u@db.example/app", "postgresql+asyncpg://u@db.example/app"),
        ("postgres://u@db.example/app", "postgresql+asyncpg://u@db.example/app"),
        ("sqlite:///stress.db", "sqlite+aiosqlite:///stress.db"),
        ("sqlite+aiosqlite:///stress.db", "sqlite+aiosqlite:///stress.db"),
        ("mariadb://root@h:3306/test", "mariadb+asyncmy://root@h:3306/test"),
        ("mysql://root@h/test", "mariadb+asyncmy://root@h/test"),
    ],
)
def test_a_url_without_the_async_driver_means_the_one_dsm_installs(url: str, meant: str) -> None:
    from dsm_sim.stress.settings import stress_database_url

    assert stress_database_url(url) == meant
    assert StressSettings(db_url=url).db_url == meant


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql+psycopg2://u@h/db", "driver 'psycopg2' is not one dsm stress uses"),
        ("postgresql://", "no host"),
        ("mariadb+aiomysql://u:secret@h/db", "driver 'aiomysql' is not one dsm stress uses"),
        ("mariadb+asyncmy://u:secret@h", "no database"),
        ("redis://localhost/0", "unsupported database 'redis'"),
        ("not a url", "not a database URL"),
        ("", "no URL given"),
        ("sqlite://", "in-memory SQLite"),
        ("sqlite+aiosqlite:///:memory:", "in-memory SQLite"),
        ("sqlite+aiosqlite:////no/such/dir/x.db", "'/no/such/dir' of the SQLite file does not"),
        ("sqlite+aiosqlite:////tmp", "is a directory"),
    ],
)
def test_a_bad_database_url_says_which_urls_are_accepted(url: str, problem: str) -> None:
    from dsm_sim.stress.settings import DatabaseUrlError, stress_database_url

    with pytest.raises(DatabaseUrlError) as info:
        stress_database_url(url)
    message = str(info.value)
    assert problem in message
    assert "postgresql+asyncpg://" in message and "sqlite+aiosqlite:///" in message
    assert "secret" not in message


def test_dsm_stress_names_a_sqlite_file_in_a_missing_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'x.db'}"
    code, out, err = dsm(capsys, "stress", "--db", db)
    assert (code, out) == (2, "")
    _one_named_line(err, "stress")
    assert "does not exist" in err and "dsm stress accepts" in err


def test_dsm_stress_names_a_refused_connection(capsys: pytest.CaptureFixture[str]) -> None:
    db = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    code, out, err = dsm(capsys, "stress", "--db", db, "--processes", "1", "--keys", "1")
    assert (code, out) == (2, "")
    _one_named_line(err, "stress")
    assert "cannot prepare the run on postgresql+asyncpg://postgres@127.0.0.1:1/test" in err
    assert "Connect" in err and "close" not in err


# --- the whole run's wall clock ----------------------------------------------------------------


def test_max_wall_stops_the_run_names_it_and_keeps_what_finished(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    code, out, err = dsm(
        capsys,
        "run",
        "tiny.toml",
        "--handler",
        f"{MODULE}:slow_after_first_run",
        "--max-wall",
        "3",
        "--junit",
        "junit.xml",
        "--report",
        "reports",
    )
    assert code == 2
    assert "tiny seed 1: PASS" in out
    assert "1/1 runs kept every invariant" in out
    assert "dsm run: WallClockLimitError: --max-wall 3s of real time expired while running " in err
    assert "tiny seed 2; 1 of 2 runs finished" in err
    assert (here / "junit.xml").read_text(encoding="utf-8").count("<testcase") == 1
    assert len(list((here / "reports").glob("tiny-seed1-*.json"))) == 1


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "604801"])
def test_max_wall_is_bounded(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "scenarios", "--max-wall", value])
    assert info.value.code == 2
    assert "--max-wall" in capsys.readouterr().err


# --- report names ------------------------------------------------------------------------------


def test_two_handlers_never_share_a_report_name(here: Path) -> None:
    import dataclasses

    from dsm_sim.reports.json_report import report_name
    from dsm_sim.scenario import load_scenario
    from dsm_sim.simulator.run import run_scenario

    result = run_scenario(load_scenario(here / "tiny.toml"), 1)
    names = {
        report_name(dataclasses.replace(result, handler=spec))
        for spec in ("a:make", "b:make", "a.b:make", "exec:node x.js", "exec:node-x.js")
    }
    assert len(names) == 5
    assert all(name.startswith("tiny-seed1-") for name in names)


def test_two_scenarios_of_one_name_are_refused(
    capsys: pytest.CaptureFixture[str], here: Path
) -> None:
    (here / "other").mkdir()
    (here / "other" / "copy.toml").write_text(TINY, encoding="utf-8")
    code, out, err = dsm(capsys, "run", "tiny.toml", "other/copy.toml", "--report", "reports")
    assert (code, out) == (2, "")
    _one_named_line(err, "run")
    assert "'tiny' is also the name of tiny.toml" in err
    code, _, err = dsm(capsys, "run", "tiny.toml", "tiny.toml")
    assert code == 2 and "the same file, given twice" in err
