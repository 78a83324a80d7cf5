"""Edge probes: short fixed programs every verification runs before its search.

The search draws its world and its steps at random, so whether a test case
meets one given edge of the domain (the empty error detail, two
256-character entity keys that differ in their last character, a half-second
lock at its last live instant, a zone whose clocks change an hour into the
run) is a matter of chance: a rare edge shows in one seed out of several.
Stores get the edges wrong far more often than the rest of the domain, so the
kit does not leave them to chance.  Before the search it runs a few fixed
programs that walk each edge table of the world through the same machine and
the same judges:

* every error detail of :data:`~dsm_sim.conformance.generate.payloads.ERROR_DETAILS`
  through ``release_lock_as_failed``;
* every class of payload (each special string as a value and as a key, every
  edge number, every empty value, deep nesting, sizes either side of the
  limit in one-, two- and four-byte characters, every field name the record
  and document stores give meaning to, every look-alike text beside the value
  it looks like, every line ending) through ``set`` and ``upsert``;
* every near spelling of every identifier (item key, item entity key, entity
  id, tenant), including two a type conversion makes one and two whose
  32-bit hash is one: the two keys must never share a record or a lock;
* one item taken over 105 times, each holder before writing late with its
  token: refused at every digit boundary;
* every node configuration of :data:`~dsm_sim.model.WORLD_CONFIGS` on its own
  lock and retention boundaries: the last live instant, the first expired one,
  the sweeps at both, the retry after each;
* every non-UTC zone of :data:`~dsm_sim.conformance.generate.worlds.ZONES`, with a lock
  that spans the zone's daylight-saving change.

A probe that breaks a property is reported like a finding of the search
(story, then a program that replays it, trimmed by
:mod:`dsm_sim.conformance.tell.trim`), and the search then looks for the rest.
The probes are data (a world and calls in the printed format), never drawn,
so the search's seeds explore what they explored before; they cost a few
hundred steps, about five seconds on a SQLite file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsm_sim.conformance.generate.collisions import hash_pairs
from dsm_sim.conformance.generate.domains import FAR_END
from dsm_sim.conformance.generate.payloads import (
    EMPTIES,
    ERROR_DETAILS,
    FIELD_NAMES,
    LINE_FORMS,
    LOOKALIKES,
    NUMBERS,
    STRINGS,
    lookalike_payload,
    named_payload,
    nested,
)
from dsm_sim.conformance.generate.steps import ClockMove, Instant, LandedWrite, RaceOp
from dsm_sim.conformance.generate.texts import lookalike_pairs
from dsm_sim.conformance.generate.worlds import (
    APPS,
    DEFAULT_WORLD,
    EXECUTIONS,
    NEAR_CHARACTERS,
    ROLES,
    SEPARATORS,
    UTC_ZONE,
    ZONES,
    Role,
    Spelt,
    World,
    conversion_pairs,
    near_spellings,
    one_apart,
)
from dsm_sim.conformance.program import Call, Program
from dsm_sim.model import WORLD_CONFIGS, ItemRef
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.record import MAX_DATA_BYTES
from reference_engine.scope import Scope
from reference_engine.status import IdempotencyStatus

__all__ = [
    "PROBES",
    "Probe",
]

S = IdempotencyStatus


@dataclass(frozen=True, slots=True)
class Probe:
    """One fixed program: what it walks, the world it starts in, its steps."""

    name: str
    world: World
    calls: tuple[Call, ...]
    #: A rule the machine must have for the probe to apply (``begin``: a native one).
    requires: str | None = None

    @property
    def program(self) -> Program:
        return Program((Call.of("setup", world=self.world), *self.calls))


def _call(rule: str, **arguments: object) -> Call:
    return Call.of(rule, **arguments)


def _chained(worlds: Sequence[World], steps: Callable[[int], list[Call]]) -> tuple[Call, ...]:
    """World after world on one store: ``steps(index)`` in each, entering it after the first."""
    calls: list[Call] = []
    for index, world in enumerate(worlds):
        if index:
            calls.append(_call("enter_world", world=world))
        calls += steps(index)
    return tuple(calls)


def _slotted(
    tag: str, stamps: Callable[[int], int], cases: Sequence[Callable[[Role], list[Call]]]
) -> tuple[World, tuple[Call, ...]]:
    """One case per item, eight to a world (``tag<n>/`` keys, workers by ``stamps(n)``)."""
    size = len(ROLES)
    worlds = [
        _tagged(DEFAULT_WORLD, f"{tag}{n}", stamps=stamps(n))
        for n in range((len(cases) + size - 1) // size)
    ]

    def steps(index: int) -> list[Call]:
        chunk = cases[index * size : (index + 1) * size]
        return [call for role, case in zip(ROLES, chunk, strict=False) for call in case(role)]

    return worlds[0], _chained(worlds, steps)


# --- error details ---------------------------------------------------------------------------


def _error_probe() -> Probe:
    """Each detail on a lock of its own (the items take turns: a Failed item is retried)."""
    calls: list[Call] = []
    for index, detail in enumerate(ERROR_DETAILS):
        role = ROLES[index % len(ROLES)]
        calls.append(_call("try_acquire_lock", worker=1, item=role))
        calls.append(_call("release_lock_as_failed", worker=1, item=role, error=detail))
    return Probe("error details", DEFAULT_WORLD, tuple(calls))


# --- payloads --------------------------------------------------------------------------------


def _payloads() -> list[object]:
    """Every class of payload, the ones within the size limit first."""
    within: list[object] = [
        {},
        {"strings": list(STRINGS)},
        {text: index for index, text in enumerate(STRINGS)},
        {"numbers": list(NUMBERS)},
        {str(index): number for index, number in enumerate(NUMBERS)},
        {"empties": list(EMPTIES)},
        {"items": [], "meta": {}, "": "", "note": None, "zero": 0, "float": 0.0, "no": False},
        *({"value": empty} for empty in EMPTIES),
        {"deep": nested(20)},
        {"deep": nested(40)},
        # Every name the record, the protocol or a document store gives meaning
        # to, holding a number and then a look-alike text.
        named_payload(FIELD_NAMES, lambda index, _: index),
        named_payload(FIELD_NAMES, lambda index, _: LOOKALIKES[index % len(LOOKALIKES)]),
        # Text that another type parses from, as values and as names, and each
        # beside the value it looks like (one digit and two).
        {"lookalikes": list(LOOKALIKES)},
        {text: text for text in LOOKALIKES},
        lookalike_payload(lookalike_pairs(1)),
        lookalike_payload(lookalike_pairs(10)),
        # Every line ending and whitespace form, as values and as names.
        {"lines": list(LINE_FORMS)},
        {form: form for form in LINE_FORMS},
    ]
    near: list[object] = []
    for over in (-16, 64):
        for char in ("x", "\u00e9", "\U0001f600"):
            count = (MAX_DATA_BYTES + over) // len(char.encode("utf-8"))
            near.append({"blob": char * count})
    return [*within, *near]


def _payload_probe() -> Probe:
    """Each payload completes an item, then supersedes it; a skip keeps what is stored."""
    calls: list[Call] = []
    done: set[Role] = set()
    for index, payload in enumerate(_payloads()):
        role = ROLES[index % len(ROLES)]
        if role in done:
            calls.append(_call("upsert", worker=2, item=role, data=payload))
        else:
            calls.append(_call("try_acquire_lock", worker=1, item=role))
            calls.append(_call("set", worker=1, item=role, status=S.PROCESSED, data=payload))
            done.add(role)
    calls += [_call("skip_item", worker=3, item=role) for role in (Role.HOT, Role.VARIANT)]
    # A superseding upsert without data writes none: the old record's data stays with it.
    calls.append(_call("upsert", worker=2, item=Role.TENANT, data=None))
    return Probe("payloads", _tagged(DEFAULT_WORLD, "data", stamps=2), tuple(calls))


# --- identities ------------------------------------------------------------------------------

#: The item each near spelling (the VARIANT item) must stay apart from.
_COUNTERPART = {
    Spelt.ITEM_KEY: Role.HOT,
    Spelt.ENTITY_KEY: Role.ENTITY_KEY,
    Spelt.ENTITY: Role.ENTITY,
    Spelt.TENANT: Role.TENANT,
}
#: The text each field's near spellings start from.
_FIELD_TEXT = {Spelt.ENTITY_KEY: "line-2", Spelt.ENTITY: "flow-2", Spelt.TENANT: "t2"}


#: Pairs a conversion confuses, per world (each world's numbers its own).
_CONVERSIONS = len(conversion_pairs(10))


def _pairs(spelt: Spelt, text: str, number: int = 0) -> list[tuple[str, str]]:
    """(spelling, near spelling) pairs: every variant, one character of each class apart,
    two identifiers of world ``number`` a type conversion makes one, and two whose
    CRC-32, CRC-16, Java ``hashCode``, FNV-1a or MurmurHash3 are equal.

    The one character is the last: where a narrower column cuts, and where a
    lossy character set leaves the rest alike.  (The search puts it anywhere.)
    """
    pairs = near_spellings(text)
    pairs += [one_apart(text, pair, 2) for pair in NEAR_CHARACTERS]
    pairs += list(conversion_pairs(10 + number))[:_CONVERSIONS]
    pairs += [(one, other) for _, one, other in hash_pairs(text, MAX_KEY_LENGTH)]
    return [(one, other) for one, other in pairs if max(len(one), len(other)) <= MAX_KEY_LENGTH]


def _identity_world(number: int, spelt: Spelt, pair: tuple[str, str]) -> World | None:
    """A world whose VARIANT item is the near spelling of one field; None if keys coincide."""
    one, other = pair
    hot = one if spelt is Spelt.ITEM_KEY else f"INV-{number}"
    entity_key = one if spelt is Spelt.ENTITY_KEY else "line-2"
    entity = one if spelt is Spelt.ENTITY else "flow-2"
    tenant = one if spelt is Spelt.TENANT else "t2"
    variant = {
        Spelt.ITEM_KEY: ItemRef("t1", Scope.ELEMENT, other),
        Spelt.ENTITY_KEY: ItemRef("t1", Scope.ELEMENT, hot, entity_key=other),
        Spelt.ENTITY: ItemRef("t1", Scope.ELEMENT, hot, entity=other),
        Spelt.TENANT: ItemRef(other, Scope.ELEMENT, hot),
    }[spelt]
    at = hot.find("-")
    head, tail = (hot[:at], hot[at + 1 :]) if at > 0 else ("", hot)
    split_key = tail if head and tail else hot + "-"
    split_entity_key = (entity_key + "-" + head)[-MAX_KEY_LENGTH:] if head else entity_key
    refs = (
        ItemRef("t1", Scope.ELEMENT, hot),
        ItemRef(tenant, Scope.ELEMENT, hot),
        ItemRef("t1", Scope.WORKFLOW, hot),
        ItemRef("t1", Scope.ELEMENT, hot, entity=entity),
        ItemRef("t1", Scope.ELEMENT, hot, entity_key=entity_key),
        ItemRef("t1", Scope.ELEMENT, f"next-{number}", config=ItemRef.FOREVER),
        variant,
        ItemRef("t1", Scope.ELEMENT, split_key, entity_key=split_entity_key),
    )
    if len({ref.record_key for ref in refs}) < len(refs):
        return None
    return World(refs)


def _identity_probe(spelt: Spelt) -> Probe:
    """World after world on one store: the spelling is locked, then its near spelling.

    Each world's keys are its own (the item keys are ``INV-<n>``, or near
    spellings of it), so no world meets a record an earlier one left.
    """
    counterpart = _COUNTERPART[spelt]

    def text(number: int) -> str:
        return f"INV-{number}" if spelt is Spelt.ITEM_KEY else _FIELD_TEXT[spelt]

    worlds: list[World] = []
    for kind in range(len(_pairs(spelt, text(0)))):
        number = len(worlds)
        world = _identity_world(number, spelt, _pairs(spelt, text(number), number)[kind])
        if world is not None:
            worlds.append(world)
    name = f"near spellings of the {spelt.value.replace('_', ' ')}"
    return Probe(name, worlds[0], _apart_calls(worlds, counterpart))


def _apart_calls(worlds: Sequence[World], counterpart: Role) -> tuple[Call, ...]:
    """In each world the near spelling is done, then the spelling must still be new and free.

    ``exists`` on the spelling is where a lookup by pattern (``LIKE``, a
    ``_`` that matches any character) or by a normalised key shows; the
    acquire is where a lock keyed apart from the record shows.
    """
    return _chained(
        worlds,
        lambda _: [
            _call("try_acquire_lock", worker=1, item=Role.VARIANT),
            _call("set", worker=1, item=Role.VARIANT, status=S.PROCESSED, data=None),
            _call("exists", worker=2, item=counterpart),
            _call("try_acquire_lock", worker=2, item=counterpart),
        ],
    )


# --- the same text split between two parts of the key --------------------------------------


def _split_world(number: int, hot: ItemRef, variant: ItemRef) -> World:
    """A world whose HOT and VARIANT items join to the same text, cut between other parts."""
    refs = (
        hot,
        dataclasses.replace(hot, tenant=f"other-{number}"),
        dataclasses.replace(hot, scope=Scope.WORKFLOW),
        dataclasses.replace(hot, entity=f"flow-other-{number}"),
        dataclasses.replace(hot, entity_key=f"line-other-{number}"),
        ItemRef("t1", Scope.ELEMENT, f"next-{number}", config=ItemRef.FOREVER),
        variant,
        dataclasses.replace(hot, item=f"{hot.item}-split-{number}"),
    )
    return World(refs)


def _split_probe() -> Probe:
    """Tenant and entity, entity and item entity key, item entity key and item key, re-cut.

    A store that keys records by the parts joined into one text (with no
    separator, or one a part may contain) mixes up ``("t1-flow", "x")`` and
    ``("t1", "flow-x")``; each joiner of :data:`SEPARATORS`, and none, is tried
    between each pair of neighbouring parts.
    """
    worlds: list[World] = []
    for joiner in ("", *SEPARATORS):
        for cut in ("tenant", "entity", "entity_key"):
            n = len(worlds)
            if cut == "tenant":
                hot = ItemRef(f"t{n}", Scope.ELEMENT, "INV-1", entity=f"flow{joiner}x")
                variant = ItemRef(f"t{n}{joiner}flow", Scope.ELEMENT, "INV-1", entity="x")
            elif cut == "entity":
                hot = ItemRef("t1", Scope.ELEMENT, "INV-1", f"flow{n}{joiner}x", "line")
                variant = ItemRef("t1", Scope.ELEMENT, "INV-1", f"flow{n}", f"x{joiner}line")
            else:
                hot = ItemRef("t1", Scope.ELEMENT, "INV", entity_key=f"line{n}{joiner}x")
                variant = ItemRef("t1", Scope.ELEMENT, f"x{joiner}INV", entity_key=f"line{n}")
            worlds.append(_split_world(n, hot, variant))
    return Probe("key parts split differently", worlds[0], _apart_calls(worlds, Role.HOT))


# --- every item at once ----------------------------------------------------------------------


def _bulk_probe() -> Probe:
    """One item retried 260 times; every item locked, expired and swept at once; one
    item superseded forty times, then expired.

    A token counter in a narrow column, a sweep that works in batches (a
    ``LIMIT``), or a history that keeps only the newest rows, shows only when
    there are more acquisitions or records than it holds.
    """
    world = _tagged(DEFAULT_WORLD, "bulk", stamps=2)
    # Past the 127 and 255 acquisitions a one-byte counter column holds.
    calls = [_call("retry_many", worker=3, item=Role.SPLIT, times=260)]
    calls += [_call("try_acquire_lock", worker=1, item=role) for role in ROLES]
    calls += [_call("clock_jumps_past_lock_duration", item=Role.HOT), _call("reset_expired_locks")]
    calls += [_call("try_acquire_lock", worker=2, item=role) for role in ROLES]
    calls += [
        _call("set", worker=2, item=role, status=S.PROCESSED, data={"n": 0}) for role in ROLES
    ]
    calls += [_call("exists", worker=2, item=role) for role in ROLES]
    # Expired by a node's own decision: no longer done for the worker that asked before.
    calls += [
        _call("set", worker=2, item=Role.ENTITY, status=S.EXPIRED, data=None),
        _call("exists", worker=2, item=Role.ENTITY),
    ]
    # A history longer than a store that keeps the newest few rows holds (4, 8, 32).
    calls.append(_call("upsert_many", worker=3, item=Role.HOT, times=40))
    calls += [_call("clock_jumps_past_retention", item=Role.HOT), _call("expire_past_retention")]
    # Expired by the retention worker's instance: no longer done, whoever asks.
    calls += [_call("exists", worker=2, item=role) for role in ROLES]
    return Probe("every item at once", world, tuple(calls))


def _take_over_probe() -> Probe:
    """One item taken over 105 times, each holder before it writing late with its token.

    Its tokens pass the digit boundaries (9 to 10, 99 to 100), where a token
    kept or compared as text orders wrongly (``"10" < "9"``) and the late
    write of the holder before lands.  Another item is then completed with a
    three-digit token and read back.
    """
    world = _tagged(DEFAULT_WORLD, "takeover", stamps=1)
    calls = [
        _call("take_over_many", item=Role.ENTITY_KEY, times=105),
        _call("set", worker=1, item=Role.ENTITY_KEY, status=S.PROCESSED, data={"n": 105}),
        _call("exists", worker=2, item=Role.ENTITY_KEY),
    ]
    return Probe("one item taken over past 10 and 100", world, tuple(calls))


# --- stale tokens ----------------------------------------------------------------------------

#: How worker 1's lock on an item ended before it writes with its token, as steps
#: after its acquisition (``{item}`` is the item's role).
_ENDINGS: tuple[tuple[str, tuple[tuple[str, dict[str, object]], ...]], ...] = (
    (
        "taken over",
        (("clock_to_item_lock_expiry", {"micros": 1}), ("try_acquire_lock", {"worker": 2})),
    ),
    (
        "taken over by the same execution (a redelivery it picked up)",
        (("clock_to_item_lock_expiry", {"micros": 1}), ("try_acquire_lock", {"worker": 1})),
    ),
    (
        "taken over, that lock expired too",
        (
            ("clock_to_item_lock_expiry", {"micros": 1}),
            ("try_acquire_lock", {"worker": 2}),
            ("clock_to_item_lock_expiry", {"micros": 1}),
        ),
    ),
    ("swept", (("clock_to_item_lock_expiry", {"micros": 1}), ("reset_expired_locks", {}))),
    (
        "taken over and completed",
        (
            ("clock_to_item_lock_expiry", {"micros": 1}),
            ("try_acquire_lock", {"worker": 2}),
            ("set", {"worker": 2, "status": S.PROCESSED, "data": {"n": 2}}),
        ),
    ),
    (
        "taken over and released",
        (
            ("clock_to_item_lock_expiry", {"micros": 1}),
            ("try_acquire_lock", {"worker": 2}),
            ("release_lock_as_failed", {"worker": 2, "error": "declined"}),
        ),
    ),
    (
        "taken over, completed and superseded",
        (
            ("clock_to_item_lock_expiry", {"micros": 1}),
            ("try_acquire_lock", {"worker": 2}),
            ("set", {"worker": 2, "status": S.PROCESSED, "data": {"n": 2}}),
            ("upsert", {"worker": 3, "data": {"n": 3}}),
        ),
    ),
    # Not ended: expired but neither swept nor taken over, the token still writes.
    ("expired, not swept", (("clock_to_item_lock_expiry", {"micros": 1}),)),
)
#: Steps that act on every item, not on one.
_SWEEPS = frozenset({"reset_expired_locks", "expire_past_retention"})
#: The writes worker 1 then makes with its token.
_STALE_WRITES: tuple[tuple[str, dict[str, object]], ...] = (
    ("set", {"status": S.PROCESSED, "data": {"n": 1}}),
    ("release_lock_as_failed", {"error": "card declined"}),
    ("upsert", {"data": {"n": 1}}),
    ("set", {"status": S.SKIPPED, "data": None}),
)


def _fencing_probe() -> Probe:
    """Each write by a holder whose lock ended in each way: refused (or, not ended, accepted)."""

    def case(
        steps: Sequence[tuple[str, dict[str, object]]], write: str, arguments: dict[str, object]
    ) -> Callable[[Role], list[Call]]:
        def calls(role: Role) -> list[Call]:
            return [
                _call("try_acquire_lock", worker=1, item=role),
                *(
                    _call(rule, **kwargs) if rule in _SWEEPS else _call(rule, item=role, **kwargs)
                    for rule, kwargs in steps
                ),
                _call("first_hold_writes", item=role, write=write, **arguments),
            ]

        return calls

    cases = [case(steps, *write) for _, steps in _ENDINGS for write in _STALE_WRITES]
    world, calls = _slotted("stale", lambda n: n + 1, cases)
    return Probe("writes with a token whose lock ended", world, calls)


# --- races across instances -----------------------------------------------------------------

#: (racing calls, where the clock stands, how the item is prepared): the pairs
#: whose outcome a store's atomicity decides.  Preparations: "new" (no
#: record), "held" (worker 1's live lock), "done" (Processed), "failed".
_RACES: tuple[tuple[tuple[RaceOp, ...], Instant, str], ...] = (
    ((RaceOp.ACQUIRE, RaceOp.ACQUIRE), Instant.NOW, "new"),
    ((RaceOp.UPSERT, RaceOp.UPSERT), Instant.NOW, "done"),
    ((RaceOp.UPSERT, RaceOp.ACQUIRE), Instant.NOW, "failed"),
    ((RaceOp.UPSERT, RaceOp.SKIP), Instant.NOW, "done"),
    ((RaceOp.SKIP, RaceOp.ACQUIRE), Instant.NOW, "new"),
    ((RaceOp.COMPLETE, RaceOp.UPSERT), Instant.NOW, "held"),
    ((RaceOp.COMPLETE, RaceOp.SWEEP), Instant.PAST_LOCK, "held"),
    ((RaceOp.COMPLETE, RaceOp.ACQUIRE), Instant.PAST_LOCK, "held"),
    ((RaceOp.RELEASE, RaceOp.ACQUIRE), Instant.PAST_LOCK, "held"),
    ((RaceOp.ACQUIRE, RaceOp.RETENTION), Instant.PAST_RETENTION, "done"),
)
#: Yields before each call starts: together, and each one step behind the other.
#: Interleavings: in order, the first call preempted at its first await, the second first.
_SCHEDULES: tuple[tuple[int, ...], ...] = ((), (0, 1), (1,))
_PREPARE: dict[str, tuple[tuple[str, dict[str, object]], ...]] = {
    "new": (),
    "held": (("try_acquire_lock", {"worker": 1}),),
    "done": (
        ("try_acquire_lock", {"worker": 1}),
        ("set", {"worker": 1, "status": S.PROCESSED, "data": {"n": 0}}),
    ),
    "failed": (
        ("try_acquire_lock", {"worker": 1}),
        ("release_lock_as_failed", {"worker": 1, "error": "declined"}),
    ),
}


def _race_probe() -> Probe:
    """Each pair of calls at once, each through its own worker's instance, three interleavings.

    A race that leaves history behind (upserts) is followed by a retention
    sweep past the item's end, whose count is where a second superseded row
    shows: the contract reads only the current record.
    """

    def case(
        ops: tuple[RaceOp, ...], instant: Instant, prepared: str, schedule: tuple[int, ...]
    ) -> Callable[[Role], list[Call]]:
        def calls(role: Role) -> list[Call]:
            steps = [_call(rule, item=role, **kwargs) for rule, kwargs in _PREPARE[prepared]]
            steps.append(
                _call(
                    "race",
                    item=role,
                    ops=list(ops),
                    workers=[2, 3, 1],
                    schedule=schedule,
                    instant=instant,
                    move=ClockMove.NONE,
                    data={"n": 1},
                )
            )
            if RaceOp.UPSERT in ops:
                steps += [
                    _call("clock_jumps_past_retention", item=role),
                    _call("expire_past_retention"),
                ]
            return steps

        return calls

    cases = [case(*race, schedule) for race in _RACES for schedule in _SCHEDULES]
    world, calls = _slotted("race", lambda n: n, cases)
    return Probe("races across instances", world, calls)


def _moving_clock_probe() -> Probe:
    """Each call, on a lock at its last live instant, while the clock moves under it.

    The call starts, waits at its first await, the clock moves (a second on,
    past the lock, a minute back), and the call goes on: a call that reads the
    clock twice (checks expiry with one reading and stamps with another) gives
    an answer no single reading explains.
    """

    def case(op: RaceOp, move: ClockMove) -> Callable[[Role], list[Call]]:
        def calls(role: Role) -> list[Call]:
            return [
                _call("try_acquire_lock", worker=1, item=role),
                _call(
                    "race",
                    item=role,
                    ops=[op],
                    workers=[2, 3, 1],
                    schedule=(0, 1),
                    instant=Instant.LOCK_EXPIRY,
                    move=move,
                    data={"n": 1},
                ),
            ]

        return calls

    ops = (
        RaceOp.ACQUIRE,
        RaceOp.COMPLETE,
        RaceOp.RELEASE,
        RaceOp.UPSERT,
        RaceOp.SKIP,
        RaceOp.EXISTS,
        RaceOp.SWEEP,
        RaceOp.RETENTION,
    )
    moves = (ClockMove.SECOND, ClockMove.PAST_LOCK, ClockMove.BACK)
    cases = [case(op, move) for move in moves for op in ops]
    world, calls = _slotted("moving", lambda n: n, cases)
    return Probe("calls while the clock moves under them", world, calls)


# --- time ------------------------------------------------------------------------------------


def _boundary_calls(item: Role, worker: int = 1, other: int = 2) -> list[Call]:
    """One item through its own lock and retention boundaries, each met exactly and just past."""
    return [
        _call("try_acquire_lock", worker=worker, item=item),
        _call("clock_to_item_lock_expiry", item=item, micros=0),
        _call("try_acquire_lock", worker=other, item=item),  # still live: refused
        _call("reset_expired_locks"),  # and not swept
        _call("clock_to_item_lock_expiry", item=item, micros=1),
        _call("reset_expired_locks"),  # expired: swept to Failed
        _call("try_acquire_lock", worker=other, item=item),  # the retry
        _call("set", worker=other, item=item, status=S.PROCESSED, data={"n": 1}),
        _call("clock_to_item_retention_end", item=item, micros=0),
        _call("expire_past_retention"),  # still kept
        _call("clock_to_item_retention_end", item=item, micros=1),
        _call("expire_past_retention"),  # past it: Expired
        _call("try_acquire_lock", worker=3, item=item),  # retried: the next attempt
        _call("set", worker=3, item=item, status=S.PROCESSED, data={"n": 2}),
        _call("upsert", worker=worker, item=item, data={"n": 3}),  # superseded
    ]


def _with_configs(world: World, configs: dict[Role, str], zone: str = UTC_ZONE) -> World:
    refs = tuple(
        dataclasses.replace(ref, config=WORLD_CONFIGS[configs[role]]) if role in configs else ref
        for role, ref in zip(ROLES, world.refs, strict=True)
    )
    return dataclasses.replace(world, refs=refs, zone=zone)


def _tagged(world: World, tag: str, *, stamps: int = 0) -> World:
    """The world with ``tag/`` before every item key: the same shape, keys of its own.

    ``stamps`` picks who the workers are: their source apps and execution
    ids from :data:`APPS` and :data:`EXECUTIONS` (0 is the plain world), which
    every write must stamp from its own call.
    """
    refs = tuple(dataclasses.replace(ref, item=f"{tag}/{ref.item}") for ref in world.refs)
    return dataclasses.replace(
        world,
        refs=refs,
        apps=APPS[stamps % len(APPS)],
        executions=EXECUTIONS[stamps % len(EXECUTIONS)],
    )


#: The longest options move the clock a century on: they come last.
_CONFIG_ORDER = sorted(WORLD_CONFIGS, key=lambda name: name == "longest")


#: Just over a second before midnight on a month's last day: the boundaries walked
#: next cross the day and the month (a lock kept as a date and a time of day
#: wraps), and every instant of the walk needs all six microsecond digits.  The
#: longest options then carry the clock past 2038 (a 32-bit epoch's end).
_BEFORE_MIDNIGHT = dt.datetime(2026, 3, 31, 23, 59, 58, 999_999, tzinfo=dt.UTC)


def _config_probe(start: dt.datetime = _BEFORE_MIDNIGHT, where: str = "") -> Probe:
    """Each node configuration in a world of its own, one after the other on one store,
    the first starting at ``start``, just before a month's last midnight."""
    worlds = [
        _tagged(_with_configs(DEFAULT_WORLD, {Role.HOT: name}), name) for name in _CONFIG_ORDER
    ]
    worlds[0] = dataclasses.replace(worlds[0], start=start)
    calls = _chained(worlds, lambda _: _boundary_calls(Role.HOT))
    return Probe(
        f"lock and retention boundaries of every node configuration{where}", worlds[0], calls
    )


