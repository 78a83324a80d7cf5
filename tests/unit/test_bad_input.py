"""Bad input through the real path: settings parsing, the factory, the contextual machine.

Every case asserts the named error, that its message says what was wrong and
what is allowed, and that the store is byte-for-byte as it was before the
call.  The item and payload cases run on every store: the in-memory reference
model always, SQLite in memory, and PostgreSQL, Redis and MariaDB when
``DSM_TEST_POSTGRES_URL``, ``DSM_TEST_REDIS_URL`` and ``DSM_TEST_MARIADB_URL``
are set.
Quotes and SQL fragments are not errors: they must be stored verbatim and
touch nothing else, which is asserted the same way.
"""

from __future__ import annotations

import asyncio
import collections.abc
import concurrent.futures
import copy
import dataclasses
import datetime as dt
import enum
import importlib
import inspect
import json
import pickle
import pkgutil
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any

import pytest

from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.config import parse_node_settings
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.engine.executor import Message, NodeOutcome
from reference_engine.engine.loader import MAX_DEPTH, InvalidWorkflowError, load_workflow
from reference_engine.engine.workflow import NodeTypeRegistry, WorkflowEngine
from reference_engine.errors import (
    ConfigurationError,
    DsmError,
    DuplicateElementError,
    InstantOutOfRangeError,
    InvalidClockError,
    InvalidItemError,
    InvalidOptionError,
    InvalidSettingsError,
    MissingDataStateMachineError,
    PayloadTooLargeError,
    StaleLockError,
    UnknownHandlerError,
    UnknownScopeError,
    UnsupportedStatusError,
)
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler
from reference_engine.machine import ContextualDataStateMachine
from reference_engine.nodes import approval, correction, invoice, screening
from reference_engine.nodes.invoice import FakeBillingApi, InvoiceDispatchExecutor
from reference_engine.record import MAX_DATA_BYTES, MAX_ERROR_DETAIL
from reference_engine.registry import HandlerRegistry, load_factory
from reference_engine.status import IdempotencyStatus

pytestmark = pytest.mark.unit

S = IdempotencyStatus
START = dt.datetime(2026, 4, 1, 8, 0, tzinfo=UTC)
HANDLER_KEY = "built-in"
GOOD_SETTINGS = {"dataStateMachine": {"handler": HANDLER_KEY, "scope": "Element"}}
ELEMENT = Element(id="element-1", workflow_id="wf-1", node_type="invoice-dispatch")
THREAD = ExecutionThread(execution_id="run-1", tenant_id="tenant-1", source_app_id="app-1")


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


# --- the stores --------------------------------------------------------------------------------

Snapshot = list[str]


@dataclass(frozen=True, slots=True)
class Store:
    """A handler factory plus a ground-truth read of everything it has stored."""

    name: str
    factory: HandlerFactory
    snapshot: Callable[[StateHandler], Awaitable[Snapshot]]


async def _memory_snapshot(handler: StateHandler) -> Snapshot:
    assert isinstance(handler, InMemoryStateHandler)
    return sorted(repr(r.to_state_record()) for r in handler.model.records())


async def _redis_snapshot(handler: StateHandler) -> Snapshot:
    from reference_engine.handlers.redis_handler import RedisStateHandler

    assert isinstance(handler, RedisStateHandler)
    return sorted(repr(r) for r in await handler.records())


async def _sql_snapshot(handler: StateHandler) -> Snapshot:
    from sqlalchemy import select

    from reference_engine.handlers.sql.handler import SqlStateHandler
    from reference_engine.handlers.sql.schema import process_state_logs

    assert isinstance(handler, SqlStateHandler)
    async with handler.engine.connect() as conn:
        rows = (await conn.execute(select(process_state_logs))).all()
    return sorted(repr(tuple(row)) for row in rows)


def _sqlite_store() -> Store:
    factory_module = pytest.importorskip("reference_engine.handlers.sql.factory")
    return Store("sqlite", factory_module.sqlite_memory_handler, _sql_snapshot)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("sqlite", marks=pytest.mark.integration),
        pytest.param("postgres", marks=[pytest.mark.integration, pytest.mark.postgres]),
        pytest.param("redis", marks=[pytest.mark.integration, pytest.mark.redis]),
        pytest.param("mariadb", marks=[pytest.mark.integration, pytest.mark.mariadb]),
    ]
)
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    if request.param == "memory":
        return Store("memory", in_memory_handler, _memory_snapshot)
    if request.param == "sqlite":
        return _sqlite_store()
    if request.param == "postgres":
        postgres_url: str = request.getfixturevalue("postgres_url")
        from reference_engine.handlers.sql.factory import (
            POSTGRES_TEST_URL_ENV,
            postgres_test_handler,
        )

        monkeypatch.setenv(POSTGRES_TEST_URL_ENV, postgres_url)
        return Store("postgres", postgres_test_handler, _sql_snapshot)
    if request.param == "mariadb":
        mariadb_url: str = request.getfixturevalue("mariadb_url")
        from reference_engine.handlers.sql.factory import (
            MARIADB_TEST_URL_ENV,
            mariadb_test_handler,
        )

        monkeypatch.setenv(MARIADB_TEST_URL_ENV, mariadb_url)
        return Store("mariadb", mariadb_test_handler, _sql_snapshot)
    redis_url: str = request.getfixturevalue("redis_url")
    from reference_engine.handlers.redis_factory import TEST_REDIS_ENV, redis_test_handler

    monkeypatch.setenv(TEST_REDIS_ENV, redis_url)
    return Store("redis", redis_test_handler, _redis_snapshot)


@dataclass
class Node:
    """One node execution's machine, built the way the engine builds it, on a seeded store."""

    machine: ContextualDataStateMachine
    handler: StateHandler
    store: Store
    factory: DataStateMachineFactory

    async def snapshot(self) -> Snapshot:
        return await self.store.snapshot(self.handler)


@asynccontextmanager
async def node(
    store: Store, settings: Mapping[str, Any] = GOOD_SETTINGS, clock: Clock | None = None
) -> AsyncIterator[Node]:
    """Settings -> registry -> factory -> machine, with a few records already written."""
    registry = HandlerRegistry(clock or ManualClock(START))
    registry.register(HANDLER_KEY, store.factory)
    factory = DataStateMachineFactory(registry)
    try:
        machine = await factory.create(ELEMENT, THREAD, parse_node_settings(settings))
        assert isinstance(machine, ContextualDataStateMachine)
        await machine.upsert("seed-done", {"charge": "ch_1"})
        await machine.upsert("seed-done", {"charge": "ch_2"})
        assert await machine.try_acquire_lock("seed-locked")
        seeded = Node(machine, machine.handler, store, factory)
        # Current + superseded "seed-done" and the held "seed-locked": the ground truth
        # must see all three, or "nothing was written" would compare two empty lists.
        assert len(await seeded.snapshot()) == 3
        yield seeded
    finally:
        await registry.close()


def check_message(error: BaseException, *phrases: str) -> None:
    """The message must name the problem and what is allowed, in the reader's words."""
    text = str(error)
    missing = [p for p in phrases if p not in text]
    assert not missing, f"{type(error).__name__} message {text!r} lacks {missing}"


# --- item keys ---------------------------------------------------------------------------------

Call = Callable[[ContextualDataStateMachine, Any], Awaitable[object]]

