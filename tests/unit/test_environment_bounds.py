"""A number read from the environment is bounded as its flag is, before anything runs.

``DSM_EXEC_TIMEOUT`` stands in for ``--exec-timeout`` (at most 3600) and
``DSM_CALL_TIMEOUT`` for ``--call-timeout``; ``inf`` or ``1e300`` there would
let a handler that stops answering hold the command for good.  Every command
that reads one refuses a bad value with ``EnvironmentValueError`` (exit 2),
naming the variable and the allowed range.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsm_sim import cli
from dsm_sim.options import EnvironmentValueError, seconds_from_env
from dsm_sim.protocol.client import TIMEOUT_ENV, exec_factory
from dsm_sim.simulator.bridge import CALL_TIMEOUT_ENV
from reference_engine.errors import ConfigurationError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = str(ROOT / "scenarios" / "slow-worker.toml")
#: A handler process that answers everything: the command would run, and pass, if let.
SERVED = f"{sys.executable} -m dsm_sim.cli serve reference_engine.handlers.memory:in_memory_handler"
OPEN_REQUEST = '{"id": 1, "op": "open", "now": "2026-01-01T09:00:00.000000Z", "protocol": 1}'
BAD = ["inf", "1e300", "-inf", "nan", "-5", "0", "3601", "ten", "0x10"]


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], variable: str) -> None:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert variable in err and "at most 3600" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize(
    "argv",
    [
        ["run", SCENARIO, "--seed", "1", "--handler", f"exec:{SERVED}"],
        ["verify", "--exec", SERVED, "--profile", "dev"],
        ["replay", "requests.jsonl", "--exec", SERVED],
    ],
    ids=["run", "verify", "replay"],
)
def test_a_bad_exec_timeout_in_the_environment_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    value: str,
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "requests.jsonl").write_text(OPEN_REQUEST + "\n", encoding="utf-8")
    monkeypatch.setenv(TIMEOUT_ENV, value)
    _refused(capsys, argv, TIMEOUT_ENV)


@pytest.mark.parametrize("value", BAD)
def test_a_bad_call_timeout_in_the_environment_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv(CALL_TIMEOUT_ENV, value)
    _refused(capsys, ["run", SCENARIO, "--seed", "1"], CALL_TIMEOUT_ENV)


@pytest.mark.parametrize("value", [float("inf"), 1e300, float("nan"), -1.0, 0.0, 3601.0])
def test_a_factory_refuses_an_unbounded_request_timeout(value: float) -> None:
    with pytest.raises(ConfigurationError, match="at most 3600"):
        exec_factory(SERVED, timeout=value)


def test_a_good_value_is_taken_and_an_empty_one_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DSM_SOME_TIMEOUT", " 2.5 ")
    assert seconds_from_env("DSM_SOME_TIMEOUT", 10.0, 3600.0, flag="--some-timeout") == 2.5
    monkeypatch.setenv("DSM_SOME_TIMEOUT", "")
    assert seconds_from_env("DSM_SOME_TIMEOUT", 10.0, 3600.0, flag="--some-timeout") == 10.0
    monkeypatch.setenv("DSM_SOME_TIMEOUT", "1e300")
    with pytest.raises(EnvironmentValueError) as raised:
        seconds_from_env("DSM_SOME_TIMEOUT", 10.0, 3600.0, flag="--some-timeout")
    assert raised.value.variable == "DSM_SOME_TIMEOUT" and raised.value.flag == "--some-timeout"
