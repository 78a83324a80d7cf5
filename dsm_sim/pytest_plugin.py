"""pytest plugin registered under ``pytest11``: kept light, it imports nothing heavy at load.

It adds the conformance kit's options and the fixtures its suite needs.
``dsm_handler_factory`` comes from ``--dsm-handler`` when given; otherwise a
project overrides the fixture; with neither, the error names both ways.

``pytest --pyargs dsm_sim.conformance --dsm-handler=mymod:factory`` behaves
as ``dsm verify mymod:factory`` does: ``mymod`` is imported from the folder
pytest was run from (the ``pytest`` script, unlike ``python -m pytest``, does
not put it on the import path), and Hypothesis keeps its files in the same
cache directory (``--dsm-cache-dir``, else ``$DSM_CACHE_DIR``, else
``$XDG_CACHE_HOME/dsm`` or ``~/.cache/dsm``), never in that folder.  Only a
session that runs the kit (a ``--dsm-*`` handler option or ``--dsm-cache-dir``
given) moves Hypothesis' files: the plugin is loaded into every pytest session
of an environment that has dsm installed, and a project's own Hypothesis tests
keep theirs where the project put them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "dsm_clock_mode",
    "dsm_cluster",
    "dsm_handler_factory",
    "dsm_handler_spec",
    "dsm_jobs",
    "dsm_profile",
    "dsm_seed",
    "dsm_time_zone",
    "factory_from_options",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "suite_group",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dsm", "DataStateMachine conformance kit")
    group.addoption(
        "--dsm-handler",
        action="store",
        default=None,
        metavar="MODULE:FACTORY",
        help="handler factory to verify, e.g. mypackage.store:make_handler",
    )
    group.addoption(
        "--dsm-exec",
        action="store",
        default=None,
        metavar="COMMAND",
        help="verify a handler in another process over the handler protocol "
        "(docs/protocol.md), e.g. --dsm-exec='node handlers/node/memory.js'",
    )
    group.addoption(
        "--dsm-exec-tcp",
        action="store",
        default=None,
        metavar="HOST:PORT",
        help="verify a handler that is a server: one TCP connection per test case, same "
        "framing as --dsm-exec, e.g. --dsm-exec-tcp=127.0.0.1:7411",
    )
    group.addoption(
        "--dsm-exec-timeout",
        action="store",
        default=None,
        metavar="SECONDS",
        help="how long a --dsm-exec or --dsm-exec-tcp handler may take to answer one "
        "request (default: $DSM_EXEC_TIMEOUT, else 10)",
    )
    group.addoption(
        "--dsm-profile",
        action="store",
        default=None,
        choices=("dev", "ci", "thorough"),
        help="conformance search effort (default: HYPOTHESIS_PROFILE, else ci)",
    )
    group.addoption(
        "--dsm-seed", action="store", type=int, default=None, help="conformance run seed"
    )
    group.addoption(
        "--dsm-clock",
        action="store",
        default="injected",
        choices=("injected", "system"),
        help="'system' freezes the wall clock (freezegun) for handlers that read it",
    )
    group.addoption(
        "--dsm-tz",
        action="store",
        default=None,
        metavar="ZONE",
        help="run every conformance test case in this POSIX time zone (default: each "
        "test case draws its own)",
    )
    group.addoption(
        "--dsm-cache-dir",
        action="store",
        default=None,
        metavar="DIR",
        help="where Hypothesis keeps its files during a conformance run (default: "
        "$DSM_CACHE_DIR, else $XDG_CACHE_HOME/dsm or ~/.cache/dsm); never the folder "
        "pytest runs in",
    )
    group.addoption(
        "--dsm-jobs",
        action="store",
        type=int,
        default=1,
        metavar="J",
        help="run the kit's race matrix and the search's seeds in J worker processes "
        "(default 1: in the test's process); the verdicts are the same. A factory a worker "
        "cannot load (a closure, a local class) runs with 1, with a warning",
    )
    group.addoption(
        "--dsm-cluster",
        action="store",
        default=None,
        metavar="ADDRESS",
        help="send that work to a Dask cluster instead: 'local' starts one of --dsm-jobs "
        "workers (at least 2), tcp://HOST:PORT uses the scheduler there (the 'cluster' "
        "extra); the verdicts are the same",
    )
    group.addoption(
        "--dsm-call-timeout",
        action="store",
        default=None,
        metavar="SECONDS",
        help="how long one in-process handler call may take before the kit reports it as "
        "hung (default 10; --dsm-exec handlers use --dsm-exec-timeout)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group each suite class's tests for ``pytest -n N --dist loadgroup``.

    A :class:`~dsm_sim.conformance.suite.ConformanceSuite` class verifies its
    handler once per process and every ``test_<property>`` reads that one
    report: split over two workers, the whole verification runs twice.  The
    ``xdist_group`` mark keeps a class on one worker; other ``--dist`` modes
    ignore it.  Runs first, before pytest-xdist reads the marks.
    """
    suite = sys.modules.get("dsm_sim.conformance.suite")
    if suite is None or not config.pluginmanager.hasplugin("xdist"):
        return  # no suite class was collected, or no worker to keep it on
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, suite.ConformanceSuite):
            item.add_marker(pytest.mark.xdist_group(suite_group(cls)))


