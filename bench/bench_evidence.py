"""Evidence cost: µs per simulated delivery and per kit handler call, this code against a base commit.

Both tools spend most of their time on the evidence around each handler
call (the reads, the recorder, the checker, the kit's judging), so the
figure that says whether a change made evidence cheaper is the CPU time per
unit of work: per delivery of ``dsm run`` (in-memory handler, every scenario
at a few seeds, in one process) and per handler call of ``dsm verify``
(in-memory handler, seed 0).  The baseline is the same workload on the code
of a base commit (``DSM_BENCH_EVIDENCE_BASE``, default the commit before the
evidence cuts), unpacked from git into a temporary directory, measured in
the same run on the same machine.

The machine is shared, so the sides alternate (old, new, old, new ...: each
round runs both), each in a fresh process (``evidence_workload.py``), and the
table gives the median of each side and the load average before and after.
A speed-up that changed a result would be no speed-up: every report of
both sides (every run's JSON report; the verification's JSON report without
its wall-clock ``seconds``) is hashed, and the benchmark fails unless the
hashes and the counts agree.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import BenchSkipped, Table, compile_tree

__all__ = ["TITLE", "run"]

TITLE = "Evidence cost: CPU µs per simulated delivery (dsm run) and per kit call (dsm verify), base vs this code"
HEADERS = (
    "workload",
    "count",
    "base µs/unit",
    "this µs/unit",
    "this/base",
    "rounds",
    "reports",
)
ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(__file__).resolve().parent / "evidence_workload.py"
#: The commit the evidence cuts started from; any commit or ref may be named instead.
BASE_ENV = "DSM_BENCH_EVIDENCE_BASE"
DEFAULT_BASE = "a8ed8f7"
#: Rounds in full mode (each runs both sides); short mode runs one.
ROUNDS = 5
#: Seeds per scenario of the ``dsm run`` workload (full, short).
SEEDS = (3, 1)
#: Short mode (CI) runs these scenarios only, and times verify without filling its cache
#: first: it proves the benchmark runs and compares the reports, in about 20 s.
SHORT = ("duplicate-storm", "slow-worker", "flaky-store", "crash-mid-dispatch")


def _unpack(ref: str, into: Path) -> None:
    """The tree of ``ref`` in ``into`` (``git archive``: no worktree, nothing left registered)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", ref],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BenchSkipped(f"cannot unpack the base commit {ref!r} from git: {exc}") from exc
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def _side(tree: Path, args: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(short: bool) -> list[Table]:
    base = os.environ.get(BASE_ENV, DEFAULT_BASE)
    rounds = 1 if short else ROUNDS
    seeds = SEEDS[1] if short else SEEDS[0]
    chosen = list(SHORT) if short else []
    workloads = {
        f"dsm run: {', '.join(chosen) or 'scenarios/'} x seeds 1-{seeds}, per delivery": [
            "run",
            str(ROOT / "scenarios"),
            str(seeds),
            *chosen,
        ],
        "dsm verify --profile dev, per handler call": ["verify", "dev", "{cache}"],
    }
    load_before = os.getloadavg()
    rows: list[tuple[object, ...]] = []
    with tempfile.TemporaryDirectory(prefix="dsm-evidence-") as scratch:
        old_tree = Path(scratch) / "base"
        old_tree.mkdir()
        _unpack(base, old_tree)
        # No side pays for compiling its bytecode: bench/run.py compiled this checkout.
        compile_tree(old_tree)
        for name, args in workloads.items():
            samples: dict[str, list[float]] = {"base": [], "this": []}
            seen: dict[str, set[tuple[object, object]]] = {"base": set(), "this": set()}
            # Round 0 (verify only) is not timed: it fills each side's cache of
            # Hypothesis' files, as any earlier dsm verify on the machine would have.
            first = 0 if "{cache}" in args and not short else 1
            for round_ in range(first, rounds + 1):
                for side, tree in (("base", old_tree), ("this", ROOT)):
                    cache = str(old_tree.parent / f"{old_tree.name}-{side}-cache")
                    result = _side(tree, [a.replace("{cache}", cache) for a in args])
                    if round_ == 0:
                        continue
                    count = result["count"]
                    assert isinstance(count, int) and count > 0
                    cpu = result["cpu"]
                    assert isinstance(cpu, float)
                    samples[side].append(cpu / count * 1e6)
                    seen[side].add((count, result["reports"]))
            if len(seen["base"]) != 1 or seen["base"] != seen["this"]:
                raise RuntimeError(
                    f"{name}: the sides disagree (count, report hash): "
                    f"base {sorted(map(str, seen['base']))}, this {sorted(map(str, seen['this']))}"
                )
            ((count, _),) = seen["this"]
            old, new = statistics.median(samples["base"]), statistics.median(samples["this"])
            rows.append((name, count, old, new, new / old, rounds, "identical"))
    load_after = os.getloadavg()
    warmed = "" if short else " (verify after an untimed round that fills its cache)"
    note = (
        f"base: {base} (${BASE_ENV}); CPU time of the timed part in a fresh process per side "
        f"and round, sides alternating, median of {rounds}{warmed}; load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; reports: the SHA-256 of "
        "every report of both sides agrees, and so do the counts"
    )
    return [Table(TITLE, HEADERS, rows, note)]
