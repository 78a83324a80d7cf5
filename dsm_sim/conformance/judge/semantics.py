"""Semantics profiles: a library's deliberate differences from the spec, declared as data.

The kit judges every handler against one transition table and one reference
model.  A peer library (Powertools' idempotency utility, say) makes different
choices on purpose: it deletes a record where the spec writes Failed, has no
lock sweep, lets records vanish by a store TTL, and measures time in
milliseconds or seconds.  Reporting those choices as violations would bury the
one hazard that matters in any design, so a :class:`SemanticsProfile` names
them, and the kit reads the profile in a few places only:

* :class:`ProfiledModel` applies the profile's choices on top of the
  unchanged :class:`~reference_engine.model.ReferenceModel`: what a failure
  leaves, whether the lock sweep exists, how records reach their end of
  retention, where a lock ends;
* the record judge compares instants at the profile's resolutions and skips
  fields the library does not store;
* the rules skip operations the library does not have, and a property the
  profile waives is reported as ``waived`` with the reason, never as passed;
* a property the profile names as a :class:`Hazard` is what the library's
  interface cannot prevent (the seed's writes carry no token, so a stale
  holder's late write lands): when a test case shows it, the kit reports the
  hazard by name with its story, and stops judging that test case.

What stays judged under every profile is ownership: a write by a holder whose
lock was taken over must be refused, two live holders are never allowed, and
a record the model keeps must not be missing.  The default profile,
:data:`DSM`, changes nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import enum
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import ConfigurationError, DsmError, LockError, LockNotHeldError
from reference_engine.model import NEEDS_LOCK, ReferenceModel, require_holder
from reference_engine.record import check_settable, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DSM",
    "OPERATIONS",
    "POWERTOOLS",
    "SEED",
    "SEMANTICS",
    "Failure",
    "Hazard",
    "ProfiledModel",
    "Retention",
    "SemanticsProfile",
    "UnknownSemanticsError",
    "UnsupportedOperationError",
    "resolve_semantics",
    "truncate",
]

S = IdempotencyStatus
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)

#: The handler operations a rule may call; a profile lists the ones its library has.
OPERATIONS: frozenset[str] = frozenset(
    {"exists", "get", "try_acquire_lock", "set", "release_lock_as_failed", "upsert"}
)


class Failure(enum.Enum):
    """What a holder's failure (``release_lock_as_failed``) leaves behind."""

    #: A Failed record, retried by the next acquisition with the next token.
    FAILED = "failed"
    #: No record: the item looks new to the next caller.
    DELETE = "delete"


class Retention(enum.Enum):
    """How a record reaches its end of retention."""

    #: ``expire_past_retention`` marks it Expired (history rows too).
    SWEEP = "sweep"
    #: The store drops it by itself (a TTL): the record is simply gone.
    TTL = "ttl"


def truncate(instant: dt.datetime, resolution: dt.timedelta) -> dt.datetime:
    """``instant`` cut down to a multiple of ``resolution`` since the epoch (floor)."""
    if resolution <= _MICROSECOND:
        return instant
    return instant - (instant - _EPOCH) % resolution


@dataclass(frozen=True, slots=True)
class Hazard:
    """What an interface cannot prevent: reported by name with its story, never passed or refused."""

    #: The hazard's name in the verdict (``hazard: NAME — summary``).
    name: str
    summary: str


