"""Peer libraries as targets of the harness: their persistence layers, wrapped as handlers.

A peer is another project's idempotency store.  Wrapped in the handler
Protocol, it runs through the conformance kit and the scenarios like any
handler, judged by its own declared semantics profile
(:mod:`dsm_sim.conformance.judge.semantics`), so that what it does by design is
not reported and what is a hazard in any design still is.

* :mod:`dsm_sim.peers.powertools` — Powertools for AWS Lambda (Python),
  idempotency utility: its Redis persistence layer, or any
  ``BasePersistenceLayer`` subclass (needs the ``peers`` extra).
"""

from __future__ import annotations

__all__: list[str] = []
