"""Paths checked before the work, input files read bounded, reports written safely.

``dsm demo --html`` refuses a path it could not write before the walk-through
(not a traceback, or a hang on a FIFO, after it) and says when it replaces a
file; ``dsm replay`` refuses a FIFO, ``/dev/zero``, non-UTF-8 and JSON nested
too deep by name; a report is written whole, beside its path and renamed
over it, so a symlink at a predictable name is replaced rather than followed,
and a handler command with undecodable bytes or control bytes still gives a
well-formed JUnit file and an HTML page.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dsm_sim.broken import CATALOGUE
from dsm_sim.cli import main
from dsm_sim.printable import printable, xml_safe
from dsm_sim.reports.html import write_html
from dsm_sim.reports.json_report import write_json
from dsm_sim.reports.junit import write_junit
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _unwritable_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {
        "directory": (tmp_path, "is a directory"),
        "under a file": (tmp_path / "a-file" / "page.html", "is a file, not a directory"),
        "/dev/full": (Path("/dev/full"), "is a character device"),
        "FIFO": (fifo, "is a FIFO"),
    }


@pytest.mark.parametrize("case", ["directory", "under a file", "/dev/full", "FIFO"])
def test_demo_html_refuses_an_unwritable_path_before_the_walk_through(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, problem = _unwritable_paths(tmp_path)[case]
    assert main(["demo", "invoice", "--html", str(path)]) == 2
    captured = capsys.readouterr()
    assert "OutputPathError: --html" in captured.err and problem in captured.err
    assert captured.out == ""  # refused before the first step was narrated


def test_demo_html_says_it_replaces_a_file_and_creates_missing_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "page.html"
    existing.write_text("an older page", encoding="utf-8")
    assert main(["demo", "invoice", "--html", str(existing)]) == 0
    assert "exists; it will be replaced" in capsys.readouterr().err
    assert existing.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_demo_into_a_missing_sqlite_folder_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'demo.db'}"
    assert main(["demo", "invoice", "--db", url]) == 2
    assert "does not exist" in capsys.readouterr().err


def _replay_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"id": 1, "op": "open"\xff}\n')
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": ' + "[" * 30000 + "]" * 30000 + "}\n", encoding="utf-8")
    return {
        "FIFO": (fifo, "is a FIFO"),
        "/dev/zero": (Path("/dev/zero"), "is a character device"),
        "non-UTF-8": (binary, "is not UTF-8: byte 0xff"),
        "nested 30,000 deep": (deep, "nested deeper than the reader can follow"),
    }


@pytest.mark.parametrize("case", ["FIFO", "/dev/zero", "non-UTF-8", "nested 30,000 deep"])
def test_replay_refuses_an_unreadable_file_by_name(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, problem = _replay_inputs(tmp_path)[case]
    assert main(["replay", str(path), "--exec", f"{sys.executable} -c pass"]) == 2
    assert problem in capsys.readouterr().err


@pytest.fixture(scope="module")
def hostile_run() -> object:
    """A failing run whose handler name holds undecodable bytes and control bytes."""
    scenario = load_scenario(ROOT / "scenarios" / "slow-worker.toml")
    run = run_scenario(scenario, 2, CATALOGUE["no_fencing"].factory, handler_name="broken")
    assert not run.passed
    hostile = "exec:./handler\udcff\x01\x1b[2J --name \x07bell"
    return dataclasses.replace(run, handler=hostile)


def test_junit_stays_well_formed_with_control_and_undecodable_bytes(
    hostile_run: object, tmp_path: Path
) -> None:
    path = write_junit([hostile_run], tmp_path / "junit.xml")  # type: ignore[list-item]
    root = ET.parse(path).getroot()  # raises on a file that is not well-formed XML
    case = next(root.iter("testcase"))
    assert "\\udcff\\x01\\x1b[2J" in case.attrib["name"] and "\\x07bell" in case.attrib["name"]


def test_html_and_json_reports_are_written_with_undecodable_bytes(
    hostile_run: object, tmp_path: Path
) -> None:
    for write in (write_html, write_json):
        path = write(hostile_run, tmp_path)  # type: ignore[operator]
        text = path.read_text(encoding="utf-8")
        assert text and "\\udcff" in text


def test_the_index_is_written_with_undecodable_and_control_bytes_escaped(
    hostile_run: object, tmp_path: Path
) -> None:
    from dsm_sim.reports.index import write_index

    for path in (write_index([hostile_run], tmp_path), write_html(hostile_run, tmp_path)):  # type: ignore[list-item,arg-type]
        text = path.read_text(encoding="utf-8")
        assert "\\udcff\\x01\\x1b[2J" in text and "\\x07bell" in text, path.name
        assert not any(c in text for c in "\x01\x1b\x07"), path.name


def test_the_index_replaces_a_symlink_at_its_name_instead_of_following_it(
    hostile_run: object, tmp_path: Path
) -> None:
    from dsm_sim.reports.index import write_index

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "index.html").symlink_to(victim)
    write_index([hostile_run], tmp_path / "R")  # type: ignore[list-item]
    assert victim.read_text(encoding="utf-8") == "keep me"
    assert not (tmp_path / "R" / "index.html").is_symlink()


def test_dsm_run_writes_every_output_for_a_handler_spec_with_undecodable_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--handler $'exec:... \\xff\\xfe'``: Python keeps the bytes as lone surrogates."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    serve = "from dsm_sim.cli import main; main(['serve', 'reference_engine.handlers.memory:in_memory_handler'])"
    handler = f'exec:{sys.executable} -c "{serve}" \udcff\udcfe'
    scenario = str(ROOT / "scenarios" / "slow-worker.toml")
    argv = [
        "run",
        scenario,
        "--seed",
        "1",
        "--handler",
        handler,
        "--report",
        "R",
        "--junit",
        "j.xml",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    for path in (tmp_path / "R" / "index.html", tmp_path / "j.xml"):
        assert "\\udcff\\udcfe" in path.read_text(encoding="utf-8"), path.name
    ET.parse(tmp_path / "j.xml")
    (json_file,) = (tmp_path / "R").glob("*.json")
    assert json_file.read_text(encoding="ascii")  # surrogates written as JSON escapes


def test_a_report_replaces_a_symlink_at_its_name_instead_of_following_it(
    hostile_run: object, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    planted = tmp_path / "junit.xml"
    planted.symlink_to(victim)
    write_junit([hostile_run], planted)  # type: ignore[list-item]
    assert victim.read_text(encoding="utf-8") == "keep me"
    assert not planted.is_symlink() and planted.read_text(encoding="utf-8").startswith("<?xml")


def test_control_characters_are_shown_not_obeyed() -> None:
    assert printable("a\x1b[2Jb\x07c\td\ne\x9b\udcff") == "a\\x1b[2Jb\\x07c\td\ne\\x9b\\udcff"
    assert xml_safe("a\x01b\x1bc\ud800") == "a\\x01b\\x1bc\\ud800"


#: A handler that answers every request after open with an error whose message holds ESC codes.
SHOUTING = textwrap.dedent(
    """
    import json, sys
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "open":
            answer = {"protocol": 1, "concurrent": False}
            print(json.dumps({"id": req["id"], "result": answer}), flush=True)
        elif req["op"] == "close":
            print(json.dumps({"id": req["id"], "result": None}), flush=True)
            break
        else:
            error = {"kind": "store_error", "message": "down\\u001b[2J\\u001b]0;pwned\\u0007"}
            print(json.dumps({"id": req["id"], "error": error}), flush=True)
    """
)


def test_a_handlers_terminal_escapes_are_printed_escaped(tmp_path: Path) -> None:
    script = tmp_path / "shouting.py"
    script.write_text(SHOUTING, encoding="utf-8")
    requests = tmp_path / "requests.jsonl"
    now = "2026-01-01T00:00:00.000000Z"
    requests.write_text(
        f'{{"id": 1, "op": "open", "now": "{now}", "protocol": 1}}\n'
        f'{{"id": 2, "op": "reset_expired_locks", "now": "{now}"}}\n',
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "dsm_sim.cli", "replay", str(requests)]
    done = subprocess.run(
        [*command, "--exec", f"{sys.executable} {script}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    # The replay judges the answers too (exit 1 when they break the reference model);
    # what matters here is that the handler's text is printed escaped.
    assert done.returncode in (0, 1), done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b[2J" in done.stdout


@pytest.mark.parametrize("command", ["verify", "run"])
def test_verify_and_run_print_a_handlers_escapes_escaped(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "shouting.py"
    script.write_text(SHOUTING, encoding="utf-8")
    handler = f"{sys.executable} {script}"
    if command == "verify":
        args = ["verify", "--exec", handler, "--profile", "dev", "--seed", "0", "--stop-on-first"]
    else:
        scenario = str(ROOT / "scenarios" / "slow-worker.toml")
        args = ["run", scenario, "--seed", "1", "--handler", f"exec:{handler}"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "\\x1b[2J" in captured.out
    assert "\x1b" not in captured.out + captured.err and "\x07" not in captured.out