@dataclass(frozen=True, slots=True)
class SemanticsProfile:
    """A library's deliberate semantics, as data the kit reads; see the module docstring.

    Every field defaults to the spec (``docs/semantics.md``), so a profile
    spells out only where its library differs.
    """

    name: str
    summary: str
    failure: Failure = Failure.FAILED
    #: Whether ``reset_expired_locks`` exists; without it an expired lock is
    #: only ever taken over by the next acquisition.
    lock_sweep: bool = True
    retention: Retention = Retention.SWEEP
    #: The spec's lock is still live at ``now == locked_until``; False: it has ended.
    lock_live_at_expiry: bool = True
    #: The resolution at which the lock's end is stored and compared.
    lock_resolution: dt.timedelta = _MICROSECOND
    #: The resolution at which the end of retention takes effect.
    retention_resolution: dt.timedelta = _MICROSECOND
    #: The resolution at which ``retain_until`` is stored (and read back).
    stored_retention_resolution: dt.timedelta = _MICROSECOND
    #: The unit a node's retention is configured in: a library that takes
    #: whole seconds keeps a retention of 1.5 s for 1 s.
    retention_unit: dt.timedelta = _MICROSECOND
    #: After an expired lock is taken over, further take-overs of the item are
    #: refused for this long (a library's guard against racing take-overs).
    takeover_guard: dt.timedelta | None = None
    #: Whether the store keeps who wrote a record and when
    #: (``entity_execution_id``, ``source_app_id``, ``created_at``, ``updated_at``).
    audit_fields: bool = True
    #: Whether a completion or release may be retried with the same token
    #: after its reply was lost (the spec's callers do; a flow that never
    #: retries a completion has nothing to be judged there).
    completion_retries: bool = True
    #: The handler operations the library has.
    operations: frozenset[str] = OPERATIONS
    #: The statuses ``set`` may write in this library.
    settable: frozenset[IdempotencyStatus] = frozenset(
        {S.PROCESSED, S.FAILED, S.SKIPPED, S.EXPIRED}
    )
    #: Properties that do not apply, each with the reason printed in their place.
    waived: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Whether the store sees the caller's token on a write.  False: the
    #: interface's writes carry none, so a write the spec refuses for want of
    #: the lock may land (a hazard), and one it refuses in another way
    #: (``LockNotHeldError`` for ``StaleLockError``) is a refusal all the same.
    fenced: bool = True
    #: Properties whose violation is the interface's hazard, not the handler's bug.
    hazards: Mapping[str, Hazard] = field(default_factory=lambda: MappingProxyType({}))

    def __copy__(self) -> SemanticsProfile:
        return self  # immutable: a copied model shares its profile

    def __deepcopy__(self, memo: dict[int, Any]) -> SemanticsProfile:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # ``waived`` is a read-only mapping, which pickle cannot take: a profile
        # travels to a worker process (``dsm run --jobs``) as its fields.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["waived"] = dict(self.waived)
        fields["hazards"] = dict(self.hazards)
        return (_rebuilt, (fields,))

    @property
    def strict(self) -> bool:
        """True for a profile that changes nothing (the spec itself)."""
        return self is DSM or self == DSM

    @property
    def records_vanish(self) -> bool:
        """Whether a record may disappear (deleted on failure, dropped by a TTL)."""
        return self.failure is Failure.DELETE or self.retention is Retention.TTL

    def supports(self, operation: str) -> bool:
        return operation in self.operations

    def can_set(self, status: IdempotencyStatus) -> bool:
        return "set" in self.operations and status in self.settable

    def lock_live(self, locked_until: dt.datetime | None, now: dt.datetime) -> bool:
        """Is a Processing record's lock still live at ``now`` by this library's rule?"""
        if locked_until is None:
            return False
        n = truncate(now, self.lock_resolution)
        end = truncate(locked_until, self.lock_resolution)
        return n <= end if self.lock_live_at_expiry else n < end

    def retained(self, retain_until: dt.datetime | None, now: dt.datetime) -> bool:
        """Is a record still within its retention at ``now`` (TTL libraries)?"""
        if retain_until is None:
            return True
        return truncate(now, self.retention_resolution) <= truncate(
            retain_until, self.retention_resolution
        )


def _rebuilt(fields: dict[str, Any]) -> SemanticsProfile:
    """A pickled profile, read back; a known profile comes back as itself."""
    profile = SemanticsProfile(
        **{
            **fields,
            "waived": MappingProxyType(dict(fields["waived"])),
            "hazards": MappingProxyType(dict(fields.get("hazards", {}))),
        }
    )
    known = SEMANTICS.get(profile.name)
    return known if known == profile else profile


#: The spec itself: the default of every verification.
DSM = SemanticsProfile(name="dsm", summary="the DataStateMachine semantics of docs/semantics.md")

