"""A verification for machines and reviewers: JSON, JUnit XML and an HTML report.

The same report the terminal shows, in the forms CI reads: JSON with every
property, gap and counterexample (its story and its program); JUnit with one
test case per property and per gap, a failure for a violation and for
anything NOT EXERCISED that was not waived; and a report directory whose
``index.html`` lists the verdicts and links each counterexample's page.
Every text a handler produced (its error messages, its data) reaches XML
escaped and HTML escaped.
"""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from dsm_sim.conformance.properties import PROPERTY_NAMES
from dsm_sim.conformance.report import PropertyResult, ResultStatus, VerificationReport
from dsm_sim.outputs import write_report
from dsm_sim.printable import printable, xml_safe
from dsm_sim.reports.explorer.page import explorer_view
from dsm_sim.reports.rendering import template_environment

__all__ = [
    "INDEX",
    "junit_xml",
    "report_dict",
    "report_files",
    "verdict",
    "write_html",
    "write_json",
    "write_junit",
]

SUITE = "dsm-verify"
#: The report directory's page of verdicts.
INDEX = "index.html"


def verdict(report: VerificationReport) -> str:
    """One line a CI log ends with; never a bare count with nothing to act on."""
    said = _verdict(report)
    left = report.threads_left
    if left:
        said += (
            f"; {left} handler thread{'s were' if left != 1 else ' was'} left running "
            "(blocked in a call that hung; not waited for)"
        )
    return said


def _verdict(report: VerificationReport) -> str:
    if report.passed:
        if report.hazards:
            names = ", ".join(h.name for h in report.hazards)
            return (
                f"PASSED, with {len(report.hazards)} hazard(s) of the {report.semantics} "
                f"interface: {names} (see the hazard lines)"
            )
        return "PASSED"
    violations = report.violations
    if violations:
        flaky = sum(1 for v in violations if v.flaky)
        names = ", ".join(v.name for v in violations)
        extra = f", {flaky} of them flaky" if flaky else ""
        # A race that replays only sometimes: say whether it ran across processes.
        raced = f"; {report.races()}" if flaky and report.instances else ""
        return f"FAILED ({len(violations)} violated{extra}: {names}{raced})"
    if report.error:
        return "FAILED (the run did not complete; see above)"
    count = len(report.not_exercised)
    return (
        f"NOT PASSED ({count} not exercised: a green verdict needs each exercised, or waived "
        "by name with --waive)"
    )


def _result(result: PropertyResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "summary": result.summary,
        "status": result.status.value,
        "checks": result.checks,
        "stopped": result.stopped,
        "message": result.message or None,
        "story": result.story or None,
        "story_steps": result.story_steps if result.failed else None,
        "reproduction": result.reproduction or None,
        "found_by": result.found_by,
        "found_seed": result.found_seed,
        "confirmed": None if result.confirmed is None else list(result.confirmed),
        "time_zone": result.time_zone,
    }


