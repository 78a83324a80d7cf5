"""The operation history of a run: what every worker asked, when, and what came back.

The format follows Jepsen: each operation is invoked, then completes with
exactly one outcome -- ``ok`` (it happened), ``fail`` (it definitely did not
happen) or ``info`` (the outcome is unknown: a crash or a store error after
the request was sent, so it *may* have happened).  Besides operations, a run
records instantaneous events: business side effects (charges), crashes, clock
jumps, deliveries and fault markers.

The format knows nothing about SimPy, so the checker reads histories from the
simulator and from wall-clock runs (the multi-process stress runner) alike.

Time
----
Every instant is a :data:`~dsm_sim.micros.Micros`: whole microseconds since
:attr:`History.epoch`, an aware UTC datetime (:mod:`dsm_sim.micros`), so the
whole range a record can hold, to 9999-12-31 23:59:59.999999, is exact.
Durations (lock duration, retention, sweep interval, a clock jump) are float
seconds.  Two clocks appear:

* ``invoke`` / ``complete`` / ``Event.time`` are on the *history's* timeline:
  simulated time in the simulator, wall time since the run started in the
  stress runner.  They order what happened.
* ``store_time`` is the instant the *store* saw (the handler clock's reading
  when it executed the call), which differs from the timeline when the clock
  jumps.  Lock expiry is decided on this clock, so the checker reasons about
  leases with it.  It is ``None`` when unknown (wall-clock runs); the checker
  then treats the call as having happened anywhere in ``[invoke, complete]``.

Serialisation is deterministic: fixed field order, sorted keys, instants as
seconds to the microsecond (:func:`~dsm_sim.micros.seconds_json`: a string of
the exact decimal where a double no longer holds the microsecond), durations
rounded to the microsecond, so one seed gives a byte-identical file.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dsm_sim.micros import Micros, from_json, instant_at, micros_since, seconds_json, seconds_of
from dsm_sim.wall import RunStoppedError
from reference_engine.clock import UTC, ensure_utc
from reference_engine.context import RecordKey, StateHandlerContext

__all__ = [
    "MAX_HISTORY_ENTRIES",
    "CallOptions",
    "Event",
    "EventKind",
    "FinalState",
    "History",
    "HistoryLimitError",
    "HistoryRecorder",
    "KeyInfo",
    "Observed",
    "Op",
    "OpName",
    "Outcome",
    "RecordView",
    "Scalar",
    "key_of",
]

#: What a result or detail value may be: JSON scalars only, so files stay diffable.
Scalar = bool | int | float | str | None

_DIGITS = 6

#: The most operations and events one history may hold.  The checker judges a history
#: whole, in memory (about 1 KB per entry, checker included), so this bounds the memory
#: of one run: the simulator stops a run that reaches it (``HistoryLimitError``) and the
#: stress runner does not build a history from journals that hold more.  The catalogue's
#: runs record a few thousand.
MAX_HISTORY_ENTRIES = 500_000


class HistoryLimitError(RunStoppedError):
    """A run's history reached :data:`MAX_HISTORY_ENTRIES`: stopped before it outgrew memory.

    Takes its message only (SimPy rebuilds a process's error from its args).
    """


def _t(value: float | None) -> float | None:
    """A duration (float seconds) as written: rounded to the microsecond."""
    return None if value is None else round(float(value), _DIGITS)


def _i(value: object) -> Micros | None:
    """An instant as read: microseconds from the seconds :func:`seconds_json` wrote."""
    return None if value is None else from_json(value)


def key_of(key: RecordKey | StateHandlerContext) -> str:
    """The history's key for a record key: every component, so tenants never collide.

    A context with an item key gives the key of its record key, from the same parts.
    """
    return "/".join(
        [key.tenant_id, str(key.scope_id), key.entity_id, key.item_entity_key, key.item_key]
    )


class OpName(enum.Enum):
    """The handler calls a history records (reads, writes and the two sweeps)."""

    EXISTS = "exists"
    GET = "get"
    TRY_ACQUIRE_LOCK = "try_acquire_lock"
    SET = "set"
    RELEASE_LOCK_AS_FAILED = "release_lock_as_failed"
    UPSERT = "upsert"
    RESET_EXPIRED_LOCKS = "reset_expired_locks"
    EXPIRE_PAST_RETENTION = "expire_past_retention"

    @property
    def is_write(self) -> bool:
        return self in _WRITES

    @property
    def is_sweep(self) -> bool:
        return self in (OpName.RESET_EXPIRED_LOCKS, OpName.EXPIRE_PAST_RETENTION)


_WRITES = frozenset(
    {OpName.TRY_ACQUIRE_LOCK, OpName.SET, OpName.RELEASE_LOCK_AS_FAILED, OpName.UPSERT}
)


class Outcome(enum.Enum):
    """Jepsen's three outcomes; ``info`` must be read as "may have happened"."""

    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class EventKind(enum.Enum):
    """Instantaneous happenings that are not handler calls."""

    DELIVERY = "delivery"
    SIDE_EFFECT = "side_effect"
    CRASH = "crash"
    CLOCK_JUMP = "clock_jump"
    STORE_FAULT = "store_fault"
    CATCHUP_PAUSE = "catchup_pause"
    CATCHUP_RESUME = "catchup_resume"
    FAULTS_STOP = "faults_stop"
    #: The broker gave up on a message after its last delivery failed; ``detail`` is the reason.
    DEAD_LETTER = "dead_letter"
    #: A node was redeployed (``detail``: its new options); its workers' instances were replaced.
    DEPLOYMENT = "deployment"


@dataclass(frozen=True, slots=True)
class RecordView:
    """A record as the store returned it, reduced to what the checker compares.

    Instants are store-clock microseconds since the epoch; ``utc`` is False when any
    stored instant was naive or not at offset zero.  ``data`` is a digest of the
    canonical JSON of the payload, so histories stay small whatever the data.
    ``key`` is the history key of the record the store returned, which differs
    from the key asked for when the store confuses two keys.
    """

    key: str
    status: str
    attempt: int
    locked_until: Micros | None
    created_at: Micros
    updated_at: Micros
    retain_until: Micros | None
    data: str | None
    utc: bool = True
    #: (error_detail, source_app_id, entity_execution_id) as stored; ``None`` when the
    #: recorder did not read them (histories written before they were recorded).
    audit: tuple[str | None, str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "status": self.status,
            "attempt": self.attempt,
            "locked_until": seconds_json(self.locked_until),
            "created_at": seconds_json(self.created_at),
            "updated_at": seconds_json(self.updated_at),
            "retain_until": seconds_json(self.retain_until),
            "data": self.data,
            "utc": self.utc,
            **({} if self.audit is None else {"audit": list(self.audit)}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RecordView:
        audit = raw.get("audit")
        return cls(
            key=str(raw["key"]),
            status=str(raw["status"]),
            attempt=int(raw["attempt"]),
            locked_until=_i(raw.get("locked_until")),
            created_at=from_json(raw["created_at"]),
            updated_at=from_json(raw["updated_at"]),
            retain_until=_i(raw.get("retain_until")),
            data=raw.get("data"),
            utc=bool(raw.get("utc", True)),
            audit=None if audit is None else (audit[0], str(audit[1]), str(audit[2])),
        )


def _opt(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _view(raw: object) -> RecordView | None:
    return None if raw is None else RecordView.from_json(raw)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a history key stands for: whose record it is and the options it was written with.

    ``retention`` is seconds, ``None`` for records kept forever.
    """

    node: str
    tenant: str
    scope: int
    entity: str
    item_entity_key: str
    item: str
    lock_duration: float
    retention: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "tenant": self.tenant,
            "scope": self.scope,
            "entity": self.entity,
            "item_entity_key": self.item_entity_key,
            "item": self.item,
            "lock_duration": _t(self.lock_duration),
            "retention": _t(self.retention),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KeyInfo:
        return cls(
            node=str(raw["node"]),
            tenant=str(raw["tenant"]),
            scope=int(raw["scope"]),
            entity=str(raw["entity"]),
            item_entity_key=str(raw["item_entity_key"]),
            item=str(raw["item"]),
            lock_duration=float(raw["lock_duration"]),
            retention=_opt(raw.get("retention")),
        )


@dataclass(frozen=True, slots=True)
class CallOptions:
    """The node options one call carried (seconds; ``retention`` ``None``: kept forever)."""

    lock_duration: float
    retention: float | None

    def to_json(self) -> dict[str, Any]:
        return {"lock_duration": _t(self.lock_duration), "retention": _t(self.retention)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CallOptions:
        return cls(lock_duration=float(raw["lock_duration"]), retention=_opt(raw.get("retention")))


@dataclass(frozen=True, slots=True)
class Op:
    """One handler call.

    ``token`` is the fencing token the call carried (set, release, upsert) or
    the one it returned (an ``ok`` try_acquire_lock).  ``status`` is the target
    status of a ``set``.  ``error`` is the exception class name of a ``fail`` or
    ``info``.  ``keys`` lists, for a sweep, the keys it is known to have reset
    (empty when the recorder could not tell); for a sweep, ``candidates`` lists
    the keys that were due (an expired lock, a record past retention) when it ran.

    ``probed`` says the recorder read the key right before and right after the
    store executed the call (outside the history, at the same instant):
    ``before``/``after`` are those reads (``None``: no record).  It is set even
    on an ``info`` call whose write landed, because the recorder knows.
    ``data`` is the digest of the payload a write carried; ``detail`` the error
    detail a ``release_lock_as_failed`` carried and ``app`` the call's source
    application (``None``: not recorded).
    """

    index: int
    process: str
    op: OpName
    key: str
    invoke: Micros
    complete: Micros | None = None
    outcome: Outcome | None = None
    result: Scalar = None
    token: int | None = None
    status: str | None = None
    error: str | None = None
    store_time: Micros | None = None
    execution: str = ""
    keys: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    data: str | None = None
    probed: bool = False
    before: RecordView | None = None
    after: RecordView | None = None
    #: The order in which the store executed the call, among calls of this run
    #: (recorders that know it: the simulator).  Calls that reach the store at
    #: the same instant are ordered by it, not by when they were invoked.
    seq: int | None = None
    detail: str | None = None
    app: str | None = None
    #: The node options the call was made with, when they are not its key's
    #: (:class:`KeyInfo`): a node redeployed mid-run with new options.
    options: CallOptions | None = None

    @property
    def earliest(self) -> Micros:
        """The earliest store instant the call can have taken effect at."""
        return self.store_time if self.store_time is not None else self.invoke

    @property
    def latest(self) -> float:
        """The latest store instant the call can have taken effect at (``inf``: unbounded)."""
        if self.store_time is not None:
            return self.store_time
        return self.complete if self.complete is not None else float("inf")

    @property
    def effect_lo(self) -> Micros:
        """Earliest timeline instant the call can have taken effect at.

        A recorder that knows the exact instant (the simulator) sets
        ``store_time`` and completes the operation at that same instant.
        """
        if self.store_time is not None and self.complete is not None:
            return self.complete
        return self.invoke

    @property
    def effect_hi(self) -> float:
        """Latest timeline instant the call can have taken effect at."""
        return self.complete if self.complete is not None else float("inf")

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def maybe(self) -> bool:
        """Happened or may have happened (``ok`` or ``info``)."""
        return self.outcome in (Outcome.OK, Outcome.INFO)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "process": self.process,
            "op": self.op.value,
            "key": self.key,
            "invoke": seconds_json(self.invoke),
            "complete": seconds_json(self.complete),
            "outcome": None if self.outcome is None else self.outcome.value,
            "result": self.result,
            "token": self.token,
            "status": self.status,
            "error": self.error,
            "store_time": seconds_json(self.store_time),
            "execution": self.execution,
            "keys": list(self.keys),
        }
        if self.candidates:
            out["candidates"] = list(self.candidates)
        if self.data is not None:
            out["data"] = self.data
        if self.probed:
            out["probed"] = True
            out["before"] = None if self.before is None else self.before.to_json()
            out["after"] = None if self.after is None else self.after.to_json()
        if self.seq is not None:
            out["seq"] = self.seq
        if self.detail is not None:
            out["detail"] = self.detail
        if self.app is not None:
            out["app"] = self.app
        if self.options is not None:
            out["options"] = self.options.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Op:
        return cls(
            index=int(raw["index"]),
            process=str(raw["process"]),
            op=OpName(raw["op"]),
            key=str(raw["key"]),
            invoke=from_json(raw["invoke"]),
            complete=_i(raw.get("complete")),
            outcome=None if raw.get("outcome") is None else Outcome(raw["outcome"]),
            result=raw.get("result"),
            token=raw.get("token"),
            status=raw.get("status"),
            error=raw.get("error"),
            store_time=_i(raw.get("store_time")),
            execution=str(raw.get("execution", "")),
            keys=tuple(raw.get("keys", ())),
            candidates=tuple(raw.get("candidates", ())),
            data=raw.get("data"),
            probed=bool(raw.get("probed", False)),
            seq=None if raw.get("seq") is None else int(raw["seq"]),
            before=_view(raw.get("before")),
            after=_view(raw.get("after")),
            detail=raw.get("detail"),
            app=raw.get("app"),
            options=None if raw.get("options") is None else CallOptions.from_json(raw["options"]),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """An instant: a charge (with the token it was made under), a crash, a clock jump..."""

    index: int
    time: Micros
    kind: EventKind
    process: str = ""
    key: str = ""
    token: int | None = None
    execution: str = ""
    detail: str = ""
    #: A span in seconds (a clock jump's size, a pause's length).
    value: float | None = None
    #: The node whose effect this is (side effects): duplicates are counted per key and node.
    node: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "time": seconds_json(self.time),
            "kind": self.kind.value,
            "process": self.process,
            "key": self.key,
            "token": self.token,
            "execution": self.execution,
            "detail": self.detail,
            "value": _t(self.value),
        }
        if self.node:
            out["node"] = self.node
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Event:
        return cls(
            index=int(raw["index"]),
            time=from_json(raw["time"]),
            kind=EventKind(raw["kind"]),
            process=str(raw.get("process", "")),
            key=str(raw.get("key", "")),
            token=raw.get("token"),
            execution=str(raw.get("execution", "")),
            detail=str(raw.get("detail", "")),
            value=None if raw.get("value") is None else float(raw["value"]),
            node=str(raw.get("node", "")),
        )


@dataclass(frozen=True, slots=True)
class FinalState:
    """The record of a key as read from the store after the run (``status`` "none" if absent)."""

    key: str
    status: str
    attempt: int | None
    time: Micros
    store_time: Micros | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "status": self.status,
            "attempt": self.attempt,
            "time": seconds_json(self.time),
            "store_time": seconds_json(self.store_time),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FinalState:
        return cls(
            key=str(raw["key"]),
            status=str(raw["status"]),
            attempt=raw.get("attempt"),
            time=from_json(raw["time"]),
            store_time=_i(raw.get("store_time")),
        )


@dataclass(frozen=True, slots=True)
class History:
    """A whole run: parameters the checker needs, operations, events, final states.

    ``lock_duration`` and ``sweep_interval`` are seconds; ``faults_stop`` is
    the timeline instant (microseconds) after which no fault is injected (``None``: the run
    had no faults, or they never stopped -- then liveness is not checked).
    """

    epoch: dt.datetime
    lock_duration: float
    sweep_interval: float | None = None
    faults_stop: Micros | None = None
    ops: tuple[Op, ...] = ()
    events: tuple[Event, ...] = ()
    final: tuple[FinalState, ...] = ()
    meta: Mapping[str, Scalar] = field(default_factory=dict)
    #: What each key stands for, when the recorder knows (the simulator does).
    keys: Mapping[str, KeyInfo] = field(default_factory=dict)
    #: Built on first use: a history never changes, and the checker asks per key.
    _index: _KeyIndex | None = field(default=None, init=False, repr=False, compare=False)

    def lock_duration_for(self, key: str) -> float:
        """The lock duration the key's node was configured with (the run's default otherwise)."""
        info = self.keys.get(key)
        return self.lock_duration if info is None else info.lock_duration

    def lock_duration_of(self, op: Op) -> float:
        """The lock duration ``op`` was made with: its own options, else its key's node's."""
        return self.lock_duration_for(op.key) if op.options is None else op.options.lock_duration

    def retention_of(self, op: Op) -> float | None:
        """The retention ``op`` was made with (``None``: forever), as :meth:`lock_duration_of`."""
        if op.options is not None:
            return op.options.retention
        info = self.keys.get(op.key)
        return None if info is None else info.retention

    @property
    def longest_lock(self) -> float:
        redeployed = [op.options.lock_duration for op in self.ops if op.options is not None]
        return max(
            [self.lock_duration, *(k.lock_duration for k in self.keys.values()), *redeployed]
        )

    def item_keys(self) -> list[str]:
        """Every item key mentioned, sorted."""
        return list(self._keyed().item_keys)

    def ops_for(self, key: str) -> list[Op]:
        """The key's operations, in index order."""
        return list(self._keyed().ops.get(key, ()))

    def sweeps_listing(self, key: str) -> list[Op]:
        """The sweeps (either kind) whose ``keys`` name ``key``, in index order."""
        return list(self._keyed().sweeps.get(key, ()))

    def derived(self) -> dict[object, Any]:
        """Where a check keeps what it derives from this history and asks for again.

        Several checks ask the same question of one key (its leases, say); a
        history never changes, so the first answer holds.  Keys are the
        deriving module's own.
        """
        return self._keyed().derived

    def _keyed(self) -> _KeyIndex:
        index = self._index
        if index is None:
            index = _KeyIndex.of(self)
            object.__setattr__(self, "_index", index)
        return index

    def events_for(self, key: str, kind: EventKind | None = None) -> list[Event]:
        return [ev for ev in self.events if ev.key == key and (kind is None or ev.kind is kind)]

    def instant(self, micros: Micros) -> dt.datetime:
        """An instant of the history as an aware UTC datetime (``OverflowError`` past year 9999)."""
        return instant_at(self.epoch, micros)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch.isoformat(),
            "lock_duration": _t(self.lock_duration),
            "sweep_interval": _t(self.sweep_interval),
            "faults_stop": seconds_json(self.faults_stop),
            "meta": {k: self.meta[k] for k in sorted(self.meta)},
            "ops": [op.to_json() for op in self.ops],
            "events": [ev.to_json() for ev in self.events],
            "final": [f.to_json() for f in self.final],
        }
        if self.keys:
            out["keys"] = {k: self.keys[k].to_json() for k in sorted(self.keys)}
        return out

    def dumps(self) -> str:
        """Canonical JSON text: the same history always gives the same bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> History:
        return cls(
            epoch=ensure_utc(dt.datetime.fromisoformat(raw["epoch"])),
            lock_duration=float(raw["lock_duration"]),
            sweep_interval=(
                None if raw.get("sweep_interval") is None else float(raw["sweep_interval"])
            ),
            faults_stop=_i(raw.get("faults_stop")),
            ops=tuple(Op.from_json(o) for o in raw.get("ops", ())),
            events=tuple(Event.from_json(e) for e in raw.get("events", ())),
            final=tuple(FinalState.from_json(f) for f in raw.get("final", ())),
            meta=dict(raw.get("meta", {})),
            keys={k: KeyInfo.from_json(v) for k, v in raw.get("keys", {}).items()},
        )

    @classmethod
    def loads(cls, text: str) -> History:
        return cls.from_json(json.loads(text))


@dataclass(frozen=True, slots=True)
class _KeyIndex:
    """A history's operations grouped by key, each group in index order."""

    item_keys: tuple[str, ...]
    ops: Mapping[str, tuple[Op, ...]]
    sweeps: Mapping[str, tuple[Op, ...]]
    #: What checks derive from the history more than once, kept by whoever derives it.
    derived: dict[object, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, history: History) -> _KeyIndex:
        ops: dict[str, list[Op]] = {}
        sweeps: dict[str, list[Op]] = {}
        for op in history.ops:
            ops.setdefault(op.key, []).append(op)
            if op.op.is_sweep:
                for key in dict.fromkeys(op.keys):
                    sweeps.setdefault(key, []).append(op)
        found = {key for key in ops if key}
        found |= {ev.key for ev in history.events if ev.key}
        found |= {f.key for f in history.final}
        return cls(
            item_keys=tuple(sorted(found)),
            ops={key: tuple(group) for key, group in ops.items()},
            sweeps={key: tuple(group) for key, group in sweeps.items()},
        )


@dataclass(frozen=True, slots=True)
class Observed:
    """The reads taken right before and right after the store ran a call (see :class:`Op`).

    ``data`` is the digest of the payload the call carried.
    """

    before: RecordView | None
    after: RecordView | None
    data: str | None


#: A call invoked and not completed yet: ``(process, op, key, invoke, token, status,
#: execution, detail, app, options)``.  Its :class:`Op` is built once, when it
#: completes (or when the history is frozen first): a simulated run completes
#: nearly every call, and building an ``Op`` costs more than the rest of the invocation.
_Invoked = tuple[
    str,
    OpName,
    str,
    Micros,
    int | None,
    str | None,
    str,
    str | None,
    str | None,
    CallOptions | None,
]


class HistoryRecorder:
    """Mutable builder used while a run is in progress; :meth:`freeze` gives the History.

    Operations are numbered in invocation order; completing one replaces it
    in place, so an operation that never completes (a crash) stays visible as
    an invocation without outcome until :meth:`freeze` turns it into ``info``.
    """

    def __init__(
        self,
        *,
        epoch: dt.datetime | None = None,
        lock_duration: float,
        sweep_interval: float | None = None,
        meta: Mapping[str, Scalar] | None = None,
        store_order: bool = False,
        limit: int | None = None,
    ) -> None:
        self.epoch = ensure_utc(epoch or dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC))
        #: The most operations and events this recorder takes (None: no limit).
        self.limit = limit
        # A recorder whose completions are called in the order the store ran
        # the calls (the simulator) numbers them, so ties in time keep that order.
        self._store_order = store_order
        self._completed = 0
        self.lock_duration = lock_duration
        self.sweep_interval = sweep_interval
        self.faults_stop: Micros | None = None
        self.meta: dict[str, Scalar] = dict(meta or {})
        self._ops: list[Op | _Invoked] = []
        self._events: list[Event] = []
        self._final: list[FinalState] = []
        self._keys: dict[str, KeyInfo] = {}

    def key_info(self, key: str, info: KeyInfo) -> None:
        """Say what ``key`` stands for (first word wins: a key means one thing)."""
        self._keys.setdefault(key, info)

    @property
    def keys_info(self) -> Mapping[str, KeyInfo]:
        """What each key stands for, so far (read-only view)."""
        return self._keys

    def micros(self, instant: dt.datetime) -> Micros:
        """An aware datetime as microseconds since the epoch (for wall-clock recorders)."""
        micros = micros_since(ensure_utc(instant), self.epoch)
        assert micros is not None
        return micros

    def invoke(
        self,
        process: str,
        op: OpName,
        key: str,
        at: Micros,
        *,
        token: int | None = None,
        status: str | None = None,
        execution: str = "",
        detail: str | None = None,
        app: str | None = None,
        options: CallOptions | None = None,
    ) -> int:
        self._room(at)
        index = len(self._ops)
        self._ops.append((process, op, key, at, token, status, execution, detail, app, options))
        return index

    def _op(self, index: int) -> Op:
        """Operation ``index`` as it stands (an invocation without outcome while pending)."""
        entry = self._ops[index]
        if isinstance(entry, Op):
            return entry
        process, op, key, at, token, status, execution, detail, app, options = entry
        return Op(
            index=index,
            process=process,
            op=op,
            key=key,
            invoke=at,
            token=token,
            status=status,
            execution=execution,
            detail=detail,
            app=app,
            options=options,
        )

    def complete(
        self,
        index: int,
        outcome: Outcome,
        at: Micros,
        *,
        result: Scalar = None,
        error: str | None = None,
        store_time: Micros | None = None,
        token: int | None = None,
        keys: Iterable[str] = (),
        candidates: Iterable[str] = (),
        observed: Observed | None = None,
    ) -> Op:
        """Give the operation its outcome; ``observed``: the reads around it (as :meth:`observe`).

        Built field by field rather than with ``dataclasses.replace``: a
        simulated run completes every call it makes, and replace costs as
        much again as the operation itself.  The fields are given in
        :class:`Op`'s order, not by keyword, which costs 40 % less on the
        simulator's path; the test of the recorder checks each of them.
        """
        entry = self._ops[index]
        if isinstance(entry, Op):
            process, name, key, invoked = entry.process, entry.op, entry.key, entry.invoke
            carried, status, execution = entry.token, entry.status, entry.execution
            detail, app, options = entry.detail, entry.app, entry.options
            probed, before, after, data = entry.probed, entry.before, entry.after, entry.data
        else:
            process, name, key, invoked, carried, status, execution, detail, app, options = entry
            probed, before, after, data = False, None, None, None
        if observed is not None:
            probed, before, after, data = True, observed.before, observed.after, observed.data
        done = Op(
            index,
            process,
            name,
            key,
            invoked,
            at,  # complete
            outcome,
            result,
            carried if token is None else token,
            status,
            error,
            store_time,
            execution,
            tuple(sorted(keys)) if keys else (),
            tuple(sorted(candidates)) if candidates else (),
            data,
            probed,
            before,
            after,
            self._completed if self._store_order else None,  # seq
            detail,
            app,
            options,
        )
        self._completed += 1
        self._ops[index] = done
        return done

    def observe(
        self, index: int, before: RecordView | None, after: RecordView | None, data: str | None
    ) -> None:
        """Attach the reads taken around a call the store executed (see :class:`Op`)."""
        self._ops[index] = replace(
            self._op(index), probed=True, before=before, after=after, data=data
        )

    def _pending(self, index: int, at: Micros | None) -> Op:
        """Operation ``index``, not completed, as a frozen history shows it: ``info``."""
        op = self._op(index)
        return replace(
            op, outcome=Outcome.INFO, complete=op.invoke if at is None else at, error="Crash"
        )

    def event(
        self,
        kind: EventKind,
        at: Micros,
        *,
        process: str = "",
        key: str = "",
        token: int | None = None,
        execution: str = "",
        detail: str = "",
        value: float | None = None,
        node: str = "",
    ) -> Event:
        self._room(at)
        # Positional, in Event's field order (see complete).
        ev = Event(len(self._events), at, kind, process, key, token, execution, detail, value, node)
        self._events.append(ev)
        return ev

    def _room(self, at: Micros) -> None:
        """Refuse an entry past :attr:`limit`, before the run's memory grows without bound."""
        if self.limit is None or len(self._ops) + len(self._events) < self.limit:
            return
        raise HistoryLimitError(
            f"the run's history reached {self.limit:,} operations and events at "
            f"{seconds_of(at):g}s of simulated time, the most one run holds in memory (about 1 KB each, "
            "checker included), so the run stopped unchecked; the scenario asks for more work "
            "than one run can judge: lower run.items, run.tenants, the nodes' revisions or "
            "lines, faults.duplicate_delivery.copies or run.max_deliveries, or shorten "
            "faults_until"
        )

    def final_state(
        self,
        key: str,
        status: str,
        attempt: int | None,
        at: Micros,
        store_time: Micros | None = None,
    ) -> None:
        self._final.append(FinalState(key, status, attempt, at, store_time))

    def freeze(self, *, at: Micros | None = None) -> History:
        """The finished history; an op still pending becomes ``info`` (it may have happened)."""
        ops = tuple(
            entry
            if isinstance(entry, Op) and entry.outcome is not None
            else self._pending(index, at)
            for index, entry in enumerate(self._ops)
        )
        return History(
            epoch=self.epoch,
            lock_duration=self.lock_duration,
            sweep_interval=self.sweep_interval,
            faults_stop=self.faults_stop,
            ops=ops,
            events=tuple(self._events),
            final=tuple(sorted(self._final, key=lambda f: f.key)),
            meta=dict(self.meta),
            keys=dict(self._keys),
        )
