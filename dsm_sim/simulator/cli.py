"""``dsm run``: run chaos scenarios, print verdicts, write reports, exit non-zero on a violation.

Examples::

    dsm run scenarios/                       # every scenario, its own number of seeds
    dsm run scenarios/slow-worker.toml --seed 7 --handler broken:no_fencing
    dsm run scenarios/ --seeds 3 --report reports/ --junit reports/junit-chaos.xml
    dsm run scenarios/ --handler mypkg.store:make_handler --clock system
    dsm run scenarios/ --seeds 20 --jobs 2   # runs in 2 worker processes, same output
    dsm run scenarios/ --seeds 500 --cluster tcp://scheduler:8786   # on a Dask cluster
    dsm run scenarios/ --handler dsm_sim.peers.powertools:redis_layer   # its own semantics
    dsm run scenarios/x.toml --waive deployments   # a dimension the run may not reach

``--handler`` takes ``package.module:factory``, ``broken:NAME`` (an entry of
the catalogue of broken handlers), ``exec:COMMAND`` (a handler in another
process, in any language, over the protocol of ``docs/protocol.md``; one
process per run, sent the simulated clock as each request's ``now``;
``--exec COMMAND`` says the same, as for ``dsm verify``) or
``exec-tcp:HOST:PORT`` (a handler that is a server; ``--exec-tcp HOST:PORT``
says the same).  ``--semantics`` judges by a library's declared semantics, as
``dsm verify --semantics`` does (default: the profile the factory declares,
else the spec's own).  Exit codes: 0 every run kept every
invariant, 1 a run violated one or did not reach a dimension its scenario
asks for (``NOT EXERCISED``, unless ``--waive NAME``), 2 the command or a
scenario file is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from dsm_sim.checker import all_passed
from dsm_sim.checker.liveness import UNSUPPORTED_REASON
from dsm_sim.conformance.execute.clocks import ClockMode, parse_clock_mode
from dsm_sim.conformance.judge.semantics import SemanticsProfile, resolve_semantics
from dsm_sim.history import HistoryLimitError
from dsm_sim.options import bounded_int, job_count, positive_seconds
from dsm_sim.outputs import Output, OutputKind, ReportWriteError, check_distinct, check_output
from dsm_sim.printable import printable_stream
from dsm_sim.scenario import Scenario, ScenarioError, load_scenarios
from dsm_sim.simulator.bridge import (
    CALL_TIMEOUT_ENV,
    DEFAULT_CALL_TIMEOUT_S,
    HandlerHungError,
    WallClockLimitError,
    call_timeout,
    wall_deadline,
    wall_now,
)
from dsm_sim.simulator.dimensions import Dimension
from dsm_sim.simulator.parallel import MAX_JOBS, RunOutcome, run_plan
from dsm_sim.simulator.run import DEFAULT_HANDLER, RunResult
from dsm_sim.simulator.targets import EXEC_PREFIX, EXEC_TCP_PREFIX, resolve_handler
from reference_engine.clock import ManualClock
from reference_engine.errors import ConfigurationError, DsmError
from reference_engine.registry import build_handler
from reference_engine.status import IdempotencyStatus

__all__ = ["configure", "main", "resolve_handler"]

#: The most seeds one ``--seeds`` may ask for (a scenario's own ``seeds`` has the same bound).
MAX_SEEDS = 1000
#: Real seconds a whole ``dsm run`` may take by default: a backstop, past any catalogue run
#: (``--seeds 1000`` over the catalogue included), that still ends a run gone wrong the
#: same working day.
DEFAULT_MAX_WALL_S = 6 * 3600.0
#: The longest ``--max-wall`` (a week): a soak longer than that should be split up.
MAX_WALL_S = 7 * 86400.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "targets", nargs="+", metavar="SCENARIO", help="scenario .toml files or directories of them"
    )
    parser.add_argument(
        "--handler",
        default=DEFAULT_HANDLER,
        metavar="MODULE:FACTORY",
        help=f"handler factory, or broken:NAME from the catalogue (default {DEFAULT_HANDLER})",
    )
    parser.add_argument(
        "--exec",
        dest="exec_command",
        metavar="COMMAND",
        default=None,
        help="run against a handler in another process, in any language, over the handler "
        "protocol (docs/protocol.md), e.g. --exec 'node handlers/node/memory.js'; the same "
        "as --handler 'exec:COMMAND'",
    )
    parser.add_argument(
        "--exec-tcp",
        metavar="HOST:PORT",
        default=None,
        help="run against the handler server at this address; the same as "
        "--handler exec-tcp:HOST:PORT",
    )
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=bounded_int(1, MAX_SEEDS),
        metavar="N",
        help=f"run seeds 1..N, N from 1 to {MAX_SEEDS} (default: each scenario's own)",
    )
    seeds.add_argument(
        "--seed",
        type=bounded_int(0, 2**63 - 1),
        metavar="N",
        help="run only this seed (replay)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write each run's HTML and JSON reports here, and index.html: every run, its "
        "verdict and a link to its page",
    )
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    parser.add_argument(
        "--clock",
        choices=[m.value for m in ClockMode],
        default=ClockMode.INJECTED.value,
        help="'system' pins the wall clock to the store clock with freezegun, for handlers "
        "that read the wall clock (datetime.now) instead of the clock they are given "
        "(default: injected, the clock they are given)",
    )
    parser.add_argument(
        "--jobs",
        type=job_count(MAX_JOBS),
        default=1,
        metavar="J",
        help=f"run the runs in J worker processes, J from 1 to {MAX_JOBS} or 'auto' for the "
        "cores this process may use (default 1: in this process); output, reports and exit code are the same as with 1",
    )
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        default=None,
        help="run the runs on a Dask distributed cluster: 'local' starts one of --jobs worker "
        "processes on this machine, tcp://HOST:PORT uses the scheduler there (needs the "
        "'cluster' extra); output, reports and exit code are the same as a serial run",
    )
    parser.add_argument(
        "--semantics",
        metavar="PROFILE",
        default=None,
        help="judge by a library's declared semantics: 'powertools', or MODULE:ATTRIBUTE "
        "naming a SemanticsProfile (default: the one the factory declares, else dsm's own; "
        "see docs/simulator.md)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    parser.add_argument(
        "--waive",
        action="append",
        default=[],
        choices=[d.value for d in Dimension],
        metavar="NAME",
        help="accept that a run did not reach this dimension its scenario asks for (it is said, "
        "as waived, instead of failing the run NOT EXERCISED); repeatable; one of "
        + ", ".join(d.value for d in Dimension),
    )
    parser.add_argument(
        "--call-timeout",
        type=positive_seconds(3600.0),
        default=None,
        metavar="SECONDS",
        help="how long one in-process handler call (open and close included) may take before "
        f"it is reported as hung, which stops its run (default: ${CALL_TIMEOUT_ENV}, else "
        f"{DEFAULT_CALL_TIMEOUT_S:g}; --exec handlers use $DSM_EXEC_TIMEOUT)",
    )
    parser.add_argument(
        "--max-wall",
        type=positive_seconds(MAX_WALL_S),
        default=DEFAULT_MAX_WALL_S,
        metavar="SECONDS",
        help="real seconds the whole command may take (default "
        f"{DEFAULT_MAX_WALL_S:g}, i.e. 6 hours; at most {MAX_WALL_S:g}): past it the run in "
        "progress stops at its next handler call, the runs not started are skipped, the "
        "finished runs keep their reports, and the command exits 2 (1 if a run failed) "
        "naming the scenario and seed it stopped",
    )


def _unique(scenarios: list[Scenario]) -> list[Scenario]:
    """Refuse two scenarios of one name: their reports and JUnit cases would overwrite each other."""
    seen: dict[str, str] = {}
    for scenario in scenarios:
        if scenario.name in seen:
            first = seen[scenario.name]
            again = " (the same file, given twice)" if first == scenario.path else ""
            raise ScenarioError(
                scenario.path,
                "name",
                f"{scenario.name!r} is also the name of {first}{again}",
                "a name no other scenario of the run has (it names the run's reports)",
            )
        seen[scenario.name] = scenario.path
    return scenarios


def _plan(scenarios: list[Scenario], args: argparse.Namespace) -> list[tuple[Scenario, int]]:
    if args.seed is not None:
        return [(s, args.seed) for s in scenarios]
    if args.seeds is not None and args.seeds < 1:
        raise ConfigurationError(f"--seeds must be at least 1, got {args.seeds}")
    return [(s, seed) for s in scenarios for seed in range(1, (args.seeds or s.seeds) + 1)]


def _check_distinct_outputs(args: argparse.Namespace, plan: list[tuple[Scenario, int]]) -> None:
    """--junit must not be a file the --report directory writes: its index or a run's page."""
    from dsm_sim.reports.index import INDEX
    from dsm_sim.reports.json_report import report_stem

    outputs = []
    if args.report is not None:
        stems = {report_stem(scenario.name, seed, args.handler) for scenario, seed in plan}
        names = frozenset(
            {INDEX} | {f"{stem}{ext}" for stem in stems for ext in (".html", ".json")}
        )
        outputs.append(Output("--report", args.report, OutputKind.DIRECTORY, names))
    if args.junit is not None:
        outputs.append(Output("--junit", args.junit, OutputKind.FILE))
    check_distinct(outputs)


