"""Sending to a handler's coroutine on this thread, with an event loop installed as the running one.

An in-process handler (the in-memory model and its variants) finishes most
calls without ever suspending, and a task, a timer and two turns of the loop
per call cost several times the call.  The simulator's driver and the kit's
loop driver both send to such a coroutine directly, in a copy of the context
as a task would be, with their loop as the running loop so that
``asyncio.Lock``, ``asyncio.sleep`` and friends find it; each decides how
the rest of a call that does suspend runs.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

__all__ = ["send_inline"]


def send_inline(
    loop: asyncio.AbstractEventLoop, context: contextvars.Context, coro: Coroutine[Any, Any, Any]
) -> Any:
    """Send ``None`` to ``coro`` in ``context`` with ``loop`` running; what it yielded.

    Raises :class:`StopIteration` (its ``value`` the result) when the
    coroutine returned, or whatever the coroutine raised.
    """
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(loop)
    try:
        return context.run(coro.send, None)
    finally:
        asyncio._set_running_loop(previous)
