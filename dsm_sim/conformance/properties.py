"""The named properties a handler must keep.

Names are stable: reports, pytest test ids and the catalogue's expectations
all use them.  Which property a difference between handler and model breaks
is decided by the judges in :mod:`dsm_sim.conformance.judge.judges`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reference_engine.errors import ConfigurationError, DsmError

if TYPE_CHECKING:
    from dsm_sim.conformance.program import Program

__all__ = [
    "ISOLATION",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "Finding",
    "Property",
    "PropertyViolation",
    "UnknownPropertyError",
    "get_property",
]


@dataclass(frozen=True, slots=True)
class Property:
    """A guarantee of the semantics, checked after the steps that could break it."""

    name: str
    summary: str


PROPERTIES: tuple[Property, ...] = (
    Property("at_most_one_live_lock", "no acquire succeeds while another lock is live"),
    Property("acquire_agrees_with_model", "try_acquire_lock grants and refuses as the spec says"),
    Property("exists_agrees_with_model", "exists is True only for Processed and Skipped"),
    Property("stale_write_rejected", "a swept or taken-over holder's write raises StaleLockError"),
    Property(
        "spent_token_rejected",
        "a spent token (its own write landed) changes nothing: the same write again succeeds, "
        "any other raises StaleLockError",
    ),
    Property("errors_agree_with_model", "every refused call raises the error the spec names"),
    Property("allowed_transitions_only", "every status change is in the transition table"),
    Property("completion_releases_lock", "set and release_lock_as_failed end the lock"),
    Property("data_round_trip", "the data read back is the data written"),
    Property("record_agrees_with_model", "status, token and audit fields match the spec"),
    Property("lock_duration_honoured", "locked_until is the acquire instant + lock duration"),
    Property("timestamps_in_utc", "every stored instant is aware UTC from the injected clock"),
    Property("upsert_keeps_history", "upsert over Processed keeps the old record as Superseded"),
    Property(
        "sweep_only_expired", "the lock sweep touches only Processing with locked_until < now"
    ),
    Property("sweep_resets_expired", "the lock sweep resets every expired lock to Failed"),
    Property("retention_sweep_agrees_with_model", "the retention sweep expires what the spec says"),
    Property("tenant_isolation", "no tenant sees or blocks another tenant's records"),
    Property("scope_isolation", "no scope sees or blocks another scope's records"),
    Property(
        "entity_isolation",
        "no entity (node) or item entity key sees or blocks another's records",
    ),
    Property(
        "key_identity",
        "distinct keys never share a record, lock or outcome; equal keys always do",
    ),
    Property(
        "invalid_keys_refused",
        "keys the project refuses raise InvalidItemError before any store is touched",
    ),
    Property("closes_cleanly", "close() leaves no task running on the event loop"),
)
PROPERTY_NAMES: tuple[str, ...] = tuple(p.name for p in PROPERTIES)

#: The property a mix-up with a sibling item breaks, by how the two differ
#: (:meth:`dsm_sim.model.ItemRef.sibling_of`).
ISOLATION: dict[str, str] = {
    "tenant": "tenant_isolation",
    "scope": "scope_isolation",
    "entity": "entity_isolation",
    "key": "key_identity",
    "split": "key_identity",
}


class UnknownPropertyError(ConfigurationError):
    """A property name that the kit does not define."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"unknown conformance property {name!r}; properties: {', '.join(PROPERTY_NAMES)}"
        )


def get_property(name: str) -> Property:
    for prop in PROPERTIES:
        if prop.name == name:
            return prop
    raise UnknownPropertyError(name)


@dataclass(frozen=True, slots=True)
class Finding:
    """A difference between handler and model, attributed to one property."""

    property: str
    message: str


class PropertyViolation(DsmError, AssertionError):
    """Raised inside the state machine; Hypothesis shrinks the run that raised it.

    ``story`` is the plain-language account of the (final, shrunk) run, and
    ``time_zone`` the process ``TZ`` the failing test case ran in.
    """

    #: The steps that ran, as data; set by the machine that raised it.
    program: Program | None = None

    def __init__(self, finding: Finding, story: str, time_zone: str = "UTC0") -> None:
        self.property = finding.property
        self.finding = finding
        self.story = story
        self.time_zone = time_zone
        super().__init__(f"{finding.property}: {finding.message}\n{story}")
