"""A stress journal read back: a call whose reply was lost, then proved to have landed.

Under a network fault an acquire can commit on the server while its reply is
lost; the worker reads the record back and, finding the lock its own, does the
work under that token.  The journal must then grant that token, or the checker
sees a side effect under a token no acquisition returned and calls the run a
duplicate ("the history has no acquisition for one of them").
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dsm_sim.checker.leases import acquired, leases_for
from dsm_sim.checker.safety import no_duplicate_side_effect
from dsm_sim.history import OpName
from dsm_sim.stress.history_builder import build_history, history_key
from dsm_sim.stress.journal import EventType, Journal, WallClock, read_operations
from dsm_sim.stress.ledger import EffectRow
from dsm_sim.stress.settings import StressSettings


class StepClock(WallClock):
    """A wall clock that moves only when told: journal times a test can name."""

    def __init__(self) -> None:
        super().__init__((0, 0))
        self.ns = 0

    def now_ns(self) -> int:
        return self.ns


def _journal(tmp_path: Path, process: int, clock: StepClock) -> Journal:
    return Journal(tmp_path / f"p{process}.jsonl", process, clock)


def test_a_resolved_call_reads_back_as_ok_with_its_value_at_the_proving_read(
    tmp_path: Path,
) -> None:
    clock = StepClock()
    journal = _journal(tmp_path, 0, clock)
    clock.ns = 10
    op = journal.invoke(0, "e1", OpName.TRY_ACQUIRE_LOCK, "k1")
    clock.ns = 20
    journal.complete(op, EventType.INFO, error="StoreError")
    clock.ns = 30
    read = journal.invoke(0, "e1", OpName.GET, "k1")
    clock.ns = 40
    journal.complete(read, EventType.OK, value=None)
    clock.ns = 41
    journal.resolve(op, 7)
    journal.close()
    acquire, get = read_operations([journal.path])
    assert (acquire.op, acquire.outcome, acquire.value, acquire.error) == (
        OpName.TRY_ACQUIRE_LOCK,
        EventType.OK,
        7,
        None,
    )
    # Landed somewhere between its invocation and the read that proved it.
    assert (acquire.invoke_ns, acquire.complete_ns) == (10, 41)
    assert get.outcome is EventType.OK


def test_an_unresolved_lost_reply_stays_info(tmp_path: Path) -> None:
    clock = StepClock()
    journal = _journal(tmp_path, 0, clock)
    op = journal.invoke(0, "e1", OpName.TRY_ACQUIRE_LOCK, "k1")
    journal.complete(op, EventType.INFO, error="StoreError")
    journal.close()
    (acquire,) = read_operations([journal.path])
    assert acquire.outcome is EventType.INFO
    assert acquire.error == "StoreError"


def _run(tmp_path: Path, *, resolve: bool) -> tuple[StressSettings, list[object], object]:
    """p0 reclaims an acquire whose reply was lost and charges; p1 takes over after expiry."""
    settings = StressSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}",
        processes=2,
        workers=1,
        keys=1,
        duplicates=2,
        lock_duration=dt.timedelta(seconds=1),
    )
    s = 1_000_000_000
    c0, c1 = StepClock(), StepClock()
    j0, j1 = _journal(tmp_path, 0, c0), _journal(tmp_path, 1, c1)
    c0.ns = 0
    op = j0.invoke(0, "e0", OpName.TRY_ACQUIRE_LOCK, "k00000")
    c0.ns = s // 10
    j0.complete(op, EventType.INFO, error="StoreError")
    read = j0.invoke(0, "e0", OpName.GET, "k00000")
    c0.ns = s // 5
    j0.complete(read, EventType.OK, value=None)
    if resolve:
        j0.resolve(op, 1)
    # p1 acquires long after p0's lock expired, p0 never having written.
    c1.ns = 3 * s
    take = j1.invoke(0, "e1", OpName.TRY_ACQUIRE_LOCK, "k00000")
    c1.ns = 3 * s + 1000
    j1.complete(take, EventType.OK, value=2)
    j0.close()
    j1.close()
    effects = [
        EffectRow("k00000", "e0", 1, 0, 0, s // 2),
        EffectRow("k00000", "e1", 2, 1, 0, 3 * s + 2000),
    ]
    history = build_history(
        settings,
        epoch_ns=0,
        operations=read_operations([j0.path, j1.path]),
        effects=effects,
        final=(),
    )
    return settings, effects, history


def test_a_reclaimed_acquisition_is_a_lease_and_its_expiry_excuses_the_second_charge(
    tmp_path: Path,
) -> None:
    settings, _, history = _run(tmp_path, resolve=True)
    key = history_key(settings, "k00000")
    assert [lease.token for lease in leases_for(history, key)] == [1, 2]
    assert sum(acquired(op) for op in history.ops_for(key)) == 2
    result = no_duplicate_side_effect(history)
    assert result.passed, result.violations
    assert any("excused" in note for note in result.notes)


def test_without_the_resolution_the_same_charges_are_a_duplicate(tmp_path: Path) -> None:
    # The control: the checker is right to fail a token no acquisition granted.
    _, _, history = _run(tmp_path, resolve=False)
    result = no_duplicate_side_effect(history)
    assert not result.passed
    assert "no acquisition" in result.violations[0].message