def _zone_probe(zone: str) -> Probe:
    """A four-hour lock from 09:00 UTC spans the zones' daylight-saving changes at 10:00."""
    world = _with_configs(
        DEFAULT_WORLD, {Role.HOT: "long", Role.ENTITY: "fractional", Role.TENANT: "default"}, zone
    )
    calls = [
        _call("try_acquire_lock", worker=1, item=Role.ENTITY),
        _call("set", worker=1, item=Role.ENTITY, status=S.PROCESSED, data={"n": 1}),
        _call("try_acquire_lock", worker=1, item=Role.TENANT),
        _call("release_lock_as_failed", worker=1, item=Role.TENANT, error="card declined"),
        _call("try_acquire_lock", worker=1, item=Role.HOT),
        _call("clock_to_item_lock_expiry", item=Role.HOT, micros=0),
        _call("reset_expired_locks"),  # still live
        _call("clock_to_item_lock_expiry", item=Role.HOT, micros=1),
        _call("reset_expired_locks"),  # swept
    ]
    return Probe(f"time zone {zone}", world, tuple(calls))


def _lost_reply_probe() -> Probe:
    """Each completing write lands with its reply lost, then its caller retries or releases.

    The caller still holds its token, now spent.  The same write made again
    must succeed and change nothing; ``set(Processed)`` with other data, or a
    release after the completion, must be refused and change nothing.  Then
    an acquisition's reply is lost and the worker finds its lock by reading.
    """
    retries: tuple[dict[str, object], ...] = (
        {"again": True, "release": False, "data": {"n": 1}},
        {"again": False, "release": False, "data": {"n": 2}},
        {"again": False, "release": True, "data": None},
    )

    def case(kind: LandedWrite, retry: dict[str, object]) -> Callable[[Role], list[Call]]:
        return lambda role: [
            _call("try_acquire_lock", worker=1, item=role),
            _call("write_lands_reply_lost", pick=0, kind=kind, data={"n": 1}),
            _call("retry_landed_write", pick=0, **retry),
        ]

    def found_by_reading(role: Role) -> list[Call]:
        return [
            _call("acquire_reply_lost", worker=2, item=role),
            _call("reads_back_own_lock", worker=2, item=role),
            _call("set", worker=2, item=role, status=S.PROCESSED, data={"n": 2}),
        ]

    cases = [case(kind, retry) for kind in LandedWrite for retry in retries]
    world, calls = _slotted("lost", lambda n: 3, [*cases, found_by_reading])
    return Probe("lost replies and the retries after them", world, calls)


