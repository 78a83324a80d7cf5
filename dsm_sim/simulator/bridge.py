"""Running async node code inside SimPy generator processes, deterministically.

SimPy processes are generators and cannot ``await``.  Instead of an event
loop, the worker process drives the node's coroutine by hand: the node gets a
handler proxy and a billing API whose methods are awaitables that *yield a
request object* out of the coroutine.  The worker receives the request, waits
a sampled latency in simulated time (the race window), runs the real call,
and sends the result (or throws the exception) back in.  The real executor
and the real node run unchanged, with latency between every exists,
try_acquire_lock, charge and set.

Simulated time is bounded by the scenario; the real handler's awaits are
bounded here, in real time (:func:`run_bounded`): a call that does not
return within the call timeout (``dsm run --call-timeout``, default 10 s)
is cancelled and stops the run with :class:`HandlerHungError`, naming the
call, instead of hanging ``dsm run`` with no output.  The whole of a
``dsm run`` is bounded the same way (``--max-wall``): every real call checks
the deadline set by :func:`wall_deadline`, so a run stops at its next call
once it has passed (:class:`WallClockLimitError`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from dsm_sim.history import OpName
from dsm_sim.options import seconds_from_env
from dsm_sim.wall import (
    RunStoppedError,
    WallClockLimitError,
    current_deadline,
    past_deadline,
    wall_deadline,
    wall_now,
)
from reference_engine.config import DataStateMachineConfig
from reference_engine.context import StateHandlerContext
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handler import StateHandler
from reference_engine.machine import ContextualDataStateMachine, DataStateMachine
from reference_engine.record import StateRecord
from reference_engine.registry import HandlerRegistry
from reference_engine.status import IdempotencyStatus

__all__ = [
    "CALL_TIMEOUT_ENV",
    "DEFAULT_CALL_TIMEOUT_S",
    "BillingProxy",
    "Done",
    "EffectCall",
    "HandlerCall",
    "HandlerHungError",
    "HandlerProxy",
    "RecordingFactory",
    "Request",
    "RunStoppedError",
    "WallClockLimitError",
    "bound_for",
    "bounded",
    "call_timeout",
    "check_deadline",
    "current_deadline",
    "handler_coroutine",
    "hung",
    "run_bounded",
    "step",
    "wall_deadline",
    "wall_now",
]

T = TypeVar("T")

#: Real seconds one handler call may take inside a simulated run.
DEFAULT_CALL_TIMEOUT_S = 10.0
#: Where ``dsm run --call-timeout`` puts the bound, so worker processes (``--jobs``) see it too.
CALL_TIMEOUT_ENV = "DSM_CALL_TIMEOUT"
_MAX_CALL_TIMEOUT_S = 3600.0


class HandlerHungError(RunStoppedError):
    """A real handler call did not return within the call timeout; the run was stopped."""


def call_timeout() -> float:
    """The bound in force: ``$DSM_CALL_TIMEOUT`` if set, else :data:`DEFAULT_CALL_TIMEOUT_S`.

    The variable gets the bounds of ``--call-timeout`` (:class:`EnvironmentValueError`).
    """
    return seconds_from_env(
        CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S, _MAX_CALL_TIMEOUT_S, flag="--call-timeout"
    )


def bound_for(handler: object) -> float | None:
    """The bound for ``handler``'s calls; None for a protocol client (``exec:``, ``exec-tcp:``).

    The protocol client bounds every request itself (``--exec-timeout``) and
    kills a hung process; a second timer here would race it.
    """
    return None if type(handler).__module__.startswith("dsm_sim.protocol") else call_timeout()


def check_deadline(final: bool = False) -> None:
    """Stop the run before its next call when the command's deadline has passed."""
    deadline = current_deadline(final)
    if deadline is not None and wall_now() >= deadline:
        raise past_deadline()


async def bounded(
    awaitable: Awaitable[T], what: str, seconds: float | None, deadline: float | None = None
) -> T:
    """Await ``awaitable`` under the loop's own timer; running out of time is a hung call.

    ``deadline`` (a :func:`wall_now` instant) bounds it too: reaching that
    first stops the run as past the command's wall-clock limit.
    """
    remaining = None if deadline is None else max(0.0, deadline - wall_now())
    by_deadline = remaining is not None and (seconds is None or remaining < seconds)
    if by_deadline:
        seconds = remaining
    if seconds is None:
        return await awaitable
    bound = asyncio.timeout(seconds)
    try:
        async with bound:
            return await awaitable
    except TimeoutError:
        if not bound.expired():
            raise  # the handler's own TimeoutError
        if by_deadline:
            raise past_deadline() from None
        assert seconds is not None
        raise hung(what, seconds) from None


def hung(what: str, seconds: float) -> HandlerHungError:
    """The error that stops a run whose handler call ``what`` outlived the bound."""
    return HandlerHungError(
        f"the handler's {what} did not return within {seconds:g}s of real time (hung: "
        "waiting for a lock or a connection that never came?), so the run stopped; set "
        "the limit with --call-timeout"
    )