#: Powertools for AWS Lambda (Python), idempotency utility, Redis persistence
#: layer driven in the order its ``IdempotencyHandler`` calls it
#: (``dsm_sim.peers.powertools``).
POWERTOOLS = SemanticsProfile(
    name="powertools",
    summary=(
        "Powertools idempotency: delete instead of Failed, no lock sweep, retention by TTL, "
        "a lock that ends at its expiry instant (ms), record expiry in seconds, no history"
    ),
    failure=Failure.DELETE,
    lock_sweep=False,
    retention=Retention.TTL,
    # ``in_progress_expiry_timestamp > now_ms`` is live: the expiry instant is not.
    lock_live_at_expiry=False,
    lock_resolution=dt.timedelta(milliseconds=1),
    # Redis drops a key once its (millisecond) expiry is past; the record
    # itself stores its expiry in whole seconds.
    retention_resolution=dt.timedelta(milliseconds=1),
    stored_retention_resolution=dt.timedelta(seconds=1),
    # ``expires_after_seconds`` is an int.
    retention_unit=dt.timedelta(seconds=1),
    # The Redis layer takes an orphaned record over under a ``<key>:lock`` key
    # of 10 s that it never deletes.
    takeover_guard=dt.timedelta(seconds=10),
    audit_fields=False,
    completion_retries=False,
    operations=frozenset({"exists", "get", "try_acquire_lock", "set", "release_lock_as_failed"}),
    settable=frozenset({S.PROCESSED, S.FAILED}),
    waived=MappingProxyType(
        {
            "sweep_only_expired": "no lock sweep: an expired lock is taken over by the next call",
            "sweep_resets_expired": "no lock sweep: an expired lock is taken over by the next call",
            "retention_sweep_agrees_with_model": "no retention sweep: records expire by Redis TTL",
            "upsert_keeps_history": "no upsert and no history of superseded results",
            "spent_token_rejected": (
                "its flow never retries a completion: a lost reply fails the invocation, and "
                "the redelivery reads the record"
            ),
        }
    ),
)

#: The hazard of an interface whose writes carry no fencing token.
STALE_HOLDER_LATE_WRITE = Hazard(
    name="stale_holder_late_write",
    summary=(
        "the writes (set, release_lock_as_failed, upsert) carry no token, so a holder whose "
        "lock was swept or taken over, waking late, writes over the record of the worker "
        "that holds the item now; no handler of this interface can refuse it"
    ),
)

#: The seed's ``IDataStateMachineHandler`` as it is: ``TryAcquireLockAsync``
#: answers true or false, and the writes carry no token.  Everything else the
#: seed promises is judged as the spec: the transitions, exists, the lock and
#: its duration, the sweeps, retention, history, payloads.
SEED = SemanticsProfile(
    name="seed",
    summary=(
        "the seed's IDataStateMachineHandler: acquire answers true or false, SetAsync and "
        "ReleaseLockAsFailedAsync carry no token (a stale holder's late write is a hazard)"
    ),
    fenced=False,
    completion_retries=False,
    waived=MappingProxyType(
        {
            "stale_write_rejected": (
                "no token reaches the store: reported as the hazard stale_holder_late_write"
            ),
            "spent_token_rejected": (
                "no token reaches the store, so a retried completion cannot be told from "
                "another caller's"
            ),
        }
    ),
    hazards=MappingProxyType({"stale_write_rejected": STALE_HOLDER_LATE_WRITE}),
)

#: Profiles ``dsm verify --semantics NAME`` knows by name; any other is
#: given as ``module:ATTRIBUTE``.
SEMANTICS: Mapping[str, SemanticsProfile] = MappingProxyType(
    {DSM.name: DSM, POWERTOOLS.name: POWERTOOLS, SEED.name: SEED}
)


