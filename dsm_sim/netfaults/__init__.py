"""Real network faults between workers and their store, on loopback.

:class:`FaultProxy` sits between a handler's driver and a real PostgreSQL or
Redis and delays, stalls, partitions or resets the connections on demand,
logging when each fault was active.  A proxy needs neither root nor ``tc``,
so the same fault tests run on a laptop and in CI; see ``docs/netfaults.md``.
"""

from __future__ import annotations

from dsm_sim.netfaults.errors import (
    FaultWaitTimeoutError,
    InvalidFaultError,
    NetFaultError,
    ProxyStateError,
)
from dsm_sim.netfaults.events import Direction, FaultKind, FaultWindow, history_events
from dsm_sim.netfaults.proxy import HEAL_MODES, FaultProxy, Heal

__all__ = [
    "HEAL_MODES",
    "Direction",
    "FaultKind",
    "FaultProxy",
    "FaultWaitTimeoutError",
    "FaultWindow",
    "Heal",
    "InvalidFaultError",
    "NetFaultError",
    "ProxyStateError",
    "history_events",
]
