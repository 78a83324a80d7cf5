"""What one stress run is: the database, the handler, the load shape and the fault knobs.

A run is described by one frozen :class:`StressSettings` so it can be pickled
into every spawned process unchanged and printed next to its figures; the
handler is named by a ``module:factory`` spec rather than passed as an object
because a ``spawn`` child imports its own copy of everything.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import math
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dsm_sim.stress.netfault_spec import NetFault, check_overlaps
from dsm_sim.stress.target import SavedTarget, StressTarget, export_target
from reference_engine.clock import Clock
from reference_engine.errors import ConfigurationError, InvalidOptionError, echo
from reference_engine.handler import StateHandler
from reference_engine.registry import build_handler, factory_name, load_callable

__all__ = [
    "ACCEPTED_URLS",
    "BUILTIN_HANDLER_SPEC",
    "MAX_DUPLICATES",
    "MAX_KEYS",
    "MAX_PROCESSES",
    "MAX_WORKERS",
    "DatabaseKind",
    "DatabaseUrlError",
    "NetFaultDatabaseError",
    "StressHandlerFactory",
    "StressSettings",
    "UnsharedStoreError",
    "database_kind",
    "item_key",
    "load_stress_factory",
    "new_run_id",
    "stress_database_url",
]

#: The built-in SQL handler on the run's store, the default a stress run exercises.
BUILTIN_HANDLER_SPEC = "dsm_sim.stress.factories:stress_sql_handler"
MAX_PROCESSES = 64
MAX_WORKERS = 256
MAX_KEYS = 1_000_000
MAX_DUPLICATES = 1_000


class StressHandlerFactory(Protocol):
    """The factory every command takes: a clock in, a handler out.

    Under ``dsm stress`` it must connect to the run's store, which
    :func:`dsm_sim.stress.target.run_target` names.
    """

    def __call__(self, clock: Clock) -> StateHandler: ...


class DatabaseKind(enum.Enum):
    POSTGRESQL = "postgresql"
    MARIADB = "mariadb"
    SQLITE = "sqlite"

    @property
    def server(self) -> bool:
        """Whether the run gets a schema of its own on a server (MariaDB: a database)."""
        return self is not DatabaseKind.SQLITE


#: The database URLs a stress run takes, for every error that refuses one.
ACCEPTED_URLS = (
    "postgresql+asyncpg://USER@HOST[:PORT]/DB (postgresql:// and postgres:// are taken as that)",
    "mariadb+asyncmy://USER@HOST[:PORT]/DB (mariadb:// and mysql:// are taken as that)",
    "sqlite+aiosqlite:///PATH/TO/FILE.sqlite3 (sqlite:///PATH the same) in a directory that exists",
)
_DRIVERS = {
    "postgresql": ("asyncpg",),
    "mariadb": ("asyncmy",),
    "sqlite": ("aiosqlite", "pysqlite"),
}


class DatabaseUrlError(InvalidOptionError):
    """A ``--db`` URL a stress run cannot use; says which URL forms it accepts."""

    def __init__(self, url: str, problem: str) -> None:
        self.option = "db"
        self.url = url
        self.problem = problem
        self.allowed = ACCEPTED_URLS
        ConfigurationError.__init__(
            self,
            f"--db {url}: {problem}; dsm stress accepts " + " or ".join(ACCEPTED_URLS),
        )


class NetFaultDatabaseError(InvalidOptionError):
    """``--netfault`` on a database no network leads to (SQLite is a file in the process)."""

    def __init__(self, url: str, kind: str) -> None:
        self.option = "netfault"
        self.url = url
        self.problem = f"{kind} has no network connection to fault"
        self.allowed = ACCEPTED_URLS[:2]
        ConfigurationError.__init__(
            self,
            f"--netfault needs a database server reached over TCP, and --db {url} is {kind}, "
            "a file opened inside each process: there is no connection to fault; use a "
            "postgresql+asyncpg:// or mariadb+asyncmy:// URL, or drop --netfault",
        )


class UnsharedStoreError(ConfigurationError):
    """The handler's processes do not share one store, which a stress run needs.

    ``dsm stress`` races several processes on one store and counts durable
    side effects; a handler whose store is private to its process (in
    memory, a file or schema of its own) gives each process an empty store,
    and every key would be charged once per process, which would read as a
    handler bug.
    """

    def __init__(self, handler: str, process: int, reason: str) -> None:
        self.handler, self.process, self.reason = handler, process, reason
        super().__init__(
            f"the handler {handler} does not share its store across processes: in worker "
            f"process p{process}, {reason}. dsm stress races its processes on one store, so "
            "every process's handler must reach the run's store, named by "
            "DSM_STRESS_DB_URL and DSM_STRESS_SCHEMA (dsm_sim.stress.target); a store in "
            "memory, or a file or schema of each handler's own, cannot be stress-tested "
            "(use dsm verify and dsm run for it)"
        )


def _refuse(url: str, problem: str) -> DatabaseUrlError:
    return DatabaseUrlError(echo(url, 200), problem)


def stress_database_url(url: str) -> str:
    """``url`` with its async driver named, or :class:`InvalidOptionError` saying what is accepted.

    ``postgresql://`` (and ``postgres://``) can only mean PostgreSQL through
    asyncpg here, the one PostgreSQL driver dsm installs, so it is taken as
    that rather than failing on a missing ``psycopg`` module; ``sqlite:///``
    likewise means aiosqlite.  A SQLite file must be shared by every process
    of the run, so it may be neither in memory nor in a directory that does
    not exist (SQLite would fail later with "unable to open database file").
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not isinstance(url, str) or not url.strip():
        raise _refuse(str(url), "no URL given")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise _refuse(url, f"not a database URL ({exc})") from None
    shown = parsed.render_as_string(hide_password=True)
    aliases = {"postgres": "postgresql", "mysql": "mariadb"}
    backend = aliases.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _DRIVERS:
        raise _refuse(shown, f"unsupported database {backend!r}")
    driver = parsed.drivername.partition("+")[2]
    if driver and driver not in _DRIVERS[backend]:
        raise _refuse(
            shown,
            f"driver {driver!r} is not one dsm stress uses; name no driver or "
            f"{_DRIVERS[backend][0]!r}",
        )
    if backend in ("postgresql", "mariadb"):
        if not parsed.host and not parsed.query.get("host"):
            raise _refuse(shown, "no host")
        if backend == "mariadb" and not parsed.database:
            raise _refuse(shown, "no database: the run's own database is made beside it")
        named = parsed.set(drivername=f"{backend}+{_DRIVERS[backend][0]}")
        return named.render_as_string(hide_password=False)
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        raise _refuse(shown, "an in-memory SQLite database cannot be shared between processes")
    if database.startswith("file:"):
        raise _refuse(shown, "a SQLite 'file:' URI; give the file's path")
    path = Path(database)
    if path.is_dir():
        raise _refuse(shown, f"{database!r} is a directory, not a SQLite file")
    parent = path.parent
    if not parent.is_dir():
        raise _refuse(shown, f"the directory {str(parent)!r} of the SQLite file does not exist")
    return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)