def _backwards_probe() -> Probe:
    """The clock jumps back an hour under a live lock, and again under a finished record.

    A lock is live until its ``locked_until`` whatever the clock did before:
    a store that measures a lock by elapsed time, or that refuses a write
    whose ``now`` is before ``updated_at``, shows here.
    """
    world = _tagged(DEFAULT_WORLD, "back", stamps=1)
    calls = [
        _call("try_acquire_lock", worker=1, item=Role.HOT),
        _call("clock_jumps_back", seconds=3600),
        _call("try_acquire_lock", worker=2, item=Role.HOT),  # still live: refused
        _call("reset_expired_locks"),  # and not swept
        _call("set", worker=1, item=Role.HOT, status=S.PROCESSED, data={"n": 1}),
        _call("try_acquire_lock", worker=1, item=Role.ENTITY),
        _call("release_lock_as_failed", worker=1, item=Role.ENTITY, error="declined"),
        _call("clock_jumps_back", seconds=3600),
        _call("try_acquire_lock", worker=2, item=Role.ENTITY),  # the retry, in the past
        _call("upsert", worker=3, item=Role.HOT, data={"n": 2}),
        _call("clock_to_item_lock_expiry", item=Role.ENTITY, micros=1),
        _call("reset_expired_locks"),
        _call("clock_to_item_retention_end", item=Role.HOT, micros=1),
        _call("expire_past_retention"),
        _call("skip_item", worker=3, item=Role.TENANT),  # a new record, attempt 0
        _call("try_acquire_lock", worker=1, item=Role.NEIGHBOUR),
        _call("clock_to_item_lock_expiry", item=Role.NEIGHBOUR, micros=1),
        _call("skip_item", worker=2, item=Role.NEIGHBOUR),  # over an expired lock: allowed
        _call("set", worker=2, item=Role.SCOPE, status=S.EXPIRED, data=None),  # forbidden
    ]
    return Probe("the clock jumps back", world, tuple(calls))


