"""Chaos scenarios: declarative TOML files loaded into frozen, validated values.

A scenario says how big the world is (items, workers, lock duration, sweep
interval), how slow each operation is, and which faults fire at what rate or
on what schedule.  Every field is checked when the file is loaded; a bad file
raises :class:`ScenarioError` naming the file, the field and what is allowed,
before anything runs.

Durations are seconds (a number) or strings such as ``"250ms"``, ``"90s"``,
``"5m"``, ``"2h"``; clock jumps may be signed (``"-10m"``).

The file itself is bounded before its fields are: only a regular file is
opened (a FIFO would block the reader, a device such as ``/dev/zero`` never
ends), at most :data:`MAX_FILE_BYTES` of it are read, it must be UTF-8, and
the decoded document may nest at most :data:`MAX_DEPTH` deep and hold only
integers that fit in 64 bits, as TOML 1.0 says.  Each of these is a
:class:`ScenarioError`, never an ``OverflowError`` or a ``RecursionError``
from deep inside the loader.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import random
import re
import tomllib
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsm_sim.input_files import InputFileProblem, read_bounded
from reference_engine.errors import ConfigurationError, echo

__all__ = [
    "CatchupPause",
    "ClockJump",
    "CrashFaults",
    "CrashPoint",
    "Deployment",
    "DuplicateFaults",
    "EffectFaults",
    "Faults",
    "KeyStyle",
    "Latency",
    "LostReplyFaults",
    "NodeKind",
    "NodeSpec",
    "PayloadStyle",
    "Scenario",
    "ScenarioError",
    "SkewFaults",
    "SlowFaults",
    "StoreFaults",
    "load_scenario",
    "load_scenarios",
    "parse_scenario",
]

# ASCII digits only: ``\d`` would also take full-width and other Unicode digits.
_DURATION = re.compile(r"^\s*([+-]?)(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$", re.ASCII)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ScenarioError(ConfigurationError):
    """A scenario file is unreadable or a field is wrong; says which file, field and what is allowed."""

    def __init__(self, path: str, field_name: str, problem: str, allowed: str = "") -> None:
        self.path = path
        self.field = field_name
        self.problem = problem
        self.allowed = allowed
        hint = f"; allowed: {allowed}" if allowed else ""
        where = f"field '{field_name}'" if field_name else "file"
        super().__init__(f"{path}: {where}: {problem}{hint}")


class CrashPoint(enum.Enum):
    """Where in the node's dispatch a worker can die."""

    BEFORE_ACQUIRE = "before_acquire"
    AFTER_ACQUIRE = "after_acquire"
    AFTER_EFFECT = "after_effect"
    DURING_SET = "during_set"


class NodeKind(enum.Enum):
    """The nodes a scenario's workflow can hold (``reference_engine/nodes/``)."""

    #: exists -> acquire -> charge -> set(Processed)
    INVOICE = "invoice"
    #: per revision: acquire -> notice -> set(Processed); then upsert of the invoice's totals
    CORRECTION = "correction"
    #: per line: set(Skipped) by rule, or acquire -> validate (release on failure) -> screen -> set
    SCREENING = "screening"
    #: approve (acquire -> pay -> set), waive (lock-free Skipped), confirm (lock-free
    #: Processed, refused, then the lock), amend (lock-free upsert), racing on one item
    APPROVAL = "approval"


class KeyStyle(enum.Enum):
    """How item keys look: plain numbers, or keys that differ only in ways stores get wrong."""

    PLAIN = "plain"
    VARIED = "varied"


class PayloadStyle(enum.Enum):
    """What messages carry into the stored data: a small object, or the whole JSON domain."""

    PLAIN = "plain"
    VARIED = "varied"


