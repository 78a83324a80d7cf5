"""``dsm stress --broker``: the real engine and invoice node consuming RabbitMQ, with kills.

:func:`run_broker_stress` is the API, :class:`BrokerStressSettings` the run.
"""

from dsm_sim.stress.broker.runner import BrokerStressReport, run_broker_stress
from dsm_sim.stress.broker.settings import (
    ALL_KILL_POINTS,
    BrokerStressSettings,
    KillPlan,
    KillPoint,
)

__all__ = [
    "ALL_KILL_POINTS",
    "BrokerStressReport",
    "BrokerStressSettings",
    "KillPlan",
    "KillPoint",
    "run_broker_stress",
]
