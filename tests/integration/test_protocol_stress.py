"""``dsm stress`` on a handler in another process (``--handler exec:COMMAND``).

Each stress process starts its own handler process, and they race on the
run's store, which the processes learn from ``DSM_STRESS_DB_URL`` and
``DSM_STRESS_SCHEMA`` in the environment they inherit.  The built-in SQL
handler served by ``dsm serve --shared-store`` must come out clean on a
SQLite file, the check-then-insert acquire served the same way must be caught
on PostgreSQL (so races between handler processes do reach the checker), and a
handler process with a store of its own is refused before the run starts.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest

from dsm_sim.cli import main
from dsm_sim.protocol.errors import SharedStoreRequiredError
from dsm_sim.stress import StressReport, StressSettings, run_stress
from dsm_sim.stress.factories import ExecStressFactory
from reference_engine.errors import ConfigurationError

pytestmark = pytest.mark.integration

SERVE = shlex.join([sys.executable, "-m", "dsm_sim.cli", "serve"])
SHARED_SQL = f"exec:{SERVE} --shared-store dsm_sim.stress.factories:stress_sql_handler"
SHARED_BROKEN = (
    f"exec:{SERVE} --shared-store dsm_sim.stress.factories:stress_check_then_insert_handler"
)
OWN_MEMORY = f"exec:{SERVE} reference_engine.handlers.memory:in_memory_handler"


def _settings(db_url: str, handler: str, **shape: int) -> StressSettings:
    values = {"processes": 2, "workers": 2, "keys": 16, "duplicates": 2, **shape}
    return StressSettings(db_url=db_url, handler_spec=handler, fault_free=True, **values)


def _run(settings: StressSettings) -> StressReport:
    return asyncio.run(run_stress(settings, limit_s=60))


def test_the_sql_handler_served_over_the_protocol_passes_a_stress_run(tmp_path: Path) -> None:
    settings = _settings(f"sqlite+aiosqlite:///{tmp_path / 'stress.db'}", SHARED_SQL)
    report = _run(settings)
    assert report.passed, report.summary()
    assert report.effects == settings.keys
    assert report.exit_codes == (0, 0)
    assert report.unnamed_errors == {}
    delivered = sum(v for k, v in report.outcomes.items() if not k.startswith("recovery_"))
    assert delivered == settings.deliveries


@pytest.mark.postgres
def test_a_racy_acquire_in_handler_processes_is_caught_on_postgres(postgres_url: str) -> None:
    caught = None
    for seed in range(3):
        report = _run(_settings(postgres_url, SHARED_BROKEN, keys=30, seed=seed))
        if not report.passed:
            caught = report
            break
    assert caught is not None, "the check-then-insert handler survived three contended runs"
    assert caught.duplicate_keys
    assert not {r.name: r.passed for r in caught.results}["no_duplicate_side_effect"]


def test_a_handler_process_with_a_store_of_its_own_is_refused(tmp_path: Path) -> None:
    settings = _settings(f"sqlite+aiosqlite:///{tmp_path / 'own.db'}", OWN_MEMORY)
    with pytest.raises(SharedStoreRequiredError, match="needs a shared-store handler") as caught:
        _run(settings)
    assert caught.value.command == OWN_MEMORY.removeprefix("exec:")
    assert '"shared_store": true' in str(caught.value)


def test_the_command_line_refuses_it_with_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    code = main(["stress", "--db", db, "--handler", OWN_MEMORY, "--processes", "2"])
    assert code == 2
    assert "dsm stress: a stress run needs a shared-store handler" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "message"),
    [("exec:", "the handler command is empty"), ("exec-tcp:db", "is not a TCP address")],
)
def test_a_bad_exec_spec_is_a_usage_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ExecStressFactory(spec)