def database_kind(url: str) -> DatabaseKind:
    """Which of the supported databases a (checked) SQLAlchemy URL points at."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return DatabaseKind.POSTGRESQL
    if scheme in ("mariadb", "mysql"):
        return DatabaseKind.MARIADB
    if scheme == "sqlite":
        return DatabaseKind.SQLITE
    raise _refuse(url, f"unsupported database URL scheme {scheme!r}")


def load_stress_factory(spec: str) -> Callable[..., StateHandler]:
    """Import ``"package.module:factory"``: a ``(clock)`` factory.

    ``exec:COMMAND`` and ``exec-tcp:HOST:PORT`` name a handler in another
    process instead (:func:`dsm_sim.stress.factories.exec_stress_factory`).

    A factory of the older ``(url, clock, *, schema=None)`` form is accepted
    too; :meth:`StressSettings.build_handler` tells the two apart.
    """
    from dsm_sim.stress.factories import exec_stress_factory, is_exec_spec

    if is_exec_spec(spec):  # a handler in another process (docs/protocol.md)
        return exec_stress_factory(spec)
    factory: Callable[..., StateHandler] = load_callable(
        spec, expects="build a handler from a clock", example=BUILTIN_HANDLER_SPEC
    )
    return factory


def _takes_url(factory: Callable[..., StateHandler]) -> bool:
    """Whether ``factory`` has the older ``(url, clock, *, schema=)`` signature."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return "schema" in parameters or len(positional) >= 2


#: A run id names a PostgreSQL schema and files: lower-case letters and digits only.
#: (``str.islower`` would refuse an all-digit id, which ``token_hex`` draws about
#: once in a hundred times.)
_RUN_ID = re.compile(r"[0-9a-z]+")


def new_run_id() -> str:
    """Short, lower-case and identifier-safe, so it can name a PostgreSQL schema."""
    return secrets.token_hex(5)


def item_key(index: int) -> str:
    return f"k{index:05d}"