def suite_group(cls: type) -> str:
    """The ``xdist_group`` of a suite class's tests; another test joins it to share its report."""
    return f"{cls.__module__}.{cls.__qualname__}"


#: The options that say this session runs the conformance kit.
_KIT_OPTIONS = ("--dsm-handler", "--dsm-exec", "--dsm-exec-tcp", "--dsm-cache-dir")


def pytest_configure(config: pytest.Config) -> None:
    """Keep Hypothesis' files out of the working folder, and apply ``--dsm-call-timeout``.

    The cache directory is set here, before any test case runs, because
    Hypothesis creates its folder on first use and never moves it afterwards.
    """
    if any(config.getoption(name, default=None) for name in _KIT_OPTIONS):
        from dsm_sim.conformance.cache import cache_dir, use_cache_dir

        use_cache_dir(cache_dir(config.getoption("--dsm-cache-dir", default=None)))
    raw = config.getoption("--dsm-call-timeout", default=None)
    if raw is None:
        return
    from dsm_sim.conformance.execute.loop import set_default_call_timeout
    from reference_engine.errors import ConfigurationError

    try:
        set_default_call_timeout(float(str(raw)))
    except (ValueError, ConfigurationError) as exc:
        raise pytest.UsageError(f"--dsm-call-timeout={raw!r}: {exc}") from None


#: Each out-of-process target's factory, and why it cannot be verified (None: it shook
#: hands), per session.
_PREFLIGHTS: dict[Any, tuple[Any, str | None]] = {}


def _exec_timeout(raw: object) -> float | None:
    """``--dsm-exec-timeout`` as seconds: a positive number, or a failure that says so."""
    if raw is None:
        return None
    try:
        value = float(str(raw))
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        pytest.fail(
            f"--dsm-exec-timeout={raw!r}: give a number of seconds above 0 and at most 3600",
            pytrace=False,
        )
    return value


def _out_of_process_factory(command: str | None, address: str | None, timeout: object) -> Any:
    """The factory for ``--dsm-exec`` or ``--dsm-exec-tcp``, after one handshake.

    As with ``dsm verify --exec``, a command that does not start (or a server
    nobody runs) is said once, as the reason every test fails, rather than as a
    broken conformance run per property.
    """
    from dsm_sim.protocol.client import exec_factory, preflight, tcp_factory
    from reference_engine.errors import ConfigurationError

    option = "--dsm-exec" if command is not None else "--dsm-exec-tcp"
    seconds = _exec_timeout(timeout)
    try:
        if command is not None:
            factory = exec_factory(command, timeout=seconds)
        else:
            assert address is not None
            factory = tcp_factory(address, timeout=seconds)
    except ConfigurationError as exc:
        pytest.fail(f"{option}: {exc}", pytrace=False)
    if factory not in _PREFLIGHTS:
        _PREFLIGHTS[factory] = (factory, preflight(factory))
    # The factory that shook hands: its next processes are already starting.
    factory, problem = _PREFLIGHTS[factory]
    if problem is not None:
        what = "command does not start" if command is not None else "server does not answer"
        pytest.fail(f"{option}: the handler {what}: {problem}", pytrace=False)
    return factory


