"""The Node.js PostgreSQL handler (``handlers/node/postgres.js``) through the protocol.

It is the one out-of-process handler whose atomicity lives in a real
database rather than in the process: each operation is one statement on a
connection pool, so racing requests really race in PostgreSQL.  It must pass
the kit at the ``dev`` profile with seed 0, keep every invariant of the
scenarios that exercise redeliveries, crashes and lost replies, and come out
of a short multi-process stress run clean; its ``check_then_insert`` mode (a
read, then an unconditional write) must be caught by the kit's races.

With ``DSM_NODE_PG_SERIAL=1`` the process serves one request at a time
(``"concurrent": false``), so requests to one process never race.  The kit
names a store on ``open`` and races its workers through more processes on
that store (peers), so the broken acquire is still caught (what the peers
add is shown deterministically in test_protocol_harness.py, where one
process of the same bug passes).

Needs node, the ``pg`` package (``npm ci`` in ``handlers/node``, which
``.ci/run`` does) and ``DSM_TEST_POSTGRES_URL``: skipped where one is
missing, and a failure under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from pathlib import Path

import pytest
from racy_acquire import RACY_ACQUIRE_BREAKS, racing_calls

from dsm_sim.conformance.generate.steps import RaceOp
from dsm_sim.conformance.runner import verify
from dsm_sim.protocol.client import ExecFactory, exec_factory
from dsm_sim.scenario import load_scenarios
from dsm_sim.simulator.run import run_scenario
from dsm_sim.stress import StressSettings, run_stress

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "handlers" / "node"
NODE_PG = NODE_DIR / "postgres.js"


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def command() -> list[str]:
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed")
    if not (NODE_DIR / "node_modules" / "pg").is_dir():
        _missing(f"the pg package is not installed: run npm ci in {NODE_DIR}")
    assert node is not None
    return [node, str(NODE_PG)]


def _factory(
    command: list[str],
    postgres_url: str,
    bug: str = "",
    *,
    serial: bool = False,
) -> ExecFactory:
    env = {"DSM_NODE_PG_URL": postgres_url, "DSM_NODE_BUG": bug}
    env["DSM_NODE_PG_SERIAL"] = "1" if serial else ""
    return exec_factory(command, env=env)


# Nightly (48 s here): on every pull request the Node in-memory handler passes the kit through
# the same protocol client (test_protocol.py), and this handler's broken acquire is caught below.
@pytest.mark.thorough
def test_the_node_postgres_handler_passes_the_kit(command: list[str], postgres_url: str) -> None:
    report = verify(_factory(command, postgres_url), profile="dev", seed=0)
    assert report.passed, "\n\n".join(r.render() for r in report.violations) or report.error
    assert report.test_cases > 0 and report.steps > 0


@pytest.mark.thorough  # the same kit as the test above, one request at a time: nightly
def test_a_handler_serving_one_request_at_a_time_passes_the_kit_through_peers(
    command: list[str], postgres_url: str
) -> None:
    factory = _factory(command, postgres_url, serial=True)
    report = verify(factory, profile="dev", seed=0, max_examples=8)
    assert report.passed, "\n\n".join(r.render() for r in report.violations) or report.error


def test_its_broken_acquire_is_caught_through_processes_on_one_store(
    command: list[str], postgres_url: str
) -> None:
    factory = _factory(command, postgres_url, bug="check_then_insert", serial=True)
    caught = verify(factory, profile="dev", seed=0, stop_on_first=True)
    # Which of its properties the race breaks first depends on when each process's reply
    # lands: a second live lock, or (under load) a Processing record written over the
    # upsert or skip that landed between the read and the insert.
    rendered = [v.render() for v in caught.violations]
    assert len(caught.violations) == 1, rendered
    assert caught.violations[0].name in RACY_ACQUIRE_BREAKS, rendered
    assert RaceOp.ACQUIRE in racing_calls(caught.violations[0].program), rendered


@pytest.mark.parametrize("name", ["duplicate-storm", "crash-mid-dispatch", "lost-replies"])
def test_the_node_postgres_handler_keeps_every_invariant_of_a_scenario(
    command: list[str], postgres_url: str, name: str
) -> None:
    (scenario,) = load_scenarios(ROOT / "scenarios" / f"{name}.toml")
    factory = _factory(command, postgres_url)
    result = run_scenario(scenario, 1, factory, handler_name=f"exec:{shlex.join(command)}")
    assert result.passed, result.violated
    assert result.stats["side_effects"], result.stats


def test_the_node_postgres_handler_passes_a_short_stress_run(
    command: list[str], postgres_url: str
) -> None:
    settings = StressSettings(
        db_url=postgres_url,
        handler_spec=f"exec:{shlex.join(command)}",
        processes=2,
        workers=4,
        keys=40,
        duplicates=3,
        seed=1,
        fault_free=True,
    )
    report = asyncio.run(run_stress(settings, limit_s=120))
    assert report.passed, report.summary()
    assert report.effects == settings.keys
    assert not report.duplicate_keys
    assert report.unnamed_errors == {}
    assert report.exit_codes == (0, 0)
