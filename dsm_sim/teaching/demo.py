"""``dsm demo invoice``: the annotated invoice walk-through, on a real store.

It runs the workflow engine with the invoice node against the built-in SQL
handler (a fresh SQLite file unless ``--db`` names another database), or
against the handler a ``--handler MODULE:FACTORY`` builds, and narrates each
step: configuration, initialisation, a first charge, a duplicate, a crash that
leaves a lock behind, a duplicate meeting the live lock, the catch-up sweep,
the retry and a fenced-off stale writer.  After each step it prints the real
``process_state_logs`` rows, or, for a handler of unknown layout, the records
its own ``get`` returns: the protocol is the only view of a store the demo may
assume.

The clock is a :class:`~reference_engine.clock.ManualClock` and execution ids
come from the engine's counter, so two runs print the same bytes; the demo
also checks every claim it narrates and exits 1 if the store disagrees, which
makes it a smoke test of a handler as much as a tutorial.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import URL, delete, select

from dsm_sim.teaching.demo_render import (
    LogRow,
    Narrator,
    config_lines,
    context_lines,
    describe_result,
    heading,
    indent,
    render_rows,
)
from reference_engine.catchup import CatchupWorkerService
from reference_engine.clock import UTC, Clock, ManualClock
from reference_engine.config import DataStateMachineConfig
from reference_engine.context import StateHandlerContext
from reference_engine.engine.definitions import ExecutionThread
from reference_engine.engine.executor import Message, NodeExecutionResult, NodeOutcome
from reference_engine.engine.workflow import EventLog, NodeAborted, NodeTypeRegistry, WorkflowEngine
from reference_engine.errors import ConfigurationError, StaleLockError
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.handlers.sql.engine import is_memory_url, normalize_url
from reference_engine.handlers.sql.factory import sql_handler
from reference_engine.handlers.sql.handler import SqlStateHandler
from reference_engine.handlers.sql.schema import process_state_logs
from reference_engine.model import SWEEP_ERROR_DETAIL
from reference_engine.nodes.invoice import NODE_TYPE, FakeBillingApi, invoice_node
from reference_engine.record import StateRecord, encode_data
from reference_engine.registry import HandlerRegistry, load_factory
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DEMO_START",
    "DEMO_TENANT",
    "DEMO_WORKFLOW",
    "DemoOutcome",
    "demo_workflow",
    "run_demo",
]

DEMO_START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
DEMO_TENANT = "demo-tenant"
#: The engine instance id of the walk-through (its store is emptied first, see run_demo).
DEMO_INSTANCE = "demo"
DEMO_APP = "billing-app"
NODE_ID = "dispatch-invoice"
HANDLER_KEY = "built-in"
#: The key a ``--handler`` factory is registered under: a name of the user's
#: own, as a deployment would register it, so the output never claims the
#: built-in store is in use.
CUSTOM_HANDLER_KEY = "my-store"
SCENARIOS = ("invoice",)
#: Every item the walk-through touches, in the order it first touches them.
DEMO_INVOICES = ("INV-1001", "INV-1002")


def demo_workflow(handler_key: str) -> Mapping[str, Any]:
    """The demo's workflow with its node's handler key; only the key differs between stores."""
    return {
        "id": "invoice-workflow",
        "name": "Dispatch invoices exactly once",
        "nodes": [
            {
                "id": NODE_ID,
                "type": NODE_TYPE,
                "name": "Charge the customer for the invoice",
                "settings": {
                    "dataStateMachine": {
                        "handler": handler_key,
                        "scope": "Element",
                        "options": {"lockDuration": "30m", "retention": "30d"},
                    }
                },
            }
        ],
    }


#: The workflow the demo runs; ``examples/invoice_workflow.json`` holds the same definition.
DEMO_WORKFLOW: Mapping[str, Any] = demo_workflow(HANDLER_KEY)

S = IdempotencyStatus


@dataclass
class DemoBilling(FakeBillingApi):
    """The fake billing API, able to hang one call so the demo can kill the worker inside it."""

    hang_next: bool = False
    in_flight: asyncio.Event = field(default_factory=asyncio.Event)

    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
        if self.hang_next:
            self.hang_next = False
            self.in_flight.set()
            await asyncio.Event().wait()  # the answer never comes: the worker dies first
        return await super().charge(invoice_id, amount)


@dataclass(frozen=True, slots=True)
class DemoOutcome:
    """What the demo printed and whether the store behaved as narrated."""

    lines: tuple[str, ...]
    charges: Mapping[str, int]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def invoice_message(number: int, amount: int, delivery: int = 1) -> Message:
    return Message(
        id=f"msg-{number}",
        payload={"invoiceId": f"INV-{number}", "amount": amount},
        tenant_id=DEMO_TENANT,
        source_app_id=DEMO_APP,
        delivery=delivery,
    )


async def fetch_rows(handler: SqlStateHandler) -> list[LogRow]:
    """The demo tenant's rows, straight from the table (history rows included)."""
    t = process_state_logs
    query = (
        select(
            t.c.item_key,
            t.c.status,
            t.c.attempt,
            t.c.locked_until,
            t.c.updated_at,
            t.c.entity_execution_id,
            t.c.error_detail,
            t.c.data,
        )
        .where(t.c.tenant_id == DEMO_TENANT)
        .order_by(t.c.id)
    )
    async with handler.engine.connect() as conn:
        result = await conn.execute(query)
        return [LogRow(*row) for row in result.all()]