#: The scopes a node may be configured with (the engine's scope table).
SCOPES = ("Tenant", "Application", "Workflow", "Element", "Thread")
#: The engine's bounds on the node options, repeated so a scenario fails at load time.
MAX_NODE_LOCK = 86400.0
MAX_NODE_RETENTION = 36500 * 86400.0
#: Upper bound of every other duration (latencies, windows, delays, sweeps): a larger one
#: either never ends in simulated time or leaves nothing to observe.
MAX_DURATION = 86400.0
#: A clock jump may reach past the longest retention, but not past what a datetime holds.
MAX_JUMP = 36600 * 86400.0
#: Most copies one duplicate-delivery fault may publish of a message.
MAX_COPIES = 20
#: Smallest non-zero time grid; a finer one only multiplies rounding.
MIN_GRID = 0.001
#: Most bytes of a scenario file that are read; the catalogue's largest is under 2 KiB.
MAX_FILE_BYTES = 1024 * 1024
#: Deepest nesting of tables and arrays in a scenario file (the schedules need 5).
MAX_DEPTH = 10
#: TOML 1.0 integers are 64-bit; a longer one is refused before any field reads it.
MAX_INTEGER = 2**63 - 1
#: Most entries of one array: a clock-jump or catch-up-pause schedule, the crash points.
MAX_ENTRIES = 100
#: Most nodes one scenario's workflow may hold.
MAX_NODES = 16
#: Longest scenario name (it names report files and JUnit test cases).
MAX_NAME = 64
#: Most revisions (corrections, amendments) one item may get: past a page of history
#: (a store reading an item's history a page at a time), short of a slow run.
MAX_REVISIONS = 40
#: Most items one worker instance may hold at once (``run.instance_items``).
MAX_INSTANCE_ITEMS = 16
#: Most start instants one scenario may list (one per seed, round robin).
MAX_STARTS = 31
#: The calendar a run's start may sit in: far enough from the ends of what a
#: datetime holds that the longest retention and clock jump still fit.
EARLIEST_START = dt.datetime(1971, 1, 1, tzinfo=dt.UTC)
LATEST_START = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
#: Most catch-up sweeps one run may need (its longest possible simulated span over the
#: sweep interval): the bound on how long a scenario can make a run take.
MAX_SWEEPS = 200_000


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the scenario's workflow and its ``dataStateMachine`` options.

    ``retention`` is seconds, ``None`` to keep records forever.  ``revisions``
    is how many corrections each invoice gets (correction nodes), ``lines`` how
    many lines each screening message carries.
    """

    id: str
    kind: NodeKind
    scope: str = "Element"
    lock_duration: float = 60.0
    retention: float | None = 30 * 86400.0
    revisions: int = 2
    lines: int = 3


@dataclass(frozen=True, slots=True)
class Deployment:
    """A node redeployed mid-run: new options, new handler instances on the same store.

    ``lock_duration`` and ``retention`` are the new deployment's options
    (``None`` keeps the node's current one; ``retention`` also ``"forever"``,
    which :attr:`forever` says).
    """

    at: float
    node: str
    lock_duration: float | None = None
    retention: float | None = None
    forever: bool = False


@dataclass(frozen=True, slots=True)
class Latency:
    """Mean latencies (seconds); each call samples uniformly within ``mean * (1 +- jitter)``."""

    store: float = 0.05
    effect: float = 2.0
    jitter: float = 0.5
    #: When positive, every latency, arrival and delay is a whole multiple of it, so
    #: calls land exactly on lock and retention boundaries (0: continuous time).
    grid: float = 0.0


@dataclass(frozen=True, slots=True)
class DuplicateFaults:
    """A delivered message gets extra copies, each after a delay drawn from ``delay``."""

    rate: float = 0.0
    copies: tuple[int, int] = (1, 3)
    delay: tuple[float, float] = (0.0, 30.0)


@dataclass(frozen=True, slots=True)
class CrashFaults:
    """An execution crashes at one of ``points``; the worker restarts after ``restart_delay``."""

    rate: float = 0.0
    points: tuple[CrashPoint, ...] = tuple(CrashPoint)
    restart_delay: float = 5.0


@dataclass(frozen=True, slots=True)
class SlowFaults:
    """An execution's business call takes ``factor`` times the lock duration."""

    rate: float = 0.0
    factor: float = 1.5


@dataclass(frozen=True, slots=True)
class ClockJump:
    at: float
    by: float


@dataclass(frozen=True, slots=True)
class SkewFaults:
    """Each worker's own clock is off by up to ``max`` seconds either way."""

    max: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreFaults:
    """A handler call raises StoreError; ``after_fraction`` of them after the write landed."""

    rate: float = 0.0
    after_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class EffectFaults:
    """The business call (the charge) fails before anything is charged."""

    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class LostReplyFaults:
    """Buggify: on in a run with probability ``enabled``; then ``rate`` of the writes land
    and the worker sees a ``StoreError`` anyway (the reply was lost)."""

    enabled: float = 0.0
    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class CatchupPause:
    at: float
    duration: float


