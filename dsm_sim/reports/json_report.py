"""The JSON report of one run: everything the HTML page shows, for machines.

It is deterministic -- no wall-clock durations, no absolute paths beyond the
scenario path as given, sorted keys -- so one seed gives a byte-identical
file, which is what ``tests/scenario/test_determinism.py`` checks.

A run judged under a semantics profile other than the spec's names it
(``semantics``), and an invariant the profile waives has ``"passed": null``
and its reason under ``waived``: it is neither a pass nor a failure.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dsm_sim.checker import InvariantResult
from dsm_sim.outputs import write_report
from dsm_sim.simulator.run import RunResult

__all__ = ["FORMAT", "report_dict", "report_name", "report_stem", "to_json", "write_json"]

#: Identifies the layout, so consumers can refuse a file they do not understand.
FORMAT = "dsm-chaos-report/1"


def _invariant(result: InvariantResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": result.name,
        "description": result.description,
        "passed": result.passed,
        "violations": [
            {
                "message": v.message,
                "key": v.key,
                "ops": list(v.ops),
                "events": list(v.events),
            }
            for v in result.violations
        ],
        "notes": list(result.notes),
    }
    if result.waived is not None:
        # Neither passed nor failed: the semantics profile says it does not apply.
        out["passed"] = None
        out["waived"] = result.waived
    return out


def report_dict(run: RunResult) -> dict[str, Any]:
    report: dict[str, Any] = {
        "format": FORMAT,
        "scenario": {
            "name": run.scenario.name,
            "description": run.scenario.description,
            "path": run.scenario.path,
        },
        "seed": run.seed,
        "handler": run.handler,
        "passed": run.passed,
        "replay": run.replay,
        "faults": dict(run.faults),
        "stats": dict(run.stats),
        "invariants": [_invariant(r) for r in run.results],
        "history": run.whole_history().to_json(),
    }
    if run.gaps:
        # What the scenario asked for and the run never reached: NOT EXERCISED unless waived.
        report["not_exercised"] = [
            {
                "name": gap.name,
                "what": gap.what,
                "reason": gap.reason,
                "waived": gap.name in run.waived_gaps,
            }
            for gap in run.gaps
        ]
    if not run.semantics.strict:
        report["semantics"] = {"name": run.semantics.name, "summary": run.semantics.summary}
    return report


def to_json(run: RunResult) -> str:
    """Canonical text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(report_dict(run), sort_keys=True, indent=2, allow_nan=False) + "\n"


def report_name(run: RunResult) -> str:
    """``<scenario>-seed<N>-<factory>-<digest>``: stable, filesystem-safe, one per handler.

    The factory's own name keeps the file recognisable; the digest of the
    whole handler spec keeps ``a:make`` and ``b:make`` (or two ``exec:``
    commands) from writing over each other's reports in one directory.
    """
    return report_stem(run.scenario.name, run.seed, run.handler)


def report_stem(scenario: str, seed: int, handler: str) -> str:
    """:func:`report_name` of a run not made yet: what ``dsm run`` checks its outputs against."""
    factory = "".join(c if c.isalnum() else "-" for c in handler.rsplit(":", 1)[-1])
    digest = hashlib.sha256(handler.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{scenario}-seed{seed}-{factory[:40]}-{digest}"


def write_json(run: RunResult, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report_name(run)}.json"
    return write_report(path, to_json(run))
