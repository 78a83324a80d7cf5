"""Verdicts that cannot pass vacuously: liveness of a run, and the numbers that could empty it.

A handler whose every ``exists`` raises keeps every safety invariant (it never
locks, so it never locks twice), and so does a run whose store latency is
infinite or whose stress timeout kills every worker.  Each of these must now
fail: the run through ``every_delivery_settles``, the numbers before anything
runs, with a named error and exit status 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from dsm_sim import checker
from dsm_sim.checker.liveness import REASONS_META
from dsm_sim.cli import main as dsm
from dsm_sim.history import EventKind, History, HistoryRecorder, OpName, Outcome
from dsm_sim.micros import micros_of as us
from dsm_sim.scenario import ScenarioError, load_scenario, parse_scenario
from dsm_sim.simulator.run import run_scenario
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
K = "tenant-1/4/node//inv-1"


class ExistsAlwaysRaises(InMemoryStateHandler):
    """The probe's handler: every ``exists`` fails, so nothing is ever processed."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        raise RuntimeError("exists is broken")


class StoreAlwaysDown(InMemoryStateHandler):
    """Every ``exists`` is a ``StoreError``: an error the model judge accepts from any store."""

    async def exists(self, ctx: StateHandlerContext) -> bool:
        raise StoreError("the store is down")


def exists_always_raises(clock: Clock) -> InMemoryStateHandler:
    return ExistsAlwaysRaises(clock)


def store_always_down(clock: Clock) -> InMemoryStateHandler:
    return StoreAlwaysDown(clock)


# --- whole runs ------------------------------------------------------------------------------


def _liveness_messages(factory: Any, name: str) -> tuple[list[str], list[str]]:
    scenario = load_scenario(SCENARIOS / name)
    result = run_scenario(scenario, 1, factory)
    assert int(result.stats["dead_letters"]) >= scenario.items
    (liveness,) = [r for r in result.results if r.name == "every_delivery_settles"]
    return result.violated, [v.message for v in liveness.violations]


def test_a_store_that_is_always_down_fails_the_run_on_liveness_alone() -> None:
    """Every safety invariant and every model judgement pass: only liveness can fail this run."""
    violated, messages = _liveness_messages(store_always_down, "duplicate-storm.toml")
    assert violated == ["every_delivery_settles"]
    assert any("processed nothing" in m for m in messages)
    assert any("'StoreError'" in m and "dead-lettered" in m for m in messages)


def test_a_handler_whose_exists_raises_fails_the_run() -> None:
    violated, messages = _liveness_messages(exists_always_raises, "duplicate-storm.toml")
    assert "every_delivery_settles" in violated
    assert any("'RuntimeError'" in m for m in messages)


def test_the_reference_handler_settles_every_delivery() -> None:
    result = run_scenario(load_scenario(SCENARIOS / "crash-mid-dispatch.toml"), 1)
    (liveness,) = [r for r in result.results if r.name == "every_delivery_settles"]
    assert liveness.passed, liveness.violations


def test_a_dead_letter_records_why_its_last_delivery_failed() -> None:
    result = run_scenario(load_scenario(SCENARIOS / "screening-rules.toml"), 1)
    reasons = {ev.detail for ev in result.history.events if ev.kind is EventKind.DEAD_LETTER}
    assert reasons
    allowed = set(str(result.history.meta[REASONS_META]).split(","))
    assert reasons <= allowed
    assert "Rejected" in reasons  # the screening node's invalid lines, a business decision


# --- the invariant on hand-built histories ---------------------------------------------------