async def clear_demo_rows(handler: SqlStateHandler) -> None:
    """Remove an earlier run's rows so a rerun on the same database prints the same table."""
    async with handler.engine.begin() as conn:
        await conn.execute(
            delete(process_state_logs).where(process_state_logs.c.tenant_id == DEMO_TENANT)
        )


def record_row(record: StateRecord) -> LogRow:
    """A record as the table shows it, its data in the JSON text the SQL store would hold."""
    return LogRow(
        record.key.item_key,
        record.status.value,
        record.attempt,
        record.locked_until,
        record.updated_at,
        record.entity_execution_id,
        record.error_detail,
        encode_data(record.data),
    )


class RecordView(Protocol):
    """How the demo reads back what the store holds, to print it and to check its claims."""

    title: str

    async def rows(self, ctx: StateHandlerContext) -> list[LogRow]: ...


class SqlTableView:
    """The built-in store's table itself, superseded history rows included."""

    title = "process_state_logs"

    def __init__(self, handler: SqlStateHandler) -> None:
        self.handler = handler

    async def rows(self, ctx: StateHandlerContext) -> list[LogRow]:
        return await fetch_rows(self.handler)


class HandlerGetView:
    """Any handler, through its own ``get``: a store's layout is its own business.

    Only current records are shown, which is all there is: the walk-through
    never upserts, so no history is written.
    """

    title = "records, read back with get()"

    def __init__(self, handler: StateHandler, items: Sequence[str]) -> None:
        self.handler = handler
        self.items = tuple(items)

    async def rows(self, ctx: StateHandlerContext) -> list[LogRow]:
        rows = []
        for item in self.items:
            record = await self.handler.get(ctx.for_item(item))
            if record is not None:
                rows.append(record_row(record))
        return rows


