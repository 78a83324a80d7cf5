"""A Java handler of the seed's interface behind ``SeedHost``, and findings as Java ``main`` tests.

``handlers/java/SeedMemoryHandler.java`` implements ``SeedHandler`` (acquire
answers a boolean, the writes take no token) and contains no protocol code:
``SeedHost`` adapts it and says ``"shape": "seed"``, so the kit judges it
under the ``seed`` profile and reports the stale holder's late write as a
hazard.  The contract's ``MemoryHandler`` without fencing is caught, and its
counterexample printed as a Java class whose ``main`` throws
``AssertionError`` on the broken handler and returns on the fixed one.  Each
run is the ``dev`` profile, seed 0, with a small budget.
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
SOURCES = sorted((ROOT / "handlers" / "java").glob("*.java"))
#: The seed's late-write hazard takes a lock, a clock move, a take-over and a late write.
MAX_HAZARD_STEPS = 6
#: A JVM that starts fast: the kit starts one process per test case.
JAVA_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is not None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{tool} is not installed (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip(f"{tool} is not installed")


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("java-seed")
    command = [_need("javac"), "-Xlint:all", "-Werror", "-d", str(out), *map(str, SOURCES)]
    subprocess.run(command, check=True, timeout=120)
    return out


def test_a_seed_shaped_java_handler_runs_unchanged_and_is_judged_under_seed(
    classes: Path,
) -> None:
    factory = exec_factory([_need("java"), *JAVA_FLAGS, "-cp", str(classes), "SeedMemoryHandler"])
    assert preflight(factory) is None
    assert (factory.shape, factory.language) == ("seed", "java")
    report = verify(factory, profile="dev", seed=0, max_examples=8, probes=False, volume=False)
    assert report.passed, "\n\n".join(r.render() for r in report.violations) or report.error
    assert report.semantics == "seed"
    assert [h.name for h in report.hazards] == ["stale_holder_late_write"]
    assert 0 < report.hazards[0].story_steps <= MAX_HAZARD_STEPS, report.hazards[0]


def test_a_java_finding_is_printed_as_a_main_that_throws_on_the_broken_handler(
    classes: Path, tmp_path: Path
) -> None:
    java = _need("java")
    command = [java, *JAVA_FLAGS, "-cp", str(classes), "MemoryHandler"]
    factory = exec_factory(command, env={"DSM_JAVA_BUG": "no_fencing"})
    assert preflight(factory) is None
    assert (factory.shape, factory.language) == ("contract", "java")
    kept: list[Finding] = []

    def keep(result: PropertyResult) -> None:
        recording = factory.last_recording
        overlaps = [overlapped for _, _, overlapped in recording.entries]
        kept.append(Finding(result.name, 0, recording.lines(), result.message, overlaps))

    report = verify(
        factory, profile="dev", seed=0, stop_on_first=True, probes=False, on_violation=keep
    )
    assert [v.name for v in report.violations] in (
        ["stale_write_rejected"],
        ["spent_token_rejected"],
    ), [v.render() for v in report.violations]
    printer = printer_for(factory.command, factory.language)
    assert printer is not None and printer.suffix == ".java"
    test = printer.render(kept[-1])
    assert "new YourHandler(clock)" in test and "ProtocolSteps.expect(" in test
    source = tmp_path / "Finding.java"
    source.write_text(test.replace("new YourHandler(clock)", "new MemoryHandler()"), "utf-8")
    built = tmp_path / "classes"
    compile_ = [_need("javac"), "-d", str(built), "-cp", str(classes), str(source)]
    subprocess.run(compile_, check=True, timeout=120)
    main = test.split("final class ", 1)[1].split(" ", 1)[0]
    run = [java, *JAVA_FLAGS, "-cp", f"{built}{os.pathsep}{classes}", main]

    def outcome(bug: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DSM_JAVA_BUG": bug}
        return subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)

    broken = outcome("no_fencing")
    assert broken.returncode != 0 and "AssertionError" in broken.stderr, broken.stderr
    assert '{"error":"stale_lock"}' in broken.stderr, broken.stderr
    fixed = outcome("")
    assert fixed.returncode == 0, fixed.stderr
    assert "every step answered as the reference handler" in fixed.stdout