def run_bounded(
    loop: asyncio.AbstractEventLoop,
    awaitable: Awaitable[T],
    what: str,
    seconds: float | None,
    *,
    final: bool = False,
) -> T:
    """Run a real handler call on ``loop``, bounded by ``seconds`` in real time (None: unbounded).

    The bound is the loop's own timer.  Only a call that awaits can be
    stopped; one that blocks the thread cannot.  The command's deadline
    (:func:`wall_deadline`) bounds the call too, except a ``final`` one (the
    ``close()`` that releases the store after the run, stopped or not).
    """
    deadline = current_deadline(final)
    if deadline is not None and wall_now() >= deadline:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise past_deadline()
    return loop.run_until_complete(bounded(awaitable, what, seconds, deadline))


@dataclass(frozen=True, slots=True)
class HandlerCall:
    """A node asks the store for something; ``ctx`` carries item and token."""

    op: OpName
    ctx: StateHandlerContext
    status: IdempotencyStatus | None = None
    data: Mapping[str, Any] | None = None
    error_detail: str = ""


@dataclass(frozen=True, slots=True)
class EffectCall:
    """A node performs its business side effect (a charge, a notice, a screening).

    The worker attributes it to the item the execution locked last, with the
    fencing token of that acquisition.
    """

    item_key: str
    amount: int
    action: str = "charge"


Request = HandlerCall | EffectCall


@dataclass(frozen=True, slots=True)
class Done:
    """The coroutine finished with ``value``."""

    value: Any = None


class _Suspend:
    """Awaitable that hands ``request`` to whoever drives the coroutine."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self.request)


async def _ask(request: Request) -> Any:
    return await _Suspend(request)


class HandlerProxy:
    """A :class:`StateHandler` whose every call is a request to the worker process."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def exists(self, ctx: StateHandlerContext) -> bool:
        return cast(bool, await _ask(HandlerCall(OpName.EXISTS, ctx)))

    async def get(self, ctx: StateHandlerContext) -> StateRecord | None:
        return cast("StateRecord | None", await _ask(HandlerCall(OpName.GET, ctx)))

    async def try_acquire_lock(self, ctx: StateHandlerContext) -> int | None:
        return cast("int | None", await _ask(HandlerCall(OpName.TRY_ACQUIRE_LOCK, ctx)))

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        await _ask(HandlerCall(OpName.SET, ctx, status=status, data=data))

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        await _ask(HandlerCall(OpName.RELEASE_LOCK_AS_FAILED, ctx, error_detail=error_detail))

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        await _ask(HandlerCall(OpName.UPSERT, ctx, data=data))

    async def reset_expired_locks(self) -> int:
        raise NotImplementedError("sweeps are run by the simulated catch-up worker")

    async def expire_past_retention(self) -> int:
        raise NotImplementedError("sweeps are run by the simulated catch-up worker")


class BillingProxy:
    """The business APIs as the nodes see them; every effect happens in the worker process.

    One object serves the billing API (invoice node), the notice API
    (correction node) and the screening API (screening node).
    """

    async def charge(self, invoice_id: str, amount: int) -> Mapping[str, Any]:
        return cast("Mapping[str, Any]", await _ask(EffectCall(invoice_id, amount)))

    async def send_correction(
        self, invoice_id: str, revision: int, amount: int
    ) -> Mapping[str, Any]:
        call = EffectCall(invoice_id, amount, f"correction r{revision}")
        return cast("Mapping[str, Any]", await _ask(call))

    async def screen(self, line_id: str, amount: int) -> Mapping[str, Any]:
        return cast("Mapping[str, Any]", await _ask(EffectCall(line_id, amount, "screen")))


class RecordingFactory(DataStateMachineFactory):
    """The engine's factory, remembering each execution's machine so effects know their token."""

    def __init__(self, registry: HandlerRegistry) -> None:
        super().__init__(registry)
        self.machines: dict[str, ContextualDataStateMachine] = {}

    async def create(
        self,
        element: Element,
        thread: ExecutionThread,
        config: DataStateMachineConfig | None,
    ) -> DataStateMachine:
        machine = await super().create(element, thread, config)
        if isinstance(machine, ContextualDataStateMachine):
            self.machines[thread.execution_id] = machine
        return machine

    def forget(self, execution_id: str) -> None:
        self.machines.pop(execution_id, None)


def step(
    coro: Coroutine[Any, Any, Any], value: Any = None, error: BaseException | None = None
) -> Request | Done:
    """Advance the coroutine to its next request, or to its end."""
    try:
        request = coro.throw(error) if error is not None else coro.send(value)
    except StopIteration as stop:
        return Done(stop.value)
    if not isinstance(request, HandlerCall | EffectCall):
        raise TypeError(
            f"node code awaited {request!r}; inside the simulator a node may only await the "
            "DataStateMachine and the billing API"
        )
    return request


def handler_coroutine(handler: StateHandler, call: HandlerCall) -> Coroutine[Any, Any, Any]:
    """The real handler's coroutine for ``call`` (not started)."""
    ctx = call.ctx
    match call.op:
        case OpName.EXISTS:
            return handler.exists(ctx)
        case OpName.GET:
            return handler.get(ctx)
        case OpName.TRY_ACQUIRE_LOCK:
            return handler.try_acquire_lock(ctx)
        case OpName.SET:
            assert call.status is not None
            return handler.set(ctx, call.status, call.data)
        case OpName.RELEASE_LOCK_AS_FAILED:
            return handler.release_lock_as_failed(ctx, call.error_detail)
        case OpName.UPSERT:
            return handler.upsert(ctx, call.data)
        case _:
            raise ValueError(f"{call.op.value} is not a node-level handler call")
