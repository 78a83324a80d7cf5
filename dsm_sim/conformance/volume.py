"""The volume stage: many ids of realistic shapes, each written and read back on its own.

A store that places records by a 32-bit hash of the key and takes equal
hashes for one item, a cache keyed by a truncated digest, or an index that
folds ids, is wrong once in millions of pairs: no world of eight items meets
it, and the edge probes meet only the collisions the kit knows how to build
(:mod:`dsm_sim.conformance.generate.collisions`).  So under ``thorough`` the
kit also writes :data:`VOLUME` ids drawn from the seed, of the shapes real
item keys have (``ord_<hex>``, UUIDs, ULIDs, numbered invoices), each as a
new item: the acquisition must grant token 1 (no earlier id's record
answers), the completion must land, and, once every id is written, ``get``
must return each id's own record with its own data.

An id that fails is told as the edge probes tell theirs: the id and the one
whose record it met are put in a world of their own and replayed through the
machine (:func:`volume_probe`), so the finding has a story and a program of a
few steps.  The stage costs about 4 µs of the kit per id plus three handler
calls: seconds in memory, minutes on a store reached over a connection.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import string
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.loop import call_timeout
from dsm_sim.conformance.execute.tokens import tokens_factory
from dsm_sim.conformance.generate.probes import Probe
from dsm_sim.conformance.generate.worlds import DEFAULT_WORLD, ROLES, Role, World
from dsm_sim.conformance.probing import UnbuildableMachine, probe_findings
from dsm_sim.conformance.program import Call
from dsm_sim.conformance.verification import Verification
from dsm_sim.model import WORLD_START, ItemRef
from reference_engine.clock import ManualClock
from reference_engine.errors import DsmError
from reference_engine.handler import HandlerFactory
from reference_engine.status import IdempotencyStatus

__all__ = [
    "PROBE_NAME",
    "SHAPES",
    "VOLUME",
    "check_volume",
    "run_volume",
    "volume_ids",
    "volume_probe",
]

#: What a finding of the stage is told as found by.
PROBE_NAME = "many ids of realistic shapes"

#: Ids per profile; the profiles not named here have no volume stage.
VOLUME: dict[str, int] = {"thorough": 100_000}

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_START_MS = int(WORLD_START.timestamp() * 1000)


def _ord(rng: random.Random, n: int) -> str:
    return f"ord_{rng.getrandbits(96):024x}"


def _uuid(rng: random.Random, n: int) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _ulid(rng: random.Random, n: int) -> str:
    """A ULID: 48 bits of milliseconds (ids minted close together) and 80 random bits."""
    value = (_START_MS + n) << 80 | rng.getrandbits(80)
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def _invoice(rng: random.Random, n: int) -> str:
    return f"INV-{2026}-{n:07d}"


def _slug(rng: random.Random, n: int) -> str:
    return "cus_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(14))


#: The shapes of item keys real nodes see, each drawn from the seed.
SHAPES: tuple[Callable[[random.Random, int], str], ...] = (_ord, _uuid, _ulid, _invoice, _slug)


def volume_ids(seed: int, count: int) -> list[str]:
    """``count`` distinct ids, the shapes in turn, the same for the same seed."""
    rng = random.Random(seed)
    ids: list[str] = []
    seen: set[str] = set()
    n = 0
    while len(ids) < count:
        made = SHAPES[n % len(SHAPES)](rng, n // len(SHAPES))
        n += 1
        if made not in seen:
            seen.add(made)
            ids.append(made)
    return ids


def _ref(item: str) -> ItemRef:
    return ItemRef("t1", DEFAULT_WORLD[Role.HOT].scope, item)


async def _bounded(call: Coroutine[Any, Any, Any], limit: float | None) -> Any:
    return await (call if limit is None else asyncio.wait_for(call, limit))


async def _check(
    factory: HandlerFactory,
    ids: list[str],
    limit: float | None,
    progress: Callable[[int], None] | None,
) -> tuple[str, str | None] | None:
    """Write each id, then read each back; the first id that fails, and the id it met."""
    handler = factory(ManualClock(WORLD_START + dt.timedelta(seconds=1)))
    await _bounded(handler.open(), limit)
    try:
        for index, item in enumerate(ids):
            ctx = _ref(item).context(1)
            token = await _bounded(handler.try_acquire_lock(ctx), limit)
            if token != 1:
                return item, await _owner(handler, item, limit)
            held = _ref(item).context(1, lock_token=token)
            await _bounded(handler.set(held, IdempotencyStatus.PROCESSED, {"id": item}), limit)
            if progress is not None and index % 1000 == 0:
                progress(index)
        for index, item in enumerate(ids):
            record = await _bounded(handler.get(_ref(item).context(1)), limit)
            if record is None or record.key.item_key != item or record.data != {"id": item}:
                return item, await _owner(handler, item, limit)
            if progress is not None and index % 1000 == 0:
                progress(len(ids) + index)
    except (TimeoutError, DsmError):
        return None  # a store error is the other stages' to report, not a collision
    finally:
        await _bounded(handler.close(), limit)
    return None


async def _owner(handler: Any, item: str, limit: float | None) -> str | None:
    """The id whose record ``item`` met: the key its record carries, or its data's id."""
    try:
        record = await _bounded(handler.get(_ref(item).context(1)), limit)
    except (TimeoutError, DsmError):
        return None
    if record is None:
        return None
    if record.key.item_key != item:
        return str(record.key.item_key)
    data = record.data or {}
    other = data.get("id")
    return other if isinstance(other, str) and other != item else None


