"""The ``--jobs`` workers' server, started by the console script before the command loads.

Which command lines start it is read without the command's parser, so the
reading is pinned here: a value the parser would refuse starts nothing, and
a command that forks no workers of its own (``--exec``, ``--cluster``, one
job) starts nothing either.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsm_sim.options import usable_cores
from dsm_sim.worker_server import ELSEWHERE, JOBS, PRELOADS, jobs_asked, start_early

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("words", "jobs"),
    [
        ([], 1),
        (["spec"], 1),
        (["spec", "--jobs", "2"], 2),
        (["spec", "--jobs=3", "--seed", "0"], 3),
        (["spec", "--jobs", "two"], 1),
        (["spec", "--jobs"], 1),
        (["spec", "--", "--jobs", "2"], 1),
        (["spec", "--jobs", "2", "--jobs", "1"], 1),
        (["spec", "--jobs", "auto"], usable_cores()),
        (["spec", "--job", "2"], 2),
        (["spec", "--job=2"], 2),
        (["spec", "--jo", "2"], 2),
        (["spec", "--j", "2"], 1),  # argparse refuses it too: --jobs, --json or --junit
        (["spec", "--json", "2"], 1),
    ],
)
def test_the_jobs_a_command_line_asks_for(words: list[str], jobs: int) -> None:
    assert jobs_asked(words) == jobs


@pytest.mark.parametrize(
    "words",
    [
        [],
        ["verify", "spec"],
        ["verify", "spec", "--jobs", "1"],
        ["verify", "--exec", "dotnet Handler.dll", "--jobs", "2"],
        ["verify", "spec", "--cluster", "local", "--jobs", "2"],
        ["verify", "spec", "--clu=tcp://scheduler:8786", "--jobs", "2"],
        ["verify", "--exec-tcp", "127.0.0.1:9000", "--jobs", "2"],
        # dsm run hands its workers DSM_CALL_TIMEOUT through the environment, set after
        # parsing: a server started before would fork workers without it.
        ["run", "scenarios/", "--jobs", "2"],
        ["stress", "--jobs", "2"],
        ["demo", "--jobs", "2"],
    ],
)
def test_nothing_starts_for_a_command_that_forks_no_workers(words: list[str]) -> None:
    assert start_early(words) is False


def test_each_command_preloads_the_module_its_pool_names() -> None:
    from dsm_sim.conformance import parallel as verify_parallel

    assert {"verify": verify_parallel.__name__} == PRELOADS


def test_the_abbreviations_read_are_those_the_parser_takes() -> None:
    from dsm_sim.cli import build_parser

    parser = build_parser("verify")
    verify = next(a for a in parser._actions if a.choices and "verify" in a.choices)
    options = {o for a in verify.choices["verify"]._actions for o in a.option_strings}
    for full, shortest in [JOBS, *ELSEWHERE]:
        assert full in options, full
        others = {o for o in options if o != full}
        # The shortest is unambiguous, and one letter fewer is not (or it is the option).
        assert not [o for o in others if o.startswith(shortest)] or shortest == full, shortest
        assert shortest == full or [o for o in others if o.startswith(shortest[:-1])], shortest


def test_the_console_script_starts_the_server_before_the_command_loads(tmp_path: Path) -> None:
    # Its own process: the server started belongs to the process that asked for it.
    probe = (
        "import sys\n"
        "from multiprocessing import forkserver\n"
        "from dsm_sim.worker_server import start_early\n"
        "started = start_early(['verify', 'spec', '--jobs', '2'])\n"
        "loaded = 'dsm_sim.conformance.parallel' in sys.modules\n"
        "print(started, forkserver._forkserver._forkserver_pid is not None, loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # Started, and the kit is the server's to import, not this process's.
    assert done.stdout.split() == ["True", "True", "False"], done.stderr


@pytest.mark.parametrize("command", ["verify", "run"])
def test_jobs_auto_is_the_cores_this_process_may_use(command: str) -> None:
    from dsm_sim.cli import build_parser
    from dsm_sim.workers import MAX_JOBS

    parser = build_parser(command)
    args = parser.parse_args(
        [command, "spec" if command == "verify" else "scenarios/", "--jobs", "auto"]
    )
    assert args.jobs == min(usable_cores(), MAX_JOBS)
    assert parser.parse_args([command, "x", "--jobs", "AUTO"]).jobs == args.jobs


def test_a_bad_jobs_value_says_auto_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    from dsm_sim.cli import build_parser

    parser = build_parser("verify")
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["verify", "spec", "--jobs", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and "from 1 to" in err and "'auto'" in err, err


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"/sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
        ({"/sys/fs/cgroup/cpu.max": "200000 100000\n"}, 2),
        ({"/sys/fs/cgroup/cpu.max": "150000 100000\n"}, 2),
        ({"/sys/fs/cgroup/cpu.max": "50000 100000\n"}, 1),
        (
            {
                "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000\n",
                "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            },
            3,
        ),
        ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n"}, None),
        ({"/sys/fs/cgroup/cpu.max": "garbled"}, None),
        ({}, None),
    ],
)
def test_auto_is_capped_by_the_containers_cpu_quota(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, str], quota: int | None
) -> None:
    from dsm_sim import options

    monkeypatch.setattr(options, "_read", files.get)
    assert options._cgroup_quota() == quota
    cores = options.usable_cores()
    assert cores >= 1
    if quota is not None:
        assert cores <= quota
