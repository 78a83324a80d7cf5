"""Every committed scenario keeps every invariant with the correct handlers.

In-memory runs each scenario's first three seeds; SQLite and PostgreSQL run
one seed per scenario (PostgreSQL each run in its own schema, dropped
afterwards).  ``nox -s chaos`` runs more seeds on every store.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiers import every_other_nightly

from dsm_sim.history import EventKind
from dsm_sim.scenario import Scenario, load_scenario
from dsm_sim.simulator.run import RunResult, run_scenario
from reference_engine.clock import Clock
from reference_engine.handler import StateHandler

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SCENARIO_FILES = sorted(SCENARIOS.glob("*.toml"))
REQUIRED = {
    "duplicate-storm",
    "crash-mid-dispatch",
    "slow-worker",
    "clock-jump-forward",
    "clock-jump-backward",
    "skewed-workers",
    "flaky-store",
    "catchup-outage",
    "swarm",
    "correction-upserts",
    "screening-rules",
    "short-locks",
    "retention-window",
    "tenants-and-keys",
    "lost-replies",
    "time-grid",
    "race-windows",
}
SEEDS = (1, 2, 3)
HAS_SQL = importlib.util.find_spec("reference_engine.handlers.sql.factory") is not None


def _describe(result: RunResult) -> str:
    lines = [f"{result.scenario.name} seed {result.seed} failed; replay: {result.replay}"]
    lines += [f"  {r.name}: {v.message}" for r in result.results for v in r.violations[:5]]
    return "\n".join(lines)


def _scenario(path: Path) -> Scenario:
    return load_scenario(path.relative_to(SCENARIOS.parent))


def test_every_required_scenario_is_committed() -> None:
    names = {load_scenario(path).name for path in SCENARIO_FILES}
    assert names >= REQUIRED


def test_every_scenario_file_explains_itself() -> None:
    for path in SCENARIO_FILES:
        header = path.read_text(encoding="utf-8").splitlines()[:3]
        assert all(line.startswith("#") for line in header), path.name


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
def test_in_memory_handler_keeps_every_invariant(path: Path, seed: int) -> None:
    result = run_scenario(_scenario(path), seed)
    assert result.passed, _describe(result)
    assert int(result.stats["side_effects"] or 0) >= 1


@pytest.mark.skipif(not HAS_SQL, reason="the SQL handlers are not part of this installation")
@pytest.mark.parametrize("seed", SEEDS[:1])
@pytest.mark.parametrize("path", every_other_nightly(SCENARIO_FILES))
def test_sqlite_handler_keeps_every_invariant(path: Path, seed: int) -> None:
    result = run_scenario(
        _scenario(path), seed, "reference_engine.handlers.sql.factory:sqlite_memory_handler"
    )
    assert result.passed, _describe(result)


def _on_servers() -> list[Any]:
    """Every scenario on both servers nightly; on a pull request, each on one SQL store.

    The scenarios SQLite runs on every pull request (``every_other_nightly``, the
    even ones) meet the servers in the thorough tier (``--thorough``); each of
    the others runs on one server, alternating PostgreSQL and MariaDB.  The
    handler's code is the same on the three stores; what is the servers' own
    (isolation, concurrency) the SQL conformance suite and the stress runs
    check on both servers on every pull request.
    """
    params = []
    for index, path in enumerate(SCENARIO_FILES):
        for server in ("postgres", "mariadb"):
            marks = [getattr(pytest.mark, server)]
            if not (index % 2 and server == ("postgres", "mariadb")[index // 2 % 2]):
                marks.append(pytest.mark.thorough)
            params.append(pytest.param(path, server, marks=marks, id=f"{path.stem}-{server}"))
    return params


@pytest.mark.integration
@pytest.mark.parametrize(("path", "server"), _on_servers())
def test_server_handler_keeps_every_invariant(
    path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    """The built-in handler on a database server, in a schema (database) of the run's own."""
    from reference_engine.handlers.sql.factory import (
        mariadb_isolated_handler,
        postgres_isolated_handler,
    )

    url: str = request.getfixturevalue(f"{server}_url")
    isolated = postgres_isolated_handler if server == "postgres" else mariadb_isolated_handler

    def factory(clock: Clock) -> StateHandler:
        return isolated(url, clock)

    result = run_scenario(_scenario(path), 1, factory, handler_name=server)
    assert result.passed, _describe(result)


def test_sqlite_and_memory_tell_the_same_story() -> None:
    """Same seed, same decisions: a correct SQL store yields the same outcomes as the model."""
    if not HAS_SQL:
        pytest.skip("the SQL handlers are not part of this installation")
    scenario = _scenario(SCENARIOS / "crash-mid-dispatch.toml")
    memory = run_scenario(scenario, 2)
    sqlite = run_scenario(
        scenario, 2, "reference_engine.handlers.sql.factory:sqlite_memory_handler"
    )
    assert memory.stats == sqlite.stats
    assert [f.status for f in memory.history.final] == [f.status for f in sqlite.history.final]


