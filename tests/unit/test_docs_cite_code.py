"""Every name the docs cite is in the code: modules and their attributes, files, functions, flags.

A reader who copies `reference_engine.record.encode_data`, a path or a
`--flag` from the docs must find it; a name that was renamed or never
existed sends them looking for something that is not there.  The docs
(``docs/*.md`` and the README) are read for:

* dotted names of the two packages, ``module.attr`` or ``module:attr``: the
  module imports and has the attribute;
* paths in the repository (``dsm_sim/checker/``, ``scenarios/swarm.toml``): they exist;
* flags: after ``dsm COMMAND``, a flag of that command (``--exec`` of
  ``dsm verify`` is not one of ``dsm run`` unless ``dsm run`` takes it too);
  a ``--dsm-*`` flag, one of the pytest plugin; any other, a flag a parser
  in the repository defines;
* snake_case names, bare or called (``effective_status(record, now)``): the
  name occurs in the code.  CamelCase and upper-case names are left out:
  the docs show other languages' APIs (C#, Go, SQL, Redis) that way.

Names the docs mean as something other than our code are listed in
:data:`NOT_OURS`, each with what it is, and flags of other programs in
:data:`FLAGS_NOT_OURS`.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from dsm_sim import pytest_plugin
from dsm_sim.cli import build_parser
from dsm_sim.conformance.properties import PROPERTY_NAMES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = (*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md")
PACKAGES = ("reference_engine", "dsm_sim")
#: Folders whose files the code corpus is read from (the names the docs may cite).
CODE_DIRS = ("reference_engine", "dsm_sim", "tests", "bench", "handlers", "scenarios", "examples")
CODE_SUFFIXES = frozenset({".py", ".js", ".mjs", ".toml", ".json", ".j2", ".cs", ".java", ".go"})
#: Top-level entries of the repository a path in the docs may start with.
REPO_ROOTS = (*CODE_DIRS, "docs", "reports", ".ci", "noxfile.py", "pyproject.toml")

#: snake_case names the docs cite that are someone else's, and what they are.
NOT_OURS: dict[str, str] = {
    "_do_execute": "SQLAlchemy internals, in a profile of the SQL handler",
    "_finalize_fairy": "SQLAlchemy internals, in a profile of the SQL handler",
    "do_rollback": "SQLAlchemy internals, in a profile of the SQL handler",
    "pool_timeout": "SQLAlchemy's engine option",
    "delete_item": "DynamoDB's API, which the Powertools layer calls",
    "update_item": "DynamoDB's API, which the Powertools layer calls",
    "final_failed": "a run statistic, named final_<status> by the code",
    "synchronous_commit": "a PostgreSQL setting",
}

#: Flags the docs cite that are another program's, and whose.
FLAGS_NOT_OURS: dict[str, str] = {
    "--debug": "Mono's: stack traces with file and line (mono --debug Handler.exe)",
}

_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_FENCE = re.compile(r"```.*?```", re.S)
_NAME = re.compile(
    r"^(?P<dotted>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?P<attr>[A-Za-z_][\w.]*))?(?:\(.*\))?$"
)
_PATH = re.compile(
    r"^(?P<path>(?:" + "|".join(map(re.escape, REPO_ROOTS)) + r")(?:/[\w.*-]+)*/?)(?::\d+)?$"
)
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
#: A handler command quoted as a flag's value (``--exec "mono --debug X.exe"``): its words are
#: that program's, not the dsm command's.
_HANDLER_COMMAND = re.compile(
    r"(--exec|--handler|--dsm-exec)([ =])([\"'])(?!exec:dsm |dsm )[^\"']*\3"
)
#: Programs other than dsm whose flags the docs show, and what each is: other languages'
#: tools keep flags of their own (``node --test``, ``mcs -debug``).
OTHER_PROGRAMS: dict[str, str] = {
    "mono": "Mono's runtime, running a C# handler",
    "MONO_ENV_OPTIONS": "the environment variable Mono reads its options from",
    "mcs": "Mono's C# compiler",
    "nunit-console": "NUnit's console runner",
    "dotnet": "the .NET SDK's command",
    "node": "Node's runtime and its test runner (node --test)",
    "java": "the JDK's launcher, running a Java handler",
    "javac": "the JDK's compiler",
}
_COMMAND = re.compile(r"\bdsm (demo|verify|run|stress|diagram|serve|replay)\b")


def spans(text: str) -> Iterator[str]:
    """Inline code of a document, fenced blocks left out."""
    yield from (s.strip() for s in _SPAN.findall(_FENCE.sub("", text)))


@cache
def code_tokens() -> frozenset[str]:
    found: set[str] = set()
    files = [ROOT / "noxfile.py", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for folder in CODE_DIRS:
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in CODE_SUFFIXES and "node_modules" not in p.parts and p.is_file()
        ]
    for path in files:
        if path.exists() and path != Path(__file__).resolve():  # its examples are made up
            found.update(
                re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8", errors="replace"))
            )
    return frozenset(found)


@cache
def code_flags() -> frozenset[str]:
    """Every ``"--flag"`` a parser in the repository defines (bench scripts, nox sessions)."""
    found: set[str] = set()
    for folder, suffix in (
        ("bench", "*.py"),
        ("dsm_sim", "*.py"),
        ("reference_engine", "*.py"),
        ("handlers", "*.cs"),
    ):
        for path in (ROOT / folder).rglob(suffix):
            found.update(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", path.read_text("utf-8")))
    return frozenset(found)


@cache
def command_flags() -> dict[str, frozenset[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name: frozenset(o for a in command._actions for o in a.option_strings)
        for name, command in sub.choices.items()
    }


@cache
def plugin_flags() -> frozenset[str]:
    found: set[str] = set()

    class Group:
        def addoption(self, *names: str, **_: object) -> None:
            found.update(names)

    class Parser:
        def getgroup(self, *_: object, **__: object) -> Group:
            return Group()

    pytest_plugin.pytest_addoption(Parser())  # type: ignore[arg-type]
    return frozenset(found)


def command_words(line: str) -> Iterator[tuple[str, str]]:
    """Each ``dsm COMMAND`` of a line with the words that are its own.

    A command quoted inside another (``--exec "dsm serve X"``) owns the words up
    to its closing quote, and they are not the outer command's; a command
    owns the rest of its code span, or of its line.
    """
    quoted = re.compile(r"([\"'])(?:exec:)?(dsm \w+[^\"']*)\1")
    for inner in quoted.finditer(line):
        yield from command_words(inner.group(2))
    outer = _HANDLER_COMMAND.sub(r"\1\2''", quoted.sub(" ", line))
    commands = list(_COMMAND.finditer(outer))
    for i, command in enumerate(commands):
        end = commands[i + 1].start() if i + 1 < len(commands) else len(outer)
        yield command.group(1), outer[command.end() : end].split("`")[0]


def resolves(dotted: str, attr: str | None) -> bool:
    """``dotted`` imports as a module (its longest importable prefix) with the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in [*parts[cut:], *(attr.split(".") if attr else [])]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def problems_in(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    found = []
    tokens, flags = code_tokens(), command_flags()
    generated = {f"test_{name}" for name in PROPERTY_NAMES}  # the suite's test per property
    for span in spans(text):
        path = _PATH.match(span)
        if (path and "/" in span) or span in REPO_ROOTS:
            target = path.group("path") if path else span
            if "*" not in target and not (ROOT / target).exists():
                found.append(f"`{span}`: no such file or folder")
            continue
        name = _NAME.match(span)
        if name is None:
            continue
        dotted, attr = name.group("dotted"), name.group("attr")
        if dotted.split(".")[0] in PACKAGES:
            if not resolves(dotted, attr):
                found.append(f"`{span}`: does not import")
        elif (
            "." not in dotted
            and "_" in dotted
            and dotted.lower() == dotted
            and dotted not in tokens | NOT_OURS.keys() | generated
        ):
            found.append(f"`{span}`: {dotted} is nowhere in the code")
    for line in text.splitlines():
        for command, words in command_words(line):
            found.extend(
                f"dsm {command} has no {flag}: {line.strip()[:90]}"
                for flag in _FLAG.findall(words)
                if flag not in flags[command] | FLAGS_NOT_OURS.keys()
            )
    for span in spans(text):
        if _COMMAND.search(span):
            continue  # judged above, per command
        for flag in _FLAG.findall(span):
            known = (
                plugin_flags()
                if flag.startswith("--dsm-")
                else (set().union(*flags.values()) | code_flags())
            )
            if "pytest" in span and not flag.startswith("--dsm-"):
                continue  # pytest's own flags
            if re.split(r"[ =]", span)[0] in OTHER_PROGRAMS:
                continue
            if flag not in known | FLAGS_NOT_OURS.keys():
                found.append(f"`{span}`: no parser defines {flag}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_name_the_doc_cites_is_in_the_code(doc: Path) -> None:
    problems = problems_in(doc)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_name_that_is_not_there(tmp_path: Path) -> None:
    doc = tmp_path / "made-up.md"
    doc.write_text(
        "Read it back with `unpack_record_data`, from `reference_engine.record.unpack_record_data`, in\n"
        "`dsm_sim/teaching/nowhere.py`; run `dsm run scenarios/ --exec-timeout 3`.\n"
        "These are fine: `reference_engine.record:encode_data`, `encode_data(data)`,\n"
        "`dsm_sim/checker/`, `dsm verify --exec-timeout 3`, `--dsm-cache-dir`,\n"
        '`dsm verify --exec "mono --debug X.exe" --seed 0`, `mono --debug X.exe`.\n',
        encoding="utf-8",
    )
    assert problems_in(doc) == [
        "`unpack_record_data`: unpack_record_data is nowhere in the code",
        "`reference_engine.record.unpack_record_data`: does not import",
        "`dsm_sim/teaching/nowhere.py`: no such file or folder",
        "dsm run has no --exec-timeout: "
        "`dsm_sim/teaching/nowhere.py`; run `dsm run scenarios/ --exec-timeout 3`.",
    ]
