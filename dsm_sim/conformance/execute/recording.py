"""Every step a machine takes is recorded as data, in the order it was taken.

Decorate each step (a Hypothesis rule, or a step only fixed programs take)
with :func:`step`: a call made from outside the machine (Hypothesis drawing
a rule, a replay, a probe) is appended to the machine's ``trace`` as a
:class:`~dsm_sim.conformance.program.Call` before it runs; a step
another step makes on its way (a stall that ends in a sweep) is part of
that step, and is not recorded again.  The trace is the failing program a
violation carries (:class:`~dsm_sim.conformance.properties.PropertyViolation`).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from dsm_sim.conformance.program import Call
from reference_engine.clock import Clock

__all__ = ["Recorder", "step"]

F = TypeVar("F", bound=Callable[..., Any])


class Recorder(Protocol):
    trace: list[Call]
    #: The clock's reading before each step of ``trace``.
    trace_instants: list[dt.datetime]
    step_depth: int

    @property
    def clock(self) -> Clock: ...


def step(function: F) -> F:
    """Record calls of ``function`` (a step of the machine) in ``self.trace``."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def recorded(self: Recorder, *args: Any, **kwargs: Any) -> Any:
        if self.step_depth:
            return function(self, *args, **kwargs)
        if args:
            kwargs = dict(signature.bind(self, *args, **kwargs).arguments)
            kwargs.pop(next(iter(signature.parameters)))
        self.trace.append(Call.of(function.__name__, **kwargs))
        self.trace_instants.append(self.clock.now())
        self.step_depth += 1
        try:
            return function(self, **kwargs)
        finally:
            self.step_depth -= 1

    return recorded  # type: ignore[return-value]