def _begin_probe() -> Probe:
    """A native ``begin`` from every state: new, live, expired, failed, done, skipped, expired."""
    world = _tagged(DEFAULT_WORLD, "begin", stamps=1)
    calls = [
        _call("begin", worker=1, item=Role.HOT),  # new: acquired
        _call("begin", worker=2, item=Role.HOT),  # live: locked
        _call("clock_to_item_lock_expiry", item=Role.HOT, micros=1),
        _call("begin", worker=2, item=Role.HOT),  # expired, unswept: taken over
        _call("release_lock_as_failed", worker=2, item=Role.HOT, error="declined"),
        _call("begin", worker=3, item=Role.HOT),  # failed: retried
        _call("set", worker=3, item=Role.HOT, status=S.PROCESSED, data={"n": 1}),
        _call("begin", worker=1, item=Role.HOT),  # done: completed, with its record
        _call("skip_item", worker=1, item=Role.ENTITY),
        _call("begin", worker=2, item=Role.ENTITY),  # skipped: completed
        _call("clock_to_item_retention_end", item=Role.ENTITY, micros=1),
        _call("expire_past_retention"),
        _call("begin", worker=2, item=Role.ENTITY),  # expired: retried
    ]
    return Probe("begin from every state", world, tuple(calls), requires="begin")


