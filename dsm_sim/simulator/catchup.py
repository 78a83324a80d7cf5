"""The catch-up worker as a SimPy process: the expired-lock sweep on its schedule.

Each tick runs the real :class:`~reference_engine.catchup.CatchupWorkerService`
once (``run_once``: the expired-lock sweep, then the retention sweep); its
asyncio timer is replaced by the SimPy schedule.  Around each run it reads
every key a worker ever tried to lock, outside the history, so the recorded sweep
says *which* keys it reset; that is what lets the checker prove "the sweep
never resets a live lock" instead of only counting.  Pauses (catch-up
outages) come from the fault schedule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator
from typing import Any

from dsm_sim.history import EventKind, OpName, Outcome
from dsm_sim.simulator.world import World
from reference_engine.catchup import CatchupWorkerService
from reference_engine.status import IdempotencyStatus

__all__ = ["CATCHUP", "catchup_process", "pause_markers"]

#: The catch-up worker's lane name.
CATCHUP = "catchup"


def catchup_process(world: World) -> Generator[Any, Any, None]:
    """Every ``sweep_interval``: one run of the real catch-up service, both sweeps recorded."""
    env = world.env
    interval = world.scenario.sweep_interval
    service = CatchupWorkerService(world.handler, interval=dt.timedelta(seconds=interval))
    while True:
        yield env.timeout(interval)
        if world.faults.catchup_paused(world.now):
            continue
        index = world.recorder.invoke(CATCHUP, OpName.RESET_EXPIRED_LOCKS, "", world.now)
        yield env.timeout(world.latency(world.scenario.latency.store))
        # Read right before and right after the run, at the same instant, so nothing
        # but the sweeps can explain a difference.
        before = world.probe(world.touched)
        store_time = world.clock.seconds()
        try:
            result = world.loop.run_until_complete(service.run_once())
        except Exception as exc:  # the sweep's outcome is unknown; it may have run
            world.recorder.complete(
                index, Outcome.INFO, world.now, error=type(exc).__name__, store_time=store_time
            )
            continue
        processing = [
            key
            for key, record in before.items()
            if record is not None and record.status is IdempotencyStatus.PROCESSING
        ]
        after = world.probe(processing)
        reset = []
        for key in processing:
            record = after.get(key)
            if record is None or record.status is not IdempotencyStatus.PROCESSING:
                reset.append(key)
        world.recorder.complete(
            index,
            Outcome.OK,
            world.now,
            result=result.locks_reset,
            store_time=store_time,
            keys=reset,
        )
        expire = world.recorder.invoke(CATCHUP, OpName.EXPIRE_PAST_RETENTION, "", world.now)
        world.recorder.complete(
            expire, Outcome.OK, world.now, result=result.records_expired, store_time=store_time
        )


def pause_markers(world: World) -> Generator[Any, Any, None]:
    """Put catch-up outages on the timeline."""
    env = world.env
    for pause in world.faults.faults.catchup_pauses:
        start = min(pause.at, world.faults.faults_until)
        end = min(pause.at + pause.duration, world.faults.faults_until)
        if start >= end:
            continue
        if start > world.now:
            yield env.timeout(start - world.now)
        world.event(EventKind.CATCHUP_PAUSE, process=CATCHUP, detail=f"paused for {end - start:g}s")
        yield env.timeout(end - world.now)
        world.event(EventKind.CATCHUP_RESUME, process=CATCHUP)
