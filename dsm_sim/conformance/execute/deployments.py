"""A world that changes under its records: what a deployment changes between two deliveries.

Records outlive deployments.  Between two deliveries of the same item a
team redeploys a node with another lock duration or retention, moves its
workers to another application id, restarts a process in another time
zone, or replaces one instance of the handler by a new one.  A store that
remembers an item's first options, stamps the app it first saw, computes
instants in the zone it started in, or keeps locks in the instance that
took them, passes every test whose world stands still.  These rules change
the world mid-test-case:

* :meth:`DeploymentRules.redeploy_node` — an item's node gets new options;
  executions already running keep theirs (a held lock completes under the
  options it was taken with), every worker's next delivery is a new
  execution under the new ones;
* :meth:`DeploymentRules.redeploy_apps` — the workers run in other apps;
* :meth:`DeploymentRules.restart_in_zone` — the process runs in another
  ``TZ`` from now on;
* :meth:`DeploymentRules.instance_restarts` — a worker's own instance of
  the handler is closed and another opened on the same store in its place
  (an instance leaves, another joins), with that worker's locks held.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.domains import configs
from dsm_sim.conformance.generate.worlds import APPS, ZONES, Role, in_zone
from dsm_sim.model import WORLD_CONFIGS, describe_config
from reference_engine.config import HandlerConfig

__all__ = ["DeploymentRules"]

#: A node's new options: one of the world's named sets, or any the options block accepts.
NEW_OPTIONS = st.one_of(st.sampled_from(tuple(WORLD_CONFIGS.values())), configs())


class DeploymentRules(OperationRules):
    """Redeploys, restarts in another zone, and instances that leave and join mid-test-case."""

    def _new_executions(self) -> None:
        """A redeploy restarts every worker: its next call belongs to a new execution."""
        for worker in W.WORKERS:
            self.deliveries[worker] += 1

    @rule(item=W.ITEMS, config=NEW_OPTIONS)
    @step
    def redeploy_node(self, item: Role, config: HandlerConfig) -> None:
        """``item``'s node is redeployed with ``config``; running executions keep their options."""
        if self.diverged:
            return
        old = self._ref(item)
        if old.config == config:
            return
        new = dataclasses.replace(old, config=config)
        refs = tuple(new if ref == old else ref for ref in self.world.refs)
        self.world = dataclasses.replace(self.world, refs=refs)
        self.observers = {
            (new if ref == old else ref): (new.context(W.OBSERVER) if ref == old else ctx)
            for ref, ctx in self.observers.items()
        }
        self.view = {(new if ref == old else ref): value for ref, value in self.view.items()}
        self.holder = {(new if ref == old else ref): w for ref, w in self.holder.items()}
        self._new_executions()
        self._step(
            "deployment",
            f"redeploys {old.name}'s node with {describe_config(config)}",
            "running executions keep their options",
        )

    @rule(apps=st.sampled_from(APPS))
    @step
    def redeploy_apps(self, apps: tuple[str, ...]) -> None:
        """Every worker runs in another application from its next delivery on."""
        if self.diverged or apps == self.world.apps:
            return
        self.world = dataclasses.replace(self.world, apps=apps)
        self._new_executions()
        self._step("deployment", f"moves the workers to apps {apps!r}")

    @rule(zone=st.sampled_from(ZONES))
    @step
    def restart_in_zone(self, zone: str) -> None:
        """The process restarts with ``TZ`` set to ``zone`` (unless the run pins one).

        Not for a handler process the kit started in the test case's zone
        (``--exec``): its store lives in the process, which a restart would
        empty, so it keeps that zone for the whole test case.
        """
        if self.diverged or type(self).time_zone is not None or zone == self.zone or self.zoned:
            return
        in_zone(zone)
        self.zone = zone
        self.world = dataclasses.replace(self.world, zone=zone)
        self._step("deployment", f"restarts the process in time zone TZ={zone}")

    @rule(worker=st.sampled_from(W.WORKERS[1:]))
    @step
    def instance_restarts(self, worker: int) -> None:
        """Worker ``worker``'s instance leaves (closed) and a new one joins on the same store.

        The locks it took live in the store: its executions carry on through
        the new instance.  Only a handler whose instances are peers on one
        store has an instance of its own per worker; for others nothing changes.
        """
        if self.diverged or worker not in self.instances.peers:
            return
        closed = self.instances.leave(worker)
        self._step(
            f"worker {worker}",
            "its handler instance leaves; a new one joins on the same store",
            closed.describe() if closed.error is not None else "",
        )
        self._checked("closes_cleanly")
        if closed.error is not None:
            self._report(
                P.Finding(
                    "closes_cleanly",
                    f"close() of worker {worker}'s instance raised {closed.describe()}: "
                    f"{closed.error}",
                )
            )
            return
        self.instances.of(worker)  # the new instance opens now, as a process starting would
        self._after_step("restart")