OPERATIONS: dict[str, Call] = {
    "exists": lambda m, key: m.exists(key),
    "get": lambda m, key: m.get(key),
    "try_acquire_lock": lambda m, key: m.try_acquire_lock(key),
    "begin": lambda m, key: m.begin(key),
    "set": lambda m, key: m.set(key, S.SKIPPED, {"why": "test"}),
    "upsert": lambda m, key: m.upsert(key, {"v": 1}),
    "release_lock_as_failed": lambda m, key: m.release_lock_as_failed(key, "boom"),
}

#: (bad item key, phrases its error message must contain)
BAD_ITEM_KEYS: dict[str, tuple[object, tuple[str, ...]]] = {
    "empty": ("", ("item_key", "must not be empty")),
    "none": (None, ("item_key", "must be a string", "NoneType")),
    "int": (42, ("item_key", "must be a string", "int")),
    "non-utf8-bytes": (b"\xff\xfeinv", ("item_key", "must be a string", "bytes")),
    "oversized": ("k" * (MAX_KEY_LENGTH + 1), ("item_key", "257 characters", "limit is 256")),
    "lone-surrogate": ("inv-\udc80", ("item_key", "not valid Unicode text", "UTF-8")),
    "nul": ("inv\x00-1", ("item_key", "must not contain NUL")),
    # Unhashable values: refused by name before anything hashes them.
    "list": (["inv", 1], ("item_key", "must be a string", "at most 256", "list", "['inv', 1]")),
    "dict": ({"id": "inv-1"}, ("item_key", "must be a string", "dict", "{'id': 'inv-1'}")),
    "set": ({"inv-1"}, ("item_key", "must be a string", "set")),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize("case", list(BAD_ITEM_KEYS))
def test_bad_item_keys_are_refused_and_nothing_is_written(
    store: Store, case: str, operation: str
) -> None:
    key, phrases = BAD_ITEM_KEYS[case]

    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            with pytest.raises(InvalidItemError) as info:
                await OPERATIONS[operation](n.machine, key)
            check_message(info.value, *phrases)
            assert info.value.field == "item_key"
            assert await n.snapshot() == before

    run(scenario)


BAD_ENTITY_KEYS: dict[str, tuple[object, tuple[str, ...]]] = {
    "int": (7, ("item_entity_key", "must be a string", "int")),
    "oversized": ("e" * 300, ("item_entity_key", "300 characters", "limit is 256")),
    "lone-surrogate": ("\ud800", ("item_entity_key", "not valid Unicode text")),
    "list": (["batch", 7], ("item_entity_key", "must be a string", "list", "['batch', 7]")),
    "dict": ({"batch": 7}, ("item_entity_key", "must be a string", "dict", "{'batch': 7}")),
}

#: Every machine call, with a good item key and the entity key under test.
ENTITY_OPERATIONS: dict[str, Call] = {
    "exists": lambda m, entity: m.exists("inv-1", entity),
    "get": lambda m, entity: m.get("inv-1", entity),
    "try_acquire_lock": lambda m, entity: m.try_acquire_lock("inv-1", entity),
    "begin": lambda m, entity: m.begin("inv-1", entity),
    "set": lambda m, entity: m.set("inv-1", S.SKIPPED, {"why": "test"}, entity),
    "upsert": lambda m, entity: m.upsert("inv-1", {"v": 1}, entity),
    "release_lock_as_failed": lambda m, entity: m.release_lock_as_failed("inv-1", "boom", entity),
}


@pytest.mark.parametrize("operation", list(ENTITY_OPERATIONS))
@pytest.mark.parametrize("case", list(BAD_ENTITY_KEYS))
def test_bad_item_entity_keys_are_refused(store: Store, case: str, operation: str) -> None:
    key, phrases = BAD_ENTITY_KEYS[case]

    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            with pytest.raises(InvalidItemError) as info:
                await ENTITY_OPERATIONS[operation](n.machine, key)
            check_message(info.value, *phrases)
            assert info.value.field == "item_entity_key"
            assert await n.snapshot() == before

    run(scenario)


def test_an_unhashable_key_is_refused_when_the_token_is_looked_up() -> None:
    """``token_for`` and ``context_for`` validate before the token table is consulted."""

    async def scenario() -> None:
        async with node(Store("memory", in_memory_handler, _memory_snapshot)) as n:
            for call in (
                lambda: n.machine.token_for(["inv-1"]),  # type: ignore[arg-type]
                lambda: n.machine.token_for("inv-1", {"e": 1}),  # type: ignore[arg-type]
                lambda: n.machine.context_for({"k": 1}),  # type: ignore[arg-type]
            ):
                with pytest.raises(InvalidItemError, match="must be a string"):
                    call()
            # The held token is still found by its plain text and by a str subclass of it.
            assert n.machine.token_for("seed-locked") == 1
            assert n.machine.token_for(Tagged("seed-locked")) == 1

    run(scenario)


def test_a_key_of_exactly_the_limit_is_accepted(store: Store) -> None:
    """The boundary: 256 characters (multi-byte ones too) is stored whole."""
    key = "é" * MAX_KEY_LENGTH

    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock(key)
            await n.machine.set(key, S.PROCESSED, {"ok": True})
            record = await n.machine.get(key)
            assert record is not None
            assert record.key.item_key == key

    run(scenario)


#: Hostile but legal keys: each must be stored verbatim and must not reach another record.
HOSTILE_KEYS = [
    "O'Brien",
    'say "hi"',
    "'; DROP TABLE process_state_logs; --",
    "1' OR '1'='1",
    "%",
    "_",
    "inv-*",
    "[a-z]?",
    "\\x00\\",
    "{dsm}:rec:1:a",
    "${jndi:ldap://x}",
    "{{7*7}}",
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_quotes_and_sql_fragments_are_data_not_code(store: Store, key: str) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            assert not await n.machine.exists(key)  # no wildcard matches "seed-done"
            assert await n.machine.try_acquire_lock(key)
            await n.machine.set(key, S.PROCESSED, {"echo": key})
            record = await n.machine.get(key)
            assert record is not None
            assert (record.key.item_key, record.data) == (key, {"echo": key})
            after = await n.snapshot()
            assert len(after) == len(before) + 1
            assert set(before) <= set(after), "a hostile key changed another record"
            assert await n.machine.exists("seed-done")
            assert not await n.machine.try_acquire_lock("seed-locked")

    run(scenario)


# --- keys that are str subclasses ----------------------------------------------------------------


class Channel(str, enum.Enum):  # noqa: UP042  # the pre-StrEnum spelling, on purpose
    EMAIL = "inv-email"


class Mode(enum.StrEnum):
    EMAIL = "inv-email"


class Tagged(str):
    """A user's str subclass with a __str__ of its own, as a formatting f-string would use."""

    def __str__(self) -> str:
        return f"Tagged({super().__str__()})"


#: Values equal to "inv-email" that format differently: each must reach the same record.
STR_SUBCLASS_KEYS: dict[str, str] = {
    "str-enum-mixin": Channel.EMAIL,
    "strenum": Mode.EMAIL,
    "user-subclass": Tagged("inv-email"),
}


@pytest.mark.parametrize("first", ["subclass", "plain"])
@pytest.mark.parametrize("case", list(STR_SUBCLASS_KEYS))
def test_a_str_subclass_key_reaches_the_record_of_its_plain_text(
    store: Store, case: str, first: str
) -> None:
    subclass_key = STR_SUBCLASS_KEYS[case]
    plain_key = "inv-email"
    writer, reader = (subclass_key, plain_key) if first == "subclass" else (plain_key, subclass_key)

    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            assert await n.machine.try_acquire_lock(writer, item_entity_key=writer)
            await n.machine.set(writer, S.PROCESSED, {"via": case}, item_entity_key=writer)
            # Another execution asks with the other spelling: one item, one record.
            other = await n.factory.create(
                ELEMENT,
                ExecutionThread(execution_id="run-2", tenant_id="tenant-1", source_app_id="app-1"),
                parse_node_settings(GOOD_SETTINGS),
            )
            assert await other.exists(reader, reader)
            assert not await other.try_acquire_lock(reader, reader)
            record = await other.get(reader, reader)
            assert record is not None
            assert type(record.key.item_key) is str and type(record.key.item_entity_key) is str
            assert (record.key.item_key, record.data) == (plain_key, {"via": case})
            assert len(await n.snapshot()) == len(before) + 1

    run(scenario)


class IdsMixin(str, enum.Enum):  # noqa: UP042  # the pre-StrEnum spelling, on purpose
    TENANT = "tenant-1"
    ELEMENT = "element-1"
    RUN = "run-9"


class IdsStrEnum(enum.StrEnum):
    TENANT = "tenant-1"
    ELEMENT = "element-1"
    RUN = "run-9"


#: How each kind of str subclass spells an id.
ID_SPELLINGS: dict[str, Callable[[str], str]] = {
    "str-enum-mixin": lambda text: IdsMixin(text),
    "strenum": lambda text: IdsStrEnum(text),
    "user-subclass": Tagged,
}


@pytest.mark.parametrize("case", list(ID_SPELLINGS))
def test_str_subclass_execution_ids_key_the_same_records(store: Store, case: str) -> None:
    """Tenant, element and execution ids given as str subclasses address the plain-text records."""
    wrap = ID_SPELLINGS[case]

    async def scenario() -> None:
        async with node(store) as n:
            element = Element(
                id=wrap("element-1"), workflow_id="wf-1", node_type="invoice-dispatch"
            )
            thread = ExecutionThread(
                execution_id=wrap("run-9"), tenant_id=wrap("tenant-1"), source_app_id="app-1"
            )
            machine = await n.factory.create(element, thread, parse_node_settings(GOOD_SETTINGS))
            assert isinstance(machine, ContextualDataStateMachine)
            ctx = machine.base_ctx
            assert all(
                type(v) is str for v in (ctx.tenant_id, ctx.entity_id, ctx.entity_execution_id)
            )
            assert await machine.exists("seed-done")
            assert not await machine.try_acquire_lock("seed-locked")

    run(scenario)


# --- data payloads -----------------------------------------------------------------------------


class _Quantity(int):
    """An ``int`` subclass: the payload walk checks it as an integer, not as its exact type."""


#: (bad payload, expected error, phrases its message must contain)
BAD_PAYLOADS: dict[str, tuple[object, type[InvalidItemError], tuple[str, ...]]] = {
    "oversized": (
        {"blob": "x" * MAX_DATA_BYTES},
        PayloadTooLargeError,
        (f"{MAX_DATA_BYTES + 11} bytes", f"limit is {MAX_DATA_BYTES} bytes", "reference"),
    ),
    "list-not-object": ([1, 2], InvalidItemError, ("data must be a JSON object", "list")),
    "text-not-object": ("done", InvalidItemError, ("data must be a JSON object", "str")),
    "nan": ({"amount": float("nan")}, InvalidItemError, ("not JSON-serialisable",)),
    "infinity": ({"amount": float("inf")}, InvalidItemError, ("not JSON-serialisable",)),
    "bytes-value": ({"raw": b"\xff"}, InvalidItemError, ("not JSON-serialisable", "bytes")),
    "set-value": ({"tags": {"a"}}, InvalidItemError, ("not JSON-serialisable", "set")),
    "lone-surrogate": ({"note": "\ud83d"}, InvalidItemError, ("not JSON-serialisable", "utf-8")),
    "mixed-key-types": ({"a": 1, 2: "b"}, InvalidItemError, ("not JSON-serialisable",)),
    # Past MAX_INT_DIGITS digits, as a value, deep in a list, and as an int subclass.
    "integer-101-digits": ({"n": 10**100}, InvalidItemError, ("more than 100 digits", "string")),
    "nested-negative-integer": (
        {"lines": [{"qty": 1}, {"qty": -(10**100)}]},
        InvalidItemError,
        ("more than 100 digits",),
    ),
    "int-subclass-101-digits": (
        {"n": _Quantity(10**100)},
        InvalidItemError,
        ("more than 100 digits",),
    ),
}


@pytest.mark.parametrize("via", ["set", "upsert"])
@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_bad_payloads_are_refused_and_the_lock_is_kept(store: Store, case: str, via: str) -> None:
    payload, error, phrases = BAD_PAYLOADS[case]

    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            before = await n.snapshot()
            write = (
                n.machine.set("inv-1", S.PROCESSED, payload)  # type: ignore[arg-type]
                if via == "set"
                else n.machine.upsert("inv-1", payload)  # type: ignore[arg-type]
            )
            with pytest.raises(error) as info:
                await write
            check_message(info.value, *phrases)
            assert info.value.field == "data"
            assert await n.snapshot() == before
            # Refused before the store saw it, so the execution still holds its lock.
            await n.machine.set("inv-1", S.PROCESSED, {"ok": True})
            record = await n.machine.get("inv-1")
            assert record is not None
            assert (record.status, record.data) == (S.PROCESSED, {"ok": True})

    run(scenario)


def _stored_as_written(store: Store, payload: Mapping[str, object]) -> None:
    """An upsert of ``payload`` is accepted and reads back equal to it."""

    async def scenario() -> None:
        async with node(store) as n:
            await n.machine.upsert("inv-1", payload)
            record = await n.machine.get("inv-1")
            assert record is not None
            assert record.data == payload

    run(scenario)


def test_a_payload_of_exactly_the_limit_is_accepted(store: Store) -> None:
    payload = {"blob": "x" * (MAX_DATA_BYTES - 11)}
    assert len(json.dumps(payload, separators=(",", ":"))) == MAX_DATA_BYTES
    _stored_as_written(store, payload)


def test_an_integer_of_exactly_the_digit_limit_is_accepted(store: Store) -> None:
    _stored_as_written(store, {"n": -(10**100 - 1), "lines": [10**100 - 1, True, None, 1.5, "x"]})


def test_non_string_payload_keys_are_refused(store: Store) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            try:
                await n.machine.upsert("inv-1", {1: "a"})  # type: ignore[dict-item]
            except InvalidItemError as exc:
                check_message(exc, "keys", "string")
            else:
                raise AssertionError("a payload with an int key was accepted")
            assert await n.snapshot() == before

    run(scenario)


# --- statuses ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "use"), [(S.SUPERSEDED, "upsert()"), (S.PROCESSING, "try_acquire_lock()")]
)
def test_statuses_set_cannot_write(store: Store, status: IdempotencyStatus, use: str) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            with pytest.raises(UnsupportedStatusError) as info:
                await n.machine.set("seed-done", status)
            check_message(info.value, f"cannot write status {status.label}", use)
            assert await n.snapshot() == before

    run(scenario)


@pytest.mark.parametrize("status", ["processed", 2, None])
def test_a_status_of_the_wrong_type_is_refused(store: Store, status: object) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            with pytest.raises(DsmError) as info:
                await n.machine.set("inv-1", status)  # type: ignore[arg-type]
            check_message(info.value, "status", "Processed", "Skipped")
            assert await n.snapshot() == before

    run(scenario)


@pytest.mark.parametrize("detail", ["card declined \udc80", "card declined \x00 twice"])
def test_an_unencodable_error_detail_still_records_the_failure(store: Store, detail: str) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            await n.machine.release_lock_as_failed("inv-1", detail)
            record = await n.machine.get("inv-1")
            assert record is not None
            assert record.status is S.FAILED
            assert record.error_detail is not None
            record.error_detail.encode("utf-8")  # what every store can hold
            assert record.error_detail.startswith("card declined ")

    run(scenario)


class UnprintableDetail(Exception):
    """An error whose ``__str__`` raises, as a broken exception class of a user's API would."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


def test_an_error_detail_whose_str_raises_still_records_the_failure(store: Store) -> None:
    """Refusing it would leave the lock held until it expires; the failure is recorded by type."""

    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            await n.machine.release_lock_as_failed("inv-1", UnprintableDetail())  # type: ignore[arg-type]
            record = await n.machine.get("inv-1")
            assert record is not None
            assert (record.status, record.locked_until) == (S.FAILED, None)
            assert record.error_detail == (
                "<UnprintableDetail error detail; str() raised RuntimeError>"
            )
            assert n.machine.token_for("inv-1") is None
            # The lock is free: the next delivery takes it with the next token.
            assert await n.machine.try_acquire_lock("inv-1")
            assert n.machine.token_for("inv-1") == 2

    run(scenario)


def test_an_overlong_error_detail_is_cut_to_the_limit(store: Store) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            await n.machine.release_lock_as_failed("inv-1", "é" * (MAX_ERROR_DETAIL + 10))
            record = await n.machine.get("inv-1")
            assert record is not None
            assert record.error_detail == "é" * MAX_ERROR_DETAIL

    run(scenario)


# --- the clock ---------------------------------------------------------------------------------


class SwitchClock:
    """A manual clock whose next readings can be replaced by any value, as a user's clock may."""

    def __init__(self) -> None:
        self.base = ManualClock(START)
        self.reading: Any = None

    def now(self) -> dt.datetime:
        return self.base.now() if self.reading is None else self.reading


#: What a user's clock may return instead of an aware datetime, and how the error shows it.
BAD_CLOCK_READINGS: dict[str, tuple[object, str]] = {
    "naive": (START.replace(tzinfo=None), "naive datetime"),
    "text": (START.isoformat(), "str '2026-04-01T08:00:00+00:00'"),
    "epoch-seconds": (1_775_030_400.0, "float 1775030400.0"),
    "date": (START.date(), "date datetime.date(2026, 4, 1)"),
}

#: Every call that reads the clock: the writes, ``exists`` and both sweeps.
ClockCall = Callable[[Node], Awaitable[object]]
CLOCK_OPERATIONS: dict[str, ClockCall] = {
    "exists": lambda n: n.machine.exists("seed-done"),
    "try_acquire_lock": lambda n: n.machine.try_acquire_lock("inv-1"),
    "begin": lambda n: n.machine.begin("inv-1"),
    "set": lambda n: n.machine.set("inv-1", S.SKIPPED, {"why": "test"}),
    "upsert": lambda n: n.machine.upsert("seed-done", {"charge": "ch_3"}),
    "release_lock_as_failed": lambda n: n.machine.release_lock_as_failed("seed-locked", "boom"),
    "reset_expired_locks": lambda n: n.handler.reset_expired_locks(),
    "expire_past_retention": lambda n: n.handler.expire_past_retention(),
}


@pytest.mark.parametrize("operation", list(CLOCK_OPERATIONS))
@pytest.mark.parametrize("case", list(BAD_CLOCK_READINGS))
def test_a_clock_that_returns_no_aware_datetime_is_refused_alike_on_every_store(
    store: Store, case: str, operation: str
) -> None:
    reading, shown = BAD_CLOCK_READINGS[case]
    clock = SwitchClock()

    async def scenario() -> None:
        async with node(store, clock=clock) as n:
            before = await n.snapshot()
            clock.reading = reading
            with pytest.raises(InvalidClockError) as info:
                await CLOCK_OPERATIONS[operation](n)
            check_message(info.value, shown, "must return a timezone-aware", "Nothing was written")
            assert isinstance(info.value, ConfigurationError)
            # Reading a stored record needs no clock, on every store alike.
            record = await n.machine.get("seed-done")
            assert record is not None and record.data == {"charge": "ch_2"}
            clock.reading = None
            assert await n.snapshot() == before

    run(scenario)


def test_a_clock_in_another_offset_is_read_in_utc_on_every_store(store: Store) -> None:
    clock = SwitchClock()
    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))

    async def scenario() -> None:
        async with node(store, clock=clock) as n:
            clock.reading = START.astimezone(kolkata)
            assert await n.machine.try_acquire_lock("inv-1")
            locked = await n.machine.get("inv-1")
            await n.machine.upsert("inv-2", {"v": 1})
            done = await n.machine.get("inv-2")
            assert locked is not None and done is not None
            instants = {
                "locked_until": locked.locked_until,
                "created_at": done.created_at,
                "updated_at": done.updated_at,
                "retain_until": done.retain_until,
            }
            expected = {
                "locked_until": START + dt.timedelta(minutes=30),
                "created_at": START,
                "updated_at": START,
                "retain_until": START + dt.timedelta(days=30),
            }
            assert instants == expected
            offsets = {name: v.utcoffset() for name, v in instants.items() if v is not None}
            assert set(offsets.values()) == {dt.timedelta(0)}, offsets

    run(scenario)


