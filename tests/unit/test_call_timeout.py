"""A handler call that never returns is a reported violation, not a hang of ``dsm verify``.

The handlers here await forever (``asyncio.Event().wait()``) in one call and
are otherwise correct.  With a short ``--call-timeout`` the kit must finish,
name the call that hung and tell the steps that led to it.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from dsm_sim.cli import main as dsm_main
from dsm_sim.conformance.execute.loop import (
    DEFAULT_CALL_TIMEOUT_S,
    CallTimeoutError,
    LoopDriver,
    call_timeout,
    timeouts_seen,
    validate_call_timeout,
)
from dsm_sim.conformance.runner import ResultStatus, verify
from dsm_sim.simulator.bridge import CALL_TIMEOUT_ENV
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.errors import ConfigurationError
from reference_engine.handlers.memory import InMemoryStateHandler

pytestmark = pytest.mark.unit

SHORT = 0.2


class HangingAcquire(InMemoryStateHandler):
    """Correct, except that ``try_acquire_lock`` waits for a lock nobody will release."""

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        await asyncio.Event().wait()
        raise AssertionError("unreachable: nobody sets the event")


class HangingOpen(InMemoryStateHandler):
    """Correct, except that ``open`` never finishes connecting."""

    async def open(self) -> None:
        await asyncio.Event().wait()


def hanging_acquire(clock: Clock) -> HangingAcquire:
    return HangingAcquire(clock)


def hanging_open(clock: Clock) -> HangingOpen:
    return HangingOpen(clock)


def test_a_hung_try_acquire_lock_is_a_violation_with_its_story() -> None:
    report = verify(hanging_acquire, profile="dev", seed=7, call_timeout_s=SHORT)
    assert not report.passed
    (violation,) = report.violations
    assert violation.name == "errors_agree_with_model"
    assert "CallTimeoutError" in violation.message
    assert f"did not return within {SHORT:g}s" in violation.message
    assert "try_acquire_lock(" in violation.story  # the step that hung is in the story
    # The search stops at the hang: the rest is unsettled, and the report says why.
    assert report.error is not None and "a handler call hung" in report.error
    assert f"--seed 7 --call-timeout {SHORT:g}" in report.replay_command()
    others = {r.status for r in report.results if r.name != violation.name}
    assert others == {ResultStatus.UNSETTLED}


def test_an_open_that_never_returns_ends_the_run_naming_open() -> None:
    report = verify(hanging_open, profile="dev", seed=7, call_timeout_s=SHORT)
    assert not report.passed
    assert report.error is not None
    assert f"open() did not return within {SHORT:g}s" in report.error, report.error


def test_the_race_matrix_bounds_its_calls_by_the_same_limit() -> None:
    # The first handler this run builds is the race matrix's (no probes): its
    # open takes a second, five times the limit and a tenth of the default.
    # Bounded by the run's limit, that open is a timeout; bounded by the
    # default, it would pass unnoticed and every later hung call would cost
    # the default's ten seconds.
    opened: list[bool] = []

    class SlowFirstOpen(InMemoryStateHandler):
        async def open(self) -> None:
            if not opened:
                opened.append(True)
                await asyncio.sleep(5 * SHORT)
            await super().open()

    before = timeouts_seen()
    verify(SlowFirstOpen, profile="dev", seed=7, probes=False, call_timeout_s=SHORT)
    assert opened and timeouts_seen() > before


_HUNG_MODULE = textwrap.dedent(
    """
    import asyncio

    from reference_engine.handlers.memory import InMemoryStateHandler


    class HangingAcquire(InMemoryStateHandler):
        async def try_acquire_lock(self, ctx):
            await asyncio.Event().wait()


    class HangingOpen(InMemoryStateHandler):
        async def open(self):
            await asyncio.Event().wait()


    def acquire(clock):
        return HangingAcquire(clock)


    def opening(clock):
        return HangingOpen(clock)
    """
)
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_dsm_verify_finishes_and_reports_the_hung_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dsm_hung_store.py").write_text(_HUNG_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["--profile", "dev", "--seed", "3", "--cache-dir", str(tmp_path / "cache")]
    timeout = ["--call-timeout", str(SHORT)]

    assert dsm_main(["verify", "dsm_hung_store:acquire", *common, *timeout]) == 1
    out = capsys.readouterr().out
    assert "errors_agree_with_model violated" in out, out
    assert f"did not return within {SHORT:g}s" in out, out
    assert "try_acquire_lock(" in out, out
    assert "a handler call hung" in out, out

    assert dsm_main(["verify", "dsm_hung_store:opening", *common, *timeout]) == 1
    out = capsys.readouterr().out
    assert f"open() did not return within {SHORT:g}s" in out, out


def test_dsm_run_stops_a_run_whose_handler_call_hangs_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dsm_hung_sim_store.py").write_text(_HUNG_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "30")  # restored afterwards; the flag overrides it
    scenario = str(SCENARIOS / "flaky-store.toml")
    for factory, call in (("acquire", "try_acquire_lock()"), ("opening", "open()")):
        argv = ["run", scenario, "--handler", f"dsm_hung_sim_store:{factory}", "--seed", "1"]
        assert dsm_main([*argv, "--call-timeout", str(SHORT)]) == 1
        out = capsys.readouterr().out
        assert f"the handler's {call} did not return within {SHORT:g}s" in out, out
        assert "1 stopped by a hung handler call" in out, out


def test_a_bad_call_timeout_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "-1")
    assert dsm_main(["run", str(SCENARIOS / "flaky-store.toml"), "--seed", "1"]) == 2
    assert CALL_TIMEOUT_ENV in capsys.readouterr().err


def test_the_bound_names_the_call_and_leaves_the_handlers_own_timeout_alone() -> None:
    async def own_timeout() -> None:
        raise TimeoutError("the handler's own")

    driver = LoopDriver(timeout=SHORT)
    try:
        handler = HangingAcquire()
        hung = driver.outcome(lambda: handler.try_acquire_lock(None))  # type: ignore[arg-type]
        assert isinstance(hung.error, CallTimeoutError)
        assert hung.error.call == "try_acquire_lock()" and hung.error.timeout == SHORT
        own = driver.outcome(own_timeout)
        assert type(own.error) is TimeoutError and str(own.error) == "the handler's own"
        (raced,) = driver.gather([lambda: handler.try_acquire_lock(None)])  # type: ignore[arg-type]
        assert isinstance(raced.error, CallTimeoutError)
        assert driver.close() == []  # the hung calls were cancelled, not left running
    finally:
        driver.close()


def test_drivers_take_the_bound_in_force_when_built() -> None:
    before = LoopDriver()
    with call_timeout(1.5):
        inside = LoopDriver()
    with call_timeout(None):
        unbounded = LoopDriver()
    after = LoopDriver()
    try:
        assert before.timeout == after.timeout == DEFAULT_CALL_TIMEOUT_S
        assert inside.timeout == 1.5
        assert unbounded.timeout is None
    finally:
        for driver in (before, inside, unbounded, after):
            driver.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e12, 10**400, True, "5"])
def test_a_bad_call_timeout_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="call_timeout must be"):
        validate_call_timeout(bad)
    with pytest.raises(ConfigurationError, match="call_timeout must be"):
        verify(hanging_acquire, profile="dev", seed=1, call_timeout_s=bad)  # type: ignore[arg-type]


class _Options:
    """``--dsm-call-timeout`` as a pytest config would answer it; no other option given."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def getoption(self, name: str, default: object = None) -> object:
        assert name.startswith("--dsm-"), name
        return self.value if name == "--dsm-call-timeout" else default


def test_the_pytest_option_sets_the_default_of_every_run() -> None:
    from dsm_sim import pytest_plugin
    from dsm_sim.conformance.execute.loop import default_call_timeout, set_default_call_timeout

    try:
        pytest_plugin.pytest_configure(_Options("2.5"))  # type: ignore[arg-type]
        assert default_call_timeout() == 2.5
        pytest_plugin.pytest_configure(_Options(None))  # type: ignore[arg-type]
        assert default_call_timeout() == 2.5  # not given: left as it is
        for bad in ("0", "soon", "inf"):
            with pytest.raises(pytest.UsageError, match="--dsm-call-timeout"):
                pytest_plugin.pytest_configure(_Options(bad))  # type: ignore[arg-type]
    finally:
        set_default_call_timeout(DEFAULT_CALL_TIMEOUT_S)
    assert default_call_timeout() == DEFAULT_CALL_TIMEOUT_S