def _progress(
    plan: list[tuple[Scenario, int]], out: TextIO
) -> Iterator[tuple[Scenario, int, Callable[[RunResult], None]]]:
    """Yield each run with a callback; a rich bar on a terminal, plain lines otherwise."""
    if out.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), transient=True
        ) as bar:
            task = bar.add_task("chaos", total=len(plan))
            for scenario, seed in plan:
                bar.update(task, description=f"{scenario.name} seed {seed}")

                def advance(_result: RunResult) -> None:
                    bar.advance(task)

                yield scenario, seed, advance
        return
    scenarios = len({scenario.path for scenario, _ in plan})
    print(f"{len(plan)} runs of {scenarios} scenario{'s' if scenarios != 1 else ''}:", file=out)

    def line(result: RunResult) -> None:
        verdict = "PASS" if result.passed else "FAIL"
        if result.not_exercised and all_passed(result.results):
            verdict = "FAIL (NOT EXERCISED)"
        print(f"{result.scenario.name} seed {result.seed}: {verdict}", file=out)

    for scenario, seed in plan:
        yield scenario, seed, line


def _prefixed(prefix: str, value: str | None) -> str | None:
    """``--exec CMD`` is ``--handler exec:CMD``, ``--exec-tcp ADDRESS`` ``--handler exec-tcp:...``."""
    return None if value is None else f"{prefix}{value}"