def _limits_world() -> World:
    """Every key part of every item at its limit at once, in characters of three and four
    bytes drawn at random (a fixed draw: the same text every run), which do not compress;
    apps and execution ids at theirs too."""
    rng = random.Random(2704)

    def text(length: int = MAX_KEY_LENGTH, width: int = 4) -> str:
        low, high = (0x20000, 0x2A6DF) if width == 4 else (0x4E00, 0x9FFF)
        return "".join(chr(rng.randint(low, high)) for _ in range(length))

    tenant, entity, entity_key, key = (text(width=w) for w in (4, 3, 4, 3))
    refs = (
        ItemRef(tenant, Scope.ELEMENT, key, entity, entity_key),
        ItemRef(text(), Scope.ELEMENT, key, entity, entity_key),
        ItemRef(tenant, Scope.WORKFLOW, key, entity, entity_key),
        ItemRef(tenant, Scope.ELEMENT, key, text(width=3), entity_key),
        ItemRef(tenant, Scope.ELEMENT, key, entity, text()),
        ItemRef(tenant, Scope.ELEMENT, text(width=3), entity, entity_key, ItemRef.FOREVER),
        ItemRef(tenant, Scope.ELEMENT, key[:-1] + text(1), entity, entity_key),
        ItemRef(tenant, Scope.ELEMENT, text(), entity, text()),
    )
    return World(refs, apps=APPS[2], executions=EXECUTIONS[2])


