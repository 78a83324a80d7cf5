"""One seed replays a run exactly: same history, byte-identical JSON report."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from dsm_sim.reports.json_report import to_json
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator import cli
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.scenario

ROOT = Path(__file__).resolve().parents[2]
HAS_SQL = importlib.util.find_spec("reference_engine.handlers.sql.factory") is not None


@pytest.mark.parametrize(
    "name",
    [
        "swarm",
        "slow-worker",
        "flaky-store",
        "correction-upserts",
        "lost-replies",
        "tenants-and-keys",
        "time-grid",
    ],
)
def test_same_seed_gives_byte_identical_report(name: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    first = to_json(run_scenario(scenario, 4))
    second = to_json(run_scenario(scenario, 4))
    assert first == second


def test_different_seeds_give_different_runs() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "swarm.toml")
    assert run_scenario(scenario, 1).history.dumps() != run_scenario(scenario, 2).history.dumps()


@pytest.mark.skipif(not HAS_SQL, reason="the SQL handlers are not part of this installation")
def test_sqlite_replays_byte_identically() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "crash-mid-dispatch.toml")
    handler = "reference_engine.handlers.sql.factory:sqlite_memory_handler"
    assert to_json(run_scenario(scenario, 3, handler)) == to_json(
        run_scenario(scenario, 3, handler)
    )


@pytest.mark.skipif(not HAS_SQL, reason="the SQL handlers are not part of this installation")
def test_sqlite_replays_multi_node_runs_byte_identically() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "correction-upserts.toml")
    handler = "reference_engine.handlers.sql.factory:sqlite_memory_handler"
    assert to_json(run_scenario(scenario, 2, handler)) == to_json(
        run_scenario(scenario, 2, handler)
    )


def test_system_clock_mode_replays_and_agrees_with_the_injected_clock() -> None:
    """Under --clock system the same seed gives the same history as the injected clock."""
    scenario = load_scenario(ROOT / "scenarios" / "time-grid.toml")
    injected = run_scenario(scenario, 1)
    system = run_scenario(scenario, 1, system_clock=True)
    assert system.passed
    assert system.history.dumps() == injected.history.dumps()


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args([str(ROOT / "scenarios" / "slow-worker.toml"), *extra])


def test_cli_report_files_are_identical_across_runs(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert cli.main(_args(tmp_path, "--seed", "2", "--report", str(first))) == 0
    assert cli.main(_args(tmp_path, "--seed", "2", "--report", str(second))) == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert any(n.endswith(".html") for n in names) and any(n.endswith(".json") for n in names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_failing_run_prints_seed_and_replay_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "junit.xml"
    code = cli.main(
        _args(tmp_path, "--seed", "2", "--handler", "broken:no_fencing", "--junit", str(junit))
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL slow-worker seed 2" in out
    assert "replay: dsm run " in out and "--seed 2 --handler broken:no_fencing" in out
    xml = junit.read_text(encoding="utf-8")
    assert "<failure" in xml and "stale_write_rejected" in xml


def test_unknown_handler_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_args(tmp_path, "--handler", "broken:nope")) == 2
    assert "the catalogue has:" in capsys.readouterr().err


def test_html_report_is_self_contained_and_flags_the_violation(tmp_path: Path) -> None:
    from dsm_sim.broken import CATALOGUE
    from dsm_sim.reports.html import render_html

    scenario = load_scenario(ROOT / "scenarios" / "slow-worker.toml")
    run = run_scenario(
        scenario, 2, CATALOGUE["no_fencing"].factory, handler_name="broken:no_fencing"
    )
    page = render_html(run)
    # Scripts are inline only (the explorer): nothing is fetched when the page is viewed.
    assert " src=" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    assert "Violating trace" in page and 'class="bad"' in page
    flagged = {i for r in run.results for v in r.violations for i in v.ops}
    assert page.count(" flagged") >= len(flagged) > 0
    for name in ("w1", "catchup", "broker"):
        assert f">{name}</text>" in page
    assert run.replay in page


def test_junit_counts_failures_per_scenario() -> None:
    import xml.etree.ElementTree as ET

    from dsm_sim.broken import CATALOGUE
    from dsm_sim.reports.junit import junit_xml

    scenario = load_scenario(ROOT / "scenarios" / "slow-worker.toml")
    runs = [
        run_scenario(scenario, 2),
        run_scenario(
            scenario, 2, CATALOGUE["no_fencing"].factory, handler_name="broken:no_fencing"
        ),
    ]
    root = ET.fromstring(junit_xml(runs))
    assert root.get("tests") == "2" and root.get("failures") == "1"
    failures = root.findall(".//failure")
    assert len(failures) == 1
    assert "replay: dsm run" in (failures[0].get("message") or "")
