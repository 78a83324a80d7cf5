"""Dsm.DataStateMachine.NUnit reads what dsm verify writes: its property list and its report members.

The C# assembly lists the properties itself (so that discovering the NUnit cases runs
nothing) and reads the JSON report with members named in C#: both are compared here with
the Python they mirror, so a property or a report field renamed on one side fails a test.
"""

from __future__ import annotations

import re
from pathlib import Path

from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTIES
from dsm_sim.conformance.report import (
    Gap,
    HazardSeen,
    PropertyResult,
    ResultStatus,
    VerificationReport,
)
from dsm_sim.conformance.tell.outputs import report_dict

ROOT = Path(__file__).resolve().parents[2]
NUNIT = ROOT / "handlers" / "dotnet" / "Dsm.DataStateMachine.NUnit"


def _csharp_string(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def test_the_csharp_property_list_is_the_kits() -> None:
    source = (NUNIT / "DsmProperties.cs").read_text(encoding="utf-8")
    listed = [
        (name, _csharp_string(summary))
        for name, summary in re.findall(
            r'new DsmProperty\("([^"]+)", "((?:[^"\\]|\\.)*)"\)', source
        )
    ]
    assert listed == [(p.name, p.summary) for p in PROPERTIES]


def _members(source: str, cls: str) -> set[str]:
    body = source[source.index(f"public sealed class {cls}") :]
    body = body[: body.index("\n    }\n")]
    return set(re.findall(r'\[DataMember\(Name = "([^"]+)"\)\]', body))


def test_every_member_the_csharp_reader_takes_is_one_the_json_report_writes() -> None:
    result = PropertyResult("at_most_one_live_lock", "s", ResultStatus.PASSED, 1)
    report = VerificationReport(
        "--exec x", "dev", 0, ClockMode.INJECTED, (result,), test_cases=1, runs=1, seconds=0.0,
        gaps=(Gap("peers", "w", "r"),),
        hazards=(HazardSeen("h", "s", "at_most_one_live_lock", "m", "story"),),
    )  # fmt: skip
    written = report_dict(report)
    source = (NUNIT / "VerifyReport.cs").read_text(encoding="utf-8")
    levels = {
        "VerifyReport": written,
        "PropertyReport": written["properties"][0],
        "HazardReport": written["hazards"][0],
        "GapReport": written["gaps"][0],
    }
    for cls, level in levels.items():
        members = _members(source, cls)
        assert members and members <= set(level), (cls, members - set(level))
    statuses = set(re.findall(r'Status = "([^"]+)";', source))
    assert statuses == {status.value for status in ResultStatus}