def _limits_probe() -> Probe:
    """The whole lifecycle of items whose every key part is at its limit, in bytes as in
    characters: what a store's index must hold all together."""
    calls = [
        *_boundary_calls(Role.HOT),
        _call("try_acquire_lock", worker=2, item=Role.VARIANT),
        _call("release_lock_as_failed", worker=2, item=Role.VARIANT, error="declined"),
        _call("upsert", worker=3, item=Role.SPLIT, data={"n": 1}),
        _call("skip_item", worker=1, item=Role.ENTITY_KEY),
        *(_call("exists", worker=2, item=role) for role in ROLES),
    ]
    return Probe("every key part at its limit at once", _limits_world(), tuple(calls))


def _changing_world_probe() -> Probe:
    """What a deployment changes between two deliveries, each once, while records live.

    A node redeployed with another lock duration and retention (a lock taken
    before keeps its options, the next takes the new ones), the workers
    moved to other apps, the process restarted in another zone, an instance
    replaced by a new one while its worker holds a lock.
    """
    world = _tagged(DEFAULT_WORLD, "change", stamps=0)
    calls = [
        _call("try_acquire_lock", worker=1, item=Role.HOT),
        _call("release_lock_as_failed", worker=1, item=Role.HOT, error="declined"),
        _call("try_acquire_lock", worker=2, item=Role.ENTITY),
        _call("redeploy_node", item=Role.HOT, config=WORLD_CONFIGS["short"]),
        _call("redeploy_node", item=Role.ENTITY, config=WORLD_CONFIGS["long"]),
        _call("try_acquire_lock", worker=3, item=Role.HOT),  # under the new lock duration
        _call("clock_to_item_lock_expiry", item=Role.HOT, micros=1),
        _call("reset_expired_locks"),
        _call("first_hold_writes", item=Role.ENTITY, write="set", status=S.PROCESSED, data=None),
        _call("redeploy_apps", apps=APPS[1]),
        _call("try_acquire_lock", worker=2, item=Role.TENANT),
        _call("set", worker=2, item=Role.TENANT, status=S.PROCESSED, data={"n": 1}),
        _call("restart_in_zone", zone=ZONES[1]),
        _call("try_acquire_lock", worker=2, item=Role.NEIGHBOUR),
        _call("instance_restarts", worker=2),
        _call("set", worker=2, item=Role.NEIGHBOUR, status=S.PROCESSED, data={"n": 2}),
        _call("clock_to_item_retention_end", item=Role.TENANT, micros=1),
        _call("expire_past_retention"),
    ]
    return Probe("a world that changes under its records", world, tuple(calls))


def _probes() -> tuple[Probe, ...]:
    return (
        _error_probe(),
        _payload_probe(),
        *(_identity_probe(spelt) for spelt in Spelt),
        _split_probe(),
        _bulk_probe(),
        _take_over_probe(),
        _fencing_probe(),
        _race_probe(),
        _moving_clock_probe(),
        _lost_reply_probe(),
        _backwards_probe(),
        _begin_probe(),
        _config_probe(),
        # The same walk at the far end of time: a century's retention ends just
        # before year 9999, and a double of epoch seconds no longer holds microseconds.
        _config_probe(FAR_END, ", at the far end of time"),
        _limits_probe(),
        _changing_world_probe(),
        *(_zone_probe(zone) for zone in ZONES if zone != UTC_ZONE),
    )


#: Every probe, in the order they run.
PROBES: tuple[Probe, ...] = _probes()
