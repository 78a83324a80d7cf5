"""Nodes redeployed mid-run: new options, new executors, new handler instances, same store.

A deployment (``[[deployments]]`` in a scenario) happens at its instant of
simulated time: every worker instance gets a new executor of the node, built
from the node's element with the new options, and its handler instance is
replaced (closed once no call is inside it; the next call opens a new one on
the populated store).  Executions already running finish with the executor
they started with, as in a rolling deployment, so for a while calls of both
deployments reach the store.  Each call carries the options it was made with
into the history, and the checker judges it by them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, MutableMapping
from dataclasses import dataclass
from typing import Any

from dsm_sim.history import EventKind
from dsm_sim.scenario import Deployment, NodeSpec
from dsm_sim.simulator.workload import nodes_of
from dsm_sim.simulator.world import World
from reference_engine.clock import Clock
from reference_engine.engine.executor import BaseNodeExecutor

__all__ = ["DEPLOYER", "Build", "Instance", "deployed", "redeployments"]

#: Builds a worker instance's executor of a node (as deployed) on the instance's clock.
Build = Callable[[NodeSpec, Clock], BaseNodeExecutor]

#: The lane deployments are drawn on.
DEPLOYER = "deployer"


@dataclass(frozen=True, slots=True)
class Instance:
    """One worker instance: its name, its clock, and its executors (shared by its lanes)."""

    name: str
    clock: Clock
    executors: MutableMapping[str, BaseNodeExecutor]


def deployed(node: NodeSpec, deployment: Deployment) -> NodeSpec:
    """``node`` with the options ``deployment`` changes."""
    lock = node.lock_duration if deployment.lock_duration is None else deployment.lock_duration
    retention = node.retention
    if deployment.forever:
        retention = None
    elif deployment.retention is not None:
        retention = deployment.retention
    return dataclasses.replace(node, lock_duration=lock, retention=retention)


def redeployments(
    world: World, instances: list[Instance], build: Build
) -> Generator[Any, Any, None]:
    """Apply the scenario's deployments at their instants."""
    current = {node.id: node for node in nodes_of(world.scenario)}
    for deployment in world.scenario.deployments:
        if deployment.at > world.now:
            yield world.env.timeout(deployment.at - world.now)
        node = deployed(current[deployment.node], deployment)
        current[node.id] = node
        for instance in instances:
            instance.executors[node.id] = build(node, instance.clock)
            world.restart(instance.name)
        world.node_locks[node.id] = node.lock_duration
        kept = "forever" if node.retention is None else f"{node.retention:g}s"
        world.event(
            EventKind.DEPLOYMENT,
            process=DEPLOYER,
            detail=f"{node.id} redeployed: lock {node.lock_duration:g}s, retention {kept}",
            node=node.id,
        )
