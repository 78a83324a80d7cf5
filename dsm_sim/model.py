"""The reference model as the harness sees it, plus the small test world around it.

The semantics live in :mod:`reference_engine.model` and are re-exported here
unchanged, so the conformance kit, the catalogue and the simulator judge
handlers against the same code the in-memory handler runs.  What this module
adds is the world: which items exist, which tenants and scopes they live in,
and how one call's outcome (a value or an error) is recorded and compared.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from reference_engine.config import MAX_LOCK_DURATION, MAX_RETENTION, HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.model import SETTABLE, SWEEP_ERROR_DETAIL, ModelRecord, ReferenceModel
from reference_engine.model import effective_status as effective_status
from reference_engine.scope import Scope

__all__ = [
    "ENTITY_ID",
    "FOREVER_CONFIG",
    "KEY_JOINERS",
    "SETTABLE",
    "SOURCE_APP_ID",
    "SWEEP_ERROR_DETAIL",
    "WORLD_CONFIG",
    "WORLD_CONFIGS",
    "WORLD_ITEMS",
    "WORLD_START",
    "ItemRef",
    "ModelRecord",
    "Outcome",
    "ReferenceModel",
    "config_name",
    "describe_config",
    "effective_status",
    "execution_id",
    "joined_alike",
    "outcome_of",
    "record_copy",
    "shown",
]

#: A model record's fields in order: a copy is the class called with them.
_RECORD_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ModelRecord)))


def record_copy(record: ModelRecord) -> ModelRecord:
    """A copy of a model record (its fields are immutable values, so a shallow copy is whole).

    The conformance kit copies a record or two for every call it judges (a
    race's replay with a sweep, every record of the model), and the
    simulator's model judge one per call: the class called with the fields
    costs a fifth of ``dataclasses.replace`` or ``copy.copy``.
    """
    if type(record) is not ModelRecord:
        return dataclasses.replace(record)
    return ModelRecord(*_RECORD_FIELDS(record))


#: The workflow and its only node share this id, so records of the Workflow and
#: Element scopes differ only by ``scope_id``: a store that leaves the scope out
#: of its key is caught, not hidden behind different entity ids.
ENTITY_ID = "flow-1"
SOURCE_APP_ID = "app-1"

#: When every run starts: a Monday morning, so plain-language times read naturally.
WORLD_START = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)

#: Lock and retention of the world: short enough for clock jumps to cross both.
WORLD_CONFIG = HandlerConfig(lock_duration=dt.timedelta(minutes=30), retention=dt.timedelta(days=1))

#: The same lock with ``retention=None``: such records are kept forever, so a
#: retention sweep that treats "no ``retain_until``" as "past it" shows.
FOREVER_CONFIG = HandlerConfig(lock_duration=WORLD_CONFIG.lock_duration, retention=None)

#: The node configurations one world mixes, as nodes of one workflow do.  A
#: handler that ignores the configured lock duration, measures expiry from
#: another column, or reads one node's options for another only shows when
#: items of one world differ: seconds-long locks, the real defaults, long
#: locks, retention just past the lock, retention none.
WORLD_CONFIGS: Mapping[str, HandlerConfig] = MappingProxyType(
    {
        "standard": WORLD_CONFIG,
        "short": HandlerConfig(
            lock_duration=dt.timedelta(seconds=5), retention=dt.timedelta(minutes=2)
        ),
        "seconds": HandlerConfig(
            lock_duration=dt.timedelta(seconds=90), retention=dt.timedelta(hours=1)
        ),
        "default": HandlerConfig(),
        "long": HandlerConfig(lock_duration=dt.timedelta(hours=4), retention=dt.timedelta(days=2)),
        "tight": HandlerConfig(
            lock_duration=dt.timedelta(minutes=30), retention=dt.timedelta(minutes=31)
        ),
        "forever": FOREVER_CONFIG,
        # Durations a store's conversion loses: a sub-second lock (whole
        # seconds make it 0 s), the longest lock with the longest retention
        # (``timedelta.seconds`` makes a day 0 s; retain_until lands past
        # 2038, where a 32-bit epoch wraps), and fractional seconds in both.
        "subsecond": HandlerConfig(
            lock_duration=dt.timedelta(milliseconds=500), retention=dt.timedelta(seconds=1.5)
        ),
        "longest": HandlerConfig(lock_duration=MAX_LOCK_DURATION, retention=MAX_RETENTION),
        "fractional": HandlerConfig(
            lock_duration=dt.timedelta(seconds=1.5),
            retention=dt.timedelta(days=2, hours=3, microseconds=250_000),
        ),
    }
)


def config_name(config: HandlerConfig) -> str | None:
    """The world's name for ``config``, if it is one of :data:`WORLD_CONFIGS`."""
    for name, known in WORLD_CONFIGS.items():
        if known == config:
            return name
    return None


def describe_config(config: HandlerConfig) -> str:
    """``lock 5s, kept 2m`` — how an item's node options read in a story."""
    kept = "forever" if config.retention is None else _span(config.retention)
    return f"lock {_span(config.lock_duration)}, kept {kept}"


def _span(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()  # fractions count: 2 days and 0.25 s is not "2d"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds) // size}{unit}"
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def shown(text: str) -> str:
    """A key as a story shows it: bare when plain, quoted (escapes visible) otherwise.

    Keys that differ by a space, a case or a combining mark must read
    differently, and a 256-character key must not fill the screen.
    """
    if len(text) > 40:
        return f"{text[:12]!a}…{text[-6:]!a} ({len(text)} characters)"
    if text.isascii() and text.replace("-", "").isalnum():
        return text
    return ascii(text)


def execution_id(worker: int, delivery: int = 0) -> str:
    """The execution id a worker writes under; records show who wrote them.

    ``delivery`` counts the fresh executions the worker started since its
    first (a redelivered message is a new execution of the node).
    """
    return f"run-{worker}" if delivery == 0 else f"run-{worker}.{delivery}"


@dataclass(frozen=True, slots=True)
class ItemRef:
    """One item of the world: tenant, scope, entity, item entity key and item key.

    The repr is a Python expression, so Hypothesis' printed reproduction runs.
    ``config`` is the handler config its node runs under: items of one world
    may differ, as nodes of one workflow do.
    """

    tenant: str
    scope: Scope
    item: str
    entity: str = ENTITY_ID
    entity_key: str = ""
    config: HandlerConfig = WORLD_CONFIG

    #: Spelled this way in reprs, so a printed reproduction needs no extra import.
    FOREVER: ClassVar[HandlerConfig] = FOREVER_CONFIG
    CONFIGS: ClassVar[Mapping[str, HandlerConfig]] = WORLD_CONFIGS

    def __repr__(self) -> str:
        extra = ""
        if self.entity != ENTITY_ID:
            extra += f", entity={self.entity!r}"
        if self.entity_key:
            extra += f", entity_key={self.entity_key!r}"
        if self.config == FOREVER_CONFIG:
            extra += ", config=ItemRef.FOREVER"
        elif (name := config_name(self.config)) is not None and name != "standard":
            extra += f", config=ItemRef.CONFIGS[{name!r}]"
        elif self.config != WORLD_CONFIG:
            extra += f", config={self.config!r}"
        return f"ItemRef({self.tenant!r}, {self.scope!r}, {self.item!r}{extra})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints dataclasses field by field; the short repr reads and runs."""
        printer.text(repr(self))

    @property
    def name(self) -> str:
        """The item key as a story shows it: quoted when it is not plain text."""
        return shown(self.item)

    @property
    def label(self) -> str:
        """How the item is named in plain-language reports."""
        where = f"tenant {shown(self.tenant)}, scope {self.scope.code}"
        if self.entity != ENTITY_ID:
            where += f", entity {shown(self.entity)}"
        if self.entity_key:
            where += f", entity key {shown(self.entity_key)}"
        if self.config.retention is None:
            where += ", kept forever"
        elif self.config != WORLD_CONFIG:
            where += f", {describe_config(self.config)}"
        return f"{self.name} ({where})"

    def context(
        self,
        worker: int,
        *,
        lock_token: int | None = None,
        config: HandlerConfig | None = None,
        execution: str | None = None,
    ) -> StateHandlerContext:
        """The per-call context worker ``worker`` passes for this item.

        ``config`` overrides the item's own, for callers that vary it per call;
        ``execution`` the worker's execution id (its first by default).
        """
        base = StateHandlerContext(
            scope_id=int(self.scope),
            scope_code=self.scope.code,
            entity_id=self.entity,
            entity_execution_id=execution_id(worker) if execution is None else execution,
            tenant_id=self.tenant,
            source_app_id=SOURCE_APP_ID,
            handler_config=self.config if config is None else config,
        )
        return base.for_item(self.item, self.entity_key, lock_token=lock_token)

    @property
    def record_key(self) -> RecordKey:
        return _record_key(self)

    def sibling_of(self, other: ItemRef) -> str | None:
        return _sibling_kind(self, other)

    def _sibling_of(self, other: ItemRef) -> str | None:
        """How ``other`` differs from this item, when a store could mix the two up.

        ``"tenant"``/``"scope"``/``"entity"``: the same item under another
        tenant, scope, or entity (node or item entity key), all else equal;
        ``"key"``: another item key in the same tenant and scope (a near
        spelling, a neighbour); ``"split"``: the same text cut differently
        between the parts of the key (:func:`joined_alike`).  ``None`` for the item itself and for items that
        differ in more than one of those ways.
        """
        if self.record_key == other.record_key:
            return None
        if self.scope is other.scope and joined_alike(self, other) is not None:
            return "split"
        same_entity = (self.entity, self.entity_key) == (other.entity, other.entity_key)
        same_place = self.tenant == other.tenant and self.scope is other.scope
        if self.item == other.item:
            if self.tenant != other.tenant and self.scope is other.scope and same_entity:
                return "tenant"
            if self.scope is not other.scope and self.tenant == other.tenant and same_entity:
                return "scope"
            if same_place and not same_entity:
                return "entity"
            return None
        return "key" if same_place else None


@functools.lru_cache(maxsize=8192)
def _record_key(ref: ItemRef) -> RecordKey:
    """Judges ask for an item's key thousands of times a run; items are frozen."""
    return RecordKey(
        tenant_id=ref.tenant,
        scope_id=int(ref.scope),
        entity_id=ref.entity,
        item_entity_key=ref.entity_key,
        item_key=ref.item,
    )


#: What a store may join the parts of a key with into one text: nothing, or a separator.
KEY_JOINERS: tuple[str, ...] = ("", "-", ":", "|", "/", "#", ".", "_", " ", "\x1f")


def joined_alike(one: ItemRef, other: ItemRef) -> str | None:
    """The joiner with which both items' key parts make the same text, if any.

    ``("t1-flow", "x")`` and ``("t1", "flow-x")`` differ, but joined with
    ``-`` both read ``t1-flow-x``: a store keying records by the joined text
    gives them one record.
    """
    parts = (one.tenant, one.entity, one.entity_key, one.item)
    others = (other.tenant, other.entity, other.entity_key, other.item)
    if parts == others:
        return None
    for joiner in KEY_JOINERS:
        if joiner.join(parts) == joiner.join(others):
            return joiner
    return None


@functools.lru_cache(maxsize=65536)
def _sibling_kind(ref: ItemRef, other: ItemRef) -> str | None:
    return ref._sibling_of(other)


#: The items every worker may touch.  INV-1 exists in two tenants, two scopes,
#: two entities and under an item entity key, so isolation bugs collide; INV-2
#: is an unrelated neighbour whose node keeps its records forever (retention
#: ``None``), so the retention sweep meets a record it must never expire.
WORLD_ITEMS: tuple[ItemRef, ...] = (
    ItemRef("t1", Scope.ELEMENT, "INV-1"),
    ItemRef("t2", Scope.ELEMENT, "INV-1"),
    ItemRef("t1", Scope.WORKFLOW, "INV-1"),
    ItemRef("t1", Scope.ELEMENT, "INV-2", config=FOREVER_CONFIG),
    ItemRef("t1", Scope.ELEMENT, "INV-1", entity="flow-2"),
    ItemRef("t1", Scope.ELEMENT, "INV-1", entity_key="line-2"),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call came to: a returned value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    def agrees_with(self, expected: Outcome) -> bool:
        """Same value, or an error of the expected class (a subclass is fine)."""
        if expected.error is not None:
            return self.error is not None and isinstance(self.error, type(expected.error))
        return self.error is None and self.value == expected.value

    def describe(self) -> str:
        if self.error is not None:
            return type(self.error).__name__
        return repr(self.value)

    def describe_grant(self) -> str:
        """An acquisition's outcome: ``token 3``, ``None (refused)`` or the error's class."""
        if self.error is not None:
            return type(self.error).__name__
        return "None (refused)" if self.value is None else f"token {self.value}"


def outcome_of(call: Callable[[], Any]) -> Outcome:
    """Run a model call and record its value or the error it raised."""
    try:
        return Outcome(value=call())
    except Exception as exc:
        return Outcome(error=exc)
