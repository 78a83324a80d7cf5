"""``dsm verify package.module:factory``: the conformance kit from the command line.

Prints a per-property table (rich on a terminal, plain lines otherwise), then
every violation, in the order found, as a sentence, the story of the shrunk
run and the program that reproduces it, and the command that replays the
run.  Exit status: 0 all properties hold, 1 a violation (or a run that
crashed), 2 a usage error such as a factory path that does not load.

A handler in another process (``--exec COMMAND``, ``--exec-tcp HOST:PORT``)
is verified over the protocol of ``docs/protocol.md``; each violation it
shows also leaves the request lines of its shrunk counterexample in a replay
file (``--replay-dir``, default the cache directory's ``replays/``), so the
handler's authors can send them again with ``dsm replay``.

The current directory is put on the import path first, as pytest does for
its rootdir, so ``dsm verify mymodule:factory`` works from the folder that
holds ``mymodule.py``.  Hypothesis keeps its files in a cache directory
(:mod:`dsm_sim.conformance.cache`), never in the working directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dsm_sim.conformance.cache import CACHE_DIR_ENV
from dsm_sim.options import job_count, positive_seconds
from dsm_sim.outputs import Output, OutputKind, ReportWriteError, check_distinct, check_output
from dsm_sim.printable import printable_stream
from dsm_sim.profiles import PROFILES
from dsm_sim.wall import wall_deadline, wall_now
from dsm_sim.workers import MAX_JOBS
from reference_engine.errors import ConfigurationError, DsmError

if TYPE_CHECKING:
    from dsm_sim.conformance.runner import PropertyResult, VerificationReport
    from dsm_sim.conformance.tell.languages import Finding, TestPrinter
    from reference_engine.handler import HandlerFactory

__all__ = [
    "configure",
    "import_path_hint",
    "main",
    "put_cwd_on_path",
    "render_plain",
    "replay_command",
]

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2
#: Real seconds a whole ``dsm verify`` may take by default (as ``dsm run``'s), and at most.
DEFAULT_MAX_WALL_S = 6 * 3600.0
MAX_WALL_S = 7 * 86400.0
#: How long the one ``open`` before the run may take (``--call-timeout`` when given).
DEFAULT_PREFLIGHT_S = 10.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        nargs="?",
        default=None,
        help="handler factory to verify: a callable taking a Clock and returning a handler, "
        "e.g. reference_engine.handlers.memory:in_memory_handler",
    )
    parser.add_argument(
        "--exec",
        dest="exec_command",
        metavar="COMMAND",
        default=None,
        help="verify a handler in another process, in any language, over the handler "
        "protocol (docs/protocol.md), e.g. --exec 'node handlers/node/memory.js'",
    )
    parser.add_argument(
        "--exec-tcp",
        metavar="HOST:PORT",
        default=None,
        help="verify a handler that is a server: one TCP connection per test case, same "
        "framing as --exec, e.g. --exec-tcp 127.0.0.1:7411",
    )
    parser.add_argument(
        "--replay-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where an --exec or --exec-tcp run writes the protocol requests of each shrunk "
        "counterexample (.jsonl, for dsm replay; default: the cache directory's replays/)",
    )
    parser.add_argument(
        "--exec-timeout",
        type=positive_seconds(3600.0),
        default=None,
        metavar="SECONDS",
        help="how long an --exec handler may take to answer one request (default: "
        "$DSM_EXEC_TIMEOUT, else 10)",
    )
    parser.add_argument(
        "--call-timeout",
        type=positive_seconds(3600.0),
        default=None,
        metavar="SECONDS",
        help="how long one in-process handler call (open and close included) may take "
        "before it is reported as hung (default 10; --exec handlers use --exec-timeout)",
    )
    parser.add_argument(
        "--max-wall",
        type=positive_seconds(MAX_WALL_S),
        default=DEFAULT_MAX_WALL_S,
        metavar="SECONDS",
        help="real seconds the whole verification may take (default "
        f"{DEFAULT_MAX_WALL_S:g}, i.e. 6 hours, as for dsm run): past it the stage running "
        "stops at its next handler call, no later stage runs, and what did not run is NOT "
        "EXERCISED (the max-wall gap, which no --waive accepts)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="ci",
        help="how hard to search: dev (seconds), ci (default), thorough (minutes)",
    )
    parser.add_argument("--seed", type=int, default=None, help="replay a run with this seed")
    parser.add_argument(
        "--clock",
        choices=("injected", "system"),
        default="injected",
        help="'system' freezes the wall clock with freezegun for handlers that ignore "
        "the clock they are given",
    )
    parser.add_argument(
        "--tz",
        metavar="ZONE",
        default=None,
        help="run every test case in this POSIX time zone (e.g. Europe/Paris); by default "
        "each test case draws its own",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where Hypothesis keeps its files (default: ${CACHE_DIR_ENV}, else "
        "$XDG_CACHE_HOME/dsm or ~/.cache/dsm); never the working directory",
    )
    parser.add_argument(
        "--semantics",
        metavar="PROFILE",
        default=None,
        help="judge by a library's declared semantics: 'powertools', or MODULE:ATTRIBUTE "
        "naming a SemanticsProfile (default: the one the factory declares, else dsm's own; "
        "see docs/conformance.md)",
    )
    parser.add_argument(
        "--tokens",
        choices=("attempts", "ordered"),
        default="attempts",
        help="how the handler's fencing tokens are judged: 'attempts' (the default: a token is "
        "the record's attempt, 1, 2, 3...) or 'ordered' (any value that grows with every grant "
        "of an item, a sequence, a rowversion, a timestamp: judged by order, not by value; "
        "the record's attempt still counts the item's acquisitions)",
    )
    parser.add_argument(
        "--jobs",
        type=job_count(MAX_JOBS),
        default=1,
        metavar="J",
        help=f"run the race matrix and the search's seeds in J worker processes, beside the "
        f"edge probes in this one, J from 1 to {MAX_JOBS} or 'auto' for the cores this process "
        "may use (default 1: all in this process); "
        "output, reports and exit code are the same as with 1",
    )
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        default=None,
        help="send the same work to a Dask distributed cluster: 'local' starts one of --jobs "
        "worker processes (at least 2) on this machine, tcp://HOST:PORT uses the scheduler "
        "there, whose workers import the factory's module (needs the 'cluster' extra); "
        "output, reports and exit code are the same as with --jobs 1",
    )
    parser.add_argument(
        "--stop-on-first",
        action="store_true",
        help="stop at the first violation instead of settling every property",
    )
    parser.add_argument(
        "--waive",
        action="append",
        default=[],
        metavar="NAME",
        help="accept that NAME was not exercised (a property, or peers, matrix, probe:<name>); "
        "repeatable. Without it, anything not exercised fails the verdict. A waiver never "
        "hides a violation: a waived property that ran is judged as usual",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="also write the report as JSON"
    )
    parser.add_argument(
        "--junit",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write JUnit XML: one test case per property and per part not exercised",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write an HTML report: DIR/index.html, and a page per counterexample",
    )


def _header(report: VerificationReport) -> str:
    zone = report.time_zone or "drawn per test case"
    judged = "" if report.semantics == "dsm" else f", semantics {report.semantics}"
    if report.tokens != "attempts":
        judged += f", tokens {report.tokens}"
    return (
        f"profile {report.profile}, seed {report.seed}, clock {report.clock_mode.value}, "
        f"time zone {zone}{judged}"
    )


def render_plain(report: object, out: TextIO) -> None:
    """The report as plain lines, for logs and pipes."""
    from dsm_sim.conformance.runner import VerificationReport

    assert isinstance(report, VerificationReport)
    out.write(f"dsm verify {report.factory} ({_header(report)})\n")
    out.write(f"explored: {report.explored()}\n")
    out.write(f"{report.coverage.render()}\n")
    out.write(f"{report.races()}\n")
    width = max(len(r.name) for r in report.results)
    for result in report.results:
        stopped = f"  {result.stopped} later test cases stopped here" if result.stopped else ""
        if result.status.value == "waived":
            stopped = f"  {_waived_why(result.message)}"
        out.write(
            f"  {result.name:<{width}}  {result.status.value.upper():<13} "
            f"{result.checks:>6} checks{stopped}\n"
        )
    _write_details(report, out)


def _waived_why(message: str) -> str:
    """A profile's waiver is by design; the user's says so itself."""
    return message if message.startswith("waived by the user") else f"by design: {message}"


def _conditional_note(report: VerificationReport) -> str:
    if not report.stopped:
        return ""
    where = ", ".join(f"{r.name}: {r.stopped}" for r in report.results if r.stopped)
    return (
        f"\nPasses are conditional: {report.stopped} test case(s) were stopped at a violation "
        f"already found ({where}); what they would have done next was not checked. "
        "Fix the violations and run again.\n"
    )


def _write_details(report: object, out: TextIO) -> None:
    from dsm_sim.conformance.runner import VerificationReport

    assert isinstance(report, VerificationReport)
    for hazard in report.hazards:
        out.write("\n" + hazard.render() + "\n")
    for result in report.violations:
        out.write("\n" + result.render() + "\n")
    if report.error:
        out.write(f"\nThe run did not complete: {report.error}\n")
    missing = report.not_exercised
    if missing:
        out.write("\n" + "\n".join(missing) + "\n")
        out.write(
            "A property or part of the run that was not exercised is no evidence: give it a "
            "chance to run (another --seed, the thorough profile, a handler that opens its "
            "peers), or accept it by name with --waive NAME.\n"
        )
    ignored = report.ignored_waivers
    for name, why in report.waived.items():
        gap = next((g for g in report.gaps if g.name == name), None)
        if name in ignored:
            out.write(f"--waive {name} ignored: {ignored[name]}\n")
        elif gap is not None:
            out.write(f"waived {name}: {gap.what}: {gap.reason}\n")
        else:
            out.write(f"waived {name}: {why}\n")
    out.write(_conditional_note(report))
    out.write(f"\n{verdict(report)}\n")


def verdict(report: VerificationReport) -> str:
    """One line a CI log ends with; never a bare count with nothing to act on."""
    from dsm_sim.conformance.tell.outputs import verdict as told

    return told(report)


def _render_rich(report: object, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    from dsm_sim.conformance.runner import ResultStatus, VerificationReport

    assert isinstance(report, VerificationReport)
    console = Console(file=out)
    table = Table(
        title=f"dsm verify {report.factory}",
        caption=f"{_header(report)}: {report.explored()}; {report.coverage.render()}; "
        f"{report.races()}",
    )
    table.add_column("property")
    table.add_column("result")
    table.add_column("checks", justify="right")
    table.add_column("stopped", justify="right")
    table.add_column("guarantee")
    style = {
        ResultStatus.PASSED: "green",
        ResultStatus.FAILED: "bold red",
        ResultStatus.FLAKY: "bold magenta",
        ResultStatus.NOT_EXERCISED: "yellow",
        ResultStatus.UNSETTLED: "dim",
        ResultStatus.WAIVED: "cyan",
    }
    for result in report.results:
        table.add_row(
            result.name,
            f"[{style[result.status]}]{result.status.value}[/]",
            str(result.checks),
            str(result.stopped) if result.stopped else "",
            _waived_why(result.message) if result.status is ResultStatus.WAIVED else result.summary,
        )
    console.print(table)
    _write_details(report, out)


def replay_command(report: VerificationReport) -> str:
    """The ``dsm verify`` command that runs the same test cases again."""
    return report.replay_command()


def _write_protocol_failures(factory: object, out: TextIO) -> None:
    """Quote the handler process's failures in full: the story names only their class."""
    failures = getattr(factory, "failures", [])
    if not failures:
        return
    out.write(f"\nThe handler process failed {len(failures)} time(s); the first:\n")
    first = failures[0]
    out.write(f"  {type(first).__name__}: {first}\n")


