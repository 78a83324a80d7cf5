"""The Node.js in-memory handler as a server (``node handlers/node/memory.js --tcp``).

A store in one process's memory is out of every other process's reach, so on
stdin the handler is verified one process per test case.  As a server it
holds its stores for every connection: the kit's peers reach a test case's
named store through connections of their own, and ``dsm stress`` runs its
processes on the server's one store.  The correct handler must pass both;
its ``check_then_insert`` mode must be caught by the stress run's checker,
which sees only what the stress processes did through the server.

Node is skipped where missing, and a failure under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

import pytest
from handler_servers import serving

from dsm_sim.conformance.runner import verify
from dsm_sim.protocol.client import tcp_factory
from dsm_sim.stress import StressReport, StressSettings, run_stress

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_HANDLER = ROOT / "handlers" / "node" / "memory.js"


def _node() -> str:
    path = shutil.which("node")
    if path is not None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("node is not installed (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip("node is not installed")


def _server(bug: str = "") -> contextlib.AbstractContextManager[str]:
    """A ``memory.js --tcp`` server on a free port: its address."""
    command = [_node(), str(NODE_HANDLER), "--tcp", "127.0.0.1:0"]
    return serving(command, env={**os.environ, "DSM_NODE_BUG": bug})


def _stress(address: str, tmp_path: Path, seed: int) -> StressReport:
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / f'ledger-{seed}.db'}",
        handler_spec=f"exec-tcp:{address}",
        processes=2,
        workers=4,
        keys=30,
        duplicates=3,
        seed=seed,
        fault_free=True,
    )
    return asyncio.run(run_stress(settings, limit_s=60))


# Nightly: test_protocol.py's test_node_handler_passes_the_kit runs the kit on this handler on every PR.
@pytest.mark.thorough
def test_the_server_passes_the_kit_through_peers_on_named_stores() -> None:
    with _server() as address:
        factory = tcp_factory(address)
        report = verify(factory, profile="dev", seed=0, max_examples=6, waive=["time-zones"])
    assert report.passed, "\n\n".join(r.render() for r in report.violations) or report.error
    opens = [line for line in factory.last_transcript if b'"op":"open"' in line]
    assert opens and b'"store":"dsm_' in opens[0], opens


def test_the_server_passes_a_short_stress_run(tmp_path: Path) -> None:
    with _server() as address:
        report = _stress(address, tmp_path, seed=1)
    assert report.passed, report.summary()
    assert report.effects == 30
    assert not report.duplicate_keys
    assert report.exit_codes == (0, 0)


def test_a_check_then_insert_server_is_caught_by_a_stress_run(tmp_path: Path) -> None:
    caught = None
    with _server(bug="check_then_insert") as address:
        for seed in range(3):
            report = _stress(address, tmp_path, seed=seed)
            if not report.passed:
                caught = report
                break
    assert caught is not None, "the check-then-insert server survived three contended runs"
    assert caught.duplicate_keys
    assert not {r.name: r.passed for r in caught.results}["no_duplicate_side_effect"]
