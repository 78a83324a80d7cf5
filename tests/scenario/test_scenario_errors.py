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
        (
            "colour = 'red'",
            "colour",
            "deployments, description, faults, latency, name, nodes, run",
        ),
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
        ("[[nodes]]\nrevisions = 0", "nodes[0].revisions", "an integer from 1 to 40"),
        ("[[nodes]]\ncolour = 'red'", "nodes[0].colour", "id, kind, lines"),
        # The dimensions: start instants, items per instance, redeployments, lock-free tenants.
        ("[run]\nstart = '2026-01-31T23:58:30'", "run.start", "with its offset"),
        ("[run]\nstart = 2026-01-31T23:58:30", "run.start", "with its offset"),
        ("[run]\nstart = 'midnight'", "run.start", "an RFC 3339 instant"),
        ("[run]\nstart = '1900-01-01T00:00:00Z'", "run.start", "from 1971-01-01"),
        ("[run]\nstart = []", "run.start", "at most 31 of them"),
        ("[run]\nstart = 20260131", "run.start", "an RFC 3339 instant"),
        ("[run]\ninstance_items = 0", "run.instance_items", "an integer from 1 to 16"),
        ("[run]\ninstance_items = 17", "run.instance_items", "an integer from 1 to 16"),
        ("[run]\ninstance_items = [4, 2]", "run.instance_items", "with low <= high"),
        ("[run]\ninstance_items = [1, 17]", "run.instance_items", "[low, high]"),
        ("[run]\ninstance_items = [2]", "run.instance_items", "one drawn per seed"),
        (
            "[run]\ntenants = 2\nlock_free_tenants = 2",
            "run.lock_free_tenants",
            "an integer from 0 to 1",
        ),
        (
            "[run]\ntenants = 2\nlock_free_tenants = 1",
            "run.lock_free_tenants",
            "a workflow with an approval node",
        ),
        ("[[deployments]]\nat = '1m'\nlock_duration = '30s'", "deployments[0].node", "[[nodes]]"),
        (
            "[[nodes]]\nid = 'a'\n[[deployments]]\nnode = 'b'\nlock_duration = '30s'",
            "deployments[0].node",
            "a",
        ),
        ("[[nodes]]\n[[deployments]]\nat = '1m'", "deployments[0].lock_duration", "retention"),
        (
            "[[nodes]]\n[[deployments]]\nat = '1m'\nlock_duration = '2h'\nretention = '1h'",
            "deployments[0].retention",
            "longer than lock_duration",
        ),
        (
            "[[nodes]]\nretention = '2m'\n[[deployments]]\nat = '1m'\nlock_duration = '5m'",
            "deployments[0].retention",
            "longer than lock_duration",
        ),
        (
            "[[nodes]]\n[[deployments]]\nat = '20m'\nlock_duration = '30s'",
            "deployments[0].at",
            "before faults_until",
        ),
        (
            "[[nodes]]\n[[deployments]]\nat = '2m'\nlock_duration = '30s'\n"
            "[[deployments]]\nat = '1m'\nlock_duration = '40s'",
            "deployments[1].at",
            "time order",
        ),
        (
            "[[nodes]]\n[[deployments]]\nat = '1m'\nlock_duration = '2d'",
            "deployments[0].lock_duration",
            "at most 1 day",
        ),
        (
            "[[nodes]]\n[[deployments]]\nwhen = '1m'",
            "deployments[0].when",
            "at, lock_duration, node, retention",
        ),
        ("deployments = 'tomorrow'", "deployments", "[[deployments]] blocks"),
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


def test_dimensions_are_read(tmp_path: Path) -> None:
    """Start instants in any offset become UTC; a deployment keeps what it does not change."""
    text = (
        "[run]\nstart = ['2026-01-31T23:58:30Z', '2026-03-01T01:59:00+02:00']\n"
        "instance_items = 3\ntenants = 2\nlock_free_tenants = 1\n"
        "[[nodes]]\nid = 'pay'\nkind = 'approval'\nretention = '10m'\n"
        "[[deployments]]\nat = '1m'\nlock_duration = '30s'\n"
        "[[deployments]]\nat = '2m'\nretention = 'forever'\n"
    )
    scenario = load_scenario(_write(tmp_path, text))
    assert [s.isoformat() for s in scenario.starts] == [
        "2026-01-31T23:58:30+00:00",
        "2026-02-28T23:59:00+00:00",
    ]
    assert scenario.start_for(1) == scenario.starts[1]
    assert scenario.start_for(2) == scenario.starts[0]
    assert scenario.instance_items == (3, 3) and scenario.lock_free_tenants == 1
    assert scenario.items_per_instance(7) == 3
    first, second = scenario.deployments
    assert (first.node, first.at, first.lock_duration, first.retention) == ("pay", 60.0, 30.0, None)
    assert second.forever and second.lock_duration is None
    assert scenario.longest_lock == 60.0


def test_items_per_instance_are_drawn_per_seed(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, "[run]\ninstance_items = [1, 4]"))
    drawn = [scenario.items_per_instance(seed) for seed in range(1, 41)]
    assert set(drawn) == {1, 2, 3, 4}
    assert drawn == [scenario.items_per_instance(seed) for seed in range(1, 41)]


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