# --- the end of the calendar -------------------------------------------------------------------

#: One hour before the last instant a datetime can hold: lock (30 minutes) fits, retention not.
NEAR_THE_END = dt.datetime(9999, 12, 31, 23, 0, tzinfo=UTC)

#: Every call that computes an instant from now: the writes (and begin, which may acquire).
DEADLINE_OPERATIONS: dict[str, ClockCall] = {
    name: CLOCK_OPERATIONS[name]
    for name in ("try_acquire_lock", "begin", "set", "upsert", "release_lock_as_failed")
}


@pytest.mark.parametrize("operation", list(DEADLINE_OPERATIONS))
def test_a_retention_past_year_9999_is_a_named_error_naming_instant_and_option(
    store: Store, operation: str
) -> None:
    clock = SwitchClock()

    async def scenario() -> None:
        async with node(store, clock=clock) as n:
            before = await n.snapshot()
            clock.reading = NEAR_THE_END
            with pytest.raises(InstantOutOfRangeError) as info:
                await DEADLINE_OPERATIONS[operation](n)
            error = info.value
            assert (error.option, error.now) == ("retention", NEAR_THE_END.isoformat())
            check_message(error, "'retention'", "9999-12-31T23:00:00+00:00", "30 days", "9999")
            assert isinstance(error, InvalidOptionError)
            # Reads compute no instant and still answer.
            assert await n.machine.exists("seed-done")
            clock.reading = None
            assert await n.snapshot() == before

    run(scenario)


