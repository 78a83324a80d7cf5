"""Handlers that stop answering, for the tests of ``dsm run --max-wall``.

``make_handler`` blocks its thread in every ``exists`` (a ``time.sleep``, as
a synchronous driver call inside an ``async`` method would) in scenarios run
in :data:`STUCK_ZONE`, and is the in-memory handler elsewhere: the scenario's
``host_timezone`` is the one input a factory sees that differs between
scenarios (the run sets ``TZ`` before building the handler).

Run as a script, this module is a protocol handler process that stops
answering at its first real call, like a process whose store hangs.
"""

from __future__ import annotations

import json
import os
import sys
import time

from reference_engine.clock import Clock
from reference_engine.context import StateHandlerContext
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import InMemoryStateHandler, in_memory_handler

__all__ = ["BLOCKED_FOR_S", "STUCK_ZONE", "make_handler"]

#: Runs of a scenario with this ``host_timezone`` block in their first ``exists``.
STUCK_ZONE = "Pacific/Chatham"
#: Far longer than any test waits: only a stop from outside ends the call.
BLOCKED_FOR_S = 600.0


class BlockingHandler(InMemoryStateHandler):
    async def exists(self, ctx: StateHandlerContext) -> bool:
        # Blocks the thread on purpose: no timer of the event loop can fire meanwhile.
        time.sleep(BLOCKED_FOR_S)  # noqa: ASYNC251
        return await super().exists(ctx)


def make_handler(clock: Clock) -> StateHandler:
    if os.environ.get("TZ") == STUCK_ZONE:
        return BlockingHandler(clock)
    return in_memory_handler(clock)


def _silent() -> None:
    """Answer ``open`` and ``close`` until the first other request; then never answer again.

    A process that hangs on its store: the harness's first start (open,
    close) goes through, and the run's first real call never returns, nor
    does the ``close`` that follows it.
    """
    hung = False
    for line in sys.stdin:
        request = json.loads(line)
        hung = hung or request["op"] not in ("open", "close")
        if hung:
            continue
        result = {"protocol": 1, "concurrent": False, "name": "silent"}
        answer = result if request["op"] == "open" else None
        print(json.dumps({"id": request["id"], "result": answer}), flush=True)


if __name__ == "__main__":
    _silent()
