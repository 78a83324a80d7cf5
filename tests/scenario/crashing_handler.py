"""A handler factory whose process dies in scenarios run in one marked time zone.

The scenario's ``host_timezone`` is the one input a factory can see that
differs between scenarios (the run sets ``TZ`` before building the handler),
so a test can make exactly one scenario's runs kill their worker process.
"""

from __future__ import annotations

import os
import signal

from reference_engine.clock import Clock
from reference_engine.handler import StateHandler
from reference_engine.handlers.memory import in_memory_handler

__all__ = ["CRASH_ZONE", "make_handler"]

#: Runs of a scenario with this ``host_timezone`` die of SIGSEGV, as a crashing C extension would.
CRASH_ZONE = "Pacific/Kiritimati"


def make_handler(clock: Clock) -> StateHandler:
    if os.environ.get("TZ") == CRASH_ZONE:
        os.kill(os.getpid(), signal.SIGSEGV)
    return in_memory_handler(clock)