def test_a_lock_past_year_9999_names_the_lock_duration(store: Store) -> None:
    clock = SwitchClock()
    keep_forever = {"dataStateMachine": {"options": {"lockDuration": "30m", "retention": None}}}

    async def scenario() -> None:
        async with node(store, keep_forever, clock=clock) as n:
            before = await n.snapshot()
            clock.reading = dt.datetime(9999, 12, 31, 23, 45, tzinfo=UTC)
            for acquire in (n.machine.try_acquire_lock, n.machine.begin):
                with pytest.raises(InstantOutOfRangeError) as info:
                    await acquire("inv-1")
                assert info.value.option == "lockDuration"
                check_message(info.value, "'lockDuration'", "9999-12-31T23:45:00+00:00", "0:30:00")
            # Without a retention nothing else needs a later instant: a decision still lands.
            await n.machine.set("inv-2", S.SKIPPED)
            assert len(await n.snapshot()) == len(before) + 1

    run(scenario)


def _calendar_end_outcomes(store: Store) -> list[str]:
    """Each write near the end of the calendar on ``store``: what it raised, or that it landed."""
    clock = SwitchClock()
    outcomes: list[str] = []

    async def scenario() -> None:
        async with node(store, clock=clock) as n:
            handler, ctx = n.handler, n.machine.context_for("inv-1")
            held = dataclasses.replace(ctx, lock_token=1)
            calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("acquire", lambda: handler.try_acquire_lock(ctx)),
                ("set(Processed) after it", lambda: handler.set(ctx, S.PROCESSED, {"a": 1})),
                ("set with a token", lambda: handler.set(held, S.PROCESSED, {"a": 1})),
                ("release without a token", lambda: handler.release_lock_as_failed(ctx, "x")),
                ("release with a token", lambda: handler.release_lock_as_failed(held, "x")),
            ]
            clock.reading = NEAR_THE_END
            for name, call in calls:
                try:
                    await call()
                    outcomes.append(f"{name}: lands")
                except DsmError as exc:
                    outcomes.append(f"{name}: {type(exc).__name__}")

    run(scenario)
    return outcomes


