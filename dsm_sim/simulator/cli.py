"""``dsm run``: run chaos scenarios, print verdicts, write reports, exit non-zero on a violation.

Examples::

    dsm run scenarios/                       # every scenario, its own number of seeds
    dsm run scenarios/slow-worker.toml --seed 7 --handler broken:no_fencing
    dsm run scenarios/ --seeds 3 --report reports/ --junit reports/junit-chaos.xml

``--handler`` takes ``package.module:factory`` or ``broken:NAME`` (an entry of
the catalogue of broken handlers).  Exit codes: 0 every run kept every
invariant, 1 a run violated one, 2 the command or a scenario file is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from dsm_sim.scenario import Scenario, load_scenarios
from dsm_sim.simulator.run import DEFAULT_HANDLER, RunResult, run_scenario
from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory
from reference_engine.registry import load_factory

__all__ = ["configure", "main", "resolve_handler"]

BROKEN_PREFIX = "broken:"


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
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds", type=int, metavar="N", help="run seeds 1..N (default: each scenario's own)"
    )
    seeds.add_argument("--seed", type=int, metavar="N", help="run only this seed (replay)")
    parser.add_argument(
        "--report", type=Path, metavar="DIR", help="write HTML and JSON reports here"
    )
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")


def resolve_handler(spec: str) -> HandlerFactory:
    """``module:factory`` through the registry loader, or ``broken:NAME`` from the catalogue."""
    if spec.startswith(BROKEN_PREFIX):
        from dsm_sim.broken import CATALOGUE

        name = spec[len(BROKEN_PREFIX) :]
        if name not in CATALOGUE:
            raise ConfigurationError(
                f"unknown broken handler {name!r}; the catalogue has: {', '.join(sorted(CATALOGUE))}"
            )
        return CATALOGUE[name].factory
    return load_factory(spec)


def _plan(scenarios: list[Scenario], args: argparse.Namespace) -> list[tuple[Scenario, int]]:
    if args.seed is not None:
        return [(s, args.seed) for s in scenarios]
    if args.seeds is not None and args.seeds < 1:
        raise ConfigurationError(f"--seeds must be at least 1, got {args.seeds}")
    return [(s, seed) for s in scenarios for seed in range(1, (args.seeds or s.seeds) + 1)]


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
    total = len(plan)

    def line(result: RunResult) -> None:
        verdict = "PASS" if result.passed else "FAIL"
        print(f"{result.scenario.name} seed {result.seed} ({total} runs): {verdict}", file=out)

    for scenario, seed in plan:
        yield scenario, seed, line


def main(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    try:
        scenarios = [s for target in args.targets for s in load_scenarios(target)]
        factory = resolve_handler(args.handler)
        plan = _plan(scenarios, args)
    except ConfigurationError as exc:
        print(f"dsm run: {exc}", file=err)
        return 2
    results: list[RunResult] = []
    for scenario, seed, done in _progress(plan, out if not args.quiet else err):
        result = run_scenario(scenario, seed, factory, handler_name=args.handler)
        results.append(result)
        done(result)
        if args.report is not None:
            from dsm_sim.reports.html import write_html
            from dsm_sim.reports.json_report import write_json

            write_json(result, args.report)
            write_html(result, args.report)
    failed = [r for r in results if not r.passed]
    for result in failed:
        print(
            f"FAIL {result.scenario.name} seed {result.seed}: {', '.join(result.violated)}",
            file=out,
        )
        for invariant in result.results:
            for violation in invariant.violations[:3]:
                print(f"  {invariant.name}: {violation.message}", file=out)
        print(f"  replay: {result.replay}", file=out)
    if args.junit is not None:
        from dsm_sim.reports.junit import write_junit

        write_junit(results, args.junit)
    print(
        f"{len(results) - len(failed)}/{len(results)} runs kept every invariant"
        + (f"; reports in {args.report}" if args.report is not None else ""),
        file=out,
    )
    return 1 if failed else 0
