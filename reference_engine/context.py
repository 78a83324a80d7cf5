"""The per-call context a handler receives.

The factory builds one frozen base context per node execution; the contextual
machine derives a per-call copy carrying the item fields and the fencing token,
so handlers never see mutable shared state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from reference_engine.config import HandlerConfig
from reference_engine.errors import InvalidItemError, echo

__all__ = ["MAX_KEY_LENGTH", "RecordKey", "StateHandlerContext", "plain_text", "validate_key"]

MAX_KEY_LENGTH = 256
#: The text fields of a context: each becomes a key part or a stamp in a record.
_TEXT_FIELDS = (
    "scope_code",
    "entity_id",
    "entity_execution_id",
    "tenant_id",
    "source_app_id",
    "item_key",
    "item_entity_key",
)


def plain_text(value: object) -> object:
    """The plain ``str`` of a ``str`` subclass (a ``(str, Enum)`` member, a ``StrEnum``...).

    Such a value equals its text, yet formats differently (``f"{Channel.EMAIL}"``
    is ``"Channel.EMAIL"``), so a store that builds keys from text would keep
    two records for one item.  Anything that is not a string is returned as is,
    for the validation that refuses it.
    """
    if isinstance(value, str) and type(value) is not str:
        return str.__str__(value)
    return value


def validate_key(
    value: object, *, field_name: str, allow_empty: bool = False, allow_blank: bool = True
) -> str:
    """Reject keys a store cannot hold faithfully, before anything is written.

    Quotes and SQL fragments are fine (every store binds parameters); what is
    refused is what would be silently changed or truncated: non-strings
    (lists and dicts included, before anything hashes them), empty item keys,
    NUL characters, text that is not encodable as UTF-8 (lone surrogates),
    and keys longer than :data:`MAX_KEY_LENGTH` characters.  Identifiers that
    name who is writing (a tenant) are refused blank as well as empty
    (``allow_blank=False``): spaces alone identify no one.
    The key returned is always a plain ``str`` (see :func:`plain_text`).
    """
    value = plain_text(value)
    if not isinstance(value, str):
        raise InvalidItemError(
            f"{field_name} must be a string of at most {MAX_KEY_LENGTH} characters, got "
            f"{type(value).__name__} {echo(value)}",
            field=field_name,
        )
    if not value and not allow_empty:
        raise InvalidItemError(f"{field_name} must not be empty", field=field_name)
    if value and not allow_blank and not value.strip():
        raise InvalidItemError(
            f"{field_name} must not be blank (got {len(value)} whitespace characters); "
            "give a non-empty identifier",
            field=field_name,
        )
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidItemError(
            f"{field_name} is {len(value)} characters; the limit is {MAX_KEY_LENGTH}",
            field=field_name,
        )
    if "\x00" in value:
        raise InvalidItemError(f"{field_name} must not contain NUL characters", field=field_name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidItemError(
            f"{field_name} is not valid Unicode text (cannot be encoded as UTF-8): {exc.reason}",
            field=field_name,
        ) from exc
    return value


@dataclass(frozen=True, slots=True)
class RecordKey:
    """What identifies one item's current record: tenant and scope are always part of it."""

    tenant_id: str
    scope_id: int
    entity_id: str
    item_entity_key: str
    item_key: str


@dataclass(frozen=True, slots=True)
class StateHandlerContext:
    """Everything a handler needs to locate and stamp a record.

    ``scope_id``/``scope_code`` come from the scope table, ``entity_id`` is the
    entity the scope points at (the element for ``Element``), and
    ``entity_execution_id`` the run that is writing.  ``item_key`` and
    ``item_entity_key`` are empty in the base context and set per call, as is
    ``lock_token``, the fencing token of this execution's acquisition.
    """

    scope_id: int
    scope_code: str
    entity_id: str
    entity_execution_id: str
    tenant_id: str
    source_app_id: str
    handler_config: HandlerConfig = field(default_factory=HandlerConfig)
    item_key: str = ""
    item_entity_key: str = ""
    lock_token: int | None = None

    def __post_init__(self) -> None:
        # Every text field becomes a plain str here, once, whoever builds the
        # context: no handler can then tell an enum member from its text.
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if type(value) is not str:
                object.__setattr__(self, name, plain_text(value))
        # A base context is validated once, when it is built; per-call copies
        # (which carry an item key) come from for_item, which checks the item
        # fields, so the hot path does not pay for this again.
        if not self.item_key:
            validate_key(self.tenant_id, field_name="tenant_id", allow_blank=False)
            validate_key(self.entity_id, field_name="entity_id", allow_blank=False)
            validate_key(
                self.entity_execution_id, field_name="entity_execution_id", allow_empty=True
            )
            validate_key(self.source_app_id, field_name="source_app_id", allow_empty=True)

    def for_item(
        self, item_key: str, item_entity_key: str = "", *, lock_token: int | None = None
    ) -> StateHandlerContext:
        """A per-call copy for one item, validated so bad keys never reach a store."""
        item_key = validate_key(item_key, field_name="item_key")
        item_entity_key = validate_key(
            item_entity_key, field_name="item_entity_key", allow_empty=True
        )
        return self._per_item(item_key, item_entity_key, lock_token)

    def with_lock_token(self, lock_token: int | None) -> StateHandlerContext:
        """This per-item context carrying ``lock_token``: its keys were validated by for_item."""
        return self._per_item(self.item_key, self.item_entity_key, lock_token)

    def _per_item(
        self, item_key: str, item_entity_key: str, lock_token: int | None
    ) -> StateHandlerContext:
        if type(self) is not StateHandlerContext:
            return dataclasses.replace(
                self, item_key=item_key, item_entity_key=item_entity_key, lock_token=lock_token
            )
        # Built field by field rather than by dataclasses.replace: this runs on
        # every call a node makes, and replace introspects the fields each time.
        return StateHandlerContext(
            self.scope_id,
            self.scope_code,
            self.entity_id,
            self.entity_execution_id,
            self.tenant_id,
            self.source_app_id,
            self.handler_config,
            item_key,
            item_entity_key,
            lock_token,
        )

    @property
    def record_key(self) -> RecordKey:
        if not self.item_key:
            raise InvalidItemError(
                "this context has no item key; derive one with for_item(item_key)", field="item_key"
            )
        # In field order, not by keyword: every handler call builds one, and a
        # frozen dataclass built by keyword costs twice as much.
        return RecordKey(
            self.tenant_id, self.scope_id, self.entity_id, self.item_entity_key, self.item_key
        )
