"""A bad scenario file fails at load time, naming the file, the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsm_sim.scenario import CrashPoint, NodeKind, ScenarioError, load_scenario, load_scenarios
from reference_engine.errors import ConfigurationError

pytestmark = pytest.mark.scenario


def _write(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        ("colour = 'red'", "colour", "description, faults, latency, name, nodes, run"),
        ("[run]\nitems = 0", "run.items", "an integer from 1 to 500"),
        ("[run]\nitems = 'many'", "run.items", "an integer from 1 to 500"),
        ("[run]\nworkers = true", "run.workers", "an integer from 1 to 64"),
        ("[run]\nlock_duration = '10 minutes'", "run.lock_duration", "'90s'"),
        ("[run]\nlock_duration = '-5m'", "run.lock_duration", "a positive duration"),
        ("[run]\nspeed = 3", "run.speed", "items, keys, lock_duration"),
        (
            "[run]\narrival_window = '20m'\nfaults_until = '10m'",
            "run.arrival_window",
            "ends before faults stop",
        ),
        ("[latency]\njitter = 2", "latency.jitter", "a number from 0.0 to 0.95"),
        ("[faults.crash]\nrate = 1.5", "faults.crash.rate", "a number from 0.0 to 1.0"),
        (
            "[faults.crash]\npoints = ['after_lunch']",
            "faults.crash.points",
            ", ".join(p.value for p in CrashPoint),
        ),
        (
            "[faults.duplicate_delivery]\ncopies = [3, 1]",
            "faults.duplicate_delivery.copies",
            "low <= high",
        ),
        (
            "[faults.duplicate_delivery]\ndelay = '5s'",
            "faults.duplicate_delivery.delay",
            "[low, high]",
        ),
        (
            "[faults.clock_jump]\nschedule = [{ at = '1m', by = 'soon' }]",
            "faults.clock_jump.schedule[0].by",
            "a signed duration",
        ),
        (
            "[faults.clock_jump]\nschedule = [{ when = '1m' }]",
            "faults.clock_jump.schedule[0].when",
            "at, by",
        ),
        ("[faults.meteor]\nrate = 1", "faults.meteor", "crash, duplicate_delivery"),
        ("[faults]\nswarm = 'yes'", "faults.swarm", "true or false"),
        (
            "[faults.store_errors]\nrate = 0.9",
            "faults.store_errors.rate",
            "a number from 0.0 to 0.5",
        ),
        ("name = 'Has Spaces'", "name", "lower-case letters, digits and '-'"),
        ("run = 3", "run", "a table"),
        ("[run]\nkeys = 'weird'", "run.keys", "plain, varied"),
        ("[run]\npayloads = 1", "run.payloads", "plain, varied"),
        ("[run]\nhost_timezone = 'Mars/Olympus'", "run.host_timezone", "IANA time zone"),
        ("[latency]\ngrid = '-1s'", "latency.grid", "a positive duration"),
        ("[faults.lost_reply]\nrate = 0.8", "faults.lost_reply.rate", "a number from 0.0 to 0.5"),
        ("[faults.lost_reply]\nenabled = 2", "faults.lost_reply.enabled", "from 0.0 to 1.0"),
        ("nodes = 'invoice'", "nodes", "a non-empty array of tables"),
        ("[[nodes]]\nkind = 'payroll'", "nodes[0].kind", "invoice, correction, screening"),
        ("[[nodes]]\nscope = 'Galaxy'", "nodes[0].scope", "Tenant, Application, Workflow"),
        ("[[nodes]]\nid = 'Upper'", "nodes[0].id", "lower-case letters, digits and '-'"),
        ("[[nodes]]\nid = 'a'\n[[nodes]]\nid = 'a'", "nodes[1].id", "unique ids"),
        ("[[nodes]]\nlock_duration = '2d'", "nodes[0].lock_duration", "at most 1 day"),
        ("[[nodes]]\nlock_duration = 'soon'", "nodes[0].lock_duration", "'90s'"),
        (
            "[[nodes]]\nlock_duration = '5m'\nretention = '1m'",
            "nodes[0].retention",
            "longer than lock_duration, or 'forever'",
        ),
        ("[[nodes]]\nretention = 'never'", "nodes[0].retention", "'90s'"),
        ("[[nodes]]\nrevisions = 0", "nodes[0].revisions", "an integer from 1 to 10"),
        ("[[nodes]]\ncolour = 'red'", "nodes[0].colour", "id, kind, lines"),
    ],
)
def test_bad_field_is_named_with_what_is_allowed(
    tmp_path: Path, text: str, field: str, allowed: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    error = info.value
    assert error.path == str(path)
    assert error.field == field
    assert allowed in error.allowed
    message = str(error)
    assert str(path) in message and f"'{field}'" in message and allowed in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[run\nitems = 3")
    with pytest.raises(ScenarioError, match="not valid TOML") as info:
        load_scenario(path)
    assert str(path) in str(info.value)


def test_missing_file_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.toml")
    with pytest.raises(ScenarioError, match=r"no \*\.toml scenario files"):
        load_scenarios(tmp_path)


def test_scenario_error_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        load_scenario(_write(tmp_path, "[run]\nitems = -1"))


def test_minimal_file_gets_documented_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, "", name="tiny.toml"))
    assert scenario.name == "tiny"
    assert scenario.lock_duration == 60.0
    assert scenario.faults.crash.rate == 0.0
    assert scenario.faults.crash.points == tuple(CrashPoint)


def test_durations_accept_numbers_units_and_signs(tmp_path: Path) -> None:
    text = (
        "[run]\nlock_duration = 90\nsweep_interval = '250ms'\nfaults_until = '2h'\n"
        "[faults.clock_jump]\nschedule = [{ at = '1m', by = '-10m' }, { at = 30, by = '+1.5m' }]"
    )
    scenario = load_scenario(_write(tmp_path, text))
    assert scenario.lock_duration == 90.0
    assert scenario.sweep_interval == 0.25
    assert scenario.faults_until == 7200.0
    assert [(j.at, j.by) for j in scenario.faults.clock_jumps] == [(30.0, 90.0), (60.0, -600.0)]


def test_nodes_default_to_the_run_and_accept_forever(tmp_path: Path) -> None:
    text = (
        "[run]\nlock_duration = '45s'\n"
        "[[nodes]]\nkind = 'correction'\n"
        "[[nodes]]\nid = 'lines'\nkind = 'screening'\nscope = 'Thread'\n"
        "lock_duration = '3s'\nretention = 'forever'\nlines = 5\n"
    )
    scenario = load_scenario(_write(tmp_path, text))
    first, second = scenario.nodes
    assert (first.id, first.kind, first.lock_duration) == (
        "correction-1",
        NodeKind.CORRECTION,
        45.0,
    )
    assert first.retention == 30 * 86400.0
    assert (second.scope, second.lock_duration, second.retention, second.lines) == (
        "Thread",
        3.0,
        None,
        5,
    )
    assert scenario.longest_lock == 45.0
    assert load_scenario(_write(tmp_path, "", name="bare.toml")).nodes == ()
