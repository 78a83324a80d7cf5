"""The conformance kit: is a DataStateMachine handler correct?

Verify a handler factory with :func:`verify` (``dsm verify`` on the command
line), or subclass :class:`ConformanceSuite` in a pytest module and provide a
``dsm_handler_factory`` fixture.  Names are imported lazily, so loading the
pytest plugin or the ``dsm`` command does not import Hypothesis.

The folders follow the path a test case takes: ``generate`` (what it is
made of), ``execute`` (how it runs against the handler), ``judge`` (how an
answer is judged) and ``tell`` (how a finding is shrunk and told).  Above
them, ``probing``, ``racing`` and ``verification`` run the edge probes, the
race matrix and the search in turn, and ``runner`` is the entry point.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "PROPERTIES",
    "PROPERTY_NAMES",
    "ClockMode",
    "ConformanceSuite",
    "PropertyResult",
    "ResultStatus",
    "VerificationReport",
    "build_machine",
    "verify",
]

_WHERE = {
    "PROPERTIES": "dsm_sim.conformance.properties",
    "PROPERTY_NAMES": "dsm_sim.conformance.properties",
    "ClockMode": "dsm_sim.conformance.execute.clocks",
    "ConformanceSuite": "dsm_sim.conformance.suite",
    "PropertyResult": "dsm_sim.conformance.runner",
    "ResultStatus": "dsm_sim.conformance.runner",
    "VerificationReport": "dsm_sim.conformance.runner",
    "build_machine": "dsm_sim.conformance.execute.machine",
    "verify": "dsm_sim.conformance.runner",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dsm_sim.conformance' has no attribute {name!r}")
