"""``dsm demo invoice --html FILE``: the walk-through as an explorer page.

The demo itself is unchanged: it runs, narrates on the terminal and checks
its claims exactly as without ``--html``.  This module only listens: it taps
the handler the demo built (each call is recorded with the record read back
through the handler's own ``get`` right before and after it, on the demo's
manual clock) and the narration lines (each ``Step N.`` heading starts a
chapter covering the calls that follow).  The page's timeline is the demo's
own clock, so the page says 09:36 where the narration does.  The demo makes
several calls on one clock reading, and the scrubber steps through each: the
calls at one reading are placed a millisecond apart, which the page, writing
the demo's whole-second clock to the second, does not show.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dsm_sim.history import Event, EventKind, History, Op, OpName, Outcome, RecordView, key_of
from dsm_sim.micros import Micros, micros_in, micros_since
from dsm_sim.outputs import write_report
from dsm_sim.reports.explorer.model import Chapter
from dsm_sim.reports.explorer.page import explorer_view
from dsm_sim.reports.rendering import template_environment
from dsm_sim.simulator.views import data_text
from dsm_sim.teaching.demo import DEMO_START, DemoOutcome, run_demo
from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.record import StateRecord

__all__ = ["DemoTape", "record_demo", "render_demo_html", "write_demo_html"]

_STEP = re.compile(r"^Step \d+\. ")
_ABORTED = re.compile(r"ran as (\S+): aborted")
_SWEEPS = {
    "reset_expired_locks": OpName.RESET_EXPIRED_LOCKS,
    "expire_past_retention": OpName.EXPIRE_PAST_RETENTION,
}
_ITEM_CALLS = {
    "exists": OpName.EXISTS,
    "try_acquire_lock": OpName.TRY_ACQUIRE_LOCK,
    "set": OpName.SET,
    "release_lock_as_failed": OpName.RELEASE_LOCK_AS_FAILED,
    "upsert": OpName.UPSERT,
}
#: Calls on one clock reading are this far apart on the timeline (microseconds), each
#: lasting _CALL.
_APART = 1000
_CALL = 600
CATCHUP_LANE = "catchup"


class DemoTape:
    """Records what the walk-through did, in the shape the explorer reads (a History)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self.lines: list[str] = []
        self.ops: list[Op] = []
        self.events: list[Event] = []
        self.store_clock: dict[int, Micros] = {}
        self.chapter_starts: list[tuple[int, int]] = [(0, 0)]  # (first op, first line)
        self._contexts: dict[str, StateHandlerContext] = {}
        self._clock: Clock | None = None
        #: The clock reading of the last call, and how many calls were made on it.
        self._reading: tuple[Micros, int] = (-1, 0)

    # --- listening ------------------------------------------------------------------------
    def write(self, line: str) -> None:
        """The narrator's output: passed on to the terminal, kept for the page."""
        self._write(line)
        if _STEP.match(line):
            start = len(self.lines) - 1 if self.lines and not self.lines[-1] else len(self.lines)
            self.chapter_starts.append((len(self.ops), start))
        crashed = _ABORTED.search(line)
        if crashed:
            self.events.append(
                Event(
                    index=len(self.events),
                    time=self._after_last_call(),
                    kind=EventKind.CRASH,
                    process=crashed.group(1),
                    detail="worker killed while the charge was in flight",
                )
            )
        self.lines.append(line)

    def attach(self, handler: StateHandler, clock: Clock) -> None:
        """Tap ``handler``'s calls on this instance only (its class, and its name, are unchanged)."""
        self._clock = clock
        get = handler.get
        for name, op in _ITEM_CALLS.items():
            setattr(handler, name, self._item_call(op, getattr(handler, name), get))
        for name, op in _SWEEPS.items():
            setattr(handler, name, self._sweep(op, getattr(handler, name), get))

    # --- recording ------------------------------------------------------------------------
    def _t(self, reading: Micros) -> Micros:
        """The instant of the next call, made at clock ``reading``: after the calls before
        it on the same reading."""
        last, calls = self._reading
        calls = calls + 1 if reading == last else 0
        self._reading = (reading, calls)
        return reading + calls * _APART

    def _after_last_call(self) -> Micros:
        last = self.ops[-1].complete if self.ops else None
        return 0 if last is None else last + _CALL // 3

    def _now(self) -> Micros:
        assert self._clock is not None, "attach() comes before any call"
        return micros_in(self._clock.now() - DEMO_START)

    def _view(self, record: StateRecord | None) -> RecordView | None:
        if record is None:
            return None

        def s(instant: dt.datetime | None) -> Micros | None:
            return micros_since(instant, DEMO_START)

        return RecordView(
            key=key_of(record.key),
            status=record.status.value,
            attempt=record.attempt,
            locked_until=s(record.locked_until),
            created_at=s(record.created_at) or 0,
            updated_at=s(record.updated_at) or 0,
            retain_until=s(record.retain_until),
            data=data_text(record.data),
        )

    def _add(
        self,
        op: OpName,
        process: str,
        key: str,
        *,
        token: int | None,
        status: str | None,
        data: str | None,
        outcome: Outcome,
        result: Any,
        error: str | None,
        before: RecordView | None,
        after: RecordView | None,
        probed: bool,
        keys: tuple[str, ...] = (),
    ) -> None:
        index = len(self.ops)
        scalar = result if isinstance(result, bool | int | float | str) or result is None else None
        invoke = self._t(self._now())
        self.ops.append(
            Op(
                index=index,
                process=process,
                op=op,
                key=key,
                invoke=invoke,
                complete=invoke + _CALL,
                outcome=outcome,
                result=scalar,
                token=token,
                status=status,
                error=error,
                store_time=self._now(),
                execution=process,
                keys=keys,
                data=data,
                probed=probed,
                before=before,
                after=after,
            )
        )
        self.store_clock[index] = self._now()

    def _item_call(
        self,
        op: OpName,
        call: Callable[..., Awaitable[Any]],
        get: Callable[[StateHandlerContext], Awaitable[StateRecord | None]],
    ) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(call)
        async def recorded(ctx: StateHandlerContext, *args: Any, **kwargs: Any) -> Any:
            key = key_of(ctx.record_key)
            self._contexts.setdefault(key, ctx)
            before = self._view(await get(ctx))
            status = args[0].value if op is OpName.SET and args else None
            payload = kwargs.get("data", args[1] if op is OpName.SET and len(args) > 1 else None)
            if op is OpName.UPSERT and args:
                payload = args[0]
            outcome, result, error = Outcome.OK, None, None
            try:
                result = await call(ctx, *args, **kwargs)
            except Exception as exc:
                outcome, error = Outcome.FAIL, type(exc).__name__
                raise
            finally:
                after = self._view(await get(ctx))
                token = result if op is OpName.TRY_ACQUIRE_LOCK and result else ctx.lock_token
                self._add(
                    op,
                    ctx.entity_execution_id,
                    key,
                    token=token,
                    status=status,
                    data=data_text(payload),
                    outcome=outcome,
                    result=result,
                    error=error,
                    before=before,
                    after=after,
                    probed=op is not OpName.EXISTS,
                )
            return result

        return recorded

    def _sweep(
        self,
        op: OpName,
        call: Callable[[], Awaitable[int]],
        get: Callable[[StateHandlerContext], Awaitable[StateRecord | None]],
    ) -> Callable[[], Awaitable[int]]:
        @functools.wraps(call)
        async def recorded() -> int:
            before = {k: self._view(await get(c)) for k, c in self._contexts.items()}
            result = await call()
            after = {k: self._view(await get(c)) for k, c in self._contexts.items()}
            changed = tuple(sorted(k for k in before if before[k] != after[k]))
            self._add(
                op,
                CATCHUP_LANE,
                "",
                token=None,
                status=None,
                data=None,
                outcome=Outcome.OK,
                result=result,
                error=None,
                before=None,
                after=None,
                probed=False,
                keys=changed,
            )
            return result

        return recorded

    # --- the result -------------------------------------------------------------------------
    def history(self) -> History:
        return History(
            epoch=DEMO_START,
            lock_duration=1800.0,
            ops=tuple(self.ops),
            events=tuple(self.events),
            meta={"source": "dsm demo invoice"},
        )

    def chapters(self) -> tuple[Chapter, ...]:
        bounds = [*self.chapter_starts, (len(self.ops), len(self.lines))]
        out = []
        for (first_op, first_line), (_, end_line) in itertools.pairwise(bounds):
            lines = self.lines[first_line:end_line]
            while lines and not lines[0]:
                lines = lines[1:]
            title = lines[0] if lines else "Introduction"
            out.append(Chapter(first_op, title, tuple(lines)))
        return tuple(out)