class InvoiceDemo:
    """The walk-through's state: clock, store, engine, billing API, and the narration."""

    def __init__(
        self,
        handler: StateHandler,
        clock: ManualClock,
        say: Narrator,
        *,
        handlers: HandlerRegistry | None = None,
        handler_key: str = HANDLER_KEY,
        view: RecordView | None = None,
    ) -> None:
        self.handler = handler
        self.clock = clock
        self.n = say
        self.billing = DemoBilling(clock)
        if handlers is None:
            handlers = HandlerRegistry(clock)
            handlers.register(handler_key, lambda _clock: handler)
        self.handlers = handlers
        self.view: RecordView = view or HandlerGetView(handler, DEMO_INVOICES)
        node_types = NodeTypeRegistry()
        node_types.register(NODE_TYPE, invoice_node(self.billing, clock))
        self.engine = WorkflowEngine.from_json(
            json.dumps(demo_workflow(handler_key)),
            node_types,
            self.handlers,
            clock,
            id_prefix="invoices",
            # The walk-through starts on an emptied store, so fixed ids keep its story stable.
            instance_id=DEMO_INSTANCE,
        )
        self.events = EventLog()
        self.engine.add_listener(self.events)
        self.element = self.engine.definition.element(NODE_ID)
        config = self.engine.executors[0].dsm_config
        assert config is not None, "the demo workflow's node has a dataStateMachine block"
        self.config: DataStateMachineConfig = config
        reader = ExecutionThread(
            execution_id="demo-reader", tenant_id=DEMO_TENANT, source_app_id=DEMO_APP
        )
        self.read_ctx = self.engine.factory.base_context(self.element, reader, self.config)

    async def fetch(self) -> list[LogRow]:
        return await self.view.rows(self.read_ctx)

    async def table(self) -> None:
        self.n.say("", f"  {self.view.title}:")
        self.n.block(indent(render_rows(await self.fetch()), "    "))

    async def row(self, invoice_id: str) -> LogRow | None:
        rows = [r for r in await self.fetch() if r.item_key == invoice_id]
        return rows[-1] if rows else None

    async def record(self, invoice_id: str) -> tuple[S, int] | None:
        row = await self.row(invoice_id)
        return None if row is None else (S(row.status), row.attempt)

    async def deliver(self, message: Message) -> NodeExecutionResult:
        report = await self.engine.deliver_report(message)
        (result,) = report.results
        self.n.say(
            f"  {message.id} (delivery {message.delivery}) ran as {report.execution_id}: "
            f"{describe_result(result)}"
        )
        return result

    def at(self, minutes: int) -> None:
        self.clock.set(DEMO_START + dt.timedelta(minutes=minutes))
        self.n.say(f"  [clock {self.clock.now():%H:%M:%S}]")

    # --- the steps ---------------------------------------------------------------------------

    async def configuration(self) -> None:
        n = self.n
        n.block(heading(1, "Configuration"))
        n.say(
            f"Workflow {self.engine.definition.id!r} has one node, {NODE_ID!r} "
            f"(type {NODE_TYPE!r}). Its settings:"
        )
        n.block(indent(json.dumps(self.element.settings, indent=2, sort_keys=True)))
        n.say("Parsed when the workflow was loaded (a bad block would have stopped it here):")
        n.block(indent(config_lines(self.config)))

    async def initialisation(self) -> None:
        n = self.n
        n.block(heading(2, "Initialisation"))
        resolved = await self.handlers.resolve(self.config.handler)
        preview = ExecutionThread(
            execution_id="<one per delivery>",
            tenant_id=DEMO_TENANT,
            source_app_id=DEMO_APP,
        )
        ctx = self.engine.factory.base_context(self.element, preview, self.config)
        store = type(resolved).__name__
        if isinstance(self.handler, SqlStateHandler):
            store += f" on {self.handler.engine.dialect.name}"
        n.say(
            "Before each execution the node's pre-process step asks the factory for its machine:",
            f"  handler key {self.config.handler!r} -> {store}",
            f"  scope {ctx.scope_code} -> scope_id {ctx.scope_id}; records are keyed by the "
            f"node id, entity_id {ctx.entity_id!r}",
            "  StateHandlerContext (base; item_key and the fencing token are added per call):",
        )
        n.block(indent(context_lines(ctx), "    "))
        n.expect(ctx.scope_id == 4, "scope Element resolves to scope_id 4")
        await self.table()

    async def first_run(self) -> None:
        n = self.n
        n.block(heading(3, "First delivery: INV-1001 is charged"))
        self.at(0)
        n.say(
            "exists('INV-1001') is False, try_acquire_lock takes the lock (token 1), the billing",
            "API charges, and set(Processed, data) records the response.",
        )
        result = await self.deliver(invoice_message(1001, 12500))
        n.expect(result.outcome is NodeOutcome.SUCCESS, "the first delivery succeeds")
        n.expect(
            await self.record("INV-1001") == (S.PROCESSED, 1),
            "INV-1001 is Processed with attempt 1",
        )
        await self.table()

    async def duplicate(self) -> None:
        n = self.n
        n.block(heading(4, "Duplicate delivery: the broker redelivers INV-1001"))
        self.at(2)
        n.say("A redelivery is a new execution; exists('INV-1001') is now True, so no charge.")
        result = await self.deliver(invoice_message(1001, 12500, delivery=2))
        n.expect(result.outcome is NodeOutcome.SKIP, "the duplicate is skipped")
        n.expect(len(self.billing.charges_for("INV-1001")) == 1, "INV-1001 is charged once")
        n.say(f"  charges for INV-1001 so far: {len(self.billing.charges_for('INV-1001'))}")
        await self.table()

    async def crash(self) -> ExecutionThread:
        n = self.n
        n.block(heading(5, "Crash: the worker dies while dispatching INV-1002"))
        self.at(5)
        n.say(
            "The worker acquires the lock for INV-1002 and sends the charge request; it is",
            "killed before the billing API accepts the charge, so no money moved. The record",
            "stays Processing, locked until now + 30 minutes, and nothing releases it.",
            "(Had it died after the charge but before set(Processed), the retry in step 8",
            "would charge again: the record is exactly-once, a side effect across such a",
            "crash is at-least-once. Pass the invoice id as the billing API's idempotency",
            "key to close that window.)",
        )
        self.billing.hang_next = True
        task = asyncio.create_task(self.engine.deliver(invoice_message(1002, 4900)))
        await self.billing.in_flight.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        aborted = [e for e in self.events.events if isinstance(e, NodeAborted)]
        n.expect(len(aborted) == 1, "the engine reports exactly one aborted node")
        if not aborted:
            raise AssertionError("the crashed delivery was not reported; the demo cannot go on")
        crashed = aborted[-1]
        n.say(f"  msg-1002 (delivery 1) ran as {crashed.execution_id}: aborted ({crashed.reason})")
        n.expect(not self.billing.charges_for("INV-1002"), "the crash left INV-1002 uncharged")
        n.expect(
            await self.record("INV-1002") == (S.PROCESSING, 1),
            "INV-1002 stays Processing with attempt 1",
        )
        await self.table()
        return ExecutionThread(crashed.execution_id, DEMO_TENANT, DEMO_APP, crashed.message_id)

    async def concurrent_duplicate(self) -> None:
        n = self.n
        n.block(heading(6, "Duplicate while the lock is live: skipped by the lock"))
        self.at(10)
        n.say(
            "Another worker gets INV-1002. exists() is False (not Processed), and",
            "try_acquire_lock refuses a live lock: to the store a dead holder and a slow",
            "one look the same until the lock runs out.",
        )
        result = await self.deliver(invoice_message(1002, 4900, delivery=2))
        n.expect(result.outcome is NodeOutcome.SKIP, "the duplicate is skipped by the live lock")
        n.expect(not self.billing.charges_for("INV-1002"), "still no charge for INV-1002")
        await self.table()

    async def sweep(self) -> None:
        n = self.n
        n.block(heading(7, "Time passes: the lock expires and the catch-up sweep resets it"))
        self.at(36)
        n.say("The lock ran until 09:35:00. The catch-up worker's sweep finds it expired:")
        outcome = await CatchupWorkerService(
            self.handler, interval=dt.timedelta(minutes=1)
        ).run_once()
        n.say(
            f"  catch-up run: {outcome.locks_reset} expired lock(s) reset to Failed, "
            f"{outcome.records_expired} record(s) past retention"
        )
        n.expect(outcome.locks_reset == 1, "the sweep resets exactly one lock")
        n.expect(
            await self.record("INV-1002") == (S.FAILED, 1), "INV-1002 is Failed after the sweep"
        )
        row = await self.row("INV-1002")
        n.expect(
            row is not None and row.error_detail == SWEEP_ERROR_DETAIL,
            "the sweep notes why in error_detail",
        )
        await self.table()

    async def retry(self, crashed: ExecutionThread) -> None:
        n = self.n
        n.block(heading(8, "Retry completes INV-1002; the crashed worker's token is fenced off"))
        self.at(37)
        n.say("The broker redelivers INV-1002: Failed may be retried, the new token is 2.")
        result = await self.deliver(invoice_message(1002, 4900, delivery=3))
        n.expect(result.outcome is NodeOutcome.SUCCESS, "the retry succeeds")
        n.expect(
            await self.record("INV-1002") == (S.PROCESSED, 2),
            "INV-1002 is Processed with attempt 2",
        )
        row = await self.row("INV-1002")
        n.expect(
            row is not None and row.error_detail is None,
            "taking the lock over clears the sweep's error_detail",
        )
        n.say(
            "",
            f"Suppose the crashed worker ({crashed.execution_id}) was only frozen and now wakes",
            "up to record its result with its old fencing token 1:",
        )
        ctx = self.engine.factory.base_context(self.element, crashed, self.config)
        stale = ctx.for_item("INV-1002", lock_token=1)
        try:
            await self.handler.set(stale, S.PROCESSED, {"dispatchedAt": "stale"})
        except StaleLockError as exc:
            text = f"rejected: {type(exc).__name__}: {exc}"
            n.say(*textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="    "))
        else:
            n.expect(False, "the stale write is rejected with StaleLockError")
        n.expect(
            await self.record("INV-1002") == (S.PROCESSED, 2), "the stale write changed nothing"
        )
        await self.table()

    async def summary(self) -> dict[str, int]:
        n = self.n
        n.block(heading(9, "Summary"))
        charges = {
            invoice: len(self.billing.charges_for(invoice)) for invoice in ("INV-1001", "INV-1002")
        }
        n.say("Charges made by the billing API:")
        for invoice, count in charges.items():
            ids = ", ".join(c.charge_id for c in self.billing.charges_for(invoice))
            n.say(f"  {invoice}: {count} charge(s) ({ids})")
        outcomes = [e.outcome.value for e in self.events.finished()]
        aborted = sum(isinstance(e, NodeAborted) for e in self.events.events)
        n.say(
            f"Node executions: {len(outcomes) + aborted} "
            f"({outcomes.count('success')} success, {outcomes.count('skip')} skip, "
            f"{outcomes.count('failure')} failure, {aborted} aborted)"
        )
        for invoice, count in charges.items():
            n.expect(count == 1, f"{invoice} is charged exactly once")
        return charges