def _write_replays(findings: list[Finding], factory: object, directory: Path) -> None:
    """One replay file per violation, each named next to the command that sends it."""
    from dsm_sim.conformance.tell.languages import printer_for
    from dsm_sim.protocol.client import ExecFactory
    from dsm_sim.protocol.replay import replay_command, replay_name, write_replay

    assert isinstance(factory, ExecFactory)
    printer = printer_for(factory.command, factory.language)
    for finding in findings:
        lines = list(finding.lines)
        name = replay_name(finding.property_name, finding.seed)
        try:
            path = write_replay(lines, directory, name)
        except OSError as exc:
            print(f"cannot write the replay file {directory / name}: {exc}", file=sys.stderr)
            continue
        processes = ""
        if lines and lines[0].startswith(b'{"process":'):
            count = len({line[: line.index(b",")] for line in lines})
            processes = f", {count} processes"
        print(
            f"protocol requests of {finding.property_name} ({len(lines)} lines{processes}): "
            f"{path}\n  send them again: {replay_command(path, factory)}",
            file=sys.stderr,
        )
        if printer is not None:
            _write_finding_test(finding, printer, path.with_suffix(printer.suffix))


def _write_finding_test(finding: Finding, printer: TestPrinter, path: Path) -> None:
    """The counterexample as a test in the handler's language: printed, and kept beside its replay."""
    try:
        test = printer.render(finding)
    except Exception as exc:  # the reference's answers could not be had: say so, keep the rest
        print(
            f"no {printer.language} test for {finding.property_name}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return
    out = printable_stream(sys.stdout)
    out.write(f"\n{finding.property_name} as {printer.kind} ({path}):\n\n{test}")
    try:
        path.write_text(test, encoding="utf-8")
    except OSError as exc:
        print(f"cannot write the {printer.language} test {path}: {exc}", file=sys.stderr)


def store_preflight(factory: HandlerFactory, seconds: float | None) -> str | None:
    """Open and close one handler: why its store cannot be reached (a StoreError), or None.

    A store that refuses the connection (a server that is down, a wrong
    port) would fail every test case the same way, and the run would read
    as FAILED, as if the handler were wrong.  Said once, before the run, it
    is the environment's error (exit 2).  Anything else the handler does on
    ``open`` is left for the run to judge.
    """
    from reference_engine.clock import ManualClock
    from reference_engine.errors import StoreError
    from reference_engine.registry import build_handler

    async def probe() -> None:
        handler = build_handler(factory, ManualClock(), name="the factory")
        try:
            await asyncio.wait_for(handler.open(), seconds or DEFAULT_PREFLIGHT_S)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handler.close(), seconds or DEFAULT_PREFLIGHT_S)

    try:
        asyncio.run(probe())
    except StoreError as exc:
        return (
            f"the handler's store cannot be reached, so nothing was verified: "
            f"{type(exc).__name__}: {exc}. Check that the store's server is running and that "
            "the factory's URL (host, port, user, database) is right"
        )
    except Exception:
        return None  # the run meets it again, in a test case, and judges it
    return None


