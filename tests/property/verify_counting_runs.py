"""``python verify_counting_runs.py COUNT_FILE ARGS...``: ``python -m dsm_sim.cli ARGS``, counting.

Writes to COUNT_FILE how many runs of the search ran in the command's own
process (:meth:`Verification.run_seed_here`): with ``--jobs 2`` every run
should come from a worker, and a run here means a worker's was not kept.
The command itself is run as ``python -m dsm_sim.cli`` runs it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from dsm_sim.conformance.seeds import SeedRun, SeedWork
from dsm_sim.conformance.verification import Verification

if __name__ == "__main__":
    count_file = Path(sys.argv.pop(1))
    here: list[int] = []
    original = Verification.run_seed_here

    def counted(self: Verification, work: SeedWork) -> SeedRun:
        here.append(work.seed)
        return original(self, work)

    Verification.run_seed_here = counted  # type: ignore[method-assign]
    try:
        runpy.run_module("dsm_sim.cli", run_name="__main__", alter_sys=True)
    finally:
        count_file.write_text(f"{len(here)}\n", encoding="utf-8")
