"""Developer and CI sessions: tests, lint, chaos scenarios, conformance, stress and benchmarks."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

SERVICES = {
    "DSM_TEST_POSTGRES_URL": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "DSM_TEST_REDIS_URL": "redis://127.0.0.1:6379/0",
    "DSM_TEST_MARIADB_URL": "mariadb+asyncmy://root@127.0.0.1:3306/test",
    "DSM_TEST_AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/",
}


def _install(session: nox.Session) -> None:
    session.install("-e", ".[dev]")


def _env() -> dict[str, str]:
    return {key: os.environ.get(key, default) for key, default in SERVICES.items()}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, as CI runs it."""
    _install(session)
    session.run("pytest", *session.posargs, env=_env())


@nox.session
def thorough(session: nox.Session) -> None:
    """Nightly: the whole suite and its thorough tier (tests marked thorough)."""
    _install(session)
    session.run("pytest", "--thorough", *session.posargs, env=_env())


@nox.session
@nox.parametrize("backend", ["memory", "sqlite", "postgresql", "mariadb", "redis"])
def conformance(session: nox.Session, backend: str) -> None:
    """The conformance kit against each built-in handler."""
    _install(session)
    factories = {
        "memory": "reference_engine.handlers.memory:in_memory_handler",
        "sqlite": "reference_engine.handlers.sql.factory:sqlite_memory_handler",
        "postgresql": "reference_engine.handlers.sql.factory:postgres_test_handler",
        "mariadb": "reference_engine.handlers.sql.factory:mariadb_test_handler",
        "redis": "reference_engine.handlers.redis_factory:redis_test_handler",
    }
    session.run("dsm", "verify", factories[backend], "--profile", "ci", env=_env())


CHAOS_HANDLERS = {
    "memory": "reference_engine.handlers.memory:in_memory_handler",
    "sqlite": "reference_engine.handlers.sql.factory:sqlite_memory_handler",
}


@nox.session
def chaos(session: nox.Session) -> None:
    """The default chaos scenarios on the in-memory and SQLite handlers, with reports and JUnit."""
    _install(session)
    for name, factory in CHAOS_HANDLERS.items():
        session.run(
            "dsm",
            "run",
            "scenarios/",
            "--seeds",
            "3",
            "--handler",
            factory,
            "--report",
            f"reports/chaos-{name}",
            "--junit",
            f"reports/junit-chaos-{name}.xml",
            *session.posargs,
            env=_env(),
        )


@nox.session
def stress(session: nox.Session) -> None:
    """Multi-process stress run against PostgreSQL and a SQLite file."""
    _install(session)
    session.run("dsm", "stress", *session.posargs, env=_env())


@nox.session
def stress_broker(session: nox.Session) -> None:
    """The engine and the invoice node consuming RabbitMQ on PostgreSQL, workers SIGKILLed.

    10^5 messages by default (docs/performance.md has the figures); posargs
    replace the shape, e.g. ``nox -s stress_broker -- --keys 8000 --duplicate-publishes 2000``.
    """
    _install(session)
    env = _env()
    shape = session.posargs or [
        "--keys",
        "80000",
        "--duplicate-publishes",
        "20000",
        "--kills",
        "30",
        "--processes",
        "2",
        "--workers",
        "16",
        "--timeout",
        "3600",
    ]
    session.run(
        "dsm",
        "stress",
        "--broker",
        env["DSM_TEST_AMQP_URL"],
        "--db",
        env["DSM_TEST_POSTGRES_URL"],
        *shape,
        env=env,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks; each prints ratios against a baseline measured in the same run."""
    _install(session)
    session.run("python", "bench/run.py", *session.posargs, env=_env())
