"""One error root for everything the DataStateMachine can refuse.

Every error carries structured fields (what was asked, what is allowed) and a
message that says how to fix it, because the people reading them are node
authors and handler authors looking at a CI log, not at our source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ConfigurationError",
    "DsmError",
    "DuplicateElementError",
    "EvictingStoreError",
    "FactoryError",
    "ForbiddenTransitionError",
    "InstantOutOfRangeError",
    "InvalidClockError",
    "InvalidItemError",
    "InvalidOptionError",
    "InvalidSettingsError",
    "LockError",
    "LockHeldError",
    "LockNotHeldError",
    "MissingDataStateMachineError",
    "PayloadTooLargeError",
    "StaleLockError",
    "StoreError",
    "StoreLostError",
    "UnknownHandlerError",
    "UnknownScopeError",
    "UnsupportedStatusError",
    "clip",
    "echo",
]


#: How much of a bad value a message repeats: enough to recognise it, not a megabyte of it.
MAX_ECHO = 80


def echo(value: object, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how long the whole was."""
    try:
        text = repr(value)
    except Exception:  # a user's __repr__ must not replace the error being reported
        return f"<{type(value).__name__}>"
    return clip(text, limit)


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` cut to ``limit`` characters, saying how long the whole was.

    For text that is already a message (an import error's), which ``echo``
    would quote a second time.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _listing(values: Sequence[str]) -> str:
    return ", ".join(echo(v) for v in values) if values else "(none)"


def _rebuild(cls: type[DsmError], args: tuple[Any, ...], state: dict[str, Any]) -> DsmError:
    """Recreate an error from its message and fields without calling its ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class _Message(str):
    """An error's message that also remembers the error's class and fields.

    SimPy hands a failed process's error to the process waiting on it as
    ``type(e)(*e.args)``, and most errors here take keyword fields or several
    arguments, not their message: the call would raise a ``TypeError`` in
    place of the error.  The message an error shows as ``args[0]`` carries
    what :class:`_Rebuildable` needs to recreate the error from it instead.
    It is a ``str`` with the message's text, so everything else that reads
    ``args`` sees the message.
    """

    origin: type[DsmError]
    fields: dict[str, Any]

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))  # pickled alone (not through its error), it is only text


class _Rebuildable(type):
    """The errors' metaclass: calling a class with one of its own messages rebuilds the error."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], _Message):
            message = args[0]
            if message.origin is cls:
                state = dict(message.fields)
                if "__notes__" in state:  # a note added to the new error must not reach the old
                    state["__notes__"] = list(state["__notes__"])
                return _rebuild(message.origin, (str(message),), state)
        return super().__call__(*args, **kwargs)


class DsmError(Exception, metaclass=_Rebuildable):
    """Root of every error raised by the DataStateMachine and its harness.

    The errors take keyword-only fields, which the default exception pickling
    (``cls(*args)``) cannot call; an error raised in a worker process would
    then break the pool instead of reaching the parent with its evidence.
    Pickling and copying therefore restore message and fields directly, and
    ``type(e)(*e.args)`` (how SimPy re-raises a simulated process's error)
    rebuilds the error from the :class:`_Message` its ``args`` hold.
    """

    @property
    def args(self) -> tuple[Any, ...]:
        """The arguments given to ``Exception``; a lone message is a :class:`_Message`."""
        stored: tuple[Any, ...] = BaseException.args.__get__(self)  # type: ignore[attr-defined]
        if len(stored) != 1 or not isinstance(stored[0], str):
            return stored
        message = _Message(stored[0])
        message.origin = type(self)
        message.fields = self.__dict__
        return (message,)

    @args.setter
    def args(self, value: tuple[Any, ...]) -> None:
        BaseException.args.__set__(self, value)  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        stored = BaseException.args.__get__(self)  # type: ignore[attr-defined]
        return (_rebuild, (type(self), stored, dict(self.__dict__)))


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
            f"unknown DataStateMachine handler {echo(key)}; registered handlers: "
            f"{_listing(self.registered)}. Register it with HandlerRegistry.register(key, factory) "
            "or fix the 'handler' field of the node's dataStateMachine block."
        )


class UnknownScopeError(ConfigurationError):
    """The scope name is not one of the scope table's names."""

    def __init__(self, name: str, allowed: Sequence[str]) -> None:
        self.name = name
        self.allowed = tuple(allowed)
        super().__init__(
            f"unknown DataStateMachine scope {echo(name)}; allowed scopes: {_listing(self.allowed)}"
        )


class InvalidOptionError(ConfigurationError):
    """An option is unknown or has a value outside its allowed range."""

    def __init__(self, option: str, problem: str, allowed: Sequence[str] = ()) -> None:
        self.option = option
        self.problem = problem
        self.allowed = tuple(allowed)
        hint = f"; allowed options: {_listing(self.allowed)}" if self.allowed else ""
        super().__init__(f"invalid DataStateMachine option {echo(option)}: {problem}{hint}")


class InstantOutOfRangeError(InvalidOptionError):
    """``now`` plus a lock duration or a retention is past the last instant a record can hold.

    Python's ``datetime`` ends with year 9999 and so do the stores' timestamp
    types; past it the sum would raise ``OverflowError`` in the middle of a
    write.  Only a clock near that end (or set there by mistake) gets here,
    since the options themselves are bounded.
    """

    def __init__(self, *, option: str, now: str, duration: str) -> None:
        self.now = now
        self.duration = duration
        super().__init__(
            option,
            f"now ({now}) + {option} ({duration}) is past 9999-12-31 23:59:59.999999 UTC, "
            "the last instant a record can hold; nothing was written. Check the clock the "
            f"handler reads, or shorten {option}",
        )


class InvalidClockError(ConfigurationError):
    """The clock given to a handler returned something other than an aware datetime.

    A naive datetime has no instant (local time? UTC?), and each store would
    guess differently: one record would hold three different times.  The
    clock is refused on its first reading instead, before anything is written.
    """

    def __init__(self, *, clock: str, returned: str) -> None:
        self.clock = clock
        self.returned = returned
        super().__init__(
            f"the clock {clock} returned {returned}; a clock must return a timezone-aware "
            "datetime.datetime (one with a tzinfo, such as timezone.utc), which is then read "
            "in UTC. Nothing was written"
        )


class DuplicateElementError(ConfigurationError):
    """Two workflows sharing handlers use one node id with Element scope.

    Element-scope records are keyed by the node id alone, so the second
    workflow's node would skip the first one's items and supersede its results.
    """

    def __init__(self, *, element_id: str, workflow_id: str, other_workflow_id: str) -> None:
        self.element_id = element_id
        self.workflow_id = workflow_id
        self.other_workflow_id = other_workflow_id
        super().__init__(
            f"node id {element_id!r} of workflow {workflow_id!r} is already used with Element "
            f"scope by workflow {other_workflow_id!r}; Element-scope records are keyed by the "
            "node id alone, so the two nodes would share their records. Element ids must be "
            "unique across the workflows that share a handler registry: rename one of the nodes"
        )


class FactoryError(ConfigurationError):
    """A handler factory (``MODULE:FACTORY``) cannot build a handler the harness can drive.

    Said once, before a run, instead of an ``AttributeError`` from the first
    call the harness makes on whatever the factory gave back.
    """

    def __init__(self, *, factory: str, problem: str, allowed: str) -> None:
        self.factory = factory
        self.problem = problem
        self.allowed = allowed
        super().__init__(f"the factory {echo(factory)} {problem}; {allowed}")


class MissingDataStateMachineError(ConfigurationError):
    """A node type that must not run unguarded was configured without a ``dataStateMachine`` block.

    Without the block the node gets the null machine: every redelivery would
    repeat its side effect.
    """

    def __init__(self, *, node_type: str, node_id: str) -> None:
        self.node_type = node_type
        self.node_id = node_id
        super().__init__(
            f"node {node_id!r} of type {node_type!r} needs a 'dataStateMachine' block in its "
            "settings (its side effect must not repeat); add e.g. "
            '{"dataStateMachine": {"handler": "built-in", "scope": "Element"}}'
        )


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
    """Fencing: the caller's token no longer holds the record; its write is rejected.

    The caller's business side effect may already have happened; the error is
    what lets operators see the lease violation instead of a silent overwrite.
    The message says what the fields show, and offers both readings where the
    fields cannot tell them apart (a sweep and a retried write both leave the
    record finished with the caller's own token).
    """

    def __init__(
        self, *, item_key: str, token: int, current_token: int | None, status: str
    ) -> None:
        self.current_token = current_token
        self.status = status
        super().__init__(
            f"stale lock on item {item_key!r}: this execution holds fencing token {token}, "
            f"but {_what_happened(token, current_token, status)}; this write is rejected",
            item_key=item_key,
            token=token,
        )


def _what_happened(token: int, current_token: int | None, status: str) -> str:
    """The account a :class:`StaleLockError` gives, from its fields alone."""
    if current_token is None:
        return "the record no longer exists (it expired and was removed, or was deleted)"
    if current_token != token:
        return (
            f"the record is now {status} with token {current_token}: the lock was taken "
            f"over by attempt {current_token}"
        )
    if status == "Failed":
        return (
            "this token's lock already ended: the record is Failed with this token, "
            "so either the lock expired and was swept, or this token's own release landed "
            "with another error detail (retrying the write that landed succeeds)"
        )
    if status == "Processing":
        return "the record is Processing with this token, yet the store refused the write"
    return (
        f"this token's lock already ended: the record is {status} with this token, "
        "from a write of this token that asked for another outcome (retrying the write "
        "that landed succeeds; this one asks for something else)"
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


class StoreLostError(StoreError):
    """The store is no longer the one the handler opened: its data was lost or replaced.

    Redis flushed, the SQLite file deleted or swapped under open connections:
    every record written so far is gone, so answering from the store would say
    "not done" for finished work and charge it again.  The handler refuses
    instead, on every write, until it is rebuilt on a store someone has
    restored or knowingly started afresh.  Nothing is written by the call that
    raises it.
    """

    def __init__(self, *, store: str, reason: str) -> None:
        self.store = store
        self.reason = reason
        super().__init__(
            f"the {store} is not the store this handler opened: {reason}. Its records were "
            "lost or replaced, so finished work would look undone and be repeated; nothing "
            "was written. Restore the store (or accept the loss) and restart the handler"
        )


class EvictingStoreError(StoreError):
    """The store may drop records on its own to free memory, so the handler refuses to use it.

    A Redis whose ``maxmemory-policy`` evicts any key (``allkeys-lru``,
    ``allkeys-lfu``, ``allkeys-random``) drops finished records under memory
    pressure while the identity marker may survive: ``exists`` then answers
    "not done" for finished work, a new acquire starts again from token 1 and
    the side effect repeats, and a live lock can vanish under its holder.
    Nothing in the store tells a dropped record from one never written, so
    the only safe answer is to refuse the store before any record is trusted.
    """

    def __init__(self, *, store: str, setting: str, value: str, fix: str) -> None:
        self.store = store
        self.setting = setting
        self.value = value
        self.fix = fix
        super().__init__(
            f"the {store} has {setting} {value}: under memory pressure it evicts keys, "
            "finished records included, and evicted work would look undone and be repeated; "
            f"nothing was read or written. Set {fix}"
        )
