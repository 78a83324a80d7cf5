"""The JSON reports of seeded in-memory runs, pinned byte for byte across changes to the code.

``test_determinism.py`` runs a seed twice in one process; this compares
with the reports the code gave before, by SHA-256.  A change meant to make
the evidence cheaper (the reads, the recorder, the checker: see
docs/performance.md, "Evidence cost") must leave every byte of every report
as it was, so these stay put.  A change that means to change what a report
says updates them: ``python tests/scenario/test_report_bytes.py`` prints the
current digests.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dsm_sim.reports.json_report import to_json
from dsm_sim.scenario import load_scenario
from dsm_sim.simulator.run import run_scenario

pytestmark = pytest.mark.scenario

ROOT = Path(__file__).resolve().parents[2]
SEED = 1
#: SHA-256 of ``to_json(run_scenario(scenario, 1))``, in-memory handler: sweeps and a
#: catch-up outage, crashes, a backward clock jump, upserts, lost replies, a swarm.
PINNED = {
    "catchup-outage": "8ead6d50d763bca989a260ebd57ef039c5cf798b25c1211e30f29b20eac14458",
    "crash-mid-dispatch": "000538e99c779a07461b59915e948cc6d3d12d2ca640d2611c56e314ec7023db",
    "clock-jump-backward": "88fa4f36c77fe1a59bfd94f2024613fa53625417a970cfd0389e1724ec8dd649",
    "correction-upserts": "b5676dbaec6b2d492806d08a0a1e0e798cfc1e69ade6755d3f0691bca129ad2a",
    "lost-replies": "fafc20bd2f6ff51cd0841678279ea0ce659bba9bf9130b990470c6c13f07440a",
    "swarm": "6c1dd9957f72c92ed47b1825d76e29e20cefe8aaecc0fbea16505b9cef29408b",
}


def report_digest(name: str) -> str:
    """The digest of the run's report; the scenario is named as ``dsm run`` from the root would be.

    (A report names its scenario's path as given, in the replay command.)
    """
    run = run_scenario(load_scenario(Path("scenarios") / f"{name}.toml"), SEED)
    return hashlib.sha256(to_json(run).encode("utf-8")).hexdigest()


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_report_of_a_seeded_run_is_byte_for_byte_the_pinned_one(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert report_digest(name) == PINNED[name], (
        f"the JSON report of {name} seed {SEED} changed; if that is meant, "
        "print the new digests with: python tests/scenario/test_report_bytes.py"
    )


if __name__ == "__main__":
    os.chdir(ROOT)
    for scenario in sorted(PINNED):
        print(f'    "{scenario}": "{report_digest(scenario)}",')
