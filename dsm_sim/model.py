"""The reference model as the harness sees it, plus the small test world around it.

The semantics live in :mod:`reference_engine.model` and are re-exported here
unchanged, so the conformance kit, the catalogue and the simulator judge
handlers against the same code the in-memory handler runs.  What this module
adds is the world: which items exist, which tenants and scopes they live in,
and how one call's outcome (a value or an error) is recorded and compared.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from reference_engine.config import HandlerConfig
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.model import SETTABLE, SWEEP_ERROR_DETAIL, ModelRecord, ReferenceModel
from reference_engine.model import effective_status as effective_status
from reference_engine.scope import Scope

__all__ = [
    "ENTITY_ID",
    "FOREVER_CONFIG",
    "SETTABLE",
    "SOURCE_APP_ID",
    "SWEEP_ERROR_DETAIL",
    "WORLD_CONFIG",
    "WORLD_ITEMS",
    "WORLD_START",
    "ItemRef",
    "ModelRecord",
    "Outcome",
    "ReferenceModel",
    "effective_status",
    "execution_id",
    "outcome_of",
]

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


def execution_id(worker: int) -> str:
    """The execution id a worker writes under; records show who wrote them."""
    return f"run-{worker}"


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

    def __repr__(self) -> str:
        extra = ""
        if self.entity != ENTITY_ID:
            extra += f", entity={self.entity!r}"
        if self.entity_key:
            extra += f", entity_key={self.entity_key!r}"
        if self.config == FOREVER_CONFIG:
            extra += ", config=ItemRef.FOREVER"
        elif self.config != WORLD_CONFIG:
            extra += f", config={self.config!r}"
        return f"ItemRef({self.tenant!r}, {self.scope!r}, {self.item!r}{extra})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints dataclasses field by field; the short repr reads and runs."""
        printer.text(repr(self))

    @property
    def label(self) -> str:
        """How the item is named in plain-language reports."""
        where = f"tenant {self.tenant}, scope {self.scope.code}"
        if self.entity != ENTITY_ID:
            where += f", entity {self.entity}"
        if self.entity_key:
            where += f", entity key {self.entity_key}"
        if self.config.retention is None:
            where += ", kept forever"
        return f"{self.item} ({where})"

    def context(
        self,
        worker: int,
        *,
        lock_token: int | None = None,
        config: HandlerConfig | None = None,
    ) -> StateHandlerContext:
        """The per-call context worker ``worker`` passes for this item.

        ``config`` overrides the item's own, for callers that vary it per call.
        """
        base = StateHandlerContext(
            scope_id=int(self.scope),
            scope_code=self.scope.code,
            entity_id=self.entity,
            entity_execution_id=execution_id(worker),
            tenant_id=self.tenant,
            source_app_id=SOURCE_APP_ID,
            handler_config=self.config if config is None else config,
        )
        return base.for_item(self.item, self.entity_key, lock_token=lock_token)

    @property
    def record_key(self) -> RecordKey:
        return RecordKey(
            tenant_id=self.tenant,
            scope_id=int(self.scope),
            entity_id=self.entity,
            item_entity_key=self.entity_key,
            item_key=self.item,
        )

    def sibling_of(self, other: ItemRef) -> str | None:
        """``"tenant"``/``"scope"``/``"entity"`` when ``other`` is this item under another
        tenant, scope, or entity (node or item entity key), all else equal."""
        if self.item != other.item:
            return None
        same_entity = (self.entity, self.entity_key) == (other.entity, other.entity_key)
        if self.tenant != other.tenant and self.scope is other.scope and same_entity:
            return "tenant"
        if self.scope is not other.scope and self.tenant == other.tenant and same_entity:
            return "scope"
        if self.tenant == other.tenant and self.scope is other.scope and not same_entity:
            return "entity"
        return None


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


def outcome_of(call: Callable[[], Any]) -> Outcome:
    """Run a model call and record its value or the error it raised."""
    try:
        return Outcome(value=call())
    except Exception as exc:
        return Outcome(error=exc)