# --- the file itself: size, type, encoding, nesting, numbers ------------------------------------


def _refused(path: Path, allowed: str, field: str | None = "") -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    error = info.value
    assert error.path == str(path) and str(path) in str(error)
    assert field is None or error.field == field
    assert allowed in error.allowed
    return error


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        pytest.param("[run]\nitems = " + "9" * 400, "run.items", "64 bits", id="400-digit-int"),
        pytest.param(
            "[latency]\nstore = " + "9" * 400, "latency.store", "64 bits", id="400-digit-duration"
        ),
        pytest.param("[run]\nitems = 0x" + "f" * 5000, "run.items", "64 bits", id="huge-hex-int"),
        pytest.param("[run]\nseeds = 9223372036854775808", "run.seeds", "64 bits", id="2**63"),
    ],
)
def test_integers_past_64_bits_are_refused_by_field(
    tmp_path: Path, text: str, field: str, allowed: str
) -> None:
    _refused(_write(tmp_path, text), allowed, field)


def test_an_integer_past_the_digit_limit_is_named(tmp_path: Path) -> None:
    error = _refused(_write(tmp_path, "[run]\nitems = " + "7" * 5000), "64 bits")
    assert "too long to read" in error.problem


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x = " + "[" * 5000 + "]" * 5000, id="deep-array-beyond-the-parser"),
        pytest.param("x = " + "{a = " * 2000 + "1" + "}" * 2000, id="deep-inline-table"),
        pytest.param("[run]\nitems = " + "[" * 40 + "]" * 40, id="deep-array-the-parser-reads"),
        pytest.param("[" + ".".join(["a"] * 5000) + "]\nb = 1", id="deep-dotted-table"),
    ],
)
def test_deep_nesting_is_refused(tmp_path: Path, text: str) -> None:
    error = _refused(_write(tmp_path, text), "nested at most 10 levels deep", field=None)
    assert "deep" in error.problem


def test_a_non_utf8_file_names_the_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("description = 'caf\u00e9'\n".encode("latin-1"))
    error = _refused(path, "UTF-8")
    assert "0xe9" in error.problem and "line 1" in error.problem


def test_a_file_over_the_size_cap_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    from dsm_sim.scenario import MAX_FILE_BYTES

    path = _write(tmp_path, "# " + "x" * MAX_FILE_BYTES + "\n")
    error = _refused(path, "at most 1024 KiB")
    assert f"larger than {MAX_FILE_BYTES} bytes" in error.problem


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)  # nobody ever writes: opening it for reading would block forever
    error = _refused(fifo, "a regular UTF-8 .toml file")
    assert "FIFO" in error.problem
    # A directory of scenarios holding one is refused the same way.
    with pytest.raises(ScenarioError, match="FIFO"):
        load_scenarios(tmp_path)


def test_an_endless_device_is_refused_before_it_is_read() -> None:
    error = _refused(Path("/dev/zero"), "a regular UTF-8 .toml file")
    assert "character device" in error.problem


def test_the_same_checks_hold_for_a_symlink_to_a_device(tmp_path: Path) -> None:
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    assert "character device" in _refused(link, "regular").problem


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        pytest.param(
            "[faults.clock_jump]\nschedule = ["
            + ", ".join("{ at = 1, by = 1 }" for _ in range(101))
            + "]",
            "faults.clock_jump.schedule",
            "at most 100 entries",
            id="clock-jump-schedule",
        ),
        pytest.param(
            "[faults.catchup_pause]\nschedule = ["
            + ", ".join("{ at = 1, for = 1 }" for _ in range(101))
            + "]",
            "faults.catchup_pause.schedule",
            "at most 100 entries",
            id="pause-schedule",
        ),
        pytest.param(
            "[faults.crash]\npoints = [" + ", ".join(["'during_set'"] * 101) + "]",
            "faults.crash.points",
            "at most 100 entries",
            id="crash-points",
        ),
        pytest.param(
            "".join(f"[[nodes]]\nid = 'n{i}'\n" for i in range(17)),
            "nodes",
            "at most 16 of them",
            id="nodes",
        ),
        pytest.param("name = '" + "a" * 65 + "'", "name", "at most 64 characters", id="name"),
        pytest.param("[run]\nworkers = 65", "run.workers", "from 1 to 64", id="workers"),
        pytest.param("[run]\nseeds = 1001", "run.seeds", "from 1 to 1000", id="seeds"),
        pytest.param("[run]\ntenants = 11", "run.tenants", "from 1 to 10", id="tenants"),
        pytest.param(
            "[faults.duplicate_delivery]\ncopies = [1, 21]",
            "faults.duplicate_delivery.copies",
            "from 1 to 20",
            id="copies",
        ),
    ],
)
def test_counts_have_documented_limits(tmp_path: Path, text: str, field: str, allowed: str) -> None:
    _refused(_write(tmp_path, text), allowed, field)


def test_a_schedule_of_exactly_the_limit_loads(tmp_path: Path) -> None:
    text = (
        "[faults.clock_jump]\nschedule = ["
        + ", ".join(f"{{ at = {i}, by = 1 }}" for i in range(100))
        + "]"
    )
    assert len(load_scenario(_write(tmp_path, text)).faults.clock_jumps) == 100
