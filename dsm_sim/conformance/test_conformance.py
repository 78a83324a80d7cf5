"""Collected by ``pytest --pyargs dsm_sim.conformance --dsm-handler=package.module:factory``.

The factory comes from ``--dsm-handler`` or from a ``dsm_handler_factory``
fixture in the caller's conftest; see ``docs/conformance.md``.
"""

from __future__ import annotations

from dsm_sim.conformance.suite import ConformanceSuite

__all__ = ["TestConformance"]


class TestConformance(ConformanceSuite):
    """Every conformance property, against the handler the plugin resolves."""