@dataclass(frozen=True, slots=True)
class Faults:
    duplicate: DuplicateFaults = field(default_factory=DuplicateFaults)
    crash: CrashFaults = field(default_factory=CrashFaults)
    slow: SlowFaults = field(default_factory=SlowFaults)
    clock_jumps: tuple[ClockJump, ...] = ()
    skew: SkewFaults = field(default_factory=SkewFaults)
    store: StoreFaults = field(default_factory=StoreFaults)
    effect: EffectFaults = field(default_factory=EffectFaults)
    lost_reply: LostReplyFaults = field(default_factory=LostReplyFaults)
    catchup_pauses: tuple[CatchupPause, ...] = ()
    swarm: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    """One chaos scenario; ``faults_until`` is when faults stop and settling starts."""

    name: str
    description: str
    path: str
    items: int = 20
    tenants: int = 1
    workers: int = 4
    arrival_window: float = 120.0
    faults_until: float = 600.0
    lock_duration: float = 60.0
    sweep_interval: float = 30.0
    max_deliveries: int = 6
    redelivery_delay: float = 90.0
    seeds: int = 3
    latency: Latency = field(default_factory=Latency)
    faults: Faults = field(default_factory=Faults)
    #: The workflow's nodes; a file without ``[[nodes]]`` runs one invoice node.
    nodes: tuple[NodeSpec, ...] = ()
    keys: KeyStyle = KeyStyle.PLAIN
    payloads: PayloadStyle = PayloadStyle.PLAIN
    #: The simulated host's local time zone ("" leaves the process' own): a store
    #: that slips local time into its instants shows it only off UTC.
    host_timezone: str = ""
    #: Where simulated second 0 sits on the calendar, one instant per seed in turn
    #: (empty: the simulator's default morning).  A start just before midnight or a
    #: month's end makes locks and retention periods end on another day.
    starts: tuple[dt.datetime, ...] = ()
    #: How many work items one worker instance holds at once (its concurrent
    #: executions, all through the one handler instance): a (low, high) range,
    #: one number drawn from it per seed (see :meth:`items_per_instance`).
    instance_items: tuple[int, int] = (1, 1)
    #: Redeployments of nodes during the run, in time order.
    deployments: tuple[Deployment, ...] = ()
    #: Tenants (the last ones) whose records are only ever written lock-free: their
    #: approval items are amended and waived, never approved.
    lock_free_tenants: int = 0

    @property
    def longest_lock(self) -> float:
        """The longest lock any node takes: what liveness deadlines wait for."""
        redeployed = [d.lock_duration for d in self.deployments if d.lock_duration is not None]
        return max([self.lock_duration, *(n.lock_duration for n in self.nodes), *redeployed])

    def items_per_instance(self, seed: int) -> int:
        """How many items each worker instance of the run with ``seed`` holds at once."""
        low, high = self.instance_items
        return low if low == high else random.Random(f"{seed}/instances").randint(low, high)

    def start_for(self, seed: int) -> dt.datetime | None:
        """The start instant of the run with ``seed`` (``None``: the default one)."""
        return self.starts[seed % len(self.starts)] if self.starts else None


# --- field readers ---------------------------------------------------------------------------


class _Reader:
    """Reads one table, remembering the dotted path and refusing unknown fields."""

    def __init__(self, path: str, table: Mapping[str, Any], prefix: str, allowed: Sequence[str]):
        self.path = path
        self.table = table
        self.prefix = prefix
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            raise ScenarioError(
                path, self.name(unknown[0]), "unknown field", ", ".join(sorted(allowed))
            )

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, problem: str, allowed: str) -> ScenarioError:
        return ScenarioError(self.path, self.name(key), problem, allowed)

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"got {value!r}", f"an integer from {low} to {high}")
        return value

    def number(self, key: str, default: float, low: float, high: float) -> float:
        value = self.table.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise self.error(key, f"got {value!r}", f"a number from {low} to {high}")
        return float(value)

    def text(self, key: str, default: str) -> str:
        value = self.table.get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"got {value!r}", "a string")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.table.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"got {value!r}", "true or false")
        return value

    def duration(
        self,
        key: str,
        default: float,
        *,
        signed: bool = False,
        zero: bool = False,
        high: float = MAX_DURATION,
    ) -> float:
        value = self.table.get(key, default)
        return _duration(self, key, value, signed=signed, zero=zero, high=high)

    def table_of(self, key: str) -> Mapping[str, Any]:
        value = self.table.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(key, f"got {type(value).__name__}", "a table")
        return value

    def list_of(self, key: str) -> list[Any]:
        value = self.table.get(key, [])
        if not isinstance(value, list):
            raise self.error(key, f"got {type(value).__name__}", "an array")
        if len(value) > MAX_ENTRIES:
            raise self.error(
                key, f"has {len(value)} entries", f"an array of at most {MAX_ENTRIES} entries"
            )
        return value


