"""The broker stress run: publish, consume in N killable processes, restart, check, clean up.

The parent declares the run's exchange and queue, publishes every message
(persistent, confirmed), and starts N worker processes.  Worker
incarnations with a kill plan SIGKILL themselves at their kill point; the
parent starts a new incarnation in the dead one's place, and RabbitMQ hands
the dead one's unacknowledged deliveries to the others.  When the ack logs
show every message acknowledged, the workers are stopped and the evidence is
read: the queue must be empty, every key Processed, the effect ledger must
hold no duplicate charge the checker cannot excuse (a lease that expired,
whose stale holder was killed or fenced off).  The queue and the exchange are
deleted at the end, also when the run fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from dsm_sim.checker import InvariantResult, check_history
from dsm_sim.checker.leases import Violation
from dsm_sim.history import OpName
from dsm_sim.processes import end_processes
from dsm_sim.stress.broker.settings import BrokerStressSettings, KillPlan
from dsm_sim.stress.broker.worker import broker_process_main
from dsm_sim.stress.history_builder import build_history, journal_outcomes
from dsm_sim.stress.journal import Operation, WallClock, read_marks, read_operations
from dsm_sim.stress.ledger import EffectLedger, EffectRow
from dsm_sim.stress.settings import StressSettings
from dsm_sim.stress.worker import base_context
from reference_engine.broker.amqp import AmqpBroker
from reference_engine.clock import SystemClock
from reference_engine.engine.executor import Message
from reference_engine.errors import DsmError, StaleLockError
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["BrokerStressReport", "run_broker_stress"]

#: Publishes in flight at once, each awaiting its confirm.
PUBLISH_WINDOW = 256
#: Times the parent restarts workers to drain messages whose ack was lost.
DRAIN_ROUNDS = 3
#: Keys judged together by the checker (see :func:`_check_by_key_groups`).
CHECK_GROUP = 200
#: Concurrent reads of the final records.
READ_WINDOW = 32


@dataclass(frozen=True, slots=True)
class BrokerStressReport:
    """What the run did and what the durable evidence says."""

    settings: BrokerStressSettings
    invariants: dict[str, bool]
    violations: tuple[str, ...]
    excused: tuple[str, ...]
    unexcused: int
    published: int
    acknowledged: int
    deliveries: int
    left_in_queue: int
    unacknowledged: tuple[str, ...]
    unfinished_keys: tuple[str, ...]
    effects: int
    duplicate_keys: tuple[str, ...]
    kills: dict[str, int]
    #: Why each key charged twice was charged again: its earlier holder's process was
    #: killed before its ``set``, or its ``set`` was fenced off, or neither.
    duplicate_causes: dict[str, int]
    #: Restarts needed after the first stop because an ack had not reached the broker.
    drain_rounds: int
    unexpected_exits: tuple[str, ...]
    outcomes: dict[str, int]
    publish_seconds: float
    run_seconds: float
    check_seconds: float
    timed_out: bool = False

    @property
    def unexcused_duplicates(self) -> int:
        """Violations of ``no_duplicate_side_effect``: repeats the checker could not excuse."""
        return self.unexcused

    @property
    def lost(self) -> int:
        return len(set(self.unfinished_keys)) + self.left_in_queue

    @property
    def passed(self) -> bool:
        return (
            all(self.invariants.values())
            and not self.violations
            and not self.unfinished_keys
            and not self.unacknowledged
            and self.left_in_queue == 0
            and not self.unexpected_exits
            and not self.timed_out
        )

    def to_json(self) -> dict[str, object]:
        s = self.settings
        return {
            "passed": self.passed,
            "broker": "amqp",
            "db": s.stress.kind.value,
            "handler": s.stress.handler_spec,
            "run_id": s.stress.run_id,
            "processes": s.stress.processes,
            "prefetch": s.stress.workers,
            "keys": s.stress.keys,
            "published": self.published,
            "duplicate_publishes": s.duplicate_publishes,
            "deliveries": self.deliveries,
            "acknowledged": self.acknowledged,
            "left_in_queue": self.left_in_queue,
            "unacknowledged": list(self.unacknowledged[:50]),
            "kills": self.kills,
            "planned_kills": s.kills,
            "duplicate_causes": self.duplicate_causes,
            "drain_rounds": self.drain_rounds,
            "ack_first": s.ack_first,
            "effects": self.effects,
            "duplicate_keys": len(self.duplicate_keys),
            "excused_duplicates": len(self.excused),
            "unexcused_duplicates": self.unexcused_duplicates,
            "lost": self.lost,
            "unfinished_keys": list(self.unfinished_keys[:50]),
            "unexpected_exits": list(self.unexpected_exits),
            "outcomes": self.outcomes,
            "publish_seconds": round(self.publish_seconds, 3),
            "run_seconds": round(self.run_seconds, 3),
            "check_seconds": round(self.check_seconds, 3),
            "deliveries_per_second": round(self.deliveries / self.run_seconds, 1)
            if self.run_seconds > 0
            else None,
            "invariants": self.invariants,
            "violations": list(self.violations[:50]),
            "timed_out": self.timed_out,
        }

    def summary(self) -> str:
        s = self.settings
        kills = ", ".join(f"{k}={v}" for k, v in sorted(self.kills.items())) or "none"
        lines = [
            f"broker stress run {s.stress.run_id}: amqp -> engine -> invoice node on "
            f"{s.stress.kind.value}, handler {s.stress.handler_spec}"
            + (" [ack before the node: broken on purpose]" if s.ack_first else ""),
            f"  {s.stress.processes} processes x prefetch {s.stress.workers}, {s.stress.keys} "
            f"invoices, {self.published} messages ({s.duplicate_publishes} duplicate publishes), "
            f"lock {s.stress.lock_duration.total_seconds():g}s",
            f"  {self.deliveries} deliveries in {self.run_seconds:.2f}s"
            f" (publish {self.publish_seconds:.2f}s, check {self.check_seconds:.2f}s); "
            f"kills: {kills} ({sum(self.kills.values())} of {s.kills} planned)",
            f"  acknowledged {self.acknowledged}/{self.published}, left in queue "
            f"{self.left_in_queue} (drain rounds {self.drain_rounds}), keys not Processed "
            f"{len(self.unfinished_keys)}",
            f"  charges {self.effects}, keys charged twice {len(self.duplicate_keys)} "
            f"(excused {len(self.excused)}, unexcused {self.unexcused_duplicates}; causes "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.duplicate_causes.items())) or "none")
            + ")",
            "  settled: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
        ]
        for name, ok in self.invariants.items():
            lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}")
        for message in self.violations[:10]:
            lines.append(f"    - {message}")
        for message in self.unexpected_exits:
            lines.append(f"    - {message}")
        if self.timed_out:
            lines.append(f"    - not every message was acknowledged within {s.timeout_s:g}s")
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


class _Processes:
    """The worker incarnations: numbered in start order, each with its journal and ack log."""

    def __init__(self, settings: BrokerStressSettings, workdir: Path, wall: WallClock) -> None:
        self.settings = settings
        self.workdir = workdir
        #: The run's time base, which every incarnation's journal reads.
        self.wall = wall
        self.context = multiprocessing.get_context("spawn")
        self.stop = self.context.Event()
        #: Off for the drain rounds: the kills belong to the run, not to its clean-up.
        self.killing = True
        self.plans: dict[int, KillPlan | None] = {}
        self.all: list[BaseProcess] = []
        self.live: dict[int, BaseProcess] = {}
        self.unexpected: list[str] = []
        self._ack_offsets: dict[int, int] = {}

    def journal(self, index: int) -> Path:
        return self.workdir / f"p{index}.jsonl"

    def acks(self, index: int) -> Path:
        return self.workdir / f"acks-{index}.txt"

    def start(self) -> None:
        index = len(self.all)
        plan = self.settings.kill_plan(index) if self.killing else None
        self.plans[index] = plan
        process = self.context.Process(
            target=broker_process_main,
            args=(
                self.settings,
                index,
                str(self.journal(index)),
                str(self.acks(index)),
                self.stop,
                plan,
                self.wall.anchor,
            ),
            name=f"dsm-broker-p{index}",
            daemon=True,
        )
        process.start()
        self.all.append(process)
        self.live[index] = process

    def reap(self) -> None:
        """Replace every incarnation that died: killed by its plan, or unexpectedly."""
        for index, process in list(self.live.items()):
            if process.exitcode is None:
                continue
            del self.live[index]
            if not self._planned_kill(index, process):
                self.unexpected.append(f"worker p{index} exited with {process.exitcode}")
            # A worker that crashes by itself would crash again: it is not replaced
            # more than once per slot, so a broken setup ends the run instead of looping.
            if not self.stop.is_set() and len(self.unexpected) <= self.settings.stress.processes:
                self.start()

    def _planned_kill(self, index: int, process: BaseProcess) -> bool:
        return self.plans.get(index) is not None and process.exitcode == -signal.SIGKILL

    def new_acks(self, into: set[str]) -> None:
        for index in range(len(self.all)):
            path = self.acks(index)
            if not path.exists():
                continue
            with path.open(encoding="utf-8") as handle:
                handle.seek(self._ack_offsets.get(index, 0))
                chunk = handle.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self._ack_offsets[index] = self._ack_offsets.get(index, 0) + len(complete.encode())
            into.update(line for line in complete.splitlines() if line)

    def restart(self) -> None:
        """A fresh set of workers, without kill plans, after a shutdown."""
        self.stop = self.context.Event()
        self.killing = False
        for _ in range(self.settings.stress.processes):
            self.start()

    async def shutdown(self, grace: float = 30.0) -> None:
        """Stop every worker: each finishes (and settles) the deliveries it holds, then exits."""
        self.stop.set()
        deadline = time.monotonic() + grace
        for index, process in list(self.live.items()):
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                self.unexpected.append(f"worker p{index} did not stop within {grace:g}s")
                await asyncio.to_thread(end_processes, [process])
            elif process.exitcode != 0 and not self._planned_kill(index, process):
                self.unexpected.append(f"worker p{index} exited with {process.exitcode}")
        self.live.clear()


async def _publish(broker: AmqpBroker, settings: BrokerStressSettings) -> int:
    tenant = base_context(settings.stress).tenant_id
    messages = [
        Message(
            id=m.message_id,
            payload={"invoiceId": m.key, "amount": m.amount},
            tenant_id=tenant,
            source_app_id="dsm-stress",
        )
        for m in settings.messages()
    ]
    for start in range(0, len(messages), PUBLISH_WINDOW):
        await asyncio.gather(*(broker.publish(m) for m in messages[start : start + PUBLISH_WINDOW]))
    return len(messages)


async def _final_records(
    handler: StateHandler, settings: BrokerStressSettings, wall: WallClock
) -> list[tuple[str, StateRecord | None, int]]:
    ctx = base_context(settings.stress)
    keys = settings.stress.key_list()
    out: list[tuple[str, StateRecord | None, int]] = []
    for start in range(0, len(keys), READ_WINDOW):
        batch = keys[start : start + READ_WINDOW]
        records = await asyncio.gather(*(handler.get(ctx.for_item(k)) for k in batch))
        out.extend((k, r, wall.now_ns()) for k, r in zip(batch, records, strict=True))
    return out


async def _wait_for_acks(
    processes: _Processes, published: set[str], settings: BrokerStressSettings
) -> tuple[set[str], bool]:
    """Poll the ack logs, replacing dead workers, until every message is acknowledged."""
    acked: set[str] = set()
    deadline = time.monotonic() + settings.timeout_s
    while time.monotonic() < deadline:
        processes.new_acks(acked)
        if published <= acked:
            return acked, False
        processes.reap()
        if not processes.live:
            return acked, False
        await asyncio.sleep(0.1)
    return acked, True


def _check_by_key_groups(
    stress: StressSettings,
    *,
    epoch_ns: int,
    operations: Sequence[Operation],
    effects: Sequence[EffectRow],
    final: Sequence[tuple[str, StateRecord | None, int]],
    crashed: set[str],
    faults_stop_ns: int,
) -> list[InvariantResult]:
    """The checker's verdicts, computed on groups of :data:`CHECK_GROUP` keys and merged.

    The checker reads each key's calls by scanning the whole history, which
    is quadratic in a run of 10^5 messages.  A broker run makes no sweep and
    no call spans keys, so every invariant is a statement about one key at a
    time, and judging the keys in groups gives the same verdicts in linear time.
    The few run-wide verdicts (no key: "the run processed nothing") hold for
    the run only if every group reached them.
    """
    by_key: dict[str, list[Operation]] = {}
    for op in operations:
        by_key.setdefault(op.key, []).append(op)
    effects_by_key: dict[str, list[EffectRow]] = {}
    for row in effects:
        effects_by_key.setdefault(row.item_key, []).append(row)
    per_key: dict[str, list[Violation]] = {}
    notes: dict[str, list[str]] = {}
    #: Run-wide verdicts (no key) hold for the run only if every group reached them.
    run_wide: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for start in range(0, len(final), CHECK_GROUP):
        group = final[start : start + CHECK_GROUP]
        keys = [k for k, _, _ in group]
        history = build_history(
            stress,
            epoch_ns=epoch_ns,
            operations=sorted(
                (op for k in keys for op in by_key.get(k, ())),
                key=lambda o: (o.invoke_ns, o.process, o.worker),
            ),
            effects=[row for k in keys for row in effects_by_key.get(k, ())],
            final=group,
            crashed=crashed,
            faults_stop_ns=faults_stop_ns,
        )
        for result in check_history(history):
            names[result.name] = result.description
            per_key.setdefault(result.name, []).extend(v for v in result.violations if v.key)
            notes.setdefault(result.name, []).extend(result.notes)
            wide = {v.message for v in result.violations if not v.key}
            run_wide[result.name] = wide if start == 0 else run_wide[result.name] & wide
    merged: list[InvariantResult] = []
    for name, description in names.items():
        violations = (*per_key[name], *(Violation(m) for m in sorted(run_wide[name])))
        merged.append(
            InvariantResult(
                name=name,
                description=description,
                passed=not violations,
                violations=violations,
                notes=tuple(notes[name]),
            )
        )
    return merged


async def _drain(
    processes: _Processes, broker: AmqpBroker, settings: BrokerStressSettings, started: float
) -> tuple[int, int]:
    """Bring back the messages whose ack was sent but never reached the broker.

    With the workers stopped, RabbitMQ has returned every unsettled delivery
    to the queue, so its ready count is the truth about what is left.  While
    something is left, fresh workers (without kills) consume it, and are
    stopped again once the queue reads empty.  Returns what is left in the
    end and how many rounds it took.
    """
    rounds = 0
    left = await broker.ready_count()
    deadline = started + settings.timeout_s
    while left and rounds < DRAIN_ROUNDS and time.monotonic() < deadline:
        rounds += 1
        processes.restart()
        while time.monotonic() < deadline and await broker.ready_count():
            processes.reap()
            await asyncio.sleep(0.2)
        await processes.shutdown()
        left = await broker.ready_count()
    return left, rounds


async def run_broker_stress(
    settings: BrokerStressSettings, *, keep: bool = False
) -> BrokerStressReport:
    """The whole run; the queue, exchange, schema and files are removed unless ``keep``."""
    stress = settings.stress
    clock = SystemClock()
    handler, saved_target = stress.build_run_handler(clock)
    ledger = EffectLedger(stress)
    broker = AmqpBroker(settings.broker_url, settings.topology)
    workdir = Path(tempfile.mkdtemp(prefix=f"dsm-broker-{stress.run_id}-"))
    wall = WallClock()
    processes = _Processes(settings, workdir, wall)
    declared = False
    cleaned = False
    try:
        await ledger.create()
        await handler.open()
        await broker.connect()
        declared = True
        await broker.declare()
        epoch_ns = wall.now_ns()
        t0 = time.monotonic()
        published_n = await _publish(broker, settings)
        publish_s = time.monotonic() - t0
        published = {m.message_id for m in settings.messages()}
        t1 = time.monotonic()
        for _ in range(stress.processes):
            processes.start()
        acked, timed_out = await _wait_for_acks(processes, published, settings)
        await processes.shutdown()
        left, drain_rounds = await _drain(processes, broker, settings, t1)
        run_s = time.monotonic() - t1
        ended_ns = wall.now_ns()
        processes.new_acks(acked)
        t2 = time.monotonic()
        final = await _final_records(handler, settings, wall)
        effects = await ledger.rows()
        journals = [processes.journal(i) for i in range(len(processes.all))]
        operations = read_operations(p for p in journals if p.exists())
        crashed = {f"p{i}" for i, p in enumerate(processes.all) if p.exitcode not in (0, None)}
        results = _check_by_key_groups(
            stress,
            epoch_ns=epoch_ns,
            operations=operations,
            effects=effects,
            final=final,
            crashed=crashed,
            faults_stop_ns=ended_ns,
        )
        outcomes, _ = journal_outcomes(journals)
        kill_marks = read_marks(journals, "kill")
        kills = Counter(str(m["point"]) for m in kill_marks)
        per_key = Counter(row.item_key for row in effects)
        check_s = time.monotonic() - t2
        report = BrokerStressReport(
            settings=settings,
            invariants={r.name: r.passed for r in results},
            violations=tuple(v.message for r in results for v in r.violations),
            excused=tuple(
                n for r in results if r.name == "no_duplicate_side_effect" for n in r.notes
            ),
            unexcused=sum(
                len(r.violations) for r in results if r.name == "no_duplicate_side_effect"
            ),
            published=published_n,
            acknowledged=len(acked & published),
            deliveries=sum(1 for o in operations if o.op is OpName.EXISTS),
            left_in_queue=left,
            unacknowledged=tuple(sorted(published - acked)),
            unfinished_keys=tuple(
                k for k, r, _ in final if r is None or r.status is not IdempotencyStatus.PROCESSED
            ),
            effects=len(effects),
            duplicate_keys=tuple(sorted(k for k, n in per_key.items() if n > 1)),
            kills=dict(kills),
            drain_rounds=drain_rounds,
            duplicate_causes=_duplicate_causes(effects, operations, kill_marks),
            unexpected_exits=tuple(processes.unexpected),
            outcomes=dict(outcomes),
            publish_seconds=publish_s,
            run_seconds=run_s,
            check_seconds=check_s,
            timed_out=timed_out,
        )
        await broker.delete()
        cleaned = True
        return report
    finally:
        # Also on Ctrl-C and SIGTERM (asyncio cancels the run): no consumer is left running,
        # and the queue and exchange below are deleted.
        end_processes(processes.all)
        try:
            if declared and not cleaned:
                await _delete_run_topology(broker, settings)
        finally:
            try:
                await broker.close()
            finally:
                try:
                    if not keep:
                        await ledger.drop()
                finally:
                    try:
                        await ledger.close()
                        await handler.close()
                    finally:
                        saved_target.restore()
                    if not keep:
                        shutil.rmtree(workdir, ignore_errors=True)


async def _delete_run_topology(broker: AmqpBroker, settings: BrokerStressSettings) -> None:
    """Delete the run's queue and exchange after a run that did not get to it.

    A run stopped by Ctrl-C or SIGTERM with SIGINT ignored (a command started
    with ``&`` from a script) ends with every task of its loop cancelled,
    the broker connection's reader among them: the connection then answers
    with the reader's ``CancelledError``, and the queue is deleted on a
    connection of its own, or it would stay on the broker with the run's
    messages.  A cancellation of this task while it deletes (a Ctrl-C during
    the clean-up of a run that failed) is not the connection's: it goes on.
    Other failures to delete are not raised: the run's own outcome is.
    """
    task = asyncio.current_task()
    asked = 0 if task is None else task.cancelling()
    try:
        await broker.delete()
        return
    except DsmError:
        pass
    except asyncio.CancelledError:
        if task is not None and task.cancelling() > asked:
            raise  # this task was cancelled meanwhile
    fresh = AmqpBroker(settings.broker_url, settings.topology)
    try:
        with contextlib.suppress(DsmError):
            await fresh.connect()
            await fresh.delete()
    finally:
        await fresh.close()


def _duplicate_causes(
    effects: Sequence[EffectRow],
    operations: Sequence[Operation],
    kills: Sequence[Mapping[str, Any]],
) -> dict[str, int]:
    """For every charge of a key charged more than once, but the one kept: what ended its lease.

    Read from the durable effect rows and the journals, independently of the
    checker: the charging process was SIGKILLed (at this delivery's kill point
    or at another delivery's, with this one in flight), or its
    ``set(Processed)`` was refused as stale (fencing), or neither (then only
    the checker's verdict says whether the repeat was excused).

    The charge kept is the last one whose lease nothing ended, not simply the
    last one: a holder slower than its lock (a loaded machine) may charge after
    the worker that took the item over did, and it is then its own charge,
    fenced off, that the repeat is explained by.
    """
    killed = {int(m["p"]) for m in kills}
    fenced = {
        o.execution for o in operations if o.op is OpName.SET and o.error == StaleLockError.__name__
    }
    by_key: dict[str, list[EffectRow]] = {}
    for row in effects:
        by_key.setdefault(row.item_key, []).append(row)
    causes: Counter[str] = Counter()

    def ended(row: EffectRow) -> bool:
        return row.execution in fenced or row.process in killed

    for rows in by_key.values():
        ordered = sorted(rows, key=lambda r: r.at_ns)
        kept = next((r for r in reversed(ordered) if not ended(r)), ordered[-1])
        for row in ordered:
            if row is kept:
                continue
            if row.execution in fenced:
                causes["fenced"] += 1
            elif row.process in killed:
                causes["holder-killed"] += 1
            else:
                causes["other"] += 1
    return dict(causes)
