"""The multi-process stress run: spawn, wait, recover the stragglers, check the history.

N processes (``spawn`` context, so each imports its own handler and driver)
open their handler, meet at a barrier and start delivering together.  When
they are done, the parent plays the catch-up worker and the redelivering
broker: it sweeps expired locks and delivers every item that is not yet
Processed again until all are, or the recovery budget runs out.  Then the
journals and the durable side effects become one
:class:`~dsm_sim.history.History`, and the simulator's checker judges it.

The time limit (``dsm stress --timeout``) is a deadline for the run: the
workers still running when it expires are stopped, nothing is recovered,
and the run is reported at once as stopped at its limit, judged only by
what the effect ledger already holds (a key charged twice is a key charged
twice).  Finishing the remaining keys one by one in the parent, or reading
every record and journal back, would take far longer than the limit.

Memory is bounded too: a history holds at most
:data:`~dsm_sim.history.MAX_HISTORY_ENTRIES` operations, so journals that
hold more are not read back; the run is then judged from the effect ledger
and the final records, and its report says that the history was not checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

from dsm_sim.checker import UNPROVEN, InvariantResult, all_passed, check_history
from dsm_sim.history import MAX_HISTORY_ENTRIES, History
from dsm_sim.netfaults import FaultWindow
from dsm_sim.processes import end_processes
from dsm_sim.stress.duplicates import excused_duplicates, fenced_writes
from dsm_sim.stress.history_builder import build_history, journal_outcomes
from dsm_sim.stress.journal import Journal, WallClock, read_marks, read_operations
from dsm_sim.stress.ledger import EffectLedger, EffectRow
from dsm_sim.stress.netfault_schedule import FaultSchedule
from dsm_sim.stress.redelivery import Redelivery
from dsm_sim.stress.settings import StressSettings, UnsharedStoreError
from dsm_sim.stress.worker import (
    RECOVERY_PROCESS,
    UNSHARED_EXIT,
    StressWorker,
    base_context,
    process_main,
    write_probe,
)
from reference_engine.clock import SystemClock
from reference_engine.errors import DsmError, InvalidOptionError, StoreError
from reference_engine.handler import StateHandler
from reference_engine.record import StateRecord
from reference_engine.status import IdempotencyStatus

__all__ = ["StressReport", "StressRun", "run_stress"]

S = IdempotencyStatus


@dataclass(frozen=True, slots=True)
class StressReport:
    """What a run did and what the checker said about it.

    ``duplicate_keys`` is counted straight from the durable effect rows (more
    than one row for a key), independently of the checker's reasoning, so a
    broken handler is caught even if the history were incomplete; under
    network faults, those :mod:`dsm_sim.stress.duplicates` excuses (the lease
    expired and fencing rejected the stale write) are listed apart and do not
    fail the run.  ``fault_windows`` are timed like the history's operations,
    in seconds since the run's epoch.
    """

    settings: StressSettings
    results: tuple[InvariantResult, ...]
    outcomes: Mapping[str, int]
    unnamed_errors: Mapping[str, int]
    store_errors: int
    exit_codes: tuple[int | None, ...]
    failed_processes: tuple[int, ...]
    effects: int
    duplicate_keys: tuple[str, ...]
    unfinished_keys: tuple[str, ...]
    operations: int
    run_seconds: float
    recovery_seconds: float
    journal_dir: str
    #: Processes killed because they were still running when the run's time limit expired.
    timed_out: tuple[int, ...] = ()
    #: That limit, in seconds (None: no limit).
    limit_s: float | None = None
    excused_duplicate_keys: tuple[str, ...] = ()
    fault_windows: tuple[FaultWindow, ...] = ()
    #: When the workers started, on the windows' time base (``at=`` counts from here).
    faults_origin: float | None = None
    #: Specs whose time came after the workers had finished, so they never acted.
    netfaults_not_reached: tuple[str, ...] = ()
    fenced_writes: int = 0
    #: The history the checker judged (its ``STORE_FAULT`` events mark the fault windows).
    history: History | None = dataclasses.field(default=None, compare=False, repr=False)
    #: Why the history was not checked (None: it was): the run was stopped at its time
    #: limit, or its journals hold more than a history may.
    unchecked: str | None = None

    @property
    def passed(self) -> bool:
        return (
            all_passed(self.results)
            and not self.unexcused_duplicate_keys
            and not self.unfinished_keys
            and not self.failed_processes
            and not self.unexpected_store_errors
        )

    @property
    def unexpected_store_errors(self) -> int:
        """Store errors on a run where nothing was injected to cause any."""
        return self.store_errors if self.settings.fault_free else 0

    @property
    def unexcused_duplicate_keys(self) -> tuple[str, ...]:
        excused = set(self.excused_duplicate_keys)
        return tuple(k for k in self.duplicate_keys if k not in excused)

    @property
    def violations(self) -> list[str]:
        found = [v.message for r in self.results for v in r.violations]
        found += [
            f"key {k}: more than one durable side effect" for k in self.unexcused_duplicate_keys
        ]
        found += [f"key {k}: not Processed after recovery" for k in self.unfinished_keys]
        found += [self._exit_story(i) for i in self.failed_processes]
        if self.unexpected_store_errors:
            found.append(
                f"{self.unexpected_store_errors} StoreError(s) on a fault-free run: the store "
                "refused operations nothing was injected to break (connection limits, pool "
                "exhaustion, lock timeouts?)"
            )
        return found

    def to_json(self) -> dict[str, object]:
        s = self.settings
        return {
            "passed": self.passed,
            "db": s.kind.value,
            "handler": s.handler_spec,
            "processes": s.processes,
            "workers": s.workers,
            "keys": s.keys,
            "duplicates": s.duplicates,
            "run_id": s.run_id,
            "deliveries": s.deliveries,
            "operations": self.operations,
            "run_seconds": round(self.run_seconds, 3),
            "recovery_seconds": round(self.recovery_seconds, 3),
            "ops_per_second": round(self.operations / self.run_seconds, 1)
            if self.run_seconds > 0
            else None,
            "outcomes": dict(self.outcomes),
            "store_errors": self.store_errors,
            "fault_free": s.fault_free,
            "unnamed_errors": dict(self.unnamed_errors),
            "exit_codes": list(self.exit_codes),
            "effects": self.effects,
            "duplicate_keys": list(self.duplicate_keys),
            "excused_duplicate_keys": list(self.excused_duplicate_keys),
            "unfinished_keys": list(self.unfinished_keys),
            "invariants": {r.name: r.passed for r in self.results},
            "unchecked": self.unchecked,
            "violations": self.violations[:50],
            **self._netfaults_json(),
        }

    def _netfaults_json(self) -> dict[str, object]:
        if not self.settings.netfaults:
            return {}
        return {
            "netfaults": [f.describe() for f in self.settings.netfaults],
            "netfaults_not_reached": list(self.netfaults_not_reached),
            "faults_origin": None if self.faults_origin is None else round(self.faults_origin, 6),
            "fault_windows": [
                {
                    "kind": w.kind.value,
                    "start": round(w.start, 6),
                    "end": None if w.end is None else round(w.end, 6),
                    "detail": w.detail,
                }
                for w in self.fault_windows
            ],
            "fenced_writes": self.fenced_writes,
        }

    def _netfaults_lines(self) -> list[str]:
        if not self.settings.netfaults:
            return []
        origin = self.faults_origin or 0.0
        shown = [
            f"{w.kind.value} {w.start - origin:.2f}s-"
            + ("open" if w.end is None else f"{w.end - origin:.2f}s")
            + (f" ({w.detail})" if w.detail else "")
            for w in self.fault_windows
        ]
        lines = ["  network faults (from the workers' start): " + ("; ".join(shown) or "none")]
        if self.netfaults_not_reached:
            lines.append(
                "  not reached (the workers finished first): "
                + ", ".join(self.netfaults_not_reached)
            )
        lines.append(
            f"  stale writes fenced {self.fenced_writes}, duplicates excused "
            f"{len(self.excused_duplicate_keys)} (lease expired, stale write rejected)"
        )
        return lines

    def _exit_story(self, index: int) -> str:
        """Why a process failed; a kill by the time limit says so, or it reads like a crash."""
        code = self.exit_codes[index]
        if index in self.timed_out:
            return (
                f"process p{index} exited with {code}: killed, still running when the run's "
                f"time limit of {self.limit_s:g}s expired (raise --timeout)"
            )
        return f"process p{index} exited with {code}"

    def _exits(self) -> str:
        codes = set(self.exit_codes)
        if len(codes) == 1:
            return f"all {next(iter(codes))}"
        return str(list(self.exit_codes))

    def summary(self) -> str:
        s = self.settings
        lines = [
            f"stress run {s.run_id}: {s.kind.value}, handler {s.handler_spec}",
            f"  {s.processes} processes x {s.workers} workers, {s.keys} keys x "
            f"{s.duplicates} deliveries, fail rate {s.fail_rate}",
        ]
        if self.timed_out and self.unchecked is not None:
            lines += [
                f"  stopped at the time limit after {self.run_seconds:.2f}s, exit codes "
                f"{self._exits()}",
                f"  side effects {self.effects}, keys with duplicates {len(self.duplicate_keys)}",
            ]
        else:
            lines += [
                f"  {self.operations} operations in {self.run_seconds:.2f}s"
                f" (+{self.recovery_seconds:.2f}s recovery), exit codes {self._exits()}",
                "  outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
                f"  store errors {self.store_errors}"
                + (" (fault-free run: each one is a failure)" if s.fault_free else "")
                + f", unnamed errors {dict(self.unnamed_errors)}",
                f"  side effects {self.effects}, keys with duplicates "
                f"{len(self.duplicate_keys)}, unfinished keys {len(self.unfinished_keys)}",
            ]
        lines += self._netfaults_lines()
        if self.unchecked is not None:
            lines.append(f"  history not checked: {self.unchecked}")
        for result in self.results:
            mark = "PASS" if result.passed else "FAIL"
            unproven = sum(1 for n in result.notes if n.startswith(UNPROVEN))
            extra = f", {unproven} unproven on the wall clock" if unproven else ""
            lines.append(f"  [{mark}] {result.name}: {len(result.violations)} violation(s){extra}")
        for message in self.violations[:10]:
            lines.append(f"    - {message}")
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


class StressRun:
    """One run, in steps a fault test can interleave with: prepare, start, wait, recover, report.

    Use :func:`run_stress` for the whole sequence.
    """

    def __init__(self, settings: StressSettings, workdir: Path | None = None) -> None:
        self.settings = settings
        self.clock = SystemClock()
        # Built first: a bad handler spec must fail before anything is created.
        self.handler: StateHandler
        self.handler, self._saved_target = settings.build_run_handler(self.clock)
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"dsm-stress-{settings.run_id}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes: list[BaseProcess] = []
        self.killed: set[int] = set()
        self.timed_out: set[int] = set()
        self.limit_s: float | None = None
        self._barrier: object = None
        self.ledger = EffectLedger(settings)
        # The run's one time base: every journal, the effect rows and the final
        # reads are timed on it (the workers get its anchor, see journal.py).
        self._wall = WallClock()
        self.epoch_ns = self._wall.now_ns()
        self.started_ns: int | None = None
        self.ended_ns: int | None = None
        self.recovered_ns: int | None = None
        self.recovery_outcomes: Counter[str] = Counter()
        self.recovery_unnamed: Counter[str] = Counter()
        self.faults: FaultSchedule | None = None
        self.redelivery: Redelivery | None = None

    @property
    def journal_paths(self) -> list[Path]:
        paths = [self.workdir / f"p{i}.jsonl" for i in range(self.settings.processes)]
        return [*paths, self.workdir / "redelivery.jsonl", self.workdir / "recovery.jsonl"]

    def seconds(self) -> float:
        """Now, on the history's time base: seconds since the run's epoch."""
        return (self._wall.now_ns() - self.epoch_ns) / 1e9

    async def prepare(self) -> None:
        """Check the server can take the run, then create its schema and tables once.

        Done here, before any child races to create them.  Each worker may hold
        one handler and one ledger connection, so a PostgreSQL run needs about
        ``2 x processes x workers`` connections; a run the server cannot take is
        refused up front instead of failing half-way with "too many clients".
        """
        try:
            free = await self.ledger.free_connections()
        except DsmError:
            raise
        except Exception as exc:  # refused, unknown host, bad credentials, no such database
            from sqlalchemy.engine import make_url

            shown = make_url(self.settings.db_url).render_as_string(hide_password=True)
            raise StoreError(
                f"cannot prepare the run on {shown}: {type(exc).__name__}: {exc}; check that "
                "the database server is running and the URL's host, port, user and database "
                "are right"
            ) from exc
        need = 2 * self.settings.processes * self.settings.workers + 2
        if free is not None and need > free:
            raise InvalidOptionError(
                "processes",
                f"{self.settings.processes} processes x {self.settings.workers} workers need "
                f"about {need} database connections and the server has {free} free; lower "
                "--processes or --workers, or raise the server's max_connections",
            )
        await self.ledger.create()
        await self.handler.open()
        await write_probe(self.handler, self.settings)
        if self.settings.netfaults:
            self.faults = FaultSchedule(self.settings, self.seconds)
            await self.faults.start()

    def start(self) -> None:
        """Spawn the processes; with network faults, also start their schedule and redelivery.

        A run with faults must be started from the event loop its proxy runs in.
        """
        context = multiprocessing.get_context("spawn")
        # Kept on self: the children unpickle it after start() returns, and a
        # collected barrier takes its semaphores with it.
        self._barrier = barrier = context.Barrier(self.settings.processes)
        workers = self.settings
        if self.faults is not None:
            workers = dataclasses.replace(self.settings, store_url=self.faults.url)
        self.started_ns = self._wall.now_ns()
        for index in range(self.settings.processes):
            process = context.Process(
                target=process_main,
                args=(workers, index, str(self.journal_paths[index]), barrier, self._wall.anchor),
                name=f"dsm-stress-p{index}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        if self.faults is not None:
            self.faults.play(self._workers_started)
            self.redelivery = Redelivery(
                self.settings,
                self.handler,
                self.ledger,
                self.journal_paths[-2],
                self.clock,
                self._wall,
            )
            self.redelivery.start()

    async def _workers_started(self) -> float:
        """Wait for the first worker past the barrier; when it passed, in history seconds."""
        paths = self.journal_paths[: self.settings.processes]
        while True:
            starts = [int(m["t"]) for m in read_marks(paths, "start")]
            if starts:
                return (min(starts) - self.epoch_ns) / 1e9
            await asyncio.sleep(0.01)

    async def stop_faults(self) -> None:
        """End the redelivery and the fault schedule (every fault still on is turned off)."""
        redelivery, self.redelivery = self.redelivery, None
        if redelivery is not None:
            await redelivery.stop()
            self.recovery_outcomes.update(
                {f"redelivery_{k}": v for k, v in redelivery.outcomes.items()}
            )
            self.recovery_unnamed.update(redelivery.worker.unnamed_errors)
        if self.faults is not None:
            await self.faults.stop()

    def kill(self, index: int) -> None:
        """SIGKILL process ``index``; the report will not count its exit as a failure."""
        self.killed.add(index)
        self.processes[index].kill()

    async def wait(self, limit_s: float | None = None) -> tuple[int | None, ...]:
        """Join every process; those still alive after ``limit_s`` seconds are stopped."""
        self.limit_s = limit_s
        deadline = None if limit_s is None else time.monotonic() + limit_s
        for process in self.processes:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(process.join, remaining)
            if process.is_alive():
                break
        late = [i for i, p in enumerate(self.processes) if p.is_alive()]
        self.timed_out.update(late)
        # All at once: SIGTERM (each ends its handler processes), SIGKILL after a grace.
        await asyncio.to_thread(end_processes, [self.processes[i] for i in late])
        self.ended_ns = self._wall.now_ns()
        await self.stop_faults()
        return tuple(p.exitcode for p in self.processes)

    def check_store_shared(self) -> None:
        """Refuse a run whose workers' handlers did not read the parent's probe record."""
        for index, process in enumerate(self.processes):
            if process.exitcode != UNSHARED_EXIT:
                continue
            for mark in read_marks([self.journal_paths[index]], "unshared"):
                raise UnsharedStoreError(self.settings.handler_spec, index, str(mark["reason"]))

    async def recover(self) -> None:
        """Catch-up sweeps and redeliveries until every key is Processed or time is up."""
        settings = dataclasses.replace(self.settings, fail_rate=0.0)
        journal = Journal(self.journal_paths[-1], RECOVERY_PROCESS, self._wall)
        worker = StressWorker(settings, self.handler, self.ledger, journal, RECOVERY_PROCESS, 0)
        deadline = time.monotonic() + settings.recovery_seconds
        try:
            while time.monotonic() < deadline:
                records = await self._read_all(deadline)
                if records is None:
                    break
                pending = {
                    k: r for k, r in records.items() if r is None or r.status is not S.PROCESSED
                }
                if not pending:
                    break
                now = self.clock.now()
                expired = [
                    k
                    for k, r in pending.items()
                    if r is not None
                    and r.status is S.PROCESSING
                    and r.locked_until is not None
                    and r.locked_until < now
                ]
                if expired:
                    await worker.sweep(expired)
                for key in pending:
                    if time.monotonic() >= deadline:
                        break
                    self.recovery_outcomes[(await worker.deliver(key)).value] += 1
                await asyncio.sleep(self._next_expiry(pending, deadline))
        finally:
            self.recovery_unnamed.update(worker.unnamed_errors)
            journal.close()
            self.recovered_ns = self._wall.now_ns()

    def _next_expiry(self, pending: Mapping[str, StateRecord | None], deadline: float) -> float:
        now = self.clock.now()
        waits = [
            (r.locked_until - now).total_seconds()
            for r in pending.values()
            if r is not None and r.status is S.PROCESSING and r.locked_until is not None
        ]
        wait = min([w for w in waits if w > 0], default=0.05) + 0.05
        return max(0.0, min(wait, deadline - time.monotonic(), 1.0))

    async def _read_all(self, deadline: float) -> dict[str, StateRecord | None] | None:
        """Every key's record; retried while the store is down, None if it stays down."""
        ctx = base_context(self.settings)
        delay = 0.1
        while True:
            try:
                records: dict[str, StateRecord | None] = {}
                for key in self.settings.key_list():
                    if time.monotonic() >= deadline:
                        return None  # out of budget: what is left stays unfinished
                    records[key] = await self.handler.get(ctx.for_item(key))
                return records
            except StoreError:
                if time.monotonic() + delay > deadline:
                    return None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def stopped_report(self) -> StressReport:
        """The report of a run stopped at its time limit: the ledger's duplicates, nothing more.

        Neither the records nor the journals are read back (a run large enough
        to outlive its limit takes as long again to read), so what is reported
        is what the database counts: the effects and the keys charged twice.
        """
        effects, duplicates = await self.ledger.tally()
        journalled = _journal_bytes(self.journal_paths)
        limit = f"{self.limit_s:g}s" if self.limit_s is not None else "its time limit"
        return StressReport(
            settings=self.settings,
            results=(),
            outcomes={},
            unnamed_errors={},
            store_errors=0,
            exit_codes=tuple(p.exitcode for p in self.processes),
            failed_processes=tuple(
                i for i, p in enumerate(self.processes) if p.exitcode != 0 and i not in self.killed
            ),
            effects=effects,
            duplicate_keys=duplicates,
            unfinished_keys=(),
            operations=0,
            run_seconds=(
                (self.ended_ns or self._wall.now_ns()) - (self.started_ns or self.epoch_ns)
            )
            / 1e9,
            recovery_seconds=0.0,
            journal_dir=str(self.workdir),
            timed_out=tuple(sorted(self.timed_out)),
            limit_s=self.limit_s,
            unchecked=(
                f"the run was stopped at its time limit of {limit} with "
                f"{journalled / 1e6:.1f} MB of journals: nothing was recovered, and the "
                "records, the journals and the unfinished keys were not read back; the side "
                "effects and keys with duplicates are the ledger's count"
            ),
        )

    async def report(self) -> StressReport:
        """Read the final state and the effects, build the history, run the checker."""
        if self.timed_out:
            return await self.stopped_report()
        operations_in_journals = _journal_operations(self.journal_paths)
        if operations_in_journals > MAX_HISTORY_ENTRIES:
            return await self._ledger_report(operations_in_journals)
        ctx = base_context(self.settings)
        final: list[tuple[str, StateRecord | None, int]] = []
        for key in self.settings.key_list():
            try:
                record = await self.handler.get(ctx.for_item(key))
            except DsmError:
                record = None
            final.append((key, record, self._wall.now_ns()))
        effects: list[EffectRow] = await self.ledger.rows()
        operations = read_operations(p for p in self.journal_paths if p.exists())
        windows = self.faults.windows if self.faults is not None else ()
        crashed = {f"p{i}" for i, p in enumerate(self.processes) if p.exitcode not in (0, None)}
        history = build_history(
            self.settings,
            epoch_ns=self.epoch_ns,
            operations=operations,
            effects=effects,
            final=final,
            crashed=crashed,
            faults_stop_ns=self.ended_ns if self.recovered_ns is not None else None,
            fault_windows=windows,
        )
        results = tuple(check_history(history))
        outcomes, unnamed = journal_outcomes(self.journal_paths[:-1])
        outcomes.update(
            {
                k if k.startswith("redelivery_") else f"recovery_{k}": v
                for k, v in self.recovery_outcomes.items()
            }
        )
        unnamed.update(self.recovery_unnamed)
        per_key = Counter(row.item_key for row in effects)
        # Timed from the barrier's release, so spawning and imports do not count.
        starts = [int(m["t"]) for m in read_marks(self.journal_paths[:-1], "start")]
        start = min(starts, default=self.started_ns or self.epoch_ns)
        end = self.ended_ns or self._wall.now_ns()
        return StressReport(
            settings=self.settings,
            results=results,
            outcomes=dict(outcomes),
            unnamed_errors=dict(unnamed),
            store_errors=sum(1 for o in operations if o.error == StoreError.__name__),
            exit_codes=tuple(p.exitcode for p in self.processes),
            failed_processes=tuple(
                i for i, p in enumerate(self.processes) if p.exitcode != 0 and i not in self.killed
            ),
            effects=len(effects),
            duplicate_keys=tuple(sorted(k for k, n in per_key.items() if n > 1)),
            unfinished_keys=tuple(
                k for k, r, _ in final if r is None or r.status is not S.PROCESSED
            ),
            operations=len(operations),
            run_seconds=(end - start) / 1e9,
            recovery_seconds=((self.recovered_ns or end) - end) / 1e9,
            journal_dir=str(self.workdir),
            timed_out=tuple(sorted(self.timed_out)),
            limit_s=self.limit_s,
            excused_duplicate_keys=excused_duplicates(self.settings, effects, operations, results),
            fault_windows=tuple(windows),
            faults_origin=None if self.faults is None else self.faults.origin,
            netfaults_not_reached=()
            if self.faults is None
            else tuple(f.describe() for f in self.faults.not_reached),
            fenced_writes=fenced_writes(operations),
            history=history,
        )

    async def _ledger_report(self, journalled: int) -> StressReport:
        """A run whose journals outgrow a history: judged by the ledger and the final records."""
        ctx = base_context(self.settings)
        unfinished: list[str] = []
        for key in self.settings.key_list():
            try:
                record = await self.handler.get(ctx.for_item(key))
            except DsmError:
                record = None
            if record is None or record.status is not S.PROCESSED:
                unfinished.append(key)
        effects, duplicates = await self.ledger.tally()
        outcomes, unnamed = journal_outcomes(self.journal_paths[:-1])
        end = self.ended_ns or self._wall.now_ns()
        return StressReport(
            settings=self.settings,
            results=(),
            outcomes=dict(outcomes),
            unnamed_errors=dict(unnamed),
            store_errors=0,
            exit_codes=tuple(p.exitcode for p in self.processes),
            failed_processes=tuple(
                i for i, p in enumerate(self.processes) if p.exitcode != 0 and i not in self.killed
            ),
            effects=effects,
            duplicate_keys=duplicates,
            unfinished_keys=tuple(unfinished),
            operations=journalled,
            run_seconds=(end - (self.started_ns or self.epoch_ns)) / 1e9,
            recovery_seconds=((self.recovered_ns or end) - end) / 1e9,
            journal_dir=str(self.workdir),
            limit_s=self.limit_s,
            unchecked=(
                f"the journals hold {journalled:,} operations, more than the "
                f"{MAX_HISTORY_ENTRIES:,} a history may hold in memory; judged by the effect "
                "ledger (duplicates) and the final records (unfinished keys) only"
            ),
        )

    async def close(self, *, keep: bool = False) -> None:
        """Close the parent's connections and remove the run's schema/files unless ``keep``."""
        # Also on Ctrl-C and SIGTERM: SIGTERM first, so each worker ends its handlers.
        await asyncio.to_thread(end_processes, self.processes)
        try:
            await self.stop_faults()
            if not keep:
                await self.ledger.drop()
        finally:
            try:
                await self.ledger.close()
                await self.handler.close()
            finally:
                self._saved_target.restore()
            if not keep and self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)


