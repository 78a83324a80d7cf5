"""The arguments steps take, named: which race, where the clock stands, which write lands.

Rules draw these, probes and race matrices list them, reproductions print
them; each repr is the expression that builds it, so a printed program runs.
"""

from __future__ import annotations

import datetime as dt
import enum

from dsm_sim.model import ItemRef
from reference_engine.context import MAX_KEY_LENGTH

__all__ = [
    "CONTENDERS",
    "MATRIX_OPS",
    "THIRD",
    "WRITERS",
    "ClockMove",
    "Instant",
    "LandedWrite",
    "NodeCall",
    "RaceOp",
    "RefusedKey",
    "StartState",
]


class RaceOp(enum.Enum):
    """One call in a race: the whole alphabet of operations a handler answers.

    Complete (``set(Processed)``), fail (``set(Failed)``) and release are made
    by the item's newest holder, with its token (live, expired, or spent by a
    write that landed); skip (``set(Skipped)``), expire (``set(Expired)``) and
    upsert by a worker holding nothing; the sweeps by their own worker.
    """

    ACQUIRE = "acquire"
    COMPLETE = "complete"
    RELEASE = "release"
    UPSERT = "upsert"
    SKIP = "skip"
    SWEEP = "sweep"
    RETENTION = "retention"
    EXISTS = "exists"
    GET = "get"
    BEGIN = "begin"
    FAIL = "fail"
    EXPIRE = "expire"

    def __repr__(self) -> str:
        return f"RaceOp.{self.name}"

    @property
    def needs_token(self) -> bool:
        return self in (RaceOp.COMPLETE, RaceOp.FAIL, RaceOp.RELEASE)

    @property
    def sweeps(self) -> bool:
        return self in (RaceOp.SWEEP, RaceOp.RETENTION)


#: The race matrix's alphabet, in the order its rows are printed.
MATRIX_OPS: tuple[RaceOp, ...] = (
    RaceOp.EXISTS,
    RaceOp.GET,
    RaceOp.BEGIN,
    RaceOp.ACQUIRE,
    RaceOp.COMPLETE,
    RaceOp.FAIL,
    RaceOp.SKIP,
    RaceOp.EXPIRE,
    RaceOp.RELEASE,
    RaceOp.UPSERT,
    RaceOp.SWEEP,
    RaceOp.RETENTION,
)


class StartState(enum.Enum):
    """Where an item stands when a race on it starts: every state the lifecycle has.

    Each is reached the way a node reaches it (worker 1 acquires first), so
    the newest holder's token exists wherever a lock was ever taken: live,
    expired, or spent by its own completing write (whose reply was lost).
    """

    NONE = "no record"
    LIVE = "live lock"
    AT_EXPIRY = "lock at its last live instant"
    EXPIRED = "expired, unswept lock"
    EXPIRED_PAST_RETENTION = "expired lock past its retention"
    FAILED = "Failed"
    PROCESSED = "Processed"
    SKIPPED = "Skipped"
    SUPERSEDED = "Processed over a Superseded history row"
    EXPIRED_RECORD = "Expired"
    PAST_RETENTION = "Processed past its retention, unswept"

    def __repr__(self) -> str:
        return f"StartState.{self.name}"

    @property
    def has_holder(self) -> bool:
        return self is not StartState.NONE


class Instant(enum.Enum):
    """Where the clock stands when the race starts."""

    NOW = "now"
    LOCK_EXPIRY = "lock_expiry"  # on locked_until: still live
    PAST_LOCK = "past_lock"  # 1 µs later: expired
    PAST_RETENTION = "past_retention"  # 1 µs past retain_until

    def __repr__(self) -> str:
        return f"Instant.{self.name}"


class ClockMove(enum.Enum):
    """How the clock moves while the calls run."""

    NONE = "none"
    SECOND = "second"
    PAST_LOCK = "past_lock"
    BACK = "back"

    def __repr__(self) -> str:
        return f"ClockMove.{self.name}"

    def delta(self, ref: ItemRef) -> dt.timedelta:
        if self is ClockMove.SECOND:
            return dt.timedelta(seconds=1)
        if self is ClockMove.PAST_LOCK:
            return ref.config.lock_duration + dt.timedelta(seconds=1)
        if self is ClockMove.BACK:
            return dt.timedelta(seconds=-60)
        return dt.timedelta(0)


#: The first call of a race is a worker's write or acquisition; the second is
#: what contends with it; a third joins sometimes.  Drawing them this way makes
#: completion against sweep, release against takeover, acquire against the
#: retention sweep and upsert against acquire common, not one draw in sixty.
WRITERS = (RaceOp.COMPLETE, RaceOp.RELEASE, RaceOp.ACQUIRE, RaceOp.UPSERT, RaceOp.SKIP)
CONTENDERS = (
    RaceOp.SWEEP,
    RaceOp.ACQUIRE,
    RaceOp.RETENTION,
    RaceOp.UPSERT,
    RaceOp.RELEASE,
    RaceOp.COMPLETE,
    RaceOp.EXISTS,
)
THIRD: tuple[RaceOp | None, ...] = (
    None,
    None,
    RaceOp.ACQUIRE,
    RaceOp.COMPLETE,
    RaceOp.RELEASE,
    RaceOp.UPSERT,
    RaceOp.SKIP,
    RaceOp.SWEEP,
    RaceOp.RETENTION,
    RaceOp.EXISTS,
)


class LandedWrite(enum.Enum):
    """Which completing write lands while its reply is lost."""

    SET = "set"
    RELEASE = "release"
    UPSERT = "upsert"

    def __repr__(self) -> str:
        return f"LandedWrite.{self.name}"


class RefusedKey(enum.Enum):
    """Item keys every handler must see refused before anything is stored."""

    EMPTY = ""
    TOO_LONG = "x" * (MAX_KEY_LENGTH + 1)
    NUL = "INV\x00-1"
    LONE_SURROGATE = "INV-\udc80"
    NOT_TEXT = 42

    def __repr__(self) -> str:
        return f"RefusedKey.{self.name}"


class NodeCall(enum.Enum):
    EXISTS = "exists"
    GET = "get"
    ACQUIRE = "try_acquire_lock"
    SKIP = "set"
    UPSERT = "upsert"

    def __repr__(self) -> str:
        return f"NodeCall.{self.name}"