def report_dict(report: VerificationReport) -> dict[str, Any]:
    """Everything the report says, as plain data."""
    coverage = report.coverage
    return {
        "tool": "dsm verify",
        "factory": report.factory,
        "profile": report.profile,
        "seed": report.seed,
        "seeds": list(report.seeds),
        "semantics": report.semantics,
        "clock": report.clock_mode.value,
        "time_zone": report.time_zone,
        "verdict": verdict(report),
        "passed": report.passed,
        "error": report.error,
        "seconds": report.seconds,
        "threads_left": report.threads_left,
        "explored": {
            "probes": report.probes,
            "probe_steps": report.probe_steps,
            "test_cases": report.test_cases,
            "steps": report.steps,
            "checks": report.checks,
            "runs": report.runs,
            "race_matrix": {
                "operations": coverage.operations,
                "states": coverage.states,
                "cells": coverage.applicable,
                "cells_exercised": coverage.exercised,
                "interleavings": coverage.schedules,
                "cells_by_the_store": coverage.uncontrolled,
                "preemption_points": coverage.preemption_points,
                "preemption_points_explored": coverage.preemptions_explored,
                "cells_uncontrolled_threads": list(coverage.threaded),
                "uncontrolled_interleavings": coverage.threaded_runs,
            },
        },
        # Whether the races went through several processes (--exec peers), and how many.
        "races": {
            "instances": report.instances,
            "processes": report.instances if report.out_of_process else 0,
            "several_processes": report.out_of_process and report.instances > 1,
            "said": report.races(),
        },
        "tokens": report.tokens,
        "properties": [_result(r) for r in report.results],
        # What the semantics profile's interface cannot prevent, shown by a test case.
        "hazards": [
            {
                "name": h.name,
                "line": h.line(),
                "summary": h.summary,
                "property": h.property_name,
                "message": h.message,
                "story": h.story,
                "story_steps": h.story_steps,
                "test_cases": h.seen,
            }
            for h in report.hazards
        ],
        "not_exercised": list(report.not_exercised),
        "gaps": [
            {"name": g.name, "what": g.what, "reason": g.reason, "waived": g.name in report.waived}
            for g in report.gaps
        ],
        "waived": dict(report.waived),
        # Waivers that accepted nothing: a violated or a passed property, a gap that did not happen.
        "waivers_ignored": report.ignored_waivers,
        "replay": report.replay_command(),
    }


def write_json(report: VerificationReport, path: Path) -> Path:
    return write_report(path, json.dumps(report_dict(report), indent=2, ensure_ascii=False) + "\n")