def render_demo_html(tape: DemoTape, outcome: DemoOutcome) -> str:
    """The page: the explorer over the recorded calls, the full narration and the verdict below."""
    environment = template_environment()
    history = tape.history()
    explorer = explorer_view(
        history,
        title="dsm demo invoice",
        chapters=tape.chapters(),
        store_clock=tape.store_clock,
    )
    finals: dict[str, RecordView | None] = {}
    for op in history.ops:
        if op.probed:
            finals[op.key] = op.after
    return environment.get_template("demo.html.j2").render(
        outcome=outcome,
        lines=tape.lines,
        explorer=explorer,
        finals=sorted(finals.items()),
        start=DEMO_START,
    )


async def record_demo(
    db_url: str | None = None,
    *,
    schema: str | None = None,
    keep: bool = False,
    handler: str | HandlerFactory | None = None,
    write: Callable[[str], None] = print,
) -> tuple[DemoTape, DemoOutcome]:
    """Run the walk-through, printing it as usual, with every handler call recorded."""
    tape = DemoTape(write)
    outcome = await run_demo(
        db_url, schema=schema, keep=keep, handler=handler, write=tape.write, observe=tape.attach
    )
    return tape, outcome


def write_demo_html(path: Path, tape: DemoTape, outcome: DemoOutcome) -> Path:
    """Write the explorer page of a recorded walk-through to ``path``."""
    return write_report(path, render_demo_html(tape, outcome))
