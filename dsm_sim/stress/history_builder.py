"""Turning a stress run's journals and effect rows into the checker's :class:`History`.

The stress runner and the simulator are judged by the same checker, so the
run must be expressed in the simulator's terms: one timeline in seconds
since the run's epoch, item keys spelled with :func:`~dsm_sim.history.key_of`,
side effects as events taken from the durable effect rows.  Wall-clock runs
have no separate store clock (the handlers read the same system clock), so
``store_time`` stays ``None`` and the checker places each call anywhere in
its ``[invoke, complete]`` window.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from dsm_sim.history import (
    EventKind,
    History,
    HistoryRecorder,
    OpName,
    Outcome,
    Scalar,
    key_of,
)
from dsm_sim.micros import Micros
from dsm_sim.netfaults import FaultWindow, history_events
from dsm_sim.stress.journal import EventType, Operation
from dsm_sim.stress.ledger import EffectRow
from dsm_sim.stress.settings import StressSettings
from dsm_sim.stress.worker import RECOVERY_PROCESS, REDELIVERY_PROCESS, base_context
from reference_engine.clock import UTC
from reference_engine.record import StateRecord

__all__ = ["build_history", "history_key", "journal_outcomes", "process_name"]

_OUTCOMES = {EventType.OK: Outcome.OK, EventType.FAIL: Outcome.FAIL, EventType.INFO: Outcome.INFO}


def process_name(process: int) -> str:
    if process == RECOVERY_PROCESS:
        return "recovery"
    return "redelivery" if process == REDELIVERY_PROCESS else f"p{process}"


def history_key(settings: StressSettings, item: str) -> str:
    """The checker's key for one of the run's item keys."""
    return key_of(base_context(settings).for_item(item).record_key)


def _scalar(value: object) -> Scalar:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def build_history(
    settings: StressSettings,
    *,
    epoch_ns: int,
    operations: Sequence[Operation],
    effects: Iterable[EffectRow],
    final: Iterable[tuple[str, StateRecord | None, int]],
    crashed: Iterable[str] = (),
    faults_stop_ns: int | None = None,
    fault_windows: Iterable[FaultWindow] = (),
) -> History:
    """One history for the whole run; ``crashed`` names processes that died abnormally.

    ``fault_windows`` (timed in seconds since ``epoch_ns``, as the operations
    are) become ``STORE_FAULT`` events at each window's start and end, so a
    finding can be read against the network fault that was active then.
    """

    def key(item: str) -> str:
        return history_key(settings, item)

    def at(ns: int) -> Micros:
        return (ns - epoch_ns + 500) // 1000  # to the nearest microsecond

    recorder = HistoryRecorder(
        epoch=dt.datetime.fromtimestamp(epoch_ns / 1e9, UTC),
        lock_duration=settings.lock_duration.total_seconds(),
        meta={
            "source": "stress",
            "run_id": settings.run_id,
            "db": settings.kind.value,
            "handler": settings.handler_spec,
            "processes": settings.processes,
            "workers": settings.workers,
            "keys": settings.keys,
            "duplicates": settings.duplicates,
            "deliveries": settings.deliveries,
        },
    )
    if settings.netfaults:
        recorder.meta["netfaults"] = " ".join(f.describe() for f in settings.netfaults)
    dead = set(crashed)
    for op in operations:
        process = process_name(op.process)
        sweep = op.op is OpName.RESET_EXPIRED_LOCKS
        index = recorder.invoke(
            process,
            op.op,
            "" if sweep else key(op.key),
            at(op.invoke_ns),
            token=op.token,
            status=op.status,
            execution=op.execution,
        )
        if op.complete_ns is None:
            if process in dead:
                recorder.event(
                    EventKind.CRASH,
                    at(op.invoke_ns),
                    process=process,
                    key=key(op.key) if not sweep else "",
                    token=op.token,
                    execution=op.execution,
                    detail="process killed during the call",
                )
            continue  # freeze() turns it into info: it may have happened
        token = op.token
        outcome = _OUTCOMES[op.outcome]
        if op.op is OpName.TRY_ACQUIRE_LOCK and op.ok:
            if isinstance(op.value, int) and not isinstance(op.value, bool):
                token = op.value
            else:
                # Refused: as in Jepsen's mutex model, an acquire that definitely
                # took nothing is a ``fail``, not a write to replay.
                outcome = Outcome.FAIL
        recorder.complete(
            index,
            outcome,
            at(op.complete_ns),
            result=_scalar(op.value),
            error=op.error,
            token=token,
            keys=[key(k) for k in op.keys] if sweep and op.value == len(op.keys) else (),
        )
    for row in effects:
        recorder.event(
            EventKind.SIDE_EFFECT,
            at(row.at_ns),
            process=process_name(row.process),
            key=key(row.item_key),
            token=row.token,
            execution=row.execution,
        )
    for item, record, seen_ns in final:
        recorder.final_state(
            key(item),
            "none" if record is None else record.status.value,
            None if record is None else record.attempt,
            at(seen_ns),
        )
    for mark in history_events(fault_windows):
        recorder.event(EventKind.STORE_FAULT, mark.time, process=mark.process, detail=mark.detail)
    if faults_stop_ns is not None:
        recorder.faults_stop = at(faults_stop_ns)
    return recorder.freeze()


def journal_outcomes(paths: Iterable[Path]) -> tuple[Counter[str], Counter[str]]:
    """Sum the per-process ``summary`` markers: delivery outcomes and unnamed errors."""
    outcomes: Counter[str] = Counter()
    unnamed: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if '"summary"' not in line or not line.endswith("\n"):
                    continue
                event = json.loads(line)
                if event.get("type") == "mark" and event.get("name") == "summary":
                    outcomes.update(event["outcomes"])
                    unnamed.update(event["unnamed_errors"])
    return outcomes, unnamed