def main(args: argparse.Namespace) -> int:
    # A handler's messages are printed escaped: its control bytes are shown, never obeyed.
    out, err = printable_stream(sys.stdout), printable_stream(sys.stderr)
    given = [
        (option, spec)
        for option, spec in (
            ("--handler", args.handler if args.handler != DEFAULT_HANDLER else None),
            ("--exec", _prefixed(EXEC_PREFIX, getattr(args, "exec_command", None))),
            ("--exec-tcp", _prefixed(EXEC_TCP_PREFIX, getattr(args, "exec_tcp", None))),
        )
        if spec is not None
    ]
    if len(given) > 1:
        named = " and ".join(option for option, _ in given)
        print(f"dsm run: give one of --handler, --exec and --exec-tcp, not {named}", file=err)
        return 2
    if given:
        args.handler = given[0][1]
    max_wall: float = getattr(args, "max_wall", DEFAULT_MAX_WALL_S)
    # From the start: loading, the handler's first start and every run count.
    deadline = wall_now() + max_wall
    if getattr(args, "call_timeout", None) is not None:
        # Through the environment, so the worker processes of --jobs bound their calls too.
        os.environ[CALL_TIMEOUT_ENV] = repr(args.call_timeout)
    try:
        call_timeout()  # a bad $DSM_CALL_TIMEOUT is a usage error, before any run
        if args.report is not None:
            check_output("--report", args.report, OutputKind.DIRECTORY)
        if args.junit is not None:
            check_output("--junit", args.junit, OutputKind.FILE)
        scenarios = _unique([s for target in args.targets for s in load_scenarios(target)])
        factory = resolve_handler(args.handler)
        if not args.handler.startswith((EXEC_PREFIX, EXEC_TCP_PREFIX)):
            # Once before any run: a factory that raises or gives no handler is a usage error.
            build_handler(factory, ManualClock(), name=args.handler)
        plan = _plan(scenarios, args)
        _check_distinct_outputs(args, plan)
        system = parse_clock_mode(getattr(args, "clock", "injected")) is ClockMode.SYSTEM
        semantics_option: str | None = getattr(args, "semantics", None)
        # Once before any run: an unknown profile is a usage error.
        semantics = resolve_semantics(semantics_option, factory)
    except ConfigurationError as exc:
        print(f"dsm run: {exc}", file=err)
        return 2
    if args.handler.startswith((EXEC_PREFIX, EXEC_TCP_PREFIX)):
        from dsm_sim.protocol.client import ExecFactory, preflight

        # Said once, before any run: a command that does not start would crash every run.
        assert isinstance(factory, ExecFactory)
        with wall_deadline(deadline):
            problem = preflight(factory)
        if problem is not None:
            print(f"dsm run: the handler {args.handler!r} does not start: {problem}", file=err)
            return 2
    results: list[RunResult] = []
    #: Runs stopped because the handler process broke the protocol: nothing to check.
    stopped: list[str] = []
    #: Runs whose worker process died (a segfault, a kill): nothing to check either.
    crashed: list[str] = []
    #: Runs stopped because a real handler call did not return within --call-timeout.
    hung: list[str] = []
    #: Runs stopped because their history reached the most one run holds in memory.
    too_big: list[str] = []
    #: Reports that could not be written: said after the verdict, never instead of it.
    unwritten: list[ReportWriteError] = []
    #: What --max-wall stopped, said after the summary (None: it did not expire).
    out_of_time: WallClockLimitError | None = None
    jobs = getattr(args, "jobs", 1)
    # What reads a run's history once it is judged: the reports, and the list of calls a
    # non-strict semantics refused. Without them, workers send back verdicts and stats.
    keep_history = args.report is not None or not semantics.strict
    # Worker processes resolve the handler from its spec; in this process the factory
    # resolved above is used, as before.
    cluster = getattr(args, "cluster", None)
    if cluster is not None:
        from dsm_sim.simulator.distributed import run_plan_on_cluster

        try:
            outcomes = run_plan_on_cluster(
                plan,
                args.handler,
                address=None if cluster == "local" else cluster,
                workers=max(jobs, 2) if cluster == "local" else jobs,
                handler_name=args.handler,
                system_clock=system,
                deadline=deadline,
                semantics=semantics_option,
                keep_history=keep_history,
            )
        except ConfigurationError as exc:
            print(f"dsm run: {exc}", file=err)
            return 2
    else:
        outcomes = run_plan(
            plan,
            factory if jobs == 1 else args.handler,
            jobs=jobs,
            handler_name=args.handler,
            system_clock=system,
            deadline=deadline,
            semantics=semantics_option,
            keep_history=keep_history,
        )
    finished = 0
    try:
        for (scenario, seed, done), outcome in zip(
            _progress(plan, out if not args.quiet else err),
            _until(outcomes, deadline),
            strict=False,
        ):
            if isinstance(outcome.error, WallClockLimitError):
                out_of_time = _out_of_time(
                    max_wall, f"while running {scenario.name} seed {seed}", finished, len(plan)
                )
                break
            finished += 1
            if outcome.crash is not None:
                crashed.append(f"FAIL {scenario.name} seed {seed}: {outcome.crash.message}")
                continue
            if outcome.error is not None:
                error = outcome.error
                if isinstance(error, HandlerHungError):
                    hung.append(f"FAIL {scenario.name} seed {seed}: {error}")
                    continue
                if isinstance(error, HistoryLimitError):
                    too_big.append(f"STOPPED {scenario.name} seed {seed}: {error}")
                    continue
                if not isinstance(error, DsmError) or not args.handler.startswith(
                    (EXEC_PREFIX, EXEC_TCP_PREFIX)
                ):
                    raise error
                stopped.append(f"FAIL {scenario.name} seed {seed}: {error}")
                continue
            result = outcome.result
            assert result is not None
            if args.waive:
                result = dataclasses.replace(result, waived_gaps=frozenset(args.waive))
            results.append(result)
            done(result)
            if args.report is not None and not unwritten:
                unwritten.extend(_write_reports(result, args.report))
    finally:
        # Stops the worker processes of --jobs (and a cluster's runs) when the deadline cut
        # the plan short, and on Ctrl-C or SIGTERM: nothing is left running.
        close = getattr(outcomes, "close", None)
        if callable(close):
            close()
    if out_of_time is None and finished < len(plan):
        scenario, seed = plan[finished]
        out_of_time = _out_of_time(
            max_wall, f"before {scenario.name} seed {seed} started", finished, len(plan)
        )
    failed = [r for r in results if not r.passed]
    unreached = [r for r in failed if all_passed(r.results)]
    for line in stopped + hung + crashed + too_big:
        print(line, file=out)
    for result in failed:
        print(
            f"FAIL {result.scenario.name} seed {result.seed}: "
            + (", ".join(result.violated) or "NOT EXERCISED"),
            file=out,
        )
        for invariant in result.results:
            for violation in invariant.violations[:3]:
                print(f"  {invariant.name}: {violation.message}", file=out)
        for line in result.not_exercised:
            print(f"  {line}", file=out)
        replay = result.replay + (" --clock system" if system else "")
        print(f"  replay: {replay}", file=out)
    for result in results:
        for gap in result.gaps:
            if gap.name in result.waived_gaps:
                print(
                    f"WAIVED {result.scenario.name} seed {result.seed}: {gap.name}: {gap.what}: "
                    f"{gap.reason} (--waive {gap.name}; not evidence, not a pass)",
                    file=out,
                )
    if args.report is not None and not unwritten:
        unwritten.extend(_write_index(results, stopped + hung + crashed, args.report))
    if args.junit is not None:
        from dsm_sim.reports.junit import write_junit

        try:
            write_junit(results, args.junit)
        except OSError as exc:
            unwritten.append(
                ReportWriteError(option="--junit", path=str(args.junit), reason=_reason(exc))
            )
    if not semantics.strict:
        _print_semantics(semantics, results, out)
    print(
        f"{len(results) - len(failed) + len(unreached)}/{len(results)} runs kept every invariant"
        + (
            f"; {len(unreached)} of them did not reach a dimension their scenario asks for "
            "(NOT EXERCISED, so not passed)"
            if unreached
            else ""
        )
        + (f"; {len(stopped)} stopped by a protocol error" if stopped else "")
        + (f"; {len(hung)} stopped by a hung handler call" if hung else "")
        + (f"; {len(crashed)} crashed in their worker process" if crashed else "")
        + (f"; {len(too_big)} stopped at the history limit (not judged)" if too_big else "")
        + (f"; reports in {args.report / 'index.html'}" if args.report is not None else ""),
        file=out,
    )
    for error in unwritten:
        print(f"dsm run: {error}", file=err)
    if out_of_time is not None:
        print(f"dsm run: {type(out_of_time).__name__}: {out_of_time}", file=err)
    if failed or stopped or hung or crashed:
        return 1
    return 2 if unwritten or too_big or out_of_time is not None else 0


