"""Fault injection: which faults are on for this seed, and whether one fires now.

Following deterministic-simulation practice, a scenario's fault families are
fixed per run (or, in swarm mode, each is switched on with a probability per
seed and its rate scaled), then each fault site fires on a fraction of calls.
Every family draws from its own seeded stream, so adding draws to one never
shifts another, and the same seed always injects the same faults.  Nothing
fires after ``faults_until``: from then on the run only settles.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace
from typing import Any

from dsm_sim.history import Scalar
from dsm_sim.scenario import (
    CatchupPause,
    ClockJump,
    CrashPoint,
    Faults,
    Scenario,
)

__all__ = [
    "ExecutionPlan",
    "FaultInjector",
    "StoreFault",
    "active_faults",
    "describe",
    "stream",
]


def stream(seed: int, name: str) -> random.Random:
    """An independent, reproducible random stream for one concern of one run."""
    return random.Random(f"{seed}/{name}")


class StoreFault(enum.Enum):
    """A transient store error raised before the call (it did not happen) or after (it did)."""

    BEFORE = "before"
    AFTER = "after"


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The faults decided for one node execution when the worker picks up a message."""

    crash: CrashPoint | None = None
    slow: bool = False
    #: The business call fails (nothing charged), so the node releases its lock.
    effect_fails: bool = False


def active_faults(scenario: Scenario, seed: int) -> Faults:
    """The scenario's faults, or in swarm mode a random mix of them chosen by the seed."""
    faults = scenario.faults
    if not faults.swarm:
        return faults
    rng = stream(seed, "swarm")
    lock = scenario.lock_duration
    horizon = scenario.faults_until

    def on() -> bool:
        return rng.random() < 0.5

    def scaled(rate: float) -> float:
        return round(rate * rng.uniform(0.3, 1.0), 3) if on() else 0.0

    jumps: tuple[ClockJump, ...] = ()
    if on():
        jumps = tuple(
            sorted(
                (
                    ClockJump(
                        at=round(rng.uniform(0.1, 0.8) * horizon, 3),
                        by=round(rng.choice((-1, 1)) * rng.uniform(0.5, 2.0) * lock, 3),
                    )
                    for _ in range(rng.randint(1, 2))
                ),
                key=lambda j: j.at,
            )
        )
    pauses: tuple[CatchupPause, ...] = ()
    if on():
        start = round(rng.uniform(0.0, 0.5) * horizon, 3)
        pauses = (CatchupPause(at=start, duration=round(rng.uniform(0.1, 0.4) * horizon, 3)),)
    return replace(
        faults,
        duplicate=replace(faults.duplicate, rate=scaled(faults.duplicate.rate or 0.5)),
        crash=replace(faults.crash, rate=scaled(faults.crash.rate or 0.2)),
        slow=replace(faults.slow, rate=scaled(faults.slow.rate or 0.1)),
        clock_jumps=jumps,
        skew=replace(faults.skew, max=round(rng.uniform(0, lock / 2), 3) if on() else 0.0),
        store=replace(faults.store, rate=scaled(faults.store.rate or 0.05)),
        catchup_pauses=pauses,
    )


def describe(faults: Faults) -> dict[str, Scalar]:
    """The active faults as flat JSON scalars, for reports."""
    return {
        "duplicate_rate": faults.duplicate.rate,
        "crash_rate": faults.crash.rate,
        "crash_points": ",".join(p.value for p in faults.crash.points),
        "slow_rate": faults.slow.rate,
        "slow_factor": faults.slow.factor,
        "clock_jumps": ";".join(f"{j.by:+g}s@{j.at:g}s" for j in faults.clock_jumps),
        "skew_max": faults.skew.max,
        "store_error_rate": faults.store.rate,
        "lost_reply_rate": faults.lost_reply.rate,
        "catchup_pauses": ";".join(f"{p.duration:g}s@{p.at:g}s" for p in faults.catchup_pauses),
        "swarm": faults.swarm,
    }


class FaultInjector:
    """Answers "does a fault fire here?" for every fault site, from the run's seed."""

    def __init__(self, faults: Faults, seed: int, faults_until: float, env: Any) -> None:
        self.faults = faults
        self.faults_until = faults_until
        self.env = env
        self._exec = stream(seed, "executions")
        self._dup = stream(seed, "duplicates")
        self._store = stream(seed, "store")
        self._skew = stream(seed, "skew")
        self._effect = stream(seed, "effects")
        self._lost = stream(seed, "lost-replies")
        # Buggify: the family is switched on for the whole run, or not at all.
        lost = faults.lost_reply
        self.lost_replies = lost.rate > 0 and stream(seed, "buggify").random() < lost.enabled

    @property
    def active(self) -> bool:
        return float(self.env.now) < self.faults_until

    def execution_plan(self) -> ExecutionPlan:
        # Draw unconditionally so the stream does not depend on which faults are on.
        crash_draw, point_draw, slow_draw = (
            self._exec.random(),
            self._exec.random(),
            self._exec.random(),
        )
        # A stream of its own, so scenarios without effect faults replay as before.
        effect_draw = self._effect.random()
        if not self.active:
            return ExecutionPlan()
        crash_cfg = self.faults.crash
        crash = None
        if crash_cfg.points and crash_draw < crash_cfg.rate:
            crash = crash_cfg.points[int(point_draw * len(crash_cfg.points))]
        return ExecutionPlan(
            crash=crash,
            slow=slow_draw < self.faults.slow.rate,
            effect_fails=effect_draw < self.faults.effect.rate,
        )

    def apply_during_set(self) -> bool:
        """A crash during set: did the write reach the store before the worker died?"""
        return self._exec.random() < 0.5

    def duplicate_delays(self) -> list[float]:
        dup = self.faults.duplicate
        draw = self._dup.random()
        count = self._dup.randint(*dup.copies)
        delays = [self._dup.uniform(*dup.delay) for _ in range(count)]
        if not self.active or draw >= dup.rate:
            return []
        return delays

    def store_fault(self) -> StoreFault | None:
        draw, where = self._store.random(), self._store.random()
        if not self.active or draw >= self.faults.store.rate:
            return None
        return StoreFault.AFTER if where < self.faults.store.after_fraction else StoreFault.BEFORE

    def lost_reply(self) -> bool:
        """A write landed; does its reply get lost, so the worker sees a StoreError?"""
        if not self.lost_replies:
            return False
        draw = self._lost.random()
        return self.active and draw < self.faults.lost_reply.rate

    def worker_skews(self, workers: int) -> list[float]:
        limit = self.faults.skew.max
        return [round(self._skew.uniform(-limit, limit), 6) for _ in range(workers)]

    def catchup_paused(self, now: float) -> bool:
        if now >= self.faults_until:
            return False
        return any(p.at <= now < p.at + p.duration for p in self.faults.catchup_pauses)

    def clock_jumps(self) -> list[ClockJump]:
        return [j for j in self.faults.clock_jumps if j.at < self.faults_until]
