"""Every command dsm prints for pasting is quoted word by word for the shell.

A replay line is copied from CI logs, HTML and JUnit reports into a terminal.
A scenario file named ``a;touch X;b.toml`` or a handler command with quotes
must come back from the shell as the same words, and run nothing else.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from dsm_sim.conformance.execute.clocks import ClockMode
from dsm_sim.conformance.properties import PROPERTIES
from dsm_sim.conformance.runner import PropertyResult, ResultStatus, VerificationReport
from dsm_sim.protocol.client import ExecFactory
from dsm_sim.protocol.replay import replay_command as protocol_replay_command
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import replay_command

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "a;touch X;b $(id) `id` 'q\".toml"


def test_the_run_replay_line_gives_back_the_scenario_path_and_handler(tmp_path: Path) -> None:
    path = tmp_path / HOSTILE
    shutil.copy(ROOT / "scenarios" / "slow-worker.toml", path)
    scenario = load_scenario(path)
    line = replay_command(scenario, 7, "exec:node handlers/node/memory.js; rm -rf /", "dsm;id")
    assert shlex.split(line) == [
        "dsm",
        "run",
        str(path),
        "--seed",
        "7",
        "--handler",
        "exec:node handlers/node/memory.js; rm -rf /",
        "--semantics",
        "dsm;id",
    ]


def test_the_verify_replay_line_quotes_factory_semantics_and_zone() -> None:
    results = tuple(
        PropertyResult(p.name, p.summary, ResultStatus.PASSED, checks=1) for p in PROPERTIES
    )
    report = VerificationReport(
        factory="my;mod:make",
        profile="ci",
        seed=3,
        clock_mode=ClockMode.INJECTED,
        results=results,
        test_cases=1,
        runs=1,
        seconds=0.1,
        seeds=(3,),
        steps=1,
        semantics_spec="a b;c",
        time_zone="Europe/Paris;id",
    )
    assert shlex.split(report.replay_command()) == [
        "dsm",
        "verify",
        "my;mod:make",
        "--profile",
        "ci",
        "--seed",
        "3",
        "--semantics",
        "a b;c",
        "--tz",
        "Europe/Paris;id",
    ]


def test_the_protocol_replay_line_quotes_the_file_and_command(tmp_path: Path) -> None:
    path = tmp_path / HOSTILE
    line = protocol_replay_command(path, ExecFactory("node 'my handler.js'; id"))
    assert shlex.split(line)[:3] == ["dsm", "replay", str(path)]
    assert shlex.split(line)[3] == "--exec"
