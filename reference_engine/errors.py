"""One error root for everything the DataStateMachine can refuse.

Every error carries structured fields (what was asked, what is allowed) and a
message that says how to fix it, because the people reading them are node
authors and handler authors looking at a CI log, not at our source.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ConfigurationError",
    "DsmError",
    "ForbiddenTransitionError",
    "InvalidItemError",
    "InvalidOptionError",
    "InvalidSettingsError",
    "LockError",
    "LockHeldError",
    "LockNotHeldError",
    "PayloadTooLargeError",
    "StaleLockError",
    "StoreError",
    "UnknownHandlerError",
    "UnknownScopeError",
    "UnsupportedStatusError",
]


def _listing(values: Sequence[str]) -> str:
    return ", ".join(repr(v) for v in values) if values else "(none)"


class DsmError(Exception):
    """Root of every error raised by the DataStateMachine and its harness."""


# --- configuration ---------------------------------------------------------------------------


class ConfigurationError(DsmError):
    """A node's ``dataStateMachine`` block (or a scenario/handler spec) is wrong.

    Raised before any record is touched, so nothing is lost by a bad config.
    """


class InvalidSettingsError(ConfigurationError):
    """Settings are malformed: not JSON, not an object, or a field has the wrong type."""

    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(message)


class UnknownHandlerError(ConfigurationError):
    """The handler key is not registered."""

    def __init__(self, key: str, registered: Sequence[str]) -> None:
        self.key = key
        self.registered = tuple(registered)
        super().__init__(
            f"unknown DataStateMachine handler {key!r}; registered handlers: "
            f"{_listing(self.registered)}. Register it with HandlerRegistry.register(key, factory) "
            "or fix the 'handler' field of the node's dataStateMachine block."
        )


class UnknownScopeError(ConfigurationError):
    """The scope name is not one of the scope table's names."""

    def __init__(self, name: str, allowed: Sequence[str]) -> None:
        self.name = name
        self.allowed = tuple(allowed)
        super().__init__(
            f"unknown DataStateMachine scope {name!r}; allowed scopes: {_listing(self.allowed)}"
        )


class InvalidOptionError(ConfigurationError):
    """An option is unknown or has a value outside its allowed range."""

    def __init__(self, option: str, problem: str, allowed: Sequence[str] = ()) -> None:
        self.option = option
        self.problem = problem
        self.allowed = tuple(allowed)
        hint = f"; allowed options: {_listing(self.allowed)}" if self.allowed else ""
        super().__init__(f"invalid DataStateMachine option {option!r}: {problem}{hint}")


# --- the lifecycle ----------------------------------------------------------------------------


class ForbiddenTransitionError(DsmError):
    """A status change the transition table forbids; the record is left unchanged."""

    def __init__(
        self, *, source: str, target: str, allowed: Sequence[str], item_key: str = ""
    ) -> None:
        self.source = source
        self.target = target
        self.allowed = tuple(allowed)
        self.item_key = item_key
        where = f" for item {item_key!r}" if item_key else ""
        super().__init__(
            f"transition {source} -> {target} is not allowed{where}; "
            f"allowed from {source}: {_listing(self.allowed)}"
        )


class UnsupportedStatusError(DsmError):
    """``set`` was asked for a status only another operation may write."""

    def __init__(self, *, status: str, use: str) -> None:
        self.status = status
        self.use = use
        super().__init__(f"set() cannot write status {status}; use {use} instead")


class LockError(DsmError):
    """A write that needs the processing lock was made without a valid one."""

    def __init__(self, message: str, *, item_key: str, token: int | None = None) -> None:
        self.item_key = item_key
        self.token = token
        super().__init__(message)


class LockHeldError(LockError):
    """Another worker holds a live lock on the item; wait for it or for the sweep."""

    def __init__(self, *, item_key: str, locked_until: str) -> None:
        self.locked_until = locked_until
        super().__init__(
            f"item {item_key!r} is locked by another worker until {locked_until}; "
            "call try_acquire_lock first and only write when it returns True",
            item_key=item_key,
        )


class LockNotHeldError(LockError):
    """The caller never acquired the lock it is trying to complete or release."""

    def __init__(self, *, item_key: str, operation: str) -> None:
        self.operation = operation
        super().__init__(
            f"{operation} on item {item_key!r} needs the processing lock, and this execution "
            "never acquired it; call try_acquire_lock first",
            item_key=item_key,
        )


class StaleLockError(LockError):
    """Fencing: the caller's lock was swept or taken over; its write is rejected.

    The caller's business side effect may already have happened; the error is
    what lets operators see the lease violation instead of a silent overwrite.
    """

    def __init__(
        self, *, item_key: str, token: int, current_token: int | None, status: str
    ) -> None:
        self.current_token = current_token
        self.status = status
        super().__init__(
            f"stale lock on item {item_key!r}: this execution holds fencing token {token}, "
            f"but the record is now {status} with token {current_token}; the lock expired and "
            "was swept or taken over, so this write is rejected",
            item_key=item_key,
            token=token,
        )


# --- input ------------------------------------------------------------------------------------


class InvalidItemError(DsmError):
    """An item key, entity key or data payload cannot be stored as given."""

    def __init__(self, message: str, *, field: str) -> None:
        self.field = field
        super().__init__(message)


class PayloadTooLargeError(InvalidItemError):
    """The serialised data payload exceeds the size limit."""

    def __init__(self, *, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"data payload is {size} bytes serialised; the limit is {limit} bytes. "
            "Store a reference to large results instead of the results themselves",
            field="data",
        )


# --- the store --------------------------------------------------------------------------------


class StoreError(DsmError):
    """The handler's store failed (connection dropped, database locked, ...).

    The operation's outcome is unknown to the caller; retrying is safe because
    every operation is idempotent or fenced.
    """