def test_faults_actually_fire() -> None:
    """A scenario that injects nothing would pass vacuously; check each family leaves a trace."""
    checks: dict[str, Callable[[RunResult], bool]] = {
        "duplicate-storm": lambda r: int(r.stats["deliveries"] or 0) > int(r.stats["items"] or 0),
        "crash-mid-dispatch": lambda r: int(r.stats["crashes"] or 0) > 0,
        "slow-worker": lambda r: int(r.stats["stale_writes_rejected"] or 0) > 0,
        "clock-jump-forward": lambda r: any(
            e.kind is EventKind.CLOCK_JUMP for e in r.history.events
        ),
        "flaky-store": lambda r: int(r.stats["store_errors"] or 0) > 0,
        "catchup-outage": lambda r: any(
            e.kind is EventKind.CATCHUP_PAUSE for e in r.history.events
        ),
    }
    for name, check in checks.items():
        result = run_scenario(_scenario(SCENARIOS / f"{name}.toml"), 1)
        assert check(result), name


def test_slow_worker_shows_fencing_at_work() -> None:
    """The teaching case: a lease is violated, a second charge happens, fencing rejects the stale set."""
    result = run_scenario(_scenario(SCENARIOS / "slow-worker.toml"), 2)
    assert result.passed
    effects = next(r for r in result.results if r.name == "no_duplicate_side_effect")
    fencing = next(r for r in result.results if r.name == "stale_write_rejected")
    assert any("fencing rejected the stale set" in note for note in effects.notes)
    assert fencing.notes


def test_crashes_happen_at_every_crash_point() -> None:
    scenario = _scenario(SCENARIOS / "crash-mid-dispatch.toml")
    seen: set[str] = set()
    for seed in SEEDS:
        history = run_scenario(scenario, seed).history
        seen |= {e.detail for e in history.events if e.kind is EventKind.CRASH}
    assert seen == {"before_acquire", "after_acquire", "after_effect", "during_set"}


def test_locks_of_crashed_workers_are_swept_or_taken_over() -> None:
    """Recovery end to end: a lock left by a crash is reset by the sweep, or a retry takes
    the expired lock over with the next token; every item ends Processed."""
    result = run_scenario(_scenario(SCENARIOS / "catchup-outage.toml"), 1)
    history = result.history
    swept = {key for op in history.ops for key in op.keys}
    crashes = [e for e in history.events if e.kind is EventKind.CRASH and e.token is not None]
    assert crashes
    for crash in crashes:
        later_tokens = [
            op.token
            for op in history.ops_for(crash.key)
            if op.op.value == "try_acquire_lock" and op.ok and op.invoke > crash.time
        ]
        assert crash.key in swept or any(
            t is not None and crash.token is not None and t > crash.token for t in later_tokens
        ), crash
    assert all(f.status == "processed" for f in history.final)


def _ops(name: str, seed: int = 1) -> RunResult:
    return run_scenario(_scenario(SCENARIOS / f"{name}.toml"), seed)


def test_the_new_node_paths_are_reached() -> None:
    """Each multi-node scenario exercises the path it exists for, or it would pass vacuously."""
    corrections = _ops("correction-upserts").history
    assert any(
        op.op.value == "upsert"
        and op.ok
        and op.before is not None
        and op.before.status == "processed"
        for op in corrections.ops
    ), "no upsert superseded a Processed record"
    screening = _ops("screening-rules").history
    assert any(
        op.op.value == "set" and op.status == "skipped" and op.token is None for op in screening.ops
    )
    assert any(op.op.value == "release_lock_as_failed" and op.ok for op in screening.ops)
    scopes = {info.scope for info in screening.keys.values()}
    assert {3, 4, 5} <= scopes, scopes
    lost = _ops("lost-replies")
    assert lost.stats["lost_replies_on"] is True
    landed = [
        op
        for op in lost.history.ops
        if op.op.is_write and op.error == "StoreError" and op.probed and op.after != op.before
    ]
    assert landed, "no write landed while its worker saw a StoreError"
    retried = [
        op
        for op in lost.history.ops
        if op.op.is_write
        and op.ok
        and op.token is not None
        and any(w.key == op.key and w.token == op.token and w.index < op.index for w in landed)
    ]
    assert retried, "no worker retried, with its token, a write that had landed"
    retention = _ops("retention-window").history
    assert any(op.op.value == "expire_past_retention" and op.keys for op in retention.ops)
    locks = {info.lock_duration for info in _ops("short-locks").history.keys.values()}
    assert {3.0, 40.0, 1800.0} <= locks, locks


def test_time_grid_puts_every_call_on_the_grid() -> None:
    history = _ops("time-grid").history
    assert history.ops
    for op in history.ops:
        assert op.invoke % 250_000 == 0, op  # microseconds, on the 0.25 s grid


def test_varied_keys_reach_the_store_unchanged() -> None:
    history = _ops("tenants-and-keys").history
    items = {info.item for info in history.keys.values()}
    tenants = {info.tenant for info in history.keys.values()}
    assert {"INV-0001", "inv-0001", " INV-0001", "caf\u00e9-0002", "cafe\u0301-0002"} <= items
    assert {"tenant-a", "Tenant-A", "tenant-a "} <= tenants
    assert max(len(item) for item in items) == 256
