"""A Node handler of the seed's interface behind the Node host, and findings as ``node:test`` files.

``handlers/node/seed-memory.js`` is written to the seed's interface (acquire
answers a boolean, the writes take no token) and contains no protocol code:
``host.js`` adapts it and says ``"shape": "seed"``, so the kit judges it
under the ``seed`` profile and reports the stale holder's late write as a
hazard.  Its ``check_then_insert`` variant awaits between its read and its
write: the kit catches the race, and the counterexample printed as a
``node:test`` file fails under ``node --test`` as the race did (the fixed
handler passes it).  Each run is the ``dev`` profile, seed 0, with a small
budget: enough to show the hazard and the finding.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dsm_sim.conformance.runner import PropertyResult, verify
from dsm_sim.conformance.tell.languages import Finding, printer_for
from dsm_sim.protocol.client import exec_factory, preflight

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEED_HANDLER = ROOT / "handlers" / "node" / "seed-memory.js"
#: The seed's late-write hazard takes a lock, a clock move, a take-over and a late write.
MAX_HAZARD_STEPS = 6


def _node() -> str:
    path = shutil.which("node")
    if path is not None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("node is not installed (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip("node is not installed")


def test_a_seed_shaped_node_handler_runs_unchanged_and_is_judged_under_seed() -> None:
    factory = exec_factory([_node(), str(SEED_HANDLER)])
    assert preflight(factory) is None
    assert (factory.shape, factory.language) == ("seed", "node")
    report = verify(factory, profile="dev", seed=0, max_examples=8, probes=False, volume=False)
    assert report.passed, "\n\n".join(r.render() for r in report.violations) or report.error
    assert report.semantics == "seed"
    assert [h.name for h in report.hazards] == ["stale_holder_late_write"]
    assert 0 < report.hazards[0].story_steps <= MAX_HAZARD_STEPS, report.hazards[0]


def test_a_racy_node_handler_is_caught_and_its_node_test_fails_as_the_race_did(
    tmp_path: Path,
) -> None:
    node = _node()
    factory = exec_factory([node, str(SEED_HANDLER)], env={"DSM_NODE_BUG": "check_then_insert"})
    assert preflight(factory) is None
    kept: list[Finding] = []

    def keep(result: PropertyResult) -> None:
        recording = factory.last_recording
        kept.append(
            Finding(
                result.name,
                0,
                recording.lines(),
                result.message,
                [overlapped for _, _, overlapped in recording.entries],
                factory.shape,
            )
        )

    report = verify(
        factory,
        profile="dev",
        seed=0,
        stop_on_first=True,
        max_examples=4,
        probes=False,
        volume=False,
        on_violation=keep,
    )
    assert len(report.violations) == 1, [v.render() for v in report.violations] or report.error
    printer = printer_for(factory.command, factory.language)
    assert printer is not None and printer.suffix == ".test.js"
    test = printer.render(kept[-1])
    assert "new YourHandler(clock)" in test and '{ shape: "seed" }' in test
    assert "were on the wire at once: started together" in test

    def run(bug: str) -> subprocess.CompletedProcess[str]:
        handler = f"new (require({str(SEED_HANDLER)!r}).SeedMemoryHandler)(clock, {bug!r})"
        source = tmp_path / f"race-{bug or 'fixed'}.test.js"
        source.write_text(test.replace("new YourHandler(clock)", handler), encoding="utf-8")
        return subprocess.run(
            [node, "--test", str(source)], capture_output=True, text=True, timeout=60, check=False
        )

    broken = run("check_then_insert")
    assert broken.returncode != 0 and "# fail 1" in broken.stdout, broken.stdout
    fixed = run("")
    assert fixed.returncode == 0 and "# pass 1" in fixed.stdout, fixed.stdout + fixed.stderr


def test_the_node_host_and_its_steps_pass_their_own_node_tests() -> None:
    # handlers/node/test/: serve and serveSeed through their pipe, and ProtocolSteps.
    run = subprocess.run(
        [_node(), "--test", str(ROOT / "handlers" / "node" / "test")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0 and "# fail 0" in run.stdout, run.stdout + run.stderr