def junit_xml(report: VerificationReport) -> str:
    """One test case per property and per gap; a failure is anything that is no pass."""
    failing = {ResultStatus.FAILED, ResultStatus.FLAKY, ResultStatus.NOT_EXERCISED}
    cases: list[ET.Element] = []
    for result in report.results:
        case = ET.Element("testcase", classname=f"{SUITE}.properties", name=result.name)
        if result.status in failing:
            kind = "NotExercised" if result.status is ResultStatus.NOT_EXERCISED else "Violation"
            message = (
                f"{result.name}: not exercised: no test case reached it"
                if result.status is ResultStatus.NOT_EXERCISED
                else f"{result.name} violated{' (flaky)' if result.flaky else ''}: {result.message}"
            )
            failure = ET.SubElement(case, "failure", message=message, type=kind)
            failure.text = result.render() + f"\n\nreplay: {report.replay_command()}"
        elif result.status in (ResultStatus.WAIVED, ResultStatus.UNSETTLED):
            ET.SubElement(case, "skipped", message=f"{result.status.value}: {result.message}")
        cases.append(case)
    for gap in report.gaps:
        case = ET.Element("testcase", classname=f"{SUITE}.exercised", name=gap.name)
        if gap.name in report.waived:
            ET.SubElement(case, "skipped", message=f"waived: {gap.what}: {gap.reason}")
        else:
            failure = ET.SubElement(case, "failure", message=gap.render(), type="NotExercised")
            failure.text = gap.render()
        cases.append(case)
    if report.error:
        case = ET.Element("testcase", classname=f"{SUITE}.run", name="run completed")
        failure = ET.SubElement(case, "failure", message=report.error, type="RunError")
        failure.text = report.error
        cases.append(case)
    failures = sum(1 for case in cases if case.find("failure") is not None)
    skipped = sum(1 for case in cases if case.find("skipped") is not None)
    root = ET.Element("testsuites", name=SUITE, tests=str(len(cases)), failures=str(failures))
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"{SUITE} {report.factory}",
        tests=str(len(cases)),
        failures=str(failures),
        skipped=str(skipped),
        time=f"{report.seconds:.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("profile", report.profile),
        ("seed", str(report.seed)),
        ("semantics", report.semantics),
        ("verdict", verdict(report)),
        ("races", report.races()),
        ("raced_processes", str(report.instances if report.out_of_process else 0)),
        ("replay", report.replay_command()),
    ):
        ET.SubElement(properties, "property", name=name, value=value)
    suite.extend(cases)
    # A handler's messages may hold bytes XML 1.0 cannot carry: escaped, so the file parses.
    for element in root.iter():
        element.attrib = {key: xml_safe(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = xml_safe(element.text)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: VerificationReport, path: Path) -> Path:
    return write_report(path, junit_xml(report))


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
.failed,.flaky,.not_exercised{color:#b00;font-weight:600}.passed{color:#080}
.waived,.unsettled{color:#666}pre{background:#f6f6f6;padding:1em;overflow-x:auto}
"""


def _escape(text: str) -> str:
    """``text`` for HTML, a handler's control characters shown as escapes (as the pages' own)."""
    return html.escape(printable(text))


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{_escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def breaking_step(story: str) -> tuple[str, str, str]:
    """The story split around its breaking step: the last numbered step before the verdict line.

    The counterexample page marks that step (``#breaking-step``) and opens there.
    """
    lines = story.splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
    if not steps:
        return story, "", ""
    at_ = steps[-1]
    return "".join(lines[:at_]), lines[at_], "".join(lines[at_ + 1 :])


def _counterexample(report: VerificationReport, result: PropertyResult) -> str:
    """The counterexample's page: its story, and the explorer playing it when it was recorded."""
    environment = template_environment()
    replayed = result.replayed
    explorer = None
    if replayed is not None and replayed.history.ops:
        explorer = explorer_view(
            replayed.history,
            replayed.violations,
            title=f"{result.name} violated",
            chapters=replayed.chapters,
            store_clock=dict(replayed.store_clock),
        )
    before, breaking, after = breaking_step(result.story)
    return environment.get_template("counterexample.html.j2").render(
        result=result,
        story_before=before,
        breaking=breaking,
        story_after=after,
        explorer=explorer,
        reproduced=replayed is not None and replayed.reproduced,
        replay_command=report.replay_command(),
    )


def report_files() -> frozenset[str]:
    """Every file :func:`write_html` may write in its directory: the index and each property's page.

    Known before the run, so another output given a path among them is refused then.
    """
    return frozenset({INDEX} | {f"{_slug(name)}.html" for name in PROPERTY_NAMES})


def write_html(report: VerificationReport, directory: Path) -> Path:
    """``index.html`` with every verdict, and a page per counterexample; returns the index."""
    e = _escape
    rows = []
    for result in report.results:
        css = result.status.name.lower()
        name = e(result.name)
        if result.failed:
            name = f"<a href='{_slug(result.name)}.html#breaking-step'>{name}</a>"
            write_report(directory / f"{_slug(result.name)}.html", _counterexample(report, result))
        detail = result.message if result.status is ResultStatus.WAIVED else result.summary
        rows.append(
            f"<tr><td>{name}</td><td class={css}>{e(result.status.value)}</td>"
            f"<td>{result.checks}</td><td>{e(detail)}</td></tr>"
        )
    gaps = "".join(
        f"<li class={'waived' if g.name in report.waived else 'not_exercised'}>{e(g.render())}</li>"
        for g in report.gaps
    )
    body = (
        f"<h1>dsm verify {e(report.factory)}</h1>"
        f"<p class={'passed' if report.passed else 'failed'}>{e(verdict(report))}</p>"
        f"<p>profile {e(report.profile)}, seed {report.seed}: {e(report.explored())}<br>"
        f"{e(report.coverage.render())}<br>{e(report.races())}</p>"
        "<table><tr><th>property</th><th>result</th><th>checks</th><th>guarantee</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<h2>Not exercised</h2><ul>{gaps}</ul>" if gaps else "")
        + (f"<h2>The run did not complete</h2><p>{e(report.error)}</p>" if report.error else "")
        + f"<h2>Replay this run</h2><pre>{e(report.replay_command())}</pre>"
    )
    return write_report(directory / INDEX, _page(f"dsm verify {report.factory}", body))