_DURATION_HELP = "seconds as a number, or a string like '250ms', '90s', '5m', '2h'"


def _span(seconds: float) -> str:
    if seconds < 86400:
        return f"{seconds:g}s"
    days = seconds / 86400
    return f"{days:g} day" + ("" if days == 1 else "s")


def _duration(
    reader: _Reader,
    key: str,
    value: object,
    *,
    signed: bool,
    zero: bool,
    high: float = MAX_DURATION,
) -> float:
    """Seconds, refusing what would make a run endless or meaningless (nan, inf, 1e12)."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(2)) * _UNITS[match.group(3)]
        if match.group(1) == "-":
            seconds = -seconds
    allowed = ("a signed duration: " if signed else "") + _DURATION_HELP
    if seconds is None:
        raise reader.error(key, f"got {value!r}", allowed)
    if not math.isfinite(seconds) or abs(seconds) > high:
        bound = f"-{_span(high)} to {_span(high)}" if signed else f"at most {_span(high)}"
        raise reader.error(
            key, f"got {echo(value)}", f"a finite duration, {bound}: " + _DURATION_HELP
        )
    if not signed and (seconds < 0 or (seconds == 0 and not zero)):
        raise reader.error(key, f"got {value!r}", "a positive duration: " + _DURATION_HELP)
    return seconds


def _pair(reader: _Reader, key: str, default: tuple[Any, Any], kind: str) -> tuple[Any, Any]:
    value = reader.table.get(key, list(default))
    allowed = f"an array [low, high] of two {kind} with low <= high"
    if not isinstance(value, list) or len(value) != 2:
        raise reader.error(key, f"got {value!r}", allowed)
    if kind == "durations":
        low = _duration(reader, key, value[0], signed=False, zero=True)
        high = _duration(reader, key, value[1], signed=False, zero=True)
    else:
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_COPIES for v in value
        ):
            raise reader.error(key, f"got {echo(value)}", allowed)
        low, high = value
    if low > high:
        raise reader.error(key, f"got {value!r}", allowed)
    return (low, high)


# --- sections --------------------------------------------------------------------------------

_TOP = ("name", "description", "run", "latency", "faults", "nodes", "deployments")
_NODE = ("id", "kind", "scope", "lock_duration", "retention", "revisions", "lines")
_RUN = (
    "items",
    "tenants",
    "workers",
    "arrival_window",
    "faults_until",
    "lock_duration",
    "sweep_interval",
    "max_deliveries",
    "redelivery_delay",
    "seeds",
    "keys",
    "payloads",
    "host_timezone",
    "start",
    "instance_items",
    "lock_free_tenants",
)
_DEPLOYMENT = ("at", "node", "lock_duration", "retention")
_START_HELP = (
    "an RFC 3339 instant with its offset such as '2026-01-31T23:58:30Z', or an array "
    f"of at most {MAX_STARTS} of them (one per seed in turn), from "
    f"{EARLIEST_START:%Y-%m-%d} to {LATEST_START:%Y-%m-%d}"
)
_FAULTS = (
    "duplicate_delivery",
    "crash",
    "slow_worker",
    "clock_jump",
    "clock_skew",
    "store_errors",
    "effect_errors",
    "lost_reply",
    "catchup_pause",
    "swarm",
)


def _faults(path: str, raw: Mapping[str, Any]) -> Faults:
    top = _Reader(path, raw, "faults", _FAULTS)
    dup = _Reader(
        path,
        top.table_of("duplicate_delivery"),
        "faults.duplicate_delivery",
        ("rate", "copies", "delay"),
    )
    crash = _Reader(
        path, top.table_of("crash"), "faults.crash", ("rate", "points", "restart_delay")
    )
    points_raw = crash.list_of("points") or [p.value for p in CrashPoint]
    names = ", ".join(p.value for p in CrashPoint)
    points = []
    for entry in points_raw:
        try:
            points.append(CrashPoint(entry))
        except ValueError:
            raise crash.error("points", f"unknown crash point {entry!r}", names) from None
    slow = _Reader(path, top.table_of("slow_worker"), "faults.slow_worker", ("rate", "factor"))
    jump = _Reader(path, top.table_of("clock_jump"), "faults.clock_jump", ("schedule",))
    jumps = []
    for i, entry in enumerate(jump.list_of("schedule")):
        if not isinstance(entry, Mapping):
            raise jump.error(
                "schedule", f"entry {i} is {entry!r}", "tables {at = '3m', by = '-10m'}"
            )
        item = _Reader(path, entry, f"faults.clock_jump.schedule[{i}]", ("at", "by"))
        jumps.append(
            ClockJump(
                item.duration("at", 0.0, zero=True),
                item.duration("by", 0.0, signed=True, high=MAX_JUMP),
            )
        )
    skew = _Reader(path, top.table_of("clock_skew"), "faults.clock_skew", ("max",))
    store = _Reader(
        path, top.table_of("store_errors"), "faults.store_errors", ("rate", "after_fraction")
    )
    effect = _Reader(path, top.table_of("effect_errors"), "faults.effect_errors", ("rate",))
    lost = _Reader(path, top.table_of("lost_reply"), "faults.lost_reply", ("enabled", "rate"))
    pause = _Reader(path, top.table_of("catchup_pause"), "faults.catchup_pause", ("schedule",))
    pauses = []
    for i, entry in enumerate(pause.list_of("schedule")):
        if not isinstance(entry, Mapping):
            raise pause.error(
                "schedule", f"entry {i} is {entry!r}", "tables {at = '1m', for = '10m'}"
            )
        item = _Reader(path, entry, f"faults.catchup_pause.schedule[{i}]", ("at", "for"))
        pauses.append(CatchupPause(item.duration("at", 0.0, zero=True), item.duration("for", 60.0)))
    return Faults(
        duplicate=DuplicateFaults(
            rate=dup.number("rate", 0.0, 0.0, 1.0),
            copies=_pair(dup, "copies", (1, 3), f"integers from 1 to {MAX_COPIES}"),
            delay=_pair(dup, "delay", (0.0, 30.0), "durations"),
        ),
        crash=CrashFaults(
            rate=crash.number("rate", 0.0, 0.0, 1.0),
            points=tuple(points),
            restart_delay=crash.duration("restart_delay", 5.0),
        ),
        slow=SlowFaults(
            rate=slow.number("rate", 0.0, 0.0, 1.0), factor=slow.number("factor", 1.5, 1.0, 10.0)
        ),
        clock_jumps=tuple(sorted(jumps, key=lambda j: j.at)),
        skew=SkewFaults(max=skew.duration("max", 0.0, zero=True)),
        store=StoreFaults(
            rate=store.number("rate", 0.0, 0.0, 0.5),
            after_fraction=store.number("after_fraction", 0.5, 0.0, 1.0),
        ),
        effect=EffectFaults(rate=effect.number("rate", 0.0, 0.0, 1.0)),
        lost_reply=LostReplyFaults(
            enabled=lost.number("enabled", 1.0 if "lost_reply" in raw else 0.0, 0.0, 1.0),
            rate=lost.number("rate", 0.0, 0.0, 0.5),
        ),
        catchup_pauses=tuple(sorted(pauses, key=lambda p: p.at)),
        swarm=top.boolean("swarm", False),
    )


def _choice(reader: _Reader, key: str, kind: type[enum.Enum], default: enum.Enum) -> Any:
    value = reader.table.get(key, default.value)
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(str(k.value) for k in kind)
        raise reader.error(key, f"got {value!r}", names) from None


def _timezone(reader: _Reader) -> str:
    name = reader.text("host_timezone", "")
    if not name:
        return ""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise reader.error(
            "host_timezone", f"got {name!r}", "an IANA time zone name such as 'Asia/Kolkata'"
        ) from None
    return name


def _nodes(path: str, raw: object, lock_default: float) -> tuple[NodeSpec, ...]:
    if raw is None:
        return ()
    allowed = f"a non-empty array of tables ([[nodes]] blocks), at most {MAX_NODES} of them"
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(path, "nodes", f"got {echo(raw)}", allowed)
    if len(raw) > MAX_NODES:
        raise ScenarioError(path, "nodes", f"has {len(raw)} nodes", allowed)
    nodes: list[NodeSpec] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise ScenarioError(path, f"nodes[{i}]", f"got {entry!r}", "a table ([[nodes]])")
        node = _Reader(path, entry, f"nodes[{i}]", _NODE)
        kind = _choice(node, "kind", NodeKind, NodeKind.INVOICE)
        node_id = node.text("id", f"{kind.value}-{i + 1}")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", node_id):
            raise node.error("id", f"got {node_id!r}", "lower-case letters, digits and '-'")
        if any(n.id == node_id for n in nodes):
            raise node.error("id", f"{node_id!r} is already the id of another node", "unique ids")
        scope = node.text("scope", "Element")
        if scope not in SCOPES:
            raise node.error("scope", f"got {scope!r}", ", ".join(SCOPES))
        lock = node.duration("lock_duration", lock_default, high=MAX_NODE_LOCK)
        if lock > MAX_NODE_LOCK:
            raise node.error("lock_duration", f"got {lock:g}s", "at most 1 day")
        retention: float | None
        if entry.get("retention") == "forever":
            retention = None
        else:
            retention = node.duration("retention", 30 * 86400.0, high=MAX_NODE_RETENTION)
            if retention <= lock:
                raise node.error(
                    "retention",
                    f"{retention:g}s is not longer than the lock duration ({lock:g}s)",
                    "a duration longer than lock_duration, or 'forever'",
                )
            if retention > MAX_NODE_RETENTION:
                raise node.error("retention", f"got {retention:g}s", "at most 36500 days")
        nodes.append(
            NodeSpec(
                id=node_id,
                kind=kind,
                scope=scope,
                lock_duration=lock,
                retention=retention,
                revisions=node.integer("revisions", 2, 1, MAX_REVISIONS),
                lines=node.integer("lines", 3, 1, 10),
            )
        )
    return tuple(nodes)


def _starts(reader: _Reader) -> tuple[dt.datetime, ...]:
    value = reader.table.get("start", [])
    entries = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not 0 < len(value) <= MAX_STARTS and "start" in reader.table:
        raise reader.error("start", f"has {len(value)} entries", _START_HELP)
    starts = []
    for entry in entries:
        instant: dt.datetime | None = None
        if isinstance(entry, dt.datetime):
            instant = entry
        elif isinstance(entry, str):
            try:
                instant = dt.datetime.fromisoformat(entry)
            except ValueError:
                instant = None
        if instant is None or instant.tzinfo is None:
            problem = "has no UTC offset" if instant is not None else "is not an instant"
            raise reader.error("start", f"{echo(entry)} {problem}", _START_HELP)
        instant = instant.astimezone(dt.UTC)
        if not EARLIEST_START <= instant <= LATEST_START:
            raise reader.error("start", f"{echo(entry)} is out of range", _START_HELP)
        starts.append(instant)
    return tuple(starts)


def _range(reader: _Reader, key: str, low: int, high: int) -> tuple[int, int]:
    """An integer, or an array ``[low, high]`` of two to draw one from per seed."""
    value = reader.table.get(key, low)
    if isinstance(value, list):
        if (
            len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and low <= value[0] <= value[1] <= high
        ):
            return (value[0], value[1])
        raise reader.error(
            key,
            f"got {echo(value)}",
            f"an integer from {low} to {high}, or an array [low, high] of two of them "
            "with low <= high (one drawn per seed)",
        )
    number = reader.integer(key, low, low, high)
    return (number, number)


def _deployments(path: str, raw: object, nodes: tuple[NodeSpec, ...]) -> tuple[Deployment, ...]:
    if raw is None:
        return ()
    allowed = f"an array of tables ([[deployments]] blocks), at most {MAX_ENTRIES} of them"
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise ScenarioError(path, "deployments", f"got {echo(raw)}", allowed)
    ids = [n.id for n in nodes]
    found: list[Deployment] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise ScenarioError(
                path, f"deployments[{i}]", f"got {entry!r}", "a table ([[deployments]])"
            )
        item = _Reader(path, entry, f"deployments[{i}]", _DEPLOYMENT)
        if not ids:
            raise item.error("node", "the scenario has no [[nodes]]", "redeploy a [[nodes]] entry")
        node_id = item.text("node", ids[0] if len(ids) == 1 else "")
        node = next((n for n in nodes if n.id == node_id), None)
        if node is None:
            raise item.error("node", f"got {node_id!r}", ", ".join(ids))
        if "lock_duration" not in entry and "retention" not in entry:
            raise item.error(
                "lock_duration", "a deployment must change something", "lock_duration, retention"
            )
        lock = (
            item.duration("lock_duration", node.lock_duration, high=MAX_NODE_LOCK)
            if "lock_duration" in entry
            else None
        )
        forever = entry.get("retention") == "forever"
        retention = (
            item.duration("retention", 0.0, high=MAX_NODE_RETENTION)
            if "retention" in entry and not forever
            else None
        )
        previous = [d for d in found if d.node == node_id]
        effective_lock = (
            lock
            if lock is not None
            else next(
                (d.lock_duration for d in reversed(previous) if d.lock_duration is not None),
                node.lock_duration,
            )
        )
        effective_retention = retention
        if retention is None and not forever:
            last = next(
                (d for d in reversed(previous) if d.retention is not None or d.forever), None
            )
            effective_retention = node.retention if last is None else last.retention
        if effective_retention is not None and effective_retention <= effective_lock:
            raise item.error(
                "retention",
                f"{effective_retention:g}s is not longer than the lock duration "
                f"({effective_lock:g}s) of this deployment",
                "a retention longer than lock_duration, or 'forever'",
            )
        at = item.duration("at", 0.0)
        if found and at < found[-1].at:
            raise item.error("at", f"{at:g}s is before the deployment above it", "time order")
        found.append(Deployment(at, node_id, lock, retention, forever))
    return tuple(found)


def parse_scenario(raw: Mapping[str, Any], path: str) -> Scenario:
    """Validate a decoded TOML document; ``path`` is only used in error messages."""
    top = _Reader(path, raw, "", _TOP)
    name = top.text("name", Path(path).stem)
    if not re.fullmatch(rf"[a-z0-9][a-z0-9-]{{0,{MAX_NAME - 1}}}", name):
        raise top.error(
            "name",
            f"got {echo(name)}",
            f"lower-case letters, digits and '-', at most {MAX_NAME} characters",
        )
    run = _Reader(path, top.table_of("run"), "run", _RUN)
    latency = _Reader(
        path, top.table_of("latency"), "latency", ("store", "effect", "jitter", "grid")
    )
    scenario = Scenario(
        name=name,
        description=top.text("description", ""),
        path=path,
        items=run.integer("items", 20, 1, 500),
        tenants=run.integer("tenants", 1, 1, 10),
        workers=run.integer("workers", 4, 1, 64),
        arrival_window=run.duration("arrival_window", 120.0, zero=True),
        faults_until=run.duration("faults_until", 600.0),
        lock_duration=run.duration("lock_duration", 60.0),
        sweep_interval=run.duration("sweep_interval", 30.0),
        max_deliveries=run.integer("max_deliveries", 6, 1, 50),
        redelivery_delay=run.duration("redelivery_delay", 90.0),
        seeds=run.integer("seeds", 3, 1, 1000),
        latency=Latency(
            store=latency.duration("store", 0.05),
            effect=latency.duration("effect", 2.0),
            jitter=latency.number("jitter", 0.5, 0.0, 0.95),
            grid=latency.duration("grid", 0.0, zero=True),
        ),
        faults=_faults(path, top.table_of("faults")),
        keys=_choice(run, "keys", KeyStyle, KeyStyle.PLAIN),
        payloads=_choice(run, "payloads", PayloadStyle, PayloadStyle.PLAIN),
        host_timezone=_timezone(run),
        starts=_starts(run),
        instance_items=_range(run, "instance_items", 1, MAX_INSTANCE_ITEMS),
    )
    lock = scenario.lock_duration
    nodes = _nodes(path, raw.get("nodes"), lock)
    scenario = replace(
        scenario,
        nodes=nodes,
        deployments=_deployments(path, raw.get("deployments"), nodes),
        lock_free_tenants=run.integer("lock_free_tenants", 0, 0, scenario.tenants - 1),
    )
    if scenario.lock_free_tenants and not any(n.kind is NodeKind.APPROVAL for n in nodes):
        raise run.error(
            "lock_free_tenants",
            f"got {scenario.lock_free_tenants} without an approval node",
            "0, or a workflow with an approval node (its lock-free amendments)",
        )
    late = [d for d in scenario.deployments if d.at >= scenario.faults_until]
    if late:
        raise ScenarioError(
            path,
            f"deployments[{scenario.deployments.index(late[0])}].at",
            f"{late[0].at:g}s is not before faults_until ({scenario.faults_until:g}s)",
            "a redeployment while the run is still busy, before faults_until",
        )
    if 0 < scenario.latency.grid < MIN_GRID:
        raise latency.error(
            "grid", f"got {scenario.latency.grid:g}s", f"0 (no grid) or at least {MIN_GRID:g}s"
        )
    span = scenario.faults_until + 20 * (
        scenario.longest_lock + scenario.sweep_interval + scenario.redelivery_delay
    )
    if span / scenario.sweep_interval > MAX_SWEEPS:
        raise run.error(
            "sweep_interval",
            f"{scenario.sweep_interval:g}s would need up to {span / scenario.sweep_interval:.0f} "
            f"sweeps over the run's span of {span:g}s (faults_until + 20 x (longest lock + "
            "sweep_interval + redelivery_delay))",
            f"a sweep interval of at least {span / MAX_SWEEPS:g}s for this scenario "
            f"(at most {MAX_SWEEPS} sweeps)",
        )
    if scenario.arrival_window > scenario.faults_until:
        raise run.error(
            "arrival_window",
            f"{scenario.arrival_window}s is after faults_until ({scenario.faults_until}s)",
            "an arrival window that ends before faults stop",
        )
    return scenario


_REGULAR_FILE = f"a regular UTF-8 .toml file of at most {MAX_FILE_BYTES // 1024} KiB"


def _read_bytes(where: str, path: Path) -> bytes:
    """The file's bytes, refusing what is not a regular file or is over the cap unread."""
    try:
        return read_bounded(path, MAX_FILE_BYTES)
    except InputFileProblem as exc:
        allowed = "a readable .toml file" if exc.problem.startswith("cannot") else _REGULAR_FILE
        raise ScenarioError(where, "", exc.problem, allowed) from exc