@pytest.fixture
def dsm_handler_factory(request: pytest.FixtureRequest) -> Any:
    """The factory under test: ``--dsm-handler``, ``--dsm-exec``, ``--dsm-exec-tcp``, or
    override this fixture."""
    option = request.config.getoption
    return factory_from_options(
        handler=option("--dsm-handler"),
        command=option("--dsm-exec"),
        address=option("--dsm-exec-tcp"),
        timeout=option("--dsm-exec-timeout"),
        folder=request.config.invocation_params.dir,
    )


@pytest.fixture
def dsm_handler_spec(request: pytest.FixtureRequest, dsm_handler_factory: Any) -> str | None:
    """The ``--dsm-handler`` MODULE:FACTORY the factory under test was loaded from, or None.

    The replay lines import the factory by it, as the user gave it: a factory
    made by a closure has a ``module:qualname`` that does not import
    (``make_factory.<locals>.make``).  None when the factory under test is not
    the one the option names (a fixture of the user's own), so nothing is
    named after another factory.
    """
    spec = request.config.getoption("--dsm-handler")
    if not spec:
        return None
    from reference_engine.errors import ConfigurationError
    from reference_engine.registry import load_factory

    try:
        named = load_factory(str(spec))
    except ConfigurationError:
        return None
    return str(spec) if named is dsm_handler_factory else None


def factory_from_options(
    *,
    handler: object,
    command: object,
    address: object,
    timeout: object,
    folder: Path | None = None,
) -> Any:
    """The factory the plugin's options name (a ``pytest.fail`` that says why when they cannot).

    ``folder`` (the one pytest was run from) is searched first for the
    module of ``--dsm-handler``, as ``dsm verify`` searches the current one.
    Separate from the fixture so the rules for the options can be checked
    without starting a pytest run per combination.
    """
    given = [
        name
        for name, value in (
            ("--dsm-handler", handler),
            ("--dsm-exec", command),
            ("--dsm-exec-tcp", address),
        )
        if value
    ]
    if len(given) > 1:
        pytest.fail(
            f"give one of --dsm-handler, --dsm-exec and --dsm-exec-tcp, not {' and '.join(given)}",
            pytrace=False,
        )
    if command or address:
        return _out_of_process_factory(
            str(command) if command else None, str(address) if address else None, timeout
        )
    if not handler:
        pytest.fail(
            "no handler to verify: pass --dsm-handler=package.module:factory (or "
            "--dsm-exec='COMMAND' for a handler in another process, --dsm-exec-tcp=HOST:PORT "
            "for a handler that is a server), or define a fixture named "
            "'dsm_handler_factory' returning your factory (a callable taking a Clock and "
            "returning a StateHandler)",
            pytrace=False,
        )
    from reference_engine.errors import ConfigurationError
    from reference_engine.registry import load_factory

    if folder is not None and str(folder) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        return load_factory(str(handler))
    except ConfigurationError as exc:
        pytest.fail(f"--dsm-handler: {exc}", pytrace=False)


@pytest.fixture
def dsm_profile(request: pytest.FixtureRequest) -> str:
    chosen = request.config.getoption("--dsm-profile")
    return str(chosen or os.environ.get("HYPOTHESIS_PROFILE") or "ci")


@pytest.fixture
def dsm_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--dsm-seed")
    return None if seed is None else int(seed)


@pytest.fixture
def dsm_jobs(request: pytest.FixtureRequest) -> int:
    jobs = int(request.config.getoption("--dsm-jobs", default=1) or 1)
    if jobs < 1:
        raise pytest.UsageError(f"--dsm-jobs={jobs}: give 1 or more worker processes")
    return jobs


@pytest.fixture
def dsm_cluster(request: pytest.FixtureRequest) -> str | None:
    cluster = request.config.getoption("--dsm-cluster", default=None)
    return None if cluster in (None, "") else str(cluster)


@pytest.fixture
def dsm_clock_mode(request: pytest.FixtureRequest) -> Any:
    from dsm_sim.conformance.execute.clocks import parse_clock_mode

    return parse_clock_mode(request.config.getoption("--dsm-clock"))


@pytest.fixture
def dsm_time_zone(request: pytest.FixtureRequest) -> str | None:
    zone = request.config.getoption("--dsm-tz")
    return None if zone is None else str(zone)