def check_volume(
    factory: HandlerFactory,
    seed: int,
    count: int,
    *,
    limit: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[str, str | None] | None:
    """Run the stage on a fresh handler: None, or (the id that failed, the id it met)."""
    ids = volume_ids(seed, count)
    return asyncio.run(_check(factory, ids, limit, progress))


def volume_probe(item: str, other: str | None) -> Probe:
    """The failing id and the id it met, as a fixed program: the other written, then the id."""
    refs = list(DEFAULT_WORLD.refs)
    hot = _ref(item)
    refs[ROLES.index(Role.HOT)] = hot
    if other is not None and other != item:
        refs[ROLES.index(Role.VARIANT)] = _ref(other)
    world = World(tuple(refs))
    calls = [
        Call.of("try_acquire_lock", worker=1, item=Role.VARIANT),
        Call.of(
            "set",
            worker=1,
            item=Role.VARIANT,
            status=IdempotencyStatus.PROCESSED,
            data={"id": other},
        ),
        Call.of("exists", worker=2, item=Role.HOT),
        Call.of("try_acquire_lock", worker=2, item=Role.HOT),
        Call.of(
            "set", worker=2, item=Role.HOT, status=IdempotencyStatus.PROCESSED, data={"id": item}
        ),
        Call.of("get", worker=2, item=Role.VARIANT),
    ]
    if other is None or other == item:
        calls = calls[2:]
    return Probe(PROBE_NAME, world, tuple(calls))


def run_volume(verification: Verification, budget: str, count: int | None = None) -> None:
    """The stage, if ``budget`` (a profile) has one (or of ``count`` ids); a failing id is
    booked as a probe's finding."""
    count = VOLUME.get(budget, 0) if count is None else count
    if not count:
        return
    plan = verification.plan
    found = check_volume(
        tokens_factory(plan.factory, plan.tokens),
        plan.seed,
        count,
        limit=plan.limit,
        progress=lambda done: plan.tell("volume (ids)", done, 2 * count),
    )
    verification.checks["key_identity"] += count
    if found is None:
        return
    probe = volume_probe(*found)
    machine = plan.machine(RunStats())
    with call_timeout(plan.limit):
        try:
            for finding in probe_findings(machine, found=verification.known, probes=(probe,)):
                verification.book(finding.violation, machine, found_by=probe.name, examples=0)
        except UnbuildableMachine:
            return  # the search reports a handler that cannot be built, in its own words
    if plan.stop_on_first or verification.all_found():
        verification.done, verification.settled = True, verification.all_found()
