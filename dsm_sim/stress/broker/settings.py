"""What a broker stress run is: a stress run's store and load, plus the broker and the kills.

Frozen and picklable, like :class:`~dsm_sim.stress.settings.StressSettings`,
because every spawned worker process receives it unchanged.  The messages
and the kill plans are drawn from the seed, so a run can be described (and
repeated) by its settings alone.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

from dsm_sim.stress.settings import StressSettings, item_key
from reference_engine.broker.amqp import check_amqp_url
from reference_engine.broker.base import Topology
from reference_engine.errors import InvalidOptionError

__all__ = ["ALL_KILL_POINTS", "BrokerStressSettings", "KillPlan", "KillPoint", "PublishedMessage"]


class KillPoint(enum.Enum):
    """Where in a delivery a worker process is SIGKILLed."""

    #: Lock taken, nothing charged yet: the redelivery must take the item over.
    BEFORE_CHARGE = "before-charge"
    #: Charged, ``set(Processed)`` not written: the lock must expire, then a retry charges again.
    AFTER_CHARGE = "after-charge"
    #: ``set(Processed)`` landed, the message not acknowledged: the redelivery must skip.
    AFTER_SET = "after-set"


ALL_KILL_POINTS = tuple(KillPoint)


@dataclass(frozen=True, slots=True)
class KillPlan:
    """One worker incarnation dies the ``nth`` time it reaches ``point``."""

    point: KillPoint
    nth: int


@dataclass(frozen=True, slots=True)
class PublishedMessage:
    message_id: str
    key: str
    amount: int


@dataclass(frozen=True, slots=True)
class BrokerStressSettings:
    """One broker stress run.

    ``stress`` names the store, the handler, the process count, the keys, the
    lock duration and the seed; its ``workers`` is each process's prefetch
    (deliveries in flight at once).  ``duplicate_publishes`` extra messages
    repeat keys drawn from the seed, each published right after its original
    so two workers are likely to hold the pair at once.  ``kills`` worker
    incarnations SIGKILL themselves, at the kill points in turn.
    ``ack_first`` is the deliberately broken consumer (ack before the node).
    """

    stress: StressSettings
    broker_url: str
    duplicate_publishes: int = 0
    kills: int = 3
    kill_points: tuple[KillPoint, ...] = ALL_KILL_POINTS
    ack_first: bool = False
    requeue_delay: float = 0.2
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_amqp_url(self.broker_url)
        for name, value, upper in (
            ("duplicate_publishes", self.duplicate_publishes, 10 * self.stress.keys),
            ("kills", self.kills, 10_000),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
                raise InvalidOptionError(
                    name, f"must be an integer from 0 to {upper}, got {value!r}"
                )
        if self.kills and not self.kill_points:
            raise InvalidOptionError(
                "kill_points", "kills were asked for but no kill point is enabled", _POINTS
            )
        for name in ("requeue_delay", "timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidOptionError(name, f"must be finite and not negative, got {value!r}")

    @property
    def topology(self) -> Topology:
        return Topology.for_run(self.stress.run_id)

    @property
    def message_count(self) -> int:
        return self.stress.keys + self.duplicate_publishes

    def messages(self) -> list[PublishedMessage]:
        """Every publish, in order: each key once, duplicates right behind their original."""
        rng = random.Random(f"{self.stress.seed}/publish")
        repeats = [rng.randrange(self.stress.keys) for _ in range(self.duplicate_publishes)]
        extra: dict[int, int] = {}
        for k in repeats:
            extra[k] = extra.get(k, 0) + 1
        out: list[PublishedMessage] = []
        for k in range(self.stress.keys):
            amount = 100 + k % 900
            for _ in range(1 + extra.get(k, 0)):
                out.append(PublishedMessage(f"m{len(out):07d}", item_key(k), amount))
        return out

    def kill_plan(self, incarnation: int) -> KillPlan | None:
        """The plan of the ``incarnation``-th worker process started (None: it is not killed).

        The first ``kills`` incarnations die, each after a number of arrivals
        at its point drawn so that the kills are spread over the first part of
        the run (a kill planned too late would find the queue already drained).
        """
        if incarnation >= self.kills:
            return None
        rng = random.Random(f"{self.stress.seed}/kill/{incarnation}")
        # Early enough that incarnations started late (replacements) still reach their point.
        gap = max(1, self.message_count // (4 * (self.kills + self.stress.processes)))
        point = self.kill_points[incarnation % len(self.kill_points)]
        if incarnation >= self.stress.processes:
            # A replacement starts late, when less is left to consume: it dies sooner.
            gap = max(1, gap // 4)
        return KillPlan(point, rng.randint(1, gap))


_POINTS = tuple(p.value for p in KillPoint)
