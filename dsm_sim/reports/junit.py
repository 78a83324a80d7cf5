"""JUnit XML for CI: one test case per scenario, seed and handler; a violation is a failure.

A run judged under a semantics profile other than the spec's carries it as
test case properties (``semantics``, and ``waived:<name>`` with the reason of
each invariant the profile waives); a waived invariant is never a failure.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from dsm_sim.outputs import write_report
from dsm_sim.printable import xml_safe
from dsm_sim.simulator.run import RunResult

__all__ = ["junit_xml", "write_junit"]


def junit_xml(runs: Sequence[RunResult], suite: str = "dsm-chaos") -> str:
    failures = sum(1 for run in runs if not run.passed)
    root = ET.Element("testsuites", name=suite, tests=str(len(runs)), failures=str(failures))
    by_scenario: dict[str, list[RunResult]] = {}
    for run in runs:
        by_scenario.setdefault(run.scenario.name, []).append(run)
    for name in sorted(by_scenario):
        group = by_scenario[name]
        element = ET.SubElement(
            root,
            "testsuite",
            name=f"{suite}.{name}",
            tests=str(len(group)),
            failures=str(sum(1 for run in group if not run.passed)),
        )
        for run in group:
            case = ET.SubElement(
                element,
                "testcase",
                classname=f"{suite}.{name}",
                name=f"seed {run.seed} [{run.handler}]",
            )
            if not run.semantics.strict:
                properties = ET.SubElement(case, "properties")
                ET.SubElement(properties, "property", name="semantics", value=run.semantics.name)
                for result in run.waived:
                    ET.SubElement(
                        properties,
                        "property",
                        name=f"waived:{result.name}",
                        value=result.waived or "",
                    )
            if run.passed:
                continue
            lines = [
                f"{result.name}: {violation.message}"
                for result in run.results
                for violation in result.violations
            ]
            lines += list(run.not_exercised)
            what = f"violated: {', '.join(run.violated)}" if run.violated else "NOT EXERCISED"
            failure = ET.SubElement(
                case,
                "failure",
                message=f"{what}; replay: {run.replay}",
                type="InvariantViolation" if run.violated else "NotExercised",
            )
            failure.text = "\n".join([*lines, "", f"replay: {run.replay}"])
    # A handler's command or output may hold control bytes (0x01, ESC) that XML 1.0
    # cannot carry: every name and text goes out escaped, so the file stays well-formed.
    for element in root.iter():
        element.attrib = {key: xml_safe(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = xml_safe(element.text)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(runs: Sequence[RunResult], path: Path) -> Path:
    return write_report(path, junit_xml(runs))
