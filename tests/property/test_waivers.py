"""A waiver accepts only what was not exercised: it never hides a violation (issue 34, item 5).

``--waive NAME`` says "I accept that NAME did not run".  A property that did
run is judged whatever was waived: violated is FAILED, held is PASSED; only
a property no test case reached becomes WAIVED.  A name that could waive
nothing, a misspelt probe's included, is a usage error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dsm_sim.broken.handlers import NoFencing
from dsm_sim.conformance import cli
from dsm_sim.conformance.generate.probes import PROBES
from dsm_sim.conformance.properties import PROPERTY_NAMES
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.simulator.dimensions import Dimension
from reference_engine.errors import ConfigurationError
from reference_engine.handlers.memory import in_memory_handler

pytestmark = pytest.mark.property

NO_FENCING = "dsm_sim.broken.handlers:NoFencing"
EVERY_PROPERTY = [word for name in PROPERTY_NAMES for word in ("--waive", name)]


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    code = cli.main(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_waiving_every_property_does_not_pass_a_handler_without_fencing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report_path = tmp_path / "verify.json"
    argv = (NO_FENCING, "--profile", "dev", "--seed", "0", "--json", str(report_path))
    code, out, _ = _run_cli(capsys, *argv, *EVERY_PROPERTY)
    assert code == 1, out
    assert "FAILED (" in out and "stale_write_rejected" in out.splitlines()[-1]
    assert "--waive stale_write_rejected ignored: it was violated" in out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["passed"] is False
    statuses = {p["name"]: p["status"] for p in report["properties"]}
    assert statuses["stale_write_rejected"] == "failed"
    # Exercised and held: a pass, not a waiver.
    assert statuses["at_most_one_live_lock"] == "passed"
    assert "violated" in report["waivers_ignored"]["stale_write_rejected"]
    assert "PASSED" in report["waivers_ignored"]["at_most_one_live_lock"]


def test_a_waiver_accepts_only_a_property_no_test_case_reached() -> None:
    # One step per test case reaches almost nothing: what is waived and was not
    # reached is WAIVED; what is waived and ran is judged as usual.
    report = verify(
        in_memory_handler,
        "dev",
        seed=5,
        max_examples=2,
        step_count=1,
        probes=False,
        matrix=False,
        waive=PROPERTY_NAMES,
    )
    reached = {r.name for r in report.results if r.checks}
    assert reached and set(PROPERTY_NAMES) - reached
    for result in report.results:
        expected = ResultStatus.PASSED if result.name in reached else ResultStatus.WAIVED
        assert result.status is expected, result
    assert report.passed
    assert set(report.ignored_waivers) == reached


def test_a_violation_found_under_a_waiver_is_reported_by_verify() -> None:
    report = verify(NoFencing, "dev", seed=0, waive=PROPERTY_NAMES)
    assert not report.passed
    assert "stale_write_rejected" in {v.name for v in report.violations}
    assert report.result("stale_write_rejected").status is ResultStatus.FAILED
    assert all(r.status is not ResultStatus.WAIVED for r in report.results if r.checks)


def test_a_misspelt_probe_is_refused_like_a_misspelt_property(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("probe:no such probe", "no_such_property"):
        code, out, err = _run_cli(capsys, NO_FENCING, "--profile", "dev", "--waive", name)
        assert code == 2, (name, out, err)
        assert repr(name) in err
        assert PROBES[0].name in err  # the valid names are listed
        assert out == ""
    with pytest.raises(ConfigurationError, match="names no edge probe"):
        verify(in_memory_handler, "dev", seed=0, waive=["probe:payload"])


def test_a_waiver_of_a_probe_that_ran_accepts_nothing() -> None:
    name = f"probe:{PROBES[0].name}"
    report = verify(in_memory_handler, "dev", seed=1, waive=[name, "peers"])
    assert report.passed
    assert set(report.ignored_waivers) == {name, "peers"}


def test_dsm_run_waives_only_dimensions_never_an_invariant() -> None:
    # dsm run --waive takes a dimension a scenario asks for (argparse choices):
    # no invariant can be named, so no violation can be waived there.
    from dsm_sim.cli import build_parser

    names = {d.value for d in Dimension}
    assert not names & set(PROPERTY_NAMES)
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["run", "scenarios", "--waive", "stale_write_rejected"])
    assert exit_info.value.code == 2