def _history(
    *,
    allowed: str | None = "Crash,StoreError",
    final: str = "processed",
    dead: str | None = None,
    crash: bool = False,
    deliveries: int = 1,
) -> History:
    meta: dict[str, Any] = {} if allowed is None else {REASONS_META: allowed}
    rec = HistoryRecorder(lock_duration=60.0, sweep_interval=20.0, meta=meta)
    for i in range(deliveries):
        rec.event(EventKind.DELIVERY, us(i), process="broker", key=K, detail=f"m delivery {i}")
    index = rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, us(1.0))
    rec.complete(index, Outcome.OK, us(1.1), result=1, token=1, store_time=us(1.1))
    if crash:
        rec.event(EventKind.CRASH, us(2.0), process="w1", key=K, token=1)
    if dead is not None:
        rec.event(
            EventKind.DEAD_LETTER, us(3.0), process="broker", key=K, execution="m", detail=dead
        )
    rec.final_state(K, final, 1, us(400.0), us(400.0))
    return rec.freeze()


def test_a_processed_item_settles() -> None:
    assert checker.every_delivery_settles(_history()).passed


def test_deliveries_with_nothing_done_are_a_violation() -> None:
    result = checker.every_delivery_settles(_history(final="failed", dead="StoreError"))
    assert not result.passed
    assert "processed nothing" in result.violations[0].message


def test_a_dead_letter_for_a_reason_no_fault_injects_is_a_violation() -> None:
    history = _history(final="failed", dead="RuntimeError", allowed="Crash,StoreError")
    result = checker.every_delivery_settles(history)
    assert [v.key for v in result.violations if "RuntimeError" in v.message] == [K]


def test_an_item_dropped_without_a_dead_letter_or_a_crash_is_a_violation() -> None:
    history = _history(final="failed", allowed="Crash")
    messages = [v.message for v in checker.every_delivery_settles(history).violations]
    assert any("the item was dropped" in m for m in messages)


def test_an_item_abandoned_to_a_crashed_holder_is_explained_when_crashes_are_injected() -> None:
    def dropped(allowed: str) -> list[str]:
        history = _history(final="failed", crash=True, allowed=allowed)
        result = checker.every_delivery_settles(history)
        return [v.message for v in result.violations if "dropped" in v.message]

    assert dropped("Crash") == []
    assert dropped("StoreError") != []  # the crash itself was not a fault of the scenario


def _stranded(release: Outcome, error: str | None, allowed: str) -> list[str]:
    """A holder whose one release met ``release``/``error``; the item ends Failed by the sweep."""
    rec = HistoryRecorder(lock_duration=60.0, sweep_interval=20.0, meta={REASONS_META: allowed})
    rec.event(EventKind.DELIVERY, 0, process="broker", key=K, detail="m delivery 1")
    index = rec.invoke("w1", OpName.TRY_ACQUIRE_LOCK, K, us(1.0))
    rec.complete(index, Outcome.OK, us(1.1), result=1, token=1, store_time=us(1.1))
    index = rec.invoke("w1", OpName.RELEASE_LOCK_AS_FAILED, K, us(2.0), token=1)
    rec.complete(index, release, us(2.1), error=error, store_time=us(2.1))
    rec.final_state(K, "failed", 1, us(400.0), us(400.0))
    result = checker.every_delivery_settles(rec.freeze())
    return [v.message for v in result.violations if "dropped" in v.message]


def test_an_item_stranded_by_a_release_that_met_a_store_error_is_explained() -> None:
    """The release did not land (or its reply was lost): redeliveries skip the live lock."""
    assert _stranded(Outcome.FAIL, "StoreError", "Crash,StoreError") == []
    assert _stranded(Outcome.INFO, "StoreError", "StoreError") == []


def test_a_stranded_holder_explains_nothing_when_its_release_landed_or_no_store_fault_runs() -> (
    None
):
    assert _stranded(Outcome.OK, None, "Crash,StoreError") != []
    assert _stranded(Outcome.FAIL, "StoreError", "Crash") != []
    assert _stranded(Outcome.FAIL, "StaleLockError", "Crash,StoreError") != []


def test_a_history_without_deliveries_is_not_judged() -> None:
    rec = HistoryRecorder(lock_duration=60.0)
    result = checker.every_delivery_settles(rec.freeze())
    assert result.passed
    assert "not checked" in result.notes[0]