def test_every_store_refuses_the_set_after_a_refused_acquire_as_the_model(store: Store) -> None:
    # The model checks the record's retention before it looks at the lock: a set past
    # year 9999 is InstantOutOfRangeError whether or not the caller holds the lock.
    expected = _calendar_end_outcomes(Store("memory", in_memory_handler, _memory_snapshot))
    assert expected[:3] == [
        "acquire: InstantOutOfRangeError",
        "set(Processed) after it: InstantOutOfRangeError",
        "set with a token: InstantOutOfRangeError",
    ]
    assert _calendar_end_outcomes(store) == expected


# --- node settings -----------------------------------------------------------------------------

#: (settings as given to the node, expected error, phrases its message must contain)
BAD_SETTINGS: dict[str, tuple[object, type[ConfigurationError], tuple[str, ...]]] = {
    "malformed-json": ('{"dataStateMachine": {', InvalidSettingsError, ("not valid JSON",)),
    "empty-text": ("", InvalidSettingsError, ("not valid JSON",)),
    "non-utf8-bytes": (b"\xff\xfe\x00{", InvalidSettingsError, ("not valid JSON",)),
    "json-array": ("[1, 2]", InvalidSettingsError, ("must be a JSON object", "list")),
    "block-not-object": (
        '{"dataStateMachine": "yes"}',
        InvalidSettingsError,
        ("'dataStateMachine' must be an object", "handler, scope, options", "str"),
    ),
    "unknown-field": (
        '{"dataStateMachine": {"handlr": "built-in"}}',
        InvalidSettingsError,
        ("unknown field 'handlr'", "allowed fields: handler, scope, options"),
    ),
    "handler-not-string": (
        '{"dataStateMachine": {"handler": 5}}',
        InvalidSettingsError,
        ("'dataStateMachine.handler' must be a non-empty string", "got 5"),
    ),
    "handler-blank": (
        '{"dataStateMachine": {"handler": "  "}}',
        InvalidSettingsError,
        ("must be a non-empty string",),
    ),
    "scope-not-string": (
        '{"dataStateMachine": {"scope": 4}}',
        InvalidSettingsError,
        ("'dataStateMachine.scope' must be a string", "got 4"),
    ),
    "unknown-scope": (
        '{"dataStateMachine": {"scope": "Galaxy"}}',
        UnknownScopeError,
        ("'Galaxy'", "allowed scopes: 'Tenant', 'Application', 'Workflow', 'Element', 'Thread'"),
    ),
    "scope-sql-fragment": (
        {"dataStateMachine": {"scope": "Element'; --"}},
        UnknownScopeError,
        ("allowed scopes",),
    ),
    "options-not-object": (
        '{"dataStateMachine": {"options": "30m"}}',
        InvalidSettingsError,
        ("'dataStateMachine.options' must be an object", "str"),
    ),
    "unknown-option": (
        '{"dataStateMachine": {"options": {"ttl": 5}}}',
        InvalidOptionError,
        ("'ttl'", "unknown option", "allowed options: 'lockDuration', 'retention'"),
    ),
    "duration-boolean": (
        '{"dataStateMachine": {"options": {"lockDuration": true}}}',
        InvalidOptionError,
        ("'lockDuration'", "expected a duration", "boolean"),
    ),
    "duration-list": (
        '{"dataStateMachine": {"options": {"lockDuration": [30]}}}',
        InvalidOptionError,
        ("'lockDuration'", "'30m', '90s', '2h', '7d'", "[30]"),
    ),
    "duration-words": (
        '{"dataStateMachine": {"options": {"lockDuration": "soon"}}}',
        InvalidOptionError,
        ("'lockDuration'", "'30m', '90s', '2h', '7d'", "'soon'"),
    ),
    "duration-negative": (
        '{"dataStateMachine": {"options": {"lockDuration": -5}}}',
        InvalidOptionError,
        ("'lockDuration'", "must be positive"),
    ),
    "duration-too-long": (
        '{"dataStateMachine": {"options": {"lockDuration": "2d"}}}',
        InvalidOptionError,
        ("'lockDuration'", "at most 1 day"),
    ),
    "retention-not-longer-than-lock": (
        '{"dataStateMachine": {"options": {"retention": "10m"}}}',
        InvalidOptionError,
        ("'retention'", "must be longer than lockDuration"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_bad_settings_fail_the_node_at_load_time(case: str) -> None:
    """Through the executor, as the engine loads a workflow: the node cannot even be built."""
    settings, error, phrases = BAD_SETTINGS[case]
    clock = ManualClock(START)
    handler = InMemoryStateHandler(clock)
    registry = HandlerRegistry(clock)
    registry.register(HANDLER_KEY, lambda _clock: handler)
    element = Element(
        id="element-1",
        workflow_id="wf-1",
        node_type="invoice-dispatch",
        settings=settings,  # type: ignore[arg-type]  # raw text, as a loader may pass it
    )
    with pytest.raises(error) as info:
        InvoiceDispatchExecutor(
            element, DataStateMachineFactory(registry), FakeBillingApi(clock), clock
        )
    check_message(info.value, *phrases)
    assert list(handler.model.records()) == []


def test_unknown_handler_key_lists_the_registered_ones(store: Store) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            config = parse_node_settings({"dataStateMachine": {"handler": "mongo"}})
            with pytest.raises(UnknownHandlerError) as info:
                await n.factory.create(ELEMENT, THREAD, config)
            check_message(info.value, "'mongo'", "registered handlers: 'built-in'")
            assert await n.snapshot() == before

    run(scenario)


NON_FINITE_OR_UNREPRESENTABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "lock-nan": ('{"dataStateMachine": {"options": {"lockDuration": NaN}}}', ("lockDuration",)),
    "lock-infinity": (
        '{"dataStateMachine": {"options": {"lockDuration": 1e400}}}',
        ("lockDuration",),
    ),
    "retention-infinity": (
        '{"dataStateMachine": {"options": {"retention": Infinity}}}',
        ("retention",),
    ),
    "lock-rounds-to-zero": (
        '{"dataStateMachine": {"options": {"lockDuration": 1e-7}}}',
        ("lockDuration", "positive"),
    ),
}


@pytest.mark.parametrize("case", list(NON_FINITE_OR_UNREPRESENTABLE))
def test_non_finite_and_zero_durations_are_refused(case: str) -> None:
    settings, phrases = NON_FINITE_OR_UNREPRESENTABLE[case]
    with pytest.raises(InvalidOptionError) as info:
        parse_node_settings(settings)
    check_message(info.value, *phrases)


def test_a_retention_beyond_the_calendar_is_refused_at_load_time() -> None:
    settings = {"dataStateMachine": {"options": {"retention": 1e12}}}

    async def scenario() -> None:
        try:
            config = parse_node_settings(settings)
        except InvalidOptionError as exc:
            check_message(exc, "'retention'")
            return
        registry = HandlerRegistry(ManualClock(START))
        registry.register(HANDLER_KEY, in_memory_handler)
        machine = await DataStateMachineFactory(registry).create(ELEMENT, THREAD, config)
        await machine.try_acquire_lock("inv-1")
        raise AssertionError("the node accepted a retention past year 9999")

    run(scenario)


# --- the execution's own fields ------------------------------------------------------------------

#: (execution, scope of the node, phrases the error must contain, phrases it must not)
BAD_THREADS: dict[str, tuple[ExecutionThread, str, tuple[str, ...], tuple[str, ...]]] = {
    "empty-tenant": (
        ExecutionThread(execution_id="run-1", tenant_id="", source_app_id="app-1"),
        "Element",
        ("tenant_id", "must not be empty"),
        (),
    ),
    "blank-tenant": (
        ExecutionThread(execution_id="run-1", tenant_id="   ", source_app_id="app-1"),
        "Element",
        ("tenant_id", "must not be blank"),
        (),
    ),
    "blank-tenant-tenant-scope": (
        ExecutionThread(execution_id="run-1", tenant_id="\t \n", source_app_id="app-1"),
        "Tenant",
        ("tenant_id", "must not be blank"),
        ("entity_id",),
    ),
    "surrogate-tenant": (
        ExecutionThread(execution_id="run-1", tenant_id="t-\udc80", source_app_id="app-1"),
        "Element",
        ("tenant_id", "not valid Unicode text"),
        (),
    ),
    "oversized-execution-id": (
        ExecutionThread(execution_id="r" * 1000, tenant_id="tenant-1", source_app_id="app-1"),
        "Element",
        ("execution_id", "1000 characters", "limit is 256"),
        (),
    ),
    "empty-source-app-application-scope": (
        ExecutionThread(execution_id="run-1", tenant_id="tenant-1", source_app_id=""),
        "Application",
        ("source_app_id", "must not be empty"),
        ("entity_id",),
    ),
    "blank-source-app-application-scope": (
        ExecutionThread(execution_id="run-1", tenant_id="tenant-1", source_app_id="  "),
        "Application",
        ("source_app_id", "must not be blank"),
        ("entity_id",),
    ),
    "empty-execution-thread-scope": (
        ExecutionThread(execution_id="", tenant_id="tenant-1", source_app_id="app-1"),
        "Thread",
        ("execution_id", "must not be empty"),
        ("entity_id",),
    ),
}


@pytest.mark.parametrize("case", list(BAD_THREADS))
def test_bad_execution_fields_are_refused_by_the_factory(store: Store, case: str) -> None:
    """Each refusal names the field the caller set, not the record column it feeds."""
    thread, scope, phrases, absent = BAD_THREADS[case]

    async def scenario() -> None:
        async with node(store) as n:
            before = await n.snapshot()
            config = parse_node_settings({"dataStateMachine": {"scope": scope}})
            with pytest.raises(InvalidItemError) as info:
                await n.factory.create(ELEMENT, thread, config)
            check_message(info.value, *phrases)
            assert not [p for p in absent if p in str(info.value)], str(info.value)
            assert await n.snapshot() == before

    run(scenario)


def test_an_empty_source_app_is_still_fine_where_the_scope_does_not_key_by_it(
    store: Store,
) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            thread = ExecutionThread(execution_id="run-2", tenant_id="tenant-1", source_app_id="")
            machine = await n.factory.create(ELEMENT, thread, parse_node_settings(GOOD_SETTINGS))
            assert await machine.exists("seed-done")

    run(scenario)


# --- named errors survive pickling and copying ---------------------------------------------------


def _import_everything() -> None:
    """Import every module of the engine and the harness, so every DsmError subclass is defined."""
    import dsm_sim
    import reference_engine

    for package in (reference_engine, dsm_sim):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)


def _all_error_classes() -> list[type[DsmError]]:
    _import_everything()
    found: list[type[DsmError]] = []
    pending: list[type[DsmError]] = [DsmError]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _sample(annotation: object, name: str, index: int) -> object:
    """A distinctive value of the annotated type, so a field lost in a round trip shows."""
    origin = typing.get_origin(annotation)
    if annotation is str:
        return f"{name}-{index}"
    if annotation is int:
        return 40 + index
    if annotation is float:
        return 0.25 + index
    if annotation is object:
        return f"value-{index}"
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _sample(options[0], name, index)
    if origin is not None and issubclass(origin, collections.abc.Sequence):
        return (f"{name}-a", f"{name}-b")
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        return annotation(
            **{f.name: _sample(hints[f.name], f.name, i) for i, f in enumerate(fields(annotation))}
        )
    raise AssertionError(f"no sample for a parameter {name!r} of type {annotation!r}")


def _instance(cls: type[DsmError]) -> DsmError:
    """Build ``cls`` from its own signature: a new error class is covered without a table."""
    hints = typing.get_type_hints(cls.__init__)
    arguments: dict[str, object] = {}
    positional: list[object] = []
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for index, parameter in enumerate(parameters):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            if parameter.kind is parameter.VAR_POSITIONAL:
                positional.append(f"message of {cls.__name__}")
            continue
        value = _sample(hints.get(parameter.name, str), parameter.name, index)
        if parameter.kind is parameter.KEYWORD_ONLY:
            arguments[parameter.name] = value
        else:
            positional.append(value)
    return cls(*positional, **arguments)


ERROR_CLASSES = _all_error_classes()


def _evidence(error: BaseException) -> tuple[object, ...]:
    return (type(error), str(error), error.args, vars(error))


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "round_trip",
    [
        pytest.param(lambda e: pickle.loads(pickle.dumps(e)), id="pickle"),
        pytest.param(copy.copy, id="copy"),
        pytest.param(copy.deepcopy, id="deepcopy"),
        # How SimPy re-raises a simulated process's error in the process waiting on it.
        pytest.param(lambda e: type(e)(*e.args), id="rebuilt-from-args"),
    ],
)
def test_every_named_error_survives_pickle_and_copy(
    cls: type[DsmError], round_trip: Callable[[DsmError], DsmError]
) -> None:
    error = _instance(cls)
    error.add_note("in node 'dispatch' of workflow 'billing'")
    restored = round_trip(error)
    assert restored is not error
    assert _evidence(restored) == _evidence(error)
    assert restored.__notes__ == ["in node 'dispatch' of workflow 'billing'"]


