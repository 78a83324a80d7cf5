"""The dimensions a scenario asks for, and whether its run reached each: nothing passes that did not run.

A scenario can ask for worlds that move: a start before midnight, retention
that runs out mid-run, long item histories, worker instances that hold
several items at once, nodes redeployed mid-run, tenants that never take a
lock.  Asking is not reaching: a redeploy after the last acquisition, a
retention no sweep outlives or an instance that never held two items at
once exercises nothing, and a pass would say more than the run showed.  So
each dimension a scenario asks for is checked against the history, and one
it never reached is a :class:`~dsm_sim.conformance.report.Gap`, ``NOT
EXERCISED``, as in the conformance kit (``docs/conformance.md``, "Nothing
passes that did not run"): the run does not pass unless the gap is waived
by name (``dsm run --waive NAME``).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping

from dsm_sim.checker.history_rows import superseded_ledger
from dsm_sim.conformance.report import Gap
from dsm_sim.history import History, OpName
from dsm_sim.micros import Micros, micros_of
from dsm_sim.scenario import NodeKind, Scenario
from dsm_sim.simulator.workload import nodes_of, tenant_ids

__all__ = ["Dimension", "asked", "dimension_gaps"]


class Dimension(enum.Enum):
    """A dimension a scenario can ask for; its value is the name ``--waive`` takes."""

    #: ``run.start``: a lock live across midnight (the calendar day changes under it).
    MIDNIGHT = "midnight"
    #: A node retention shorter than the fault phase: a retention sweep expires a record mid-run.
    RETENTION = "retention"
    #: An upserting node with such a retention: a retention sweep expires a superseded row.
    HISTORY = "history"
    #: ``run.instance_items`` > 1: a worker instance holds two items or more at once.
    INSTANCES = "instances"
    #: ``[[deployments]]``: a key written under two deployments' options.
    DEPLOYMENTS = "deployments"
    #: ``run.lock_free_tenants``: a record of a tenant that never locks is expired by retention.
    LOCK_FREE_TENANTS = "lock-free-tenants"


_UPSERTING = (NodeKind.CORRECTION, NodeKind.APPROVAL)


def _retentions(scenario: Scenario) -> list[tuple[NodeKind, float]]:
    """Every finite retention a node runs with, first deployment or later."""
    found = [(n.kind, n.retention) for n in nodes_of(scenario) if n.retention is not None]
    kinds = {n.id: n.kind for n in nodes_of(scenario)}
    found += [(kinds[d.node], d.retention) for d in scenario.deployments if d.retention is not None]
    return [(kind, kept) for kind, kept in found if kept is not None]


def asked(scenario: Scenario, seed: int | None = None) -> list[Dimension]:
    """The dimensions ``scenario`` asks for, in :class:`Dimension` order.

    ``seed``: the run's, for what is drawn per seed (the items per instance);
    without one, what some seed may ask for.
    """
    items = scenario.instance_items[1] if seed is None else scenario.items_per_instance(seed)
    short = [(kind, kept) for kind, kept in _retentions(scenario) if kept < scenario.faults_until]
    wanted = {
        Dimension.MIDNIGHT: bool(scenario.starts),
        Dimension.RETENTION: bool(short),
        Dimension.HISTORY: any(kind in _UPSERTING for kind, _ in short),
        Dimension.INSTANCES: items > 1,
        Dimension.DEPLOYMENTS: bool(scenario.deployments),
        Dimension.LOCK_FREE_TENANTS: scenario.lock_free_tenants > 0 and bool(short),
    }
    return [dimension for dimension, on in wanted.items() if on]


def _midnight(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    def day(micros: Micros) -> dt.date:
        return history.instant(micros).date()

    for op in history.ops:
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.ok and isinstance(op.result, int):
            start = op.earliest
            if day(start) != day(start + micros_of(history.lock_duration_of(op))):
                return None
    last = max((op.store_time for op in history.ops if op.store_time is not None), default=0)
    return (
        f"no lock was live across midnight (the run started at {history.epoch.isoformat()} "
        f"and its store clock ended on {day(last).isoformat()})"
    )


def _retention(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    stop = history.faults_stop if history.faults_stop is not None else float("inf")
    for op in history.ops:
        if op.op is OpName.EXPIRE_PAST_RETENTION and op.ok and op.keys and op.invoke <= stop:
            return None
    return "no retention sweep expired a current record before faults stopped"


def _history(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    swept, stopped = superseded_ledger(history)
    if any(s.due and s.claimed > 0 for s in swept):
        return None
    if stopped is not None:
        return f"the superseded rows could not be followed: {stopped}"
    return "no retention sweep was due to expire a superseded row"


def _instances(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    most = max(held.values(), default=0)
    if most >= 2:
        return None
    return f"no worker instance held two items at once (the most was {most})"


def _deployments(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    seen: dict[str, set[tuple[float, float | None]]] = {}
    for op in history.ops:
        if op.op.is_write and op.key and op.ok:
            options = (history.lock_duration_of(op), history.retention_of(op))
            seen.setdefault(op.key, set()).add(options)
    if any(len(options) > 1 for options in seen.values()):
        return None
    return "no item was written under the options of two deployments"


def _lock_free(scenario: Scenario, history: History, held: Mapping[str, int]) -> str | None:
    tenants = set(tenant_ids(scenario)[-scenario.lock_free_tenants :])

    def theirs(key: str) -> bool:
        info = history.keys.get(key)
        return info is not None and info.tenant in tenants

    for op in history.ops:
        if op.op is OpName.EXPIRE_PAST_RETENTION and op.ok and any(map(theirs, op.keys)):
            return None
    swept, _ = superseded_ledger(history)
    if any(s.claimed > 0 and any(theirs(row.key) for row in s.due) for s in swept):
        return None
    return "no record of a tenant that never locks was expired by the retention sweep"


_CHECKS: Mapping[Dimension, Callable[[Scenario, History, Mapping[str, int]], str | None]] = {
    Dimension.MIDNIGHT: _midnight,
    Dimension.RETENTION: _retention,
    Dimension.HISTORY: _history,
    Dimension.INSTANCES: _instances,
    Dimension.DEPLOYMENTS: _deployments,
    Dimension.LOCK_FREE_TENANTS: _lock_free,
}

_WHAT = {
    Dimension.MIDNIGHT: "a day that crosses midnight (run.start)",
    Dimension.RETENTION: "retention passing mid-run (a node retention shorter than faults_until)",
    Dimension.HISTORY: "superseded history rows judged by the retention sweep",
    Dimension.INSTANCES: "instances holding several items at once (run.instance_items)",
    Dimension.DEPLOYMENTS: "a node redeployed mid-run ([[deployments]])",
    Dimension.LOCK_FREE_TENANTS: "tenants that never take a lock (run.lock_free_tenants)",
}


def dimension_gaps(
    scenario: Scenario, seed: int, history: History, held: Mapping[str, int]
) -> tuple[Gap, ...]:
    """A :class:`Gap` for each dimension ``scenario`` asks of run ``seed`` that it did not reach.

    ``held``: the most items each worker instance held at once.
    """
    gaps = []
    for dimension in asked(scenario, seed):
        reason = _CHECKS[dimension](scenario, history, held)
        if reason is not None:
            gaps.append(Gap(dimension.value, _WHAT[dimension], reason))
    return tuple(gaps)