def _print_semantics(semantics: SemanticsProfile, results: list[RunResult], out: TextIO) -> None:
    """Name the profile the runs were judged by, and what it waived (neither passed nor failed)."""
    print(f"judged by the {semantics.name} semantics: {semantics.summary}", file=out)
    waived = {r.name: r.waived for result in results for r in result.waived}
    for name, reason in waived.items():
        print(f"  {name}: waived, by design: {reason}", file=out)
    refused = Counter(
        op.op.value + (f"({IdempotencyStatus(op.status).label})" if op.status else "")
        for result in results
        for op in result.history.ops
        if op.error == UNSUPPORTED_REASON and op.store_time is None
    )
    if refused:
        calls = ", ".join(f"{name} x{count}" for name, count in sorted(refused.items()))
        print(
            f"  not called, the library lacks them: {calls}; the deliveries that needed them "
            "failed with UnsupportedOperationError",
            file=out,
        )


def _until(outcomes: Iterator[RunOutcome], deadline: float) -> Iterator[RunOutcome]:
    """The outcomes, but none pulled once ``deadline`` has passed: pulling starts the next run."""
    while wall_now() < deadline:
        try:
            yield next(outcomes)
        except StopIteration:
            return


def _out_of_time(max_wall: float, when: str, finished: int, planned: int) -> WallClockLimitError:
    return WallClockLimitError(
        f"--max-wall {max_wall:g}s of real time expired {when}; "
        f"{finished} of {planned} runs finished and are reported above (and in --report and "
        f"--junit), {planned - finished} were stopped or not started. Raise --max-wall, or "
        "run fewer seeds or scenarios"
    )


def _reason(exc: OSError) -> str:
    return f"{exc.strerror or type(exc).__name__} ({type(exc).__name__})"


def _write_index(
    results: list[RunResult], stopped: list[str], directory: Path
) -> list[ReportWriteError]:
    """Write the ``index.html`` of the runs' reports; a failure is returned, as for a report."""
    from dsm_sim.reports.index import INDEX, write_index

    try:
        write_index(results, directory, stopped)
    except OSError as exc:
        return [
            ReportWriteError(option="--report", path=str(directory / INDEX), reason=_reason(exc))
        ]
    return []


def _write_reports(result: RunResult, directory: Path) -> list[ReportWriteError]:
    """Write one run's JSON and HTML reports; a failure is returned, to be said after the verdict."""
    from dsm_sim.reports.html import write_html
    from dsm_sim.reports.json_report import write_json

    try:
        write_json(result, directory)
        write_html(result, directory)
    except OSError as exc:
        return [ReportWriteError(option="--report", path=str(directory), reason=_reason(exc))]
    return []