async def run_demo(
    db_url: str | None = None,
    *,
    schema: str | None = None,
    keep: bool = False,
    handler: str | HandlerFactory | None = None,
    write: Callable[[str], None] = print,
    observe: Callable[[StateHandler, Clock], None] | None = None,
) -> DemoOutcome:
    """Run the walk-through; ``db_url`` None means a fresh SQLite file in a temporary directory.

    ``handler`` (a ``module:factory`` spec, loaded as ``dsm verify`` loads it,
    or the factory itself) replaces the built-in store.  The demo cannot clear
    a store it does not know, so, as for the conformance kit, the factory must
    give it an empty one; leftover records show up as claims that did not hold.
    ``observe`` is shown the handler and the clock before the first step (the
    ``--html`` page records the calls through it).
    """
    if handler is not None:
        if db_url is not None or schema is not None or keep:
            raise ConfigurationError(
                "--db, --schema and --keep choose the built-in SQL store, and --handler "
                "brings its own store: give one or the other"
            )
        factory = load_factory(handler) if isinstance(handler, str) else handler
        return await _run_on_factory(factory, _factory_name(handler), write, observe)
    if db_url is not None:
        _check_sqlite_folder(normalize_url(db_url))  # a bad URL fails before anything is created
    directory: Path | None = None
    if db_url is None:
        directory = Path(tempfile.mkdtemp(prefix="dsm-demo-"))
        url = f"sqlite+aiosqlite:///{directory / 'demo.db'}"
    else:
        url = db_url
    clock = ManualClock(DEMO_START)
    narrator = Narrator(write)
    sql: SqlStateHandler | None = None
    try:
        sql = sql_handler(url, clock, schema=schema)
        await sql.open()
        await clear_demo_rows(sql)
        if observe is not None:
            observe(sql, clock)
        shown = "a fresh SQLite file (temporary)" if directory else _display_url(db_url, schema)
        narrator.say(
            "DataStateMachine walk-through: dispatching invoices exactly once",
            f"Store: {shown}; table process_state_logs, tenant {DEMO_TENANT!r}",
            f"Clock: a ManualClock on {DEMO_START:%Y-%m-%d}; all times are UTC",
        )
        charges = await _walk_through(InvoiceDemo(sql, clock, narrator, view=SqlTableView(sql)))
        if db_url is not None and not keep:
            await clear_demo_rows(sql)
    finally:
        if sql is not None:
            await sql.close()
        if directory is not None:
            if keep:
                print(f"dsm demo: database kept at {directory / 'demo.db'}", file=sys.stderr)
            else:
                shutil.rmtree(directory, ignore_errors=True)
    return _outcome(narrator, charges)