def put_cwd_on_path() -> None:
    """Import modules from the current directory first, as pytest does for its rootdir."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_path_hint(spec: str) -> str:
    """What to do when the module of ``spec`` cannot be imported from here."""
    module = spec.partition(":")[0]
    top = module.split(".")[0] or module
    return (
        f"run dsm from the folder that holds {top}.py (or the {top}/ package), "
        "or add that folder to PYTHONPATH"
    )


def _progress_bar() -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    """A progress line on a terminal: which stage runs, and how far it is."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(
        TextColumn("verifying: {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        transient=True,
    )
    task = bar.add_task("starting", total=None)
    bar.start()

    def update(stage: str, done: int, planned: int) -> None:
        bar.update(task, description=stage, completed=min(done, planned), total=planned)

    return update, bar.stop


def main(args: argparse.Namespace) -> int:
    from dsm_sim.conformance.cache import cache_dir, use_cache_dir
    from dsm_sim.conformance.runner import verify
    from reference_engine.clock import ManualClock
    from reference_engine.registry import build_handler, load_factory

    # From the start, as for dsm run: loading and the handler's first start count.
    started = wall_now()
    max_wall: float = getattr(args, "max_wall", DEFAULT_MAX_WALL_S)
    put_cwd_on_path()
    use_cache_dir(cache_dir(args.cache_dir))
    exec_command = getattr(args, "exec_command", None)
    exec_tcp = getattr(args, "exec_tcp", None)
    given = [x for x in (args.factory, exec_command, exec_tcp) if x is not None]
    if len(given) != 1:
        sys.stderr.write(
            "dsm verify: give one of MODULE:FACTORY, --exec COMMAND or --exec-tcp HOST:PORT\n"
        )
        return EXIT_USAGE
    out_of_process = exec_command is not None or exec_tcp is not None
    factory: HandlerFactory
    try:
        if exec_command is not None:
            from dsm_sim.protocol.client import exec_factory

            factory = exec_factory(exec_command, timeout=args.exec_timeout)
        elif exec_tcp is not None:
            from dsm_sim.protocol.client import tcp_factory

            factory = tcp_factory(exec_tcp, timeout=args.exec_timeout)
        else:
            factory = load_factory(args.factory)
    except ConfigurationError as exc:
        hint = f"; {import_path_hint(args.factory)}" if "cannot import" in str(exc) else ""
        sys.stderr.write(f"dsm verify: {exc}{hint}\n")
        return EXIT_USAGE
    try:
        # A factory that cannot build (missing URL, raises, returns no handler, wants other
        # arguments) is a usage error, said before the run instead of inside every test case.
        build_handler(factory, ManualClock(), name=args.factory or " ".join(given))
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm verify: {exc}\n")
        return EXIT_USAGE
    if not out_of_process:
        unreachable = store_preflight(factory, getattr(args, "call_timeout", None))
        if unreachable is not None:
            sys.stderr.write(f"dsm verify: {unreachable}\n")
            return EXIT_USAGE
    replays: list[Finding] = []
    on_violation: Callable[[PropertyResult], None] | None = None
    if out_of_process:
        from dsm_sim.conformance.tell.languages import Finding
        from dsm_sim.protocol.client import ExecFactory, preflight

        assert isinstance(factory, ExecFactory)
        exec_handlers = factory
        with wall_deadline(started + max_wall):
            problem = preflight(factory)
        if problem is not None:
            what = "command does not start" if exec_tcp is None else "server does not answer"
            sys.stderr.write(f"dsm verify: the handler {what}: {problem}\n")
            return EXIT_USAGE
        from dsm_sim.protocol.versions import judged_by

        if judged_by(factory.protocol):
            sys.stderr.write(f"dsm verify: {judged_by(factory.protocol)}\n")

        def on_violation(result: PropertyResult) -> None:
            # The handler built last (with its peers) ran the reported program and broke
            # the property: a flaky finding's last replay is one that broke it, if any did.
            if not result.flaky or (result.confirmed is not None and result.confirmed[0] > 0):
                recording = exec_handlers.last_recording
                in_flight = [overlapped for _, _, overlapped in recording.entries]
                finding = Finding(
                    result.name,
                    result.found_seed or 0,
                    recording.lines(),
                    result.message,
                    in_flight,
                    exec_handlers.shape,
                    dict(exec_handlers.last_answers),
                    getattr(args, "tokens", "attempts"),
                )
                replays.append(finding)

    from dsm_sim.conformance.tell.outputs import report_files

    outputs = [
        Output(option, path, kind, names)
        for option, path, kind, names in (
            ("--json", args.json, OutputKind.FILE, frozenset[str]()),
            ("--junit", args.junit, OutputKind.FILE, frozenset[str]()),
            ("--report", args.report, OutputKind.DIRECTORY, report_files()),
        )
        if path is not None
    ]
    try:
        for output in outputs:
            check_output(output.option, output.path, output.kind)
        check_distinct(outputs)
    except DsmError as exc:
        sys.stderr.write(f"dsm verify: {exc}\n")
        return EXIT_USAGE
    jobs = getattr(args, "jobs", 1)
    cluster = getattr(args, "cluster", None)
    if (jobs > 1 or cluster is not None) and out_of_process:
        option = "--cluster" if cluster is not None else "--jobs"
        sys.stderr.write(
            f"dsm verify: note: {option} applies to in-process factories; --exec runs with 1\n"
        )
        jobs, cluster = 1, None
    tty = sys.stdout.isatty()
    update: Callable[[str, int, int], None] | None = None
    stop: Callable[[], None] = lambda: None  # noqa: E731
    if tty:
        update, stop = _progress_bar()
    try:
        report = verify(
            factory,
            profile=args.profile,
            seed=args.seed,
            clock_mode=args.clock,
            stop_on_first=args.stop_on_first,
            time_zone=args.tz,
            stage=update,
            on_violation=on_violation,
            waive=getattr(args, "waive", ()),
            semantics=getattr(args, "semantics", None),
            call_timeout_s=getattr(args, "call_timeout", None),
            record=getattr(args, "report", None) is not None,
            factory_spec=args.factory,
            max_wall_s=max_wall,
            started_at=started,
            tokens=getattr(args, "tokens", "attempts"),
            jobs=jobs,
            cluster=cluster,
        )
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm verify: {exc}\n")
        return EXIT_USAGE
    finally:
        stop()
    if exec_command is not None:
        # Name the run by the command, so the header and the replay line can be pasted.
        report = dataclasses.replace(report, factory=f"--exec {shlex.quote(exec_command)}")
    elif exec_tcp is not None:
        report = dataclasses.replace(report, factory=f"--exec-tcp {shlex.quote(exec_tcp)}")
    if tty:
        _render_rich(report, sys.stdout)
    else:
        render_plain(report, printable_stream(sys.stdout))
    if out_of_process:
        _write_protocol_failures(factory, printable_stream(sys.stdout))
    written = _write_outputs(report, args)
    if not report.passed:
        cut = next((gap for gap in report.gaps if gap.name == "max-wall"), None)
        if cut is not None:
            print(f"dsm verify: WallClockLimitError: {cut.reason}", file=sys.stderr)
        print(f"replay this run: {report.replay_command()}", file=sys.stderr)
        if replays:
            _write_replays(
                replays, factory, args.replay_dir or cache_dir(args.cache_dir) / "replays"
            )
        return EXIT_VIOLATION
    return EXIT_OK if written else EXIT_USAGE


def _write_outputs(report: VerificationReport, args: argparse.Namespace) -> bool:
    """Write --json, --junit and --report; False (and a named error said) if one failed."""
    from dsm_sim.conformance.tell.outputs import write_html, write_json, write_junit

    ok = True
    writers = (
        ("--json", args.json, write_json),
        ("--junit", args.junit, write_junit),
        ("--report", args.report, write_html),
    )
    for option, path, write in writers:
        if path is None:
            continue
        try:
            written = write(report, path)
        except OSError as exc:
            error = ReportWriteError(option=option, path=str(path), reason=exc.strerror or str(exc))
            print(f"dsm verify: {error}", file=sys.stderr)
            ok = False
            continue
        print(f"dsm verify: {option} written to {written}", file=sys.stderr)
    return ok
