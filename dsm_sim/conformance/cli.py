"""``dsm verify package.module:factory``: the conformance kit from the command line.

Prints a per-property table (rich on a terminal, plain lines otherwise), then
every violation as a sentence, the story of the shrunk run and the program
that reproduces it.  Exit status: 0 all properties hold, 1 a violation (or a
run that crashed), 2 a usage error such as a factory path that does not load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from dsm_sim.profiles import PROFILES
from reference_engine.errors import ConfigurationError

if TYPE_CHECKING:
    from dsm_sim.conformance.runner import VerificationReport

__all__ = ["configure", "main", "render_plain", "replay_command"]

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        help="handler factory to verify: a callable taking a Clock and returning a handler, "
        "e.g. reference_engine.handlers.memory:in_memory_handler",
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
        "--stop-on-first",
        action="store_true",
        help="stop at the first violation instead of settling every property",
    )


def render_plain(report: object, out: TextIO) -> None:
    """The report as plain lines, for logs and pipes."""
    from dsm_sim.conformance.runner import VerificationReport

    assert isinstance(report, VerificationReport)
    out.write(
        f"dsm verify {report.factory} (profile {report.profile}, seed {report.seed}, "
        f"clock {report.clock_mode.value}): {report.test_cases} test cases in "
        f"{report.runs} run(s), {report.seconds:.1f}s\n"
    )
    width = max(len(r.name) for r in report.results)
    for result in report.results:
        out.write(
            f"  {result.name:<{width}}  {result.status.value.upper():<13} {result.checks:>6} checks\n"
        )
    _write_details(report, out)


def _write_details(report: object, out: TextIO) -> None:
    from dsm_sim.conformance.runner import VerificationReport

    assert isinstance(report, VerificationReport)
    for result in report.violations:
        out.write("\n" + result.render() + "\n")
    if report.error:
        out.write(f"\nThe run did not complete: {report.error}\n")
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.violations)} violated)"
    out.write(f"\n{verdict}\n")


def _render_rich(report: object, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    from dsm_sim.conformance.runner import ResultStatus, VerificationReport

    assert isinstance(report, VerificationReport)
    console = Console(file=out)
    table = Table(
        title=f"dsm verify {report.factory}",
        caption=f"profile {report.profile}, seed {report.seed}, clock {report.clock_mode.value}: "
        f"{report.test_cases} test cases, {report.runs} run(s), {report.seconds:.1f}s",
    )
    table.add_column("property")
    table.add_column("result")
    table.add_column("checks", justify="right")
    table.add_column("guarantee")
    style = {
        ResultStatus.PASSED: "green",
        ResultStatus.FAILED: "bold red",
        ResultStatus.NOT_EXERCISED: "yellow",
        ResultStatus.UNSETTLED: "dim",
    }
    for result in report.results:
        table.add_row(
            result.name,
            f"[{style[result.status]}]{result.status.value}[/]",
            str(result.checks),
            result.summary,
        )
    console.print(table)
    _write_details(report, out)


def replay_command(report: VerificationReport) -> str:
    """The ``dsm verify`` command that runs the same test cases again."""
    from dsm_sim.conformance.clocks import ClockMode

    command = f"dsm verify {report.factory} --profile {report.profile} --seed {report.seed}"
    if report.clock_mode is not ClockMode.INJECTED:
        command += f" --clock {report.clock_mode.value}"
    return command


def _progress_bar(max_examples: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(TextColumn("verifying"), BarColumn(), MofNCompleteColumn(), transient=True)
    task = bar.add_task("verify", total=max_examples)
    bar.start()

    def update(done: int, total: int) -> None:
        bar.update(task, completed=min(done, total), total=total)

    return update, bar.stop


def main(args: argparse.Namespace) -> int:
    from dsm_sim.conformance.runner import ResultStatus, profile_settings, verify
    from reference_engine.clock import ManualClock
    from reference_engine.registry import load_factory

    try:
        factory = load_factory(args.factory)
        max_examples = profile_settings(args.profile).max_examples
        factory(ManualClock())  # a factory that cannot build (missing URL, ...) is a usage error
    except ConfigurationError as exc:
        sys.stderr.write(f"dsm verify: {exc}\n")
        return EXIT_USAGE
    tty = sys.stdout.isatty()
    update: Callable[[int, int], None] | None = None
    stop: Callable[[], None] = lambda: None  # noqa: E731
    if tty:
        update, stop = _progress_bar(max_examples)
    try:
        report = verify(
            factory,
            profile=args.profile,
            seed=args.seed,
            clock_mode=args.clock,
            stop_on_first=args.stop_on_first,
            progress=update,
        )
    finally:
        stop()
    if tty:
        _render_rich(report, sys.stdout)
    else:
        render_plain(report, sys.stdout)
    if not report.passed:
        print(f"replay this run: {replay_command(report)}", file=sys.stderr)
        return EXIT_VIOLATION
    unexercised = [r.name for r in report.results if r.status is ResultStatus.NOT_EXERCISED]
    if unexercised and args.profile != "dev":
        # A check that never ran is not a pass under ci or thorough.
        print(
            f"not exercised under profile {args.profile}: {', '.join(unexercised)}; "
            "nothing was verified for these properties",
            file=sys.stderr,
        )
        return EXIT_VIOLATION
    return EXIT_OK