#: Bytes of journal past which the operations are not even counted: far more than a
#: history may hold (an operation journals about 250 bytes).
_UNCOUNTED_BYTES = 4096 * MAX_HISTORY_ENTRIES


def _journal_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def _journal_operations(paths: list[Path]) -> int:
    """How many operations the journals hold: their invocations, counted without parsing."""
    if _journal_bytes(paths) > _UNCOUNTED_BYTES:
        return _UNCOUNTED_BYTES
    needle = b'"type":"invoke"'
    count = 0
    for path in paths:
        if not path.exists():
            continue
        with path.open("rb") as handle:
            tail = b""
            while chunk := handle.read(1 << 20):
                block = tail + chunk
                count += block.count(needle)
                tail = block[-(len(needle) - 1) :]  # a needle cut by the chunk boundary
    return count


async def run_stress(
    settings: StressSettings,
    *,
    workdir: Path | None = None,
    keep: bool = False,
    recover: bool = True,
    limit_s: float | None = None,
) -> StressReport:
    """Prepare, run N processes, recover the stragglers, check; clean up unless ``keep``."""
    run = StressRun(settings, workdir)
    try:
        await run.prepare()
        run.start()
        await run.wait(limit_s)
        run.check_store_shared()
        if recover and not run.timed_out:
            await run.recover()
        report = await run.report()
    except BaseException as exc:
        # The first failure is the one to report: a close that fails after it (the
        # server that refused the run refuses the clean-up too) is a note, not a mask.
        try:
            await run.close(keep=keep)
        except Exception as also:
            exc.add_note(f"closing the run also failed: {type(also).__name__}: {also}")
        raise
    await run.close(keep=keep)
    return report