def _positive(option: str, value: object, upper: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise InvalidOptionError(option, f"must be an integer from 1 to {upper}, got {value!r}")


@dataclass(frozen=True, slots=True)
class StressSettings:
    """One stress run.

    Each of ``keys`` items is delivered ``duplicates`` times; duplicate ``d`` of
    key ``k`` goes to process ``(k + d) % processes`` and every process walks
    its deliveries in key order, so the duplicates of a key meet in different
    processes at about the same instant, which is where a racy acquire breaks.

    ``fail_rate`` is the share of side effects that raise, exercising
    ``release_lock_as_failed`` and the retry of a Failed item.
    ``stall_after_acquire`` makes process 0 hold its first lock that long with
    its side-effect transaction open, so a test can SIGKILL it there.
    ``fault_free`` says nothing was injected to break the store (what
    ``dsm stress`` runs without ``--netfault``): a ``StoreError`` then fails
    the run, because a healthy store that refuses operations is a bug, not
    bad luck.  ``netfaults`` are played on a proxy between the worker
    processes and the server (docs/netfaults.md); ``store_url`` is where a
    worker process's handler connects when that is not ``db_url`` (the
    proxy), while its effect ledger always uses ``db_url``.
    """

    db_url: str
    handler_spec: str = BUILTIN_HANDLER_SPEC
    processes: int = 8
    workers: int = 4
    keys: int = 200
    duplicates: int = 3
    fail_rate: float = 0.05
    lock_duration: dt.timedelta = dt.timedelta(minutes=30)
    retry_seconds: float = 15.0
    recovery_seconds: float = 60.0
    stall_after_acquire: float = 0.0
    start_timeout: float = 120.0
    seed: int = 0
    fault_free: bool = False
    netfaults: tuple[NetFault, ...] = ()
    store_url: str | None = None
    run_id: str = dataclasses.field(default_factory=new_run_id)

    def __post_init__(self) -> None:
        # Frozen, so the one spelling every process and the ledger use is set here.
        object.__setattr__(self, "db_url", stress_database_url(self.db_url))
        _positive("processes", self.processes, MAX_PROCESSES)
        _positive("workers", self.workers, MAX_WORKERS)
        _positive("keys", self.keys, MAX_KEYS)
        _positive("duplicates", self.duplicates, MAX_DUPLICATES)
        if not 0.0 <= self.fail_rate < 1.0:
            raise InvalidOptionError("fail_rate", f"must be in [0, 1), got {self.fail_rate!r}")
        if self.lock_duration <= dt.timedelta(0):
            raise InvalidOptionError("lock_duration", f"must be positive, got {self.lock_duration}")
        for name in ("retry_seconds", "recovery_seconds", "stall_after_acquire", "start_timeout"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidOptionError(name, f"must be finite and not negative, got {value!r}")
        if self.store_url is not None:
            object.__setattr__(self, "store_url", stress_database_url(self.store_url))
        if self.netfaults:
            self._check_netfaults()
        if _RUN_ID.fullmatch(self.run_id) is None:
            raise InvalidOptionError(
                "run_id", f"must be lower-case alphanumeric, got {self.run_id!r}"
            )

    def _check_netfaults(self) -> None:
        if not self.kind.server:
            raise NetFaultDatabaseError(echo(self.db_url, 200), self.kind.value)
        if self.fault_free:
            raise InvalidOptionError(
                "fault_free", "a run with netfaults is not fault-free: its StoreErrors are expected"
            )
        check_overlaps(self.netfaults)

    @property
    def kind(self) -> DatabaseKind:
        return database_kind(self.db_url)

    @property
    def schema(self) -> str | None:
        """The schema (MariaDB: database) this run's tables live in; SQLite runs use a file."""
        return f"dsm_stress_{self.run_id}" if self.kind.server else None

    @property
    def deliveries(self) -> int:
        return self.keys * self.duplicates

    def key_list(self) -> list[str]:
        return [item_key(i) for i in range(self.keys)]

    def deliveries_for(self, process: int) -> Iterator[tuple[str, int]]:
        """This process's ``(item_key, duplicate)`` deliveries, in key order, generated lazily.

        Lazily, because the documented limits allow 10^6 keys x 1,000
        duplicates: 10^9 deliveries, which no process can hold as a list.
        Duplicate ``d`` of key ``k`` is this process's when ``(k + d) % processes``
        is its number, so its duplicates of ``k`` start at ``(process - k) % processes``.
        """
        for k in range(self.keys):
            for d in range((process - k) % self.processes, self.duplicates, self.processes):
                yield item_key(k), d

    @property
    def target(self) -> StressTarget:
        return StressTarget(self.store_url or self.db_url, self.schema)

    def build_run_handler(self, clock: Clock) -> tuple[StateHandler, SavedTarget]:
        """The handler of the process that drives the run, and the environment it had before.

        :meth:`build_handler` exports the run's store to this process; the
        driver outlives the run, so it restores the saved variables when the
        run ends (and here, at once, if the handler cannot be built).
        """
        saved = SavedTarget.now()
        try:
            return self.build_handler(clock), saved
        except BaseException:
            saved.restore()
            raise

    def build_handler(self, clock: Clock) -> StateHandler:
        """This run's handler, in this process: the factory is told the run's store first."""
        factory = load_stress_factory(self.handler_spec)
        target = self.target
        export_target(target)
        name = self.handler_spec or factory_name(factory)
        if not _takes_url(factory):
            return build_handler(factory, clock, name=name)
        if self.schema is None:
            return build_handler(factory, clock, name=name, arguments=(target.db_url, clock))
        return build_handler(
            lambda url, at: factory(url, at, schema=self.schema),
            clock,
            name=name,
            arguments=(target.db_url, clock),
        )