def test_the_error_walk_finds_every_class() -> None:
    """The walk must reach the leaves and the engine's own modules, or the test above is hollow."""
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"StaleLockError", "PayloadTooLargeError", "DuplicateNodeError"} <= names
    assert {"PropertyViolation", "WorkerRunError", "HandlerExitedError"} <= names  # the harness's
    assert len(ERROR_CLASSES) >= 60


def test_an_error_raised_in_a_process_pool_reaches_the_parent_with_its_fields() -> None:
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_raise_stale_lock)
        with pytest.raises(StaleLockError) as info:
            future.result()
    assert (info.value.item_key, info.value.token, info.value.current_token) == ("inv-1", 3, 4)
    assert info.value.status == "Processing"


def _raise_stale_lock() -> None:
    raise StaleLockError(item_key="inv-1", token=3, current_token=4, status="Processing")


def test_an_error_raised_in_a_simulated_process_reaches_the_waiting_process_as_itself() -> None:
    """SimPy hands a failed process's error to its waiter as ``type(e)(*e.args)``."""
    import simpy

    env = simpy.Environment()
    caught: list[BaseException] = []

    def failing() -> typing.Generator[simpy.Event, None, None]:
        yield env.timeout(1)
        error = UnknownScopeError("Tenant", ["Element", "Workflow"])
        error.add_note("raised by failing()")
        raise error

    def waiting() -> typing.Generator[simpy.Event, None, None]:
        try:
            yield env.process(failing())
        except Exception as exc:
            caught.append(exc)

    env.process(waiting())
    env.run()
    [error] = caught
    error.add_note("seen by the waiting process")
    assert error.__notes__ == ["raised by failing()", "seen by the waiting process"]
    assert error.__cause__.__notes__ == ["raised by failing()"], "the original is left as it was"
    assert type(error) is UnknownScopeError
    assert (error.name, error.allowed) == ("Tenant", ("Element", "Workflow"))
    assert str(error) == str(error.__cause__)


