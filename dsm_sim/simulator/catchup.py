"""The catch-up worker as a SimPy process: the expired-lock sweep on its schedule.

Each tick does what :meth:`~reference_engine.catchup.CatchupWorkerService.run_once`
does (the expired-lock sweep, then the retention sweep); its asyncio timer is
replaced by the SimPy schedule.  Around each sweep it reads every key a
worker ever wrote, outside the history, so the recorded sweep says *which*
keys it changed and which were due; that is what lets the checker prove "the
sweep never resets a live lock" and "the sweep resets every expired lock"
instead of only counting.  Pauses (catch-up
outages) come from the fault schedule.

A library whose semantics profile has no lock sweep (``lock_sweep=False``)
or drops records by a TTL instead of a retention sweep is not asked for the
sweep it lacks; with neither, the catch-up worker does nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from dsm_sim.conformance.judge.semantics import Retention
from dsm_sim.history import EventKind, OpName, Outcome
from dsm_sim.simulator.bridge import RunStoppedError
from dsm_sim.simulator.world import World
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["CATCHUP", "catchup_process", "pause_markers"]

#: The catch-up worker's lane name.
CATCHUP = "catchup"


def catchup_process(world: World) -> Generator[Any, Any, None]:
    """Every ``sweep_interval``: the catch-up service's two sweeps, each recorded with its keys.

    The service's ``run_once`` is the expired-lock sweep followed by the
    retention sweep; the two are called here one after the other, exactly as
    ``run_once`` does, so each can be read around on its own.
    """
    env = world.env
    interval = world.scenario.sweep_interval
    handler = world.handler
    locks = world.semantics.lock_sweep
    retention = world.semantics.retention is Retention.SWEEP
    if not (locks or retention):
        return  # the library has neither sweep
    while True:
        yield env.timeout(interval)
        if world.faults.catchup_paused(world.now):
            continue
        if locks:
            index = world.recorder.invoke(CATCHUP, OpName.RESET_EXPIRED_LOCKS, "", world.micros)
            yield env.timeout(world.latency(world.scenario.latency.store))
            if not _sweep(world, index, handler.reset_expired_locks, _lock_due):
                continue
        if retention:
            expire = world.recorder.invoke(CATCHUP, OpName.EXPIRE_PAST_RETENTION, "", world.micros)
            if not locks:
                yield env.timeout(world.latency(world.scenario.latency.store))
            _sweep(world, expire, handler.expire_past_retention, _retention_due)


def _lock_due(record: StateRecord | None, now: dt.datetime) -> bool:
    return (
        record is not None
        and record.status is IdempotencyStatus.PROCESSING
        and record.locked_until is not None
        and _aware(record.locked_until) < now
    )


def _retention_due(record: StateRecord | None, now: dt.datetime) -> bool:
    return (
        record is not None
        and record.retain_until is not None
        and _aware(record.retain_until) < now
        and record.status is not IdempotencyStatus.EXPIRED
        and not record.lock_live(now)
    )


def _aware(instant: dt.datetime) -> dt.datetime:
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=dt.UTC)


def _sweep(
    world: World,
    index: int,
    run: Callable[[], Coroutine[Any, Any, int]],
    due: Callable[[StateRecord | None, dt.datetime], bool],
) -> bool:
    """Run one sweep; record the keys it changed and the keys that were due (same instant).

    Only the keys the sweep can have to do with are read around it (the last
    record seen was Processing, or was due); if the sweep reports more changes
    than those keys show, every key is read again to find them.
    """
    now = world.clock.now()
    suspects = world.known_where(lambda r: r.status is IdempotencyStatus.PROCESSING or due(r, now))
    # Read right before and right after the sweep, at the same instant, so nothing
    # but the sweep can explain a difference.
    before = world.probe(suspects)
    store_time = world.clock.micros()
    previous = dict(world.known)
    try:
        result = world.driver.complete(run(), f"{getattr(run, '__name__', 'sweep')}()")
    except RunStoppedError:
        raise  # stops the run, as a hung node call does
    except Exception as exc:  # the sweep's outcome is unknown; it may have run
        world.recorder.complete(
            index, Outcome.INFO, world.micros, error=type(exc).__name__, store_time=store_time
        )
        world.probe(world.touched)
        return False
    after = world.probe(before)
    changed = {key for key, record in before.items() if _changed(record, after.get(key))}
    if not _count(result):
        # Not a count at all (None, text, a float, a bool, a negative number): recorded as
        # the handler answered, with every key it may have changed, for the checker to judge.
        result = result if isinstance(result, bool | int | float | str | None) else repr(result)
        changed |= {
            k for k, r in world.probe(world.touched).items() if _changed(previous.get(k), r)
        }
    elif result > len(changed):
        # More changes than the suspects show (superseded records, or a sweep
        # touching what it must not): read every key written to.
        for key, record in world.probe(world.touched).items():
            if _changed(previous.get(key), record):
                changed.add(key)
    world.recorder.complete(
        index,
        Outcome.OK,
        world.micros,
        result=result,
        store_time=store_time,
        keys=sorted(changed),
        candidates=[key for key, record in before.items() if due(record, now)],
    )
    return True


def _count(result: object) -> bool:
    """Whether a sweep answered a count: a non-negative ``int`` (``True`` is not one)."""
    return isinstance(result, int) and not isinstance(result, bool) and result >= 0


def _changed(before: StateRecord | None, after: StateRecord | None) -> bool:
    if before is None:
        return False
    return after is None or after.status is not before.status


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