def _check_sqlite_folder(url: URL) -> None:
    """A SQLite file goes into a folder that exists: named now, not a driver error later."""
    if url.get_backend_name() != "sqlite" or is_memory_url(url):
        return
    database = url.database or ""
    if database.startswith("file:"):
        return
    folder = Path(database).parent
    if not folder.is_dir():
        raise ConfigurationError(
            f"--db {url.render_as_string(hide_password=True)!r}: the folder {str(folder)!r} of "
            "the SQLite file does not exist; create it first, or name a file in a folder that does"
        )


async def _run_on_factory(
    factory: HandlerFactory,
    name: str,
    write: Callable[[str], None],
    observe: Callable[[StateHandler, Clock], None] | None = None,
) -> DemoOutcome:
    """The walk-through on a factory's handler, built and opened by the engine's own registry.

    Going through :class:`HandlerRegistry` gives the demo exactly the checks a
    deployment gets: an object that is not a ``StateHandler`` is refused by
    name before anything is narrated.
    """
    clock = ManualClock(DEMO_START)
    narrator = Narrator(write)
    handlers = HandlerRegistry(clock)
    handlers.register(CUSTOM_HANDLER_KEY, factory)
    try:
        built = await handlers.resolve(CUSTOM_HANDLER_KEY)
        if observe is not None:
            observe(built, clock)
        narrator.say(
            "DataStateMachine walk-through: dispatching invoices exactly once",
            f"Store: {type(built).__name__}, built by {name}; tenant {DEMO_TENANT!r}",
            f"Clock: a ManualClock on {DEMO_START:%Y-%m-%d}; all times are UTC",
        )
        demo = InvoiceDemo(
            built, clock, narrator, handlers=handlers, handler_key=CUSTOM_HANDLER_KEY
        )
        charges = await _walk_through(demo)
    finally:
        await handlers.close()
    return _outcome(narrator, charges)


def _factory_name(handler: str | HandlerFactory) -> str:
    if isinstance(handler, str):
        return handler
    module = getattr(handler, "__module__", None) or "?"
    return f"{module}:{getattr(handler, '__qualname__', type(handler).__name__)}"


async def _walk_through(demo: InvoiceDemo) -> dict[str, int]:
    """Every step, in order; the charges per invoice are what the summary counted."""
    await demo.configuration()
    await demo.initialisation()
    await demo.first_run()
    await demo.duplicate()
    crashed = await demo.crash()
    await demo.concurrent_duplicate()
    await demo.sweep()
    await demo.retry(crashed)
    return await demo.summary()


def _outcome(narrator: Narrator, charges: Mapping[str, int]) -> DemoOutcome:
    verdict = (
        "All narrated claims held."
        if not narrator.problems
        else f"{len(narrator.problems)} narrated claim(s) did not hold (see !! lines)."
    )
    narrator.say("", verdict)
    return DemoOutcome(tuple(narrator.lines), charges, tuple(narrator.problems))


def _display_url(url: str | None, schema: str | None) -> str:
    rendered = normalize_url(url or "").render_as_string(hide_password=True)
    return rendered + (f" (schema {schema})" if schema else "")