# --- what a StaleLockError says ----------------------------------------------------------------


def test_a_retried_write_that_already_landed_succeeds_and_changes_nothing(store: Store) -> None:
    """The reply of each lock-ending write was lost; the machine kept its token and retries."""

    async def scenario() -> None:
        async with node(store) as n:
            writes: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
                ("inv-1", lambda: n.machine.set("inv-1", S.PROCESSED, {"ok": True})),
                ("inv-2", lambda: n.machine.set("inv-2", S.PROCESSED)),
                ("inv-3", lambda: n.machine.release_lock_as_failed("inv-3", "card declined")),
                ("inv-4", lambda: n.machine.upsert("inv-4", {"v": [1, 2]})),
            )
            for key, write in writes:
                assert await n.machine.try_acquire_lock(key)
                landed = n.machine.context_for(key)
                # The write whose reply was lost, made with the machine's own token:
                if key == "inv-3":
                    await n.handler.release_lock_as_failed(landed, "card declined")
                elif key == "inv-4":
                    await n.handler.upsert(landed, {"v": [1, 2]})
                else:
                    await n.handler.set(landed, S.PROCESSED, {"ok": True})
                before = await n.snapshot()
                clock = n.factory.registry.clock
                assert isinstance(clock, ManualClock)
                clock.advance(dt.timedelta(seconds=1))
                await write()
                assert await n.snapshot() == before, f"the retry on {key} wrote again"

    run(scenario)


def test_another_write_with_a_spent_token_is_refused_and_not_called_a_sweep(
    store: Store,
) -> None:
    """Same token, another outcome: new data, or a release after the completion landed."""

    async def scenario() -> None:
        async with node(store) as n:
            writes: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
                ("inv-1", lambda: n.machine.set("inv-1", S.PROCESSED, {"ok": False})),
                ("inv-2", lambda: n.machine.release_lock_as_failed("inv-2", "gave up")),
            )
            for key, write in writes:
                assert await n.machine.try_acquire_lock(key)
                await n.handler.set(n.machine.context_for(key), S.PROCESSED, {"ok": True})
                before = await n.snapshot()
                with pytest.raises(StaleLockError) as info:
                    await write()
                error = info.value
                assert (error.token, error.current_token, error.status) == (1, 1, "Processed")
                check_message(
                    error, "already ended", "Processed with this token", "another outcome"
                )
                assert "swept" not in str(error)
                assert await n.snapshot() == before

    run(scenario)


def test_a_swept_lock_offers_both_readings(store: Store) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            clock = n.factory.registry.clock
            assert isinstance(clock, ManualClock)
            clock.advance(dt.timedelta(minutes=31))
            assert await n.handler.reset_expired_locks() == 2  # inv-1 and seed-locked
            with pytest.raises(StaleLockError) as info:
                await n.machine.set("inv-1", S.PROCESSED, {"late": True})
            error = info.value
            assert (error.token, error.current_token, error.status) == (1, 1, "Failed")
            check_message(error, "Failed with this token", "expired and was swept", "retry")

    run(scenario)


def test_a_taken_over_lock_names_the_new_attempt(store: Store) -> None:
    async def scenario() -> None:
        async with node(store) as n:
            assert await n.machine.try_acquire_lock("inv-1")
            clock = n.factory.registry.clock
            assert isinstance(clock, ManualClock)
            clock.advance(dt.timedelta(minutes=31))
            other = await n.factory.create(
                ELEMENT,
                ExecutionThread(execution_id="run-2", tenant_id="tenant-1", source_app_id="app-1"),
                parse_node_settings(GOOD_SETTINGS),
            )
            assert await other.try_acquire_lock("inv-1")
            with pytest.raises(StaleLockError) as info:
                await n.machine.release_lock_as_failed("inv-1", "late")
            error = info.value
            assert (error.token, error.current_token, error.status) == (1, 2, "Processing")
            check_message(error, "taken over by attempt 2", "Processing with token 2")
            assert "no longer exists" not in str(error)

    run(scenario)


def test_a_vanished_record_is_not_called_a_sweep() -> None:
    error = StaleLockError(item_key="inv-1", token=3, current_token=None, status="None")
    check_message(error, "token 3", "the record no longer exists", "rejected")
    assert "swept" not in str(error) and "taken over" not in str(error)


# --- workflow definitions ----------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    """A dict nested ``depth`` levels deep, built without recursion."""
    root: dict[str, Any] = {}
    current = root
    for _ in range(depth - 1):
        current["x"] = {}
        current = current["x"]
    return root


def _cyclic() -> dict[str, Any]:
    loop: dict[str, Any] = {"dataStateMachine": {"scope": "Element"}}
    loop["self"] = loop
    return loop


def _workflow(settings: object = None, *, node_id: object = "dispatch", wf_id: object = "w") -> Any:
    node: dict[str, Any] = {"id": node_id, "type": "invoice-dispatch"}
    if settings is not None:
        node["settings"] = settings
    return {"id": wf_id, "nodes": [node]}


#: Definitions nested too deeply for a stack to copy, read or encode, in every form.
TOO_DEEP: dict[str, object] = {
    "json-brackets": "[" * 100_000,
    "json-objects": '{"a":' * 5_000 + "1" + "}" * 5_000,
    "deep-settings": _workflow({"dataStateMachine": None, "x": _nested(3_000)}),
    "deep-definition": _nested(3_000),
    "cyclic-settings": _workflow(_cyclic()),
    "one-past-the-limit": _workflow({"x": _nested(MAX_DEPTH - 3)}),
}


@pytest.mark.parametrize("case", list(TOO_DEEP))
def test_a_definition_nested_too_deeply_is_a_named_error(case: str) -> None:
    with pytest.raises(InvalidWorkflowError) as info:
        load_workflow(TOO_DEEP[case])  # type: ignore[arg-type]
    check_message(info.value, f"deeper than {MAX_DEPTH} levels")


def test_a_definition_at_the_nesting_limit_loads() -> None:
    """Level 1 is the definition, 2 its nodes, 3 a node, 4 its settings: 60 more fit."""
    loaded = load_workflow(_workflow({"x": _nested(MAX_DEPTH - 4)}))
    assert loaded.elements[0].id == "dispatch"


def test_a_number_too_long_to_read_is_a_named_error() -> None:
    with pytest.raises(InvalidWorkflowError) as info:
        load_workflow('{"id": "w", "n": ' + "9" * 5_000 + "}")
    check_message(info.value, "not valid JSON", "digits")
    assert len(str(info.value)) < 400