def _decode(where: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(
            where,
            "",
            f"not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} (line {line}) "
            "cannot be decoded",
            "a UTF-8 text file (TOML 1.0)",
        ) from None


def _parse_toml(where: str, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(where, "", f"not valid TOML: {exc}", "TOML 1.0") from exc
    except RecursionError:
        raise ScenarioError(
            where,
            "",
            "arrays or tables are nested too deeply to read",
            f"tables and arrays nested at most {MAX_DEPTH} levels deep",
        ) from None
    except ValueError as exc:  # an integer past Python's int-from-text digit limit
        raise ScenarioError(
            where,
            "",
            f"a number is too long to read ({exc})",
            f"integers from {-MAX_INTEGER - 1} to {MAX_INTEGER} (64 bits, as TOML 1.0 says)",
        ) from None


def _check_shape(where: str, document: Mapping[str, Any]) -> None:
    """Refuse nesting past :data:`MAX_DEPTH` and integers past 64 bits, wherever they are.

    Walked with an explicit stack, so the check itself cannot run out of
    recursion on the document it is checking.
    """
    stack: list[tuple[object, int, str]] = [(document, 1, "")]
    while stack:
        value, depth, name = stack.pop()
        if isinstance(value, Mapping | list):
            if depth > MAX_DEPTH:
                raise ScenarioError(
                    where,
                    name,
                    f"nested {depth} levels deep",
                    f"tables and arrays nested at most {MAX_DEPTH} levels deep",
                )
            if isinstance(value, Mapping):
                children = [(v, f"{name}.{k}" if name else str(k)) for k, v in value.items()]
            else:
                children = [(v, f"{name}[{i}]") for i, v in enumerate(value)]
            stack.extend((child, depth + 1, path) for child, path in children)
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not -MAX_INTEGER - 1 <= value <= MAX_INTEGER
        ):
            raise ScenarioError(
                where,
                name,
                f"an integer of {value.bit_length()} bits",
                f"integers from {-MAX_INTEGER - 1} to {MAX_INTEGER} (64 bits, as TOML 1.0 says)",
            )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one ``.toml`` scenario file."""
    where = str(path)
    raw = _parse_toml(where, _decode(where, _read_bytes(where, Path(path))))
    _check_shape(where, raw)
    return parse_scenario(raw, where)


def load_scenarios(target: str | Path) -> list[Scenario]:
    """A file, or every ``*.toml`` in a directory (sorted by name)."""
    root = Path(target)
    if root.is_dir():
        files = sorted(root.glob("*.toml"))
        if not files:
            raise ScenarioError(
                str(root), "", "no *.toml scenario files here", "a directory of .toml files"
            )
        return [load_scenario(f) for f in files]
    return [load_scenario(root)]
