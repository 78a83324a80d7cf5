"""What ``dsm verify`` prints and how it finds things, without running the state machine.

The report is built by hand here, so each rendering rule (found order,
conditional passes, flaky results, the replay command) is checked against
exactly the report that should trigger it.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis.errors import FlakyFailure, FlakyReplay

from dsm_sim.conformance.cache import CACHE_DIR_ENV, cache_dir
from dsm_sim.conformance.cli import import_path_hint, render_plain, verdict
from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTIES, Finding, PropertyViolation
from dsm_sim.conformance.runner import PropertyResult, ResultStatus, VerificationReport
from dsm_sim.conformance.tell.flaky import find_violation, is_flaky
from dsm_sim.conformance.tell.story import render_reproduction

pytestmark = pytest.mark.unit


def _violation(name: str = "stale_write_rejected") -> PropertyViolation:
    return PropertyViolation(Finding(name, "the write was accepted"), "  1. story\n  => it broke")


def _report(*failed: PropertyResult, **changes: object) -> VerificationReport:
    by_name = {r.name: r for r in failed}
    results = tuple(
        by_name.get(p.name) or PropertyResult(p.name, p.summary, ResultStatus.PASSED, checks=3)
        for p in PROPERTIES
    )
    fields: dict[str, object] = {
        "factory": "mystore:make_handler",
        "profile": "ci",
        "seed": 42,
        "clock_mode": ClockMode.INJECTED,
        "results": results,
        "test_cases": 100,
        "runs": 2,
        "seconds": 1.5,
        "seeds": (42, 43),
        "steps": 900,
    }
    fields.update(changes)
    return VerificationReport(**fields)  # type: ignore[arg-type]


def _failed(name: str, rank: int, **changes: object) -> PropertyResult:
    summary = next(p.summary for p in PROPERTIES if p.name == name)
    fields: dict[str, object] = {
        "status": ResultStatus.FAILED,
        "checks": 5,
        "message": f"{name} broke",
        "story": f"  1. step\n  => {name} broke",
        "reproduction": "state = HandlerConformance()\ntry:\n    pass\nfinally:\n    state.teardown()",
        "found_rank": rank,
    }
    fields.update(changes)
    return PropertyResult(name, summary, **fields)  # type: ignore[arg-type]


# --- finding the violation inside what Hypothesis raised ------------------------------------


def test_a_violation_is_found_in_a_group_a_cause_and_a_context() -> None:
    violation = _violation()
    group = FlakyFailure("Inconsistent results", [ValueError("noise"), violation])  # type: ignore[no-untyped-call]
    assert find_violation(group) is violation
    caused = RuntimeError("replay failed")
    caused.__cause__ = violation
    assert find_violation(caused) is violation
    during = FlakyReplay("could not replay")  # type: ignore[no-untyped-call]
    during.__context__ = ExceptionGroup("outer", [caused])
    assert find_violation(during) is violation
    assert find_violation(RuntimeError("unrelated")) is None


def test_a_cycle_in_the_exception_chain_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert find_violation(first) is None


def test_every_flaky_variant_is_recognised_and_a_plain_error_is_not() -> None:
    assert is_flaky(FlakyFailure("x", [_violation()]))  # type: ignore[no-untyped-call]
    assert is_flaky(FlakyReplay("x"))  # type: ignore[no-untyped-call]
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = FlakyReplay("inner")  # type: ignore[no-untyped-call]
    assert is_flaky(wrapped)

    class FlakyFromAnotherVersion(Exception):
        pass

    assert is_flaky(FlakyFromAnotherVersion())
    assert not is_flaky(_violation())
    assert not is_flaky(RuntimeError("boom"))


# --- the report ------------------------------------------------------------------------------


def test_violations_are_listed_in_the_order_they_were_found() -> None:
    # data_round_trip comes before tenant_isolation in PROPERTIES, but was found second.
    report = _report(_failed("tenant_isolation", 1), _failed("data_round_trip", 2))
    assert [v.name for v in report.violations] == ["tenant_isolation", "data_round_trip"]
    out = io.StringIO()
    render_plain(report, out)
    text = out.getvalue()
    assert text.index("tenant_isolation violated") < text.index("data_round_trip violated")
    assert "FAILED (2 violated: tenant_isolation, data_round_trip)" in text


def test_stopped_test_cases_are_shown_per_property_and_passes_called_conditional() -> None:
    report = _report(_failed("stale_write_rejected", 1, stopped=7))
    out = io.StringIO()
    render_plain(report, out)
    text = out.getvalue()
    line = next(x for x in text.splitlines() if x.strip().startswith("stale_write_rejected"))
    assert "7 later test cases stopped here" in line
    assert "Passes are conditional: 7 test case(s)" in text
    assert "stale_write_rejected: 7" in text


def test_a_clean_report_says_nothing_about_conditions() -> None:
    out = io.StringIO()
    render_plain(_report(), out)
    assert "conditional" not in out.getvalue()
    assert out.getvalue().rstrip().endswith("PASSED")


def test_the_header_says_how_much_was_explored_and_in_which_zone() -> None:
    out = io.StringIO()
    render_plain(_report(time_zone="Asia/Kolkata"), out)
    head = out.getvalue().splitlines()[:2]
    assert "seed 42" in head[0] and "time zone Asia/Kolkata" in head[0]
    assert head[1] == (
        "explored: 100 test cases, 900 steps, "
        f"{3 * len(PROPERTIES)} checks, 2 seed(s), 2 run(s), 1.5s"
    )
    out = io.StringIO()
    render_plain(_report(), out)
    assert "time zone drawn per test case" in out.getvalue()


def test_a_flaky_result_keeps_its_story_and_says_what_it_means() -> None:
    flaky = _failed("at_most_one_live_lock", 1, status=ResultStatus.FLAKY, reproduction="")
    report = _report(flaky)
    out = io.StringIO()
    render_plain(report, out)
    text = out.getvalue()
    assert "at_most_one_live_lock violated (flaky)" in text
    assert "=> at_most_one_live_lock broke" in text
    assert "answered the same steps differently" in text
    assert "a race across connections?" in text
    assert "FAILED (1 violated, 1 of them flaky: at_most_one_live_lock)" in text
    assert "FLAKY" in text


def test_a_run_that_stopped_without_a_violation_is_never_zero_violated() -> None:
    report = _report(error="the handler answered the same steps differently ...")
    assert verdict(report) == "FAILED (the run did not complete; see above)"
    assert "0 violated" not in verdict(report)


@pytest.mark.parametrize(
    ("changes", "zone", "expected"),
    [
        ({}, None, "dsm verify mystore:make_handler --profile ci --seed 42"),
        ({}, "UTC", "dsm verify mystore:make_handler --profile ci --seed 42"),
        (
            {"clock_mode": ClockMode.SYSTEM, "profile": "dev"},
            "America/St_Johns",
            "dsm verify mystore:make_handler --profile dev --seed 42 --clock system "
            "--tz America/St_Johns",
        ),
        (
            {"time_zone": "Europe/Paris"},
            "America/St_Johns",
            "dsm verify mystore:make_handler --profile ci --seed 42 --tz Europe/Paris",
        ),
    ],
)
def test_the_replay_command_carries_seed_profile_clock_and_zone(
    changes: dict[str, object], zone: str | None, expected: str
) -> None:
    report = _report(_failed("data_round_trip", 1, time_zone=zone), **changes)
    assert report.replay_command() == expected


# --- the reproduction ------------------------------------------------------------------------


def test_the_reproduction_closes_the_handler_in_finally() -> None:
    notes = [
        "Falsifying example:\nstate = HandlerConformance()\n"
        "state.tick(seconds=60)\nstate.set(ref=r, worker=1)\nstate.teardown()"
    ]
    program = render_reproduction(notes, "mystore:make_handler")
    assert program.splitlines()[-6:] == [
        "state = HandlerConformance()",
        "try:",
        "    state.tick(seconds=60)",
        "    state.set(ref=r, worker=1)",
        "finally:",
        "    state.teardown()",
    ]
    assert "from mystore import make_handler" in program
    compile(program, "<reproduction>", "exec")  # it is Python, as printed


def test_a_failing_reproduction_still_runs_its_teardown() -> None:
    program = render_reproduction(
        ["state = Machine()\nstate.boom()\nstate.teardown()"], "mystore:<lambda>"
    )
    program = program.replace("Machine = build_machine(your_factory, name='Machine')", "")
    calls: list[str] = []

    class Machine:
        def boom(self) -> None:
            calls.append("boom")
            raise AssertionError("violated")

        def teardown(self) -> None:
            calls.append("teardown")

    body = "\n".join(line for line in program.splitlines() if not line.startswith("from "))
    with pytest.raises(AssertionError, match="violated"):
        exec(body, {"Machine": Machine})
    assert calls == ["boom", "teardown"]


# --- newcomer friction -----------------------------------------------------------------------


def test_the_cache_directory_is_explicit_then_env_then_xdg_then_home(tmp_path: Path) -> None:
    assert cache_dir(tmp_path / "a", env={CACHE_DIR_ENV: str(tmp_path / "b")}) == tmp_path / "a"
    assert cache_dir(None, env={CACHE_DIR_ENV: str(tmp_path / "b")}) == tmp_path / "b"
    assert cache_dir(None, env={"XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "dsm"
    assert cache_dir(None, env={}) == Path.home() / ".cache" / "dsm"


def test_an_import_failure_says_where_to_run_from() -> None:
    hint = import_path_hint("mystore.dsm:make_handler")
    assert "folder that holds mystore.py" in hint and "PYTHONPATH" in hint


# --- the HTML report ----------------------------------------------------------------------------

#: What a handler's message may hold: NUL, ESC sequences, BEL, DEL, a C1 control, an undecodable byte.
_CONTROLS = "\x00\x1b[2J\x1b]0;pwned\x07\x7f\x9b\udcff"


def test_the_counterexample_page_shows_a_handlers_control_characters_escaped(
    tmp_path: Path,
) -> None:
    from dsm_sim.conformance.tell.outputs import write_html

    failed = _failed(
        "stale_write_rejected",
        0,
        message=f"refused {_CONTROLS}",
        story=f"  1. set {_CONTROLS}\n  => it broke",
        reproduction=f"# {_CONTROLS}",
    )
    write_html(_report(failed, factory=f"mystore:{_CONTROLS}"), tmp_path)
    for page in ("stale_write_rejected.html", "index.html"):
        text = (tmp_path / page).read_text(encoding="utf-8")
        assert not any(c in text for c in "\x00\x1b\x07\x7f\x9b"), page
        assert "\\x00\\x1b[2J\\x1b]0;pwned\\x07\\x7f\\x9b\\udcff" in text, page
