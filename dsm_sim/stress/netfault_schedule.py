"""Playing a run's ``--netfault`` schedule on a :class:`FaultProxy` in front of its database.

The worker processes reach the database through the proxy; the parent (its
own handler, the catch-up and recovery passes, the final reads) and every
effect ledger connect directly.  So a fault is between the workers and the
store only, as a partition of one machine from the database would be, and the
durable evidence the checker counts duplicates from is never in doubt.

The schedule runs in the parent's event loop, timed from the instant the
first worker passed the start barrier, so ``at=2s`` means two seconds into
the work however long spawning the processes took.  Every control is logged
by the proxy as a :class:`FaultWindow` on the history's time base (seconds
since the run's epoch), so the windows can be drawn beside the operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.engine import make_url

from dsm_sim.netfaults import FaultKind, FaultProxy, FaultWindow
from dsm_sim.stress.netfault_spec import NetFault
from dsm_sim.stress.settings import DatabaseKind, StressSettings

__all__ = ["DEFAULT_PORTS", "FaultSchedule", "Switch", "upstream_of"]

#: The port a server URL without one means.
DEFAULT_PORTS = {DatabaseKind.POSTGRESQL: 5432, DatabaseKind.MARIADB: 3306}


class Switch(enum.Enum):
    """Whether a scheduled action turns its fault on or off."""

    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class _Action:
    at: float
    switch: Switch
    fault: NetFault


def upstream_of(settings: StressSettings) -> tuple[str, int]:
    """The database server's host and port, from the run's URL."""
    url = make_url(settings.db_url)
    return url.host or "127.0.0.1", url.port or DEFAULT_PORTS[settings.kind]


class FaultSchedule:
    """One proxy for all worker processes, and the task that turns its faults on and off."""

    def __init__(self, settings: StressSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        host, port = upstream_of(settings)
        self.proxy = FaultProxy(host, port, clock=clock)
        self._task: asyncio.Task[None] | None = None
        self._on: list[NetFault] = []
        #: The faults whose window began (a fault timed after the workers finished never does).
        self.reached: list[NetFault] = []
        #: When the workers started, on the history's time base (None until they did).
        self.origin: float | None = None

    async def start(self) -> None:
        await self.proxy.start()

    @property
    def url(self) -> str:
        """The run's URL pointed at the proxy: what the worker processes connect to."""
        proxied = make_url(self.settings.db_url).set(host="127.0.0.1", port=self.proxy.port)
        return proxied.render_as_string(hide_password=False)

    def play(self, started: Callable[[], Awaitable[float]]) -> None:
        """Start the schedule; ``started`` waits for the workers and says when they began."""
        self._task = asyncio.get_running_loop().create_task(self._play(started))

    async def stop(self) -> tuple[FaultWindow, ...]:
        """End the schedule and every fault still on, close the proxy; the windows stay."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for fault in reversed(self._on):
            self._apply(_Action(0.0, Switch.OFF, fault))
        self._on.clear()
        await self.proxy.close()  # a second close only closes what is still open: nothing
        return self.proxy.windows

    @property
    def windows(self) -> tuple[FaultWindow, ...]:
        return self.proxy.windows

    @property
    def not_reached(self) -> tuple[NetFault, ...]:
        return tuple(f for f in self.settings.netfaults if f not in self.reached)

    async def _play(self, started: Callable[[], Awaitable[float]]) -> None:
        origin = self.origin = await started()
        actions = [_Action(f.at, Switch.ON, f) for f in self.settings.netfaults]
        actions += [_Action(end, Switch.OFF, f) for f in self.settings.netfaults if (end := f.end)]
        # At one instant a window ends before the next begins, so adjacent ones can touch.
        actions.sort(key=lambda a: (a.at, a.switch is Switch.ON))
        for action in actions:
            delay = origin + action.at - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._apply(action)

    def _apply(self, action: _Action) -> None:
        fault, proxy = action.fault, self.proxy
        on = action.switch is Switch.ON
        if on:
            self.reached.append(fault)
            if fault.kind is not FaultKind.RESET:
                self._on.append(fault)
        elif fault in self._on:
            self._on.remove(fault)
        else:
            return
        if fault.kind is FaultKind.PARTITION:
            proxy.begin_partition() if on else proxy.heal(fault.heal)
        elif fault.kind is FaultKind.STALL:
            direction = fault.direction.direction
            proxy.stall(direction) if on else proxy.resume(direction)
        elif fault.kind is FaultKind.LATENCY:
            if on:
                proxy.set_latency(fault.to_server, fault.to_client)
            else:
                proxy.set_latency(0.0, 0.0)
        elif fault.kind is FaultKind.RESET:
            proxy.reset_connections()
        else:
            proxy.refuse(on)