def test_a_stress_history_that_processed_nothing_fails() -> None:
    rec = HistoryRecorder(lock_duration=60.0, meta={"source": "stress", "deliveries": 600})
    rec.final_state(K, "none", None, us(5.0))
    result = checker.every_delivery_settles(rec.freeze())
    assert not result.passed
    assert "600 deliveries" in result.violations[0].message


# --- numbers that would make a run meaningless -----------------------------------------------

BAD_NUMBERS = [
    ({"latency": {"store": math.inf}}, "latency.store"),
    ({"latency": {"store": math.nan}}, "latency.store"),
    ({"latency": {"effect": 1e12}}, "latency.effect"),
    ({"latency": {"grid": 1e-300}}, "latency.grid"),
    ({"run": {"faults_until": math.inf}}, "run.faults_until"),
    ({"run": {"faults_until": 1e12}}, "run.faults_until"),
    ({"run": {"faults_until": "9" * 400 + "s"}}, "run.faults_until"),
    ({"run": {"faults_until": "\uff13\uff10m"}}, "run.faults_until"),
    ({"run": {"arrival_window": math.nan}}, "run.arrival_window"),
    ({"run": {"redelivery_delay": math.inf}}, "run.redelivery_delay"),
    ({"run": {"sweep_interval": math.nan}}, "run.sweep_interval"),
    ({"run": {"sweep_interval": 1e-6}}, "run.sweep_interval"),
    ({"run": {"lock_duration": math.inf}}, "run.lock_duration"),
    ({"faults": {"clock_jump": {"schedule": [{"at": "1m", "by": -1e12}]}}}, "by"),
    ({"faults": {"clock_jump": {"schedule": [{"at": math.nan, "by": "1m"}]}}}, "at"),
    ({"faults": {"duplicate_delivery": {"copies": [1, 10**9]}}}, "copies"),
    ({"faults": {"duplicate_delivery": {"delay": [0, math.inf]}}}, "delay"),
    ({"faults": {"crash": {"restart_delay": math.inf}}}, "faults.crash.restart_delay"),
    ({"faults": {"clock_skew": {"max": math.nan}}}, "faults.clock_skew.max"),
    ({"faults": {"catchup_pause": {"schedule": [{"at": 0, "for": 1e15}]}}}, "for"),
    ({"faults": {"slow_worker": {"factor": math.nan}}}, "faults.slow_worker.factor"),
    ({"nodes": [{"lock_duration": math.nan}]}, "nodes[0].lock_duration"),
    ({"nodes": [{"retention": math.inf}]}, "nodes[0].retention"),
]


@pytest.mark.parametrize(("raw", "field"), BAD_NUMBERS, ids=[f for _, f in BAD_NUMBERS])
def test_a_number_that_would_empty_or_hang_a_run_is_refused(
    raw: dict[str, Any], field: str
) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(raw, "bad.toml")
    assert info.value.field.endswith(field)
    assert info.value.allowed, "the error must say what is allowed"
    assert len(str(info.value)) < 400, "a huge value must not be echoed whole"


def test_every_shipped_scenario_is_within_the_bounds() -> None:
    for path in sorted(SCENARIOS.glob("*.toml")):
        load_scenario(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["stress", "--timeout", "-5"],
        ["stress", "--timeout", "nan"],
        ["stress", "--timeout", "inf"],
        ["stress", "--lock-duration", "0"],
        ["stress", "--fail-rate", "nan"],
        ["stress", "--fail-rate", "1"],
        ["stress", "--processes", "0"],
        ["stress", "--keys", "9" * 30],
        ["run", "scenarios/", "--seeds", "0"],
        ["run", "scenarios/", "--seeds", "100000"],
        ["run", "scenarios/", "--seed", "-1"],
        ["verify", "x:y", "--exec-timeout", "-1"],
    ],
    ids=" ".join,
)
def test_a_numeric_option_out_of_range_exits_2_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        dsm(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}" in err
    assert "must be" in err