class UnknownSemanticsError(ConfigurationError):
    """A semantics profile that is neither a known name nor an importable ``module:ATTRIBUTE``."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        super().__init__(
            f"unknown semantics profile {name!r}: {problem}; use one of "
            f"{', '.join(SEMANTICS)} or module:ATTRIBUTE naming a SemanticsProfile"
        )


class UnsupportedOperationError(DsmError):
    """A handler operation the library has no counterpart for (a profile's ``operations``)."""

    def __init__(self, *, library: str, operation: str, supported: str) -> None:
        self.library = library
        self.operation = operation
        self.supported = supported
        super().__init__(
            f"{library} has no counterpart of {operation}; the operations it supports are "
            f"{supported}"
        )


def resolve_semantics(spec: SemanticsProfile | str | None, factory: Any = None) -> SemanticsProfile:
    """The profile to verify under: given, else the one ``factory`` declares, else :data:`DSM`.

    A factory declares its library's profile with a ``dsm_semantics``
    attribute, so ``dsm verify mylib:factory`` needs no flag.
    """
    if spec is None:
        declared = getattr(factory, "dsm_semantics", None)
        return declared if isinstance(declared, SemanticsProfile) else DSM
    if isinstance(spec, SemanticsProfile):
        return spec
    if spec in SEMANTICS:
        return SEMANTICS[spec]
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise UnknownSemanticsError(spec, "not a known profile")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise UnknownSemanticsError(spec, f"cannot import it ({exc})") from exc
    if not isinstance(found, SemanticsProfile):
        raise UnknownSemanticsError(spec, f"it is a {type(found).__name__}")
    return found


class ProfiledModel(ReferenceModel):
    """The reference model with a profile's choices applied; under :data:`DSM` it is unchanged.

    Tokens stay the model's way of telling holders apart.  A library that
    deletes records keeps no token, so the next token of an item continues
    from the last one handed out: a holder from before the delete must never
    look like the holder after it.
    """

    def __init__(self, semantics: SemanticsProfile = DSM) -> None:
        super().__init__()
        self.semantics = semantics
        self.last_token: dict[RecordKey, int] = {}
        #: Under a profile whose writes carry no token: the error the spec would have
        #: raised for the last write, which the interface let land (None: it agreed).
        self.spec_refusal: DsmError | None = None
        self.guard_until: dict[RecordKey, dt.datetime] = {}

    def __copy__(self) -> ProfiledModel:
        """A shallow copy whose own bookkeeping is its own.

        A race is judged by replaying candidate orders on shallow copies of
        the model: a token handed out in one candidate must not number the
        next candidate's grants (its records are copied by the caller).
        """
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied.last_token = dict(self.last_token)
        copied.guard_until = dict(self.guard_until)
        return copied

    # --- the end of retention by TTL ----------------------------------------------------------

    def settle(self, now: dt.datetime, key: RecordKey | None = None) -> None:
        """Drop the records a TTL has removed at ``now`` (``key``'s only, when given)."""
        if self.semantics.retention is not Retention.TTL:
            return
        keys = list(self.current) if key is None else [key]
        for k in keys:
            record = self.current.get(k)
            if record is not None and not self.semantics.retained(record.retain_until, now):
                self._forget(k)

    def _forget(self, key: RecordKey) -> None:
        record = self.current.pop(key, None)
        if record is not None:
            self.last_token[key] = max(self.last_token.get(key, 0), record.attempt)

    # --- operations ---------------------------------------------------------------------------

    def exists(self, ctx: StateHandlerContext, now: dt.datetime) -> bool:
        self.settle(now, ctx.record_key)
        return super().exists(ctx, now)

    def _as_written(
        self, ctx: StateHandlerContext, spec: Callable[[ReferenceModel, StateHandlerContext], Any]
    ) -> StateHandlerContext:
        """The caller as a store that is given no token sees it (``fenced=False``).

        A write on a Processing record is taken as the holder's: the only
        reading a store of such an interface has.  When the spec would refuse
        the caller as it is (a stale holder, a worker holding nothing), that
        refusal is kept in :attr:`spec_refusal`: the interface's hazard.
        """
        self.spec_refusal = None
        if self.semantics.fenced:
            return ctx
        record = self.current.get(ctx.record_key)
        holder = record.attempt if record is not None and record.status is S.PROCESSING else None
        if holder == ctx.lock_token:
            return ctx
        try:
            spec(copy.deepcopy(self), ctx)
        except LockError as exc:
            self.spec_refusal = exc
        except DsmError:
            pass
        return ctx.with_lock_token(holder)

    def _configured(self, ctx: StateHandlerContext) -> StateHandlerContext:
        """``ctx`` with its retention in the unit the library takes it in."""
        unit, config = self.semantics.retention_unit, ctx.handler_config
        if unit <= _MICROSECOND or config.retention is None:
            return ctx
        retention = config.retention - config.retention % unit
        return dataclasses.replace(
            ctx, handler_config=dataclasses.replace(config, retention=retention)
        )

    def try_acquire_lock(self, ctx: StateHandlerContext, now: dt.datetime) -> int | None:
        ctx = self._configured(ctx)
        semantics = self.semantics
        if semantics.strict:
            return super().try_acquire_lock(ctx, now)
        key = ctx.record_key
        self.settle(now, key)
        record = self.current.get(key)
        takeover = False
        if record is not None and record.status is S.PROCESSING:
            if semantics.lock_live(record.locked_until, now):
                return None
            guard = self.guard_until.get(key)
            if guard is not None and truncate(now, semantics.retention_resolution) <= guard:
                return None  # the library's take-over guard is still up
            # Ended by the library's rule: let the spec's model see an ended lock.
            if record.locked_until is not None and record.locked_until >= now:
                record.locked_until = now - _MICROSECOND
            takeover = True
        if record is None and key in self.last_token:
            # A record the library deleted: a fresh record, numbered after the last holder.
            token = super().try_acquire_lock(ctx, now)
            if token is not None:
                token = self.last_token[key] + 1
                self.current[key].attempt = token
        else:
            token = super().try_acquire_lock(ctx, now)
        if token is not None:
            self.last_token[key] = token
            if takeover and semantics.takeover_guard is not None:
                self.guard_until[key] = truncate(now, semantics.retention_resolution) + (
                    semantics.takeover_guard
                )
        return token

    def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None,
        now: dt.datetime,
    ) -> None:
        ctx = self._configured(ctx)
        self.settle(now, ctx.record_key)
        ctx = self._as_written(ctx, lambda m, c: ReferenceModel.set(m, c, status, data, now))
        if self.semantics.strict:
            super().set(ctx, status, data, now)
            return
        check_settable(status)
        encoded = encode_data(data)
        if (
            ctx.lock_token is None
            and status in NEEDS_LOCK
            and not self.semantics.can_set(S.SKIPPED)
        ):
            # A library with no writes but the holder's refuses any other as not held.
            raise LockNotHeldError(item_key=ctx.item_key, operation=f"set({status.label})")
        if self._vanished_under_holder(ctx):
            # The holder's record was dropped (TTL) and nobody took the item since:
            # its completion writes the record anew, its failure finds nothing to delete.
            if status is S.PROCESSED:
                self._write(
                    ctx, now, None, status=S.PROCESSED, data=encoded, locked_until=None,
                    attempt=ctx.lock_token,
                )  # fmt: skip
            return
        if self.semantics.failure is Failure.DELETE and status is S.FAILED and ctx.lock_token:
            self._delete_held(ctx)
            return
        super().set(ctx, status, data, now)

    def release_lock_as_failed(
        self, ctx: StateHandlerContext, error_detail: str, now: dt.datetime
    ) -> None:
        ctx = self._configured(ctx)
        self.settle(now, ctx.record_key)
        ctx = self._as_written(
            ctx, lambda m, c: ReferenceModel.release_lock_as_failed(m, c, error_detail, now)
        )
        if self._vanished_under_holder(ctx):
            return  # nothing left to delete, and nobody else's record to harm
        if self.semantics.failure is Failure.DELETE and ctx.lock_token is not None:
            self._delete_held(ctx)
            return
        super().release_lock_as_failed(ctx, error_detail, now)

    def _vanished_under_holder(self, ctx: StateHandlerContext) -> bool:
        """Did a TTL drop the record of the caller's own, latest grant?"""
        key = ctx.record_key
        return (
            self.semantics.retention is Retention.TTL
            and ctx.lock_token is not None
            and key not in self.current
            and self.last_token.get(key) == ctx.lock_token
        )

    def _delete_held(self, ctx: StateHandlerContext) -> None:
        """The holder's failure removes the record; a stale holder is refused as in the spec."""
        require_holder(ctx, self.current.get(ctx.record_key))
        self._forget(ctx.record_key)

    def upsert(
        self, ctx: StateHandlerContext, data: Mapping[str, Any] | None, now: dt.datetime
    ) -> None:
        ctx = self._configured(ctx)
        self.settle(now, ctx.record_key)
        ctx = self._as_written(ctx, lambda m, c: ReferenceModel.upsert(m, c, data, now))
        super().upsert(ctx, data, now)

    def reset_expired_locks(self, now: dt.datetime) -> int:
        if not self.semantics.lock_sweep:
            return 0
        return super().reset_expired_locks(now)

    def expire_past_retention(self, now: dt.datetime) -> int:
        if self.semantics.retention is Retention.TTL:
            self.settle(now)
            return 0
        return super().expire_past_retention(now)
