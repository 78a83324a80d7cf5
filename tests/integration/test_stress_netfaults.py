"""Network faults as part of ``dsm stress``: the same checker, the faults on the real wire.

The worker processes reach the database through a FaultProxy; the parent
(redelivery, recovery, the final reads) and the effect ledger go direct.  A
partition longer than the lock makes the crucial case happen in a short run:
a worker's lock expires while it is cut off, the parent redelivers the item
and takes it over, and the worker's late ``set`` reaches the server after
the partition heals.  The built-in handler must reject it (and the run pass,
the second charge excused); a handler whose ``set`` ignores the token must
be caught, or the passing run would prove nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import pickle
from pathlib import Path

import pytest

from dsm_sim.history import EventKind
from dsm_sim.micros import micros_of as us
from dsm_sim.netfaults import FaultKind, FaultWindow
from dsm_sim.reports.html import swim_lanes
from dsm_sim.stress import StressReport, StressSettings, run_stress
from dsm_sim.stress.cli import configure, main
from dsm_sim.stress.history_builder import build_history
from dsm_sim.stress.netfault_spec import (
    NetFault,
    NetFaultSpecError,
    StallDirection,
    parse_netfault,
    parse_netfaults,
)
from dsm_sim.stress.settings import NetFaultDatabaseError
from reference_engine.errors import ConfigurationError, InvalidOptionError

pytestmark = pytest.mark.integration

UNFENCED_SPEC = "dsm_sim.stress.factories:stress_unfenced_handler"
LOCK_S = 1.0
PARTITION = "partition:at=0.2s,for=2s"
#: How long process 0 holds its first lock: past the partition's start, short of the lock's end.
STALL_S = 0.6


# --- the grammar ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("partition:at=2s,for=3s", NetFault(FaultKind.PARTITION, 2.0, 3.0)),
        (
            "partition:at=0,for=500ms,heal=reset",
            NetFault(FaultKind.PARTITION, 0.0, 0.5, heal="reset"),
        ),
        (
            "latency:to_server=20ms,to_client=30ms,at=0s,for=5s",
            NetFault(FaultKind.LATENCY, 0.0, 5.0, to_server=0.02, to_client=0.03),
        ),
        ("latency:to_client=5ms", NetFault(FaultKind.LATENCY, 0.0, None, to_client=0.005)),
        ("reset:at=3s", NetFault(FaultKind.RESET, 3.0)),
        (
            "stall:direction=to_client,at=2s,for=1s",
            NetFault(FaultKind.STALL, 2.0, 1.0, direction=StallDirection.TO_CLIENT),
        ),
        ("refuse:at=1.5,for=2s", NetFault(FaultKind.REFUSE, 1.5, 2.0)),
    ],
)
def test_specs_of_every_kind_parse(spec: str, expected: NetFault) -> None:
    assert parse_netfault(spec) == dataclasses.replace(expected, spec=spec)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "empty"),
        ("blackhole:at=1s", "unknown fault 'blackhole'"),
        ("partition:at=1s", "partition needs for"),
        ("partition:at=1m,for=2s", "'1m' is not a time"),
        ("partition:at=-1s,for=2s", "not a time"),
        ("partition:at=1s,for=0s", "above 0"),
        ("partition:at=1s,for=2s,heal=drop", "heal is resume or reset"),
        ("partition:at=1s,for=2s,direction=to_client", "not 'direction'"),
        ("stall:at=1s,for=1s,direction=up", "direction is to_server, to_client or both"),
        ("reset:at=1s,for=2s", "reset takes at, not 'for'"),
        ("reset:at=1s,at=2s", "given twice"),
        ("latency:at=1s", "latency needs to_server= or to_client="),
        ("refuse:at=4000s,for=1s", "not below 3600s"),
        ("refuse:at", "not NAME=VALUE"),
    ],
)
def test_bad_specs_are_named_errors_that_list_the_grammar(spec: str, problem: str) -> None:
    with pytest.raises(NetFaultSpecError) as caught:
        parse_netfault(spec)
    error = caught.value
    assert isinstance(error, InvalidOptionError) and isinstance(error, ConfigurationError)
    assert problem in str(error)
    assert "allowed: partition:at=T,for=T" in str(error)
    # It crosses a process boundary whole, as every DsmError must.
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NetFaultSpecError
    assert (str(copy), copy.spec, copy.problem, copy.allowed) == (
        str(error),
        error.spec,
        error.problem,
        error.allowed,
    )


def test_windows_on_one_switch_of_the_proxy_must_not_overlap() -> None:
    with pytest.raises(NetFaultSpecError, match="overlaps 'partition:at=1s,for=2s'"):
        parse_netfaults(["partition:at=1s,for=2s", "stall:at=2s,for=1s"])
    with pytest.raises(NetFaultSpecError, match="overlaps"):
        parse_netfaults(["latency:to_server=5ms", "latency:to_client=5ms,at=3s,for=1s"])
    # Back to back, on different switches, or a reset inside a partition: all fine.
    faults = parse_netfaults(
        ["partition:at=3s,for=1s", "partition:at=1s,for=2s", "reset:at=1.5s", "refuse:at=1s,for=1s"]
    )
    assert [f.at for f in faults] == [1.0, 1.0, 1.5, 3.0]


def test_netfaults_on_sqlite_are_refused(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(NetFaultDatabaseError, match="no connection to fault") as caught:
        StressSettings(db_url=url, netfaults=parse_netfaults([PARTITION]))
    assert pickle.loads(pickle.dumps(caught.value)).url == caught.value.url


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    configure(parser)
    return main(parser.parse_args(list(argv)))


def test_the_cli_refuses_bad_specs_and_sqlite_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite = f"sqlite:///{tmp_path / 'cli.db'}"
    assert _cli("--db", sqlite, "--netfault", "partition:at=1s") == 2
    assert "partition needs for; allowed:" in capsys.readouterr().err
    assert _cli("--db", sqlite, "--netfault", PARTITION) == 2
    assert "needs a database server reached over TCP" in capsys.readouterr().err
    assert not (tmp_path / "cli.db").exists()  # refused before anything ran


def test_the_history_marks_each_window_where_the_operations_are_timed(tmp_path: Path) -> None:
    settings = StressSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", processes=1)
    windows = (
        FaultWindow(FaultKind.PARTITION, 2.5, 4.5, "heal=resume"),
        FaultWindow(FaultKind.RESET, 5.0, 5.0, "3 connection(s)"),
    )
    history = build_history(
        settings, epoch_ns=0, operations=(), effects=(), final=(), fault_windows=windows
    )
    marks = [(e.time, e.detail) for e in history.events if e.kind is EventKind.STORE_FAULT]
    assert marks == [
        (2_500_000, "partition (heal=resume) begins"),
        (4_500_000, "partition (heal=resume) ends"),
        (5_000_000, "reset (3 connection(s))"),
    ]
    # The HTML timeline draws each mark across every lane, as it draws a clock jump.
    rules = [s for s in swim_lanes(history, set(), set()).shapes if s.css == "netfault"]
    assert len(rules) == 3 and all(s.kind == "line" for s in rules)


# --- real runs ----------------------------------------------------------------------------------


def faulted(db_url: str, spec: str, handler_spec: str | None = None, seed: int = 0) -> StressReport:
    """A short run: 2 processes x 4 workers, 40 keys twice, a 1 s lock, the given fault.

    On a quiet machine the 80 deliveries take about 0.3 s, so a partition at
    0.2 s could find nothing in flight.  Process 0 holds its first lock for
    :data:`STALL_S` after acquiring it, so that one holder's ``set`` always
    leaves inside the partition while its lock is live, and is held there
    until the parent has taken the item over: the late write the tests look
    for happens on every machine, not only on a loaded one.
    """
    settings = StressSettings(
        db_url=db_url,
        processes=2,
        workers=4,
        keys=40,
        duplicates=2,
        lock_duration=dt.timedelta(seconds=LOCK_S),
        stall_after_acquire=STALL_S,
        seed=seed,
        netfaults=parse_netfaults([spec]),
        **({"handler_spec": handler_spec} if handler_spec else {}),
    )
    return asyncio.run(run_stress(settings, limit_s=120))


def _partition(report: StressReport) -> FaultWindow:
    (window,) = [w for w in report.fault_windows if w.kind is FaultKind.PARTITION]
    assert window.end is not None
    return window


def _late_fenced_writes(report: StressReport, window: FaultWindow) -> list[int]:
    """Writes held by the partition, rejected by fencing once it healed."""
    assert report.history is not None and window.end is not None
    return [
        op.index
        for op in report.history.ops
        if op.error == "StaleLockError" and op.invoke <= us(window.end) <= (op.complete or 0)
    ]


@pytest.mark.postgres
def test_a_partition_longer_than_the_lock_is_fenced_on_postgres(postgres_url: str) -> None:
    evidence: list[StressReport] = []
    for seed in range(3):
        report = faulted(postgres_url, PARTITION, seed=seed)
        assert report.passed, report.summary()
        assert not report.settings.fault_free
        window = _partition(report)
        assert report.fault_windows == (window,)
        assert window.end is not None and window.end - window.start >= 1.9
        assert report.faults_origin is not None
        assert window.start - report.faults_origin == pytest.approx(0.2, abs=0.1)
        # Every rejection happened inside or after the window, never before it.
        history = report.history
        assert history is not None
        fenced = [op for op in history.ops if op.error == "StaleLockError"]
        assert all((op.complete or 0) >= us(window.start) for op in fenced)
        if _late_fenced_writes(report, window):
            evidence.append(report)
            break
    assert evidence, "no late write was held by the partition and fenced in three runs"
    report = evidence[0]
    assert report.fenced_writes >= 1
    assert set(report.excused_duplicate_keys) == set(report.duplicate_keys)
    notes = [n for r in report.results for n in r.notes]
    assert any("fencing rejected" in n for n in notes), notes
    # The history and the JSON report carry the window on the operations' time base.
    assert report.history is not None
    marks = [e for e in report.history.events if e.kind is EventKind.STORE_FAULT]
    assert [e.time for e in marks] == [us(window.start), us(window.end)]
    written = json.loads(json.dumps(report.to_json()))
    assert written["fault_free"] is False
    assert written["netfaults"] == [PARTITION]
    assert written["fault_windows"] == [
        {
            "kind": "partition",
            "start": round(window.start, 6),
            "end": round(window.end, 6),
            "detail": "heal=resume",
        }
    ]


@pytest.mark.postgres
def test_a_handler_that_ignores_fencing_is_caught_through_the_partition(
    postgres_url: str,
) -> None:
    caught = None
    for seed in range(3):
        report = faulted(postgres_url, PARTITION, UNFENCED_SPEC, seed)
        if not report.passed:
            caught = report
            break
    assert caught is not None, "the unfenced handler survived three partitioned runs"
    verdicts = {r.name: r.passed for r in caught.results}
    assert not verdicts["no_duplicate_side_effect"] or not verdicts["stale_write_rejected"]
    # The durable evidence agrees: a key charged twice that nothing excuses.
    assert caught.unexcused_duplicate_keys
    assert caught.excused_duplicate_keys == ()


@pytest.mark.mariadb
def test_a_partition_healed_by_reset_is_survived_on_mariadb(mariadb_url: str) -> None:
    report = faulted(mariadb_url, PARTITION + ",heal=reset")
    assert report.passed, report.summary()
    window = _partition(report)
    assert window.detail == "heal=reset"
    # Healing by reset is logged as a reset of its own, at the instant the partition ended.
    (reset,) = [w for w in report.fault_windows if w.kind is FaultKind.RESET]
    assert reset.start == reset.end == pytest.approx(window.end, abs=0.01)
    # The reset killed the calls the partition held: errors the run expected.
    assert report.store_errors > 0
    assert report.unfinished_keys == ()