#: Ids that look like another id or are not text at all: (definition, field, phrases).
BAD_IDS: dict[str, tuple[object, str, tuple[str, ...]]] = {
    "lone-surrogate-node": (_workflow(node_id="a\udc80"), "nodes[0].id", ("lone surrogate",)),
    "zero-width-node": (_workflow(node_id="dispatch\u200b"), "nodes[0].id", ("U+200B",)),
    "bom-workflow": (_workflow(wf_id="\ufeffbilling"), "id", ("U+FEFF",)),
    "newline-node": (_workflow(node_id="dis\npatch"), "nodes[0].id", ("U+000A",)),
    "padded-node": (_workflow(node_id=" a "), "nodes[0].id", ("leading or trailing whitespace",)),
    "trailing-space-workflow": (_workflow(wf_id="billing "), "id", ("trailing whitespace",)),
    "padded-type": (
        {"id": "w", "nodes": [{"id": "a", "type": "invoice-dispatch "}]},
        "nodes[0].type",
        ("trailing whitespace",),
    ),
    "blank-node": (_workflow(node_id="\u3000"), "nodes[0].id", ("non-empty string",)),
}


@pytest.mark.parametrize("via", ["object", "json"])
@pytest.mark.parametrize("case", list(BAD_IDS))
def test_ids_that_are_invisible_padded_or_not_text_are_refused_at_load(case: str, via: str) -> None:
    definition, field, phrases = BAD_IDS[case]
    source = json.dumps(definition) if via == "json" else definition
    with pytest.raises(InvalidWorkflowError) as info:
        load_workflow(source)  # type: ignore[arg-type]
    assert info.value.field == field
    check_message(info.value, *phrases, "visible text")


def test_ids_with_inner_spaces_and_other_scripts_load() -> None:
    loaded = load_workflow(_workflow(node_id="envoi facture é 請求", wf_id="billing 2"))
    assert (loaded.id, loaded.elements[0].id) == ("billing 2", "envoi facture é 請求")


# --- handler factories by dotted path ------------------------------------------------------------

HUGE_SPECS: dict[str, str] = {
    "missing-module": "m" * 10**6 + ":f",
    "no-colon": "m" * 10**6,
    "missing-attribute": "json:" + "a" * 10**6,
}


@pytest.mark.parametrize("case", list(HUGE_SPECS))
def test_a_huge_factory_spec_is_echoed_cut(case: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_factory(HUGE_SPECS[case])
    text = str(info.value)
    assert len(text) < 600, len(text)
    check_message(info.value, "characters)")


def test_a_relative_module_spec_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        load_factory(".handlers:build")
    check_message(info.value, "cannot import module '.handlers'", "relative import")


# --- node types whose side effect needs the guard ------------------------------------------------


class _Notices:
    async def send_correction(self, invoice_id: str, revision: int, amount: int) -> dict[str, Any]:
        return {"sent": invoice_id}


class _Screens:
    async def screen(self, line_id: str, amount: int) -> dict[str, Any]:
        return {"line": line_id}


def _node_types(clock: ManualClock) -> NodeTypeRegistry:
    types = NodeTypeRegistry()
    billing = FakeBillingApi(clock)
    types.register(invoice.NODE_TYPE, invoice.invoice_node(billing, clock))
    types.register(approval.NODE_TYPE, approval.approval_node(billing))
    types.register(correction.NODE_TYPE, correction.correction_node(_Notices()))
    types.register(screening.NODE_TYPE, screening.screening_node(_Screens()))
    return types


GUARDED_NODE_TYPES = [
    invoice.NODE_TYPE,
    approval.NODE_TYPE,
    correction.NODE_TYPE,
    screening.NODE_TYPE,
]


@pytest.mark.parametrize("settings", [{}, None, {"other": 1}, {"dataStateMachine": None}])
@pytest.mark.parametrize("node_type", GUARDED_NODE_TYPES)
def test_a_node_type_with_a_side_effect_cannot_be_loaded_without_its_guard(
    node_type: str, settings: object
) -> None:
    clock = ManualClock(START)
    definition = {"id": "w", "nodes": [{"id": "step-1", "type": node_type, "settings": settings}]}
    with pytest.raises(MissingDataStateMachineError) as info:
        WorkflowEngine.from_json(definition, _node_types(clock), HandlerRegistry(clock), clock)
    assert (info.value.node_type, info.value.node_id) == (node_type, "step-1")
    check_message(info.value, "'step-1'", repr(node_type), "needs a 'dataStateMachine' block")


@pytest.mark.parametrize("node_type", GUARDED_NODE_TYPES)
def test_a_node_type_with_a_side_effect_loads_with_its_guard(node_type: str) -> None:
    clock = ManualClock(START)
    handlers = HandlerRegistry(clock)
    handlers.register(HANDLER_KEY, in_memory_handler)
    definition = {"id": "w", "nodes": [{"id": "step-1", "type": node_type, **GOOD_NODE}]}
    engine = WorkflowEngine.from_json(definition, _node_types(clock), handlers, clock)
    assert engine.executors[0].dsm_config is not None


GOOD_NODE: dict[str, Any] = {"settings": GOOD_SETTINGS}


# --- workflows sharing a store -------------------------------------------------------------------


def _invoice_workflow(workflow_id: str, node_id: str) -> dict[str, Any]:
    return {
        "id": workflow_id,
        "nodes": [{"id": node_id, "type": invoice.NODE_TYPE, "settings": GOOD_SETTINGS}],
    }


def test_two_workflows_cannot_share_an_element_scope_node_id_on_any_store(store: Store) -> None:
    """Through the real engine: billing/dispatch runs, refunds/dispatch is refused at load.

    Were the second workflow built, its node would key its records under the
    same element id and skip billing's invoices; with distinct ids the two
    share the store and charge each invoice once per workflow.
    """

    async def scenario() -> None:
        clock = ManualClock(START)
        handlers = HandlerRegistry(clock)
        handlers.register(HANDLER_KEY, store.factory)
        billing_api = FakeBillingApi(clock)
        types = NodeTypeRegistry()
        types.register(invoice.NODE_TYPE, invoice.invoice_node(billing_api, clock))
        message = Message(id="m-1", payload={"invoiceId": "INV-1", "amount": 500})
        try:
            billing = WorkflowEngine.from_json(
                _invoice_workflow("billing", "dispatch"), types, handlers, clock
            )
            assert [r.outcome for r in await billing.deliver(message)] == [NodeOutcome.SUCCESS]
            handler = await handlers.resolve(HANDLER_KEY)
            before = await store.snapshot(handler)

            with pytest.raises(DuplicateElementError) as info:
                WorkflowEngine.from_json(
                    _invoice_workflow("refunds", "dispatch"), types, handlers, clock
                )
            error = info.value
            assert (error.element_id, error.workflow_id, error.other_workflow_id) == (
                "dispatch",
                "refunds",
                "billing",
            )
            assert await store.snapshot(handler) == before

            refunds = WorkflowEngine.from_json(
                _invoice_workflow("refunds", "refund-dispatch"), types, handlers, clock
            )
            assert [r.outcome for r in await refunds.deliver(message)] == [NodeOutcome.SUCCESS]
            assert [r.outcome for r in await billing.deliver(message)] == [NodeOutcome.SKIP]
            assert [c.invoice_id for c in billing_api.charges] == ["INV-1", "INV-1"]
            after = await store.snapshot(handler)
            assert len(after) == len(before) + 1 and set(before) <= set(after)
        finally:
            await handlers.close()

    run(scenario)
