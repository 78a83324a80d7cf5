"""The handler a ``dsm run`` targets, from the words of ``--handler``.

Apart from the command (:mod:`dsm_sim.simulator.cli`) because the worker
processes of a parallel run (:mod:`dsm_sim.simulator.parallel`) resolve the
same words in each process, and the command starts those workers.
"""

from __future__ import annotations

from reference_engine.errors import ConfigurationError
from reference_engine.handler import HandlerFactory
from reference_engine.registry import load_factory

__all__ = ["BROKEN_PREFIX", "EXEC_PREFIX", "EXEC_TCP_PREFIX", "resolve_handler"]

BROKEN_PREFIX = "broken:"
EXEC_PREFIX = "exec:"
EXEC_TCP_PREFIX = "exec-tcp:"


def resolve_handler(spec: str) -> HandlerFactory:
    """``module:factory`` through the registry loader, ``broken:NAME`` from the catalogue,
    or ``exec:COMMAND`` / ``exec-tcp:HOST:PORT`` for a handler out of process."""
    if spec.startswith(EXEC_PREFIX):
        from dsm_sim.protocol.client import exec_factory

        return exec_factory(spec[len(EXEC_PREFIX) :])
    if spec.startswith(EXEC_TCP_PREFIX):
        from dsm_sim.protocol.client import tcp_factory

        return tcp_factory(spec[len(EXEC_TCP_PREFIX) :])
    if spec.startswith(BROKEN_PREFIX):
        from dsm_sim.broken import CATALOGUE

        name = spec[len(BROKEN_PREFIX) :]
        if name not in CATALOGUE:
            raise ConfigurationError(
                f"unknown broken handler {name!r}; the catalogue has: {', '.join(sorted(CATALOGUE))}"
            )
        return CATALOGUE[name].factory
    return load_factory(spec)
