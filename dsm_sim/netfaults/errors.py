"""Errors of the fault-injecting proxy, under the project's one error root.

A misused control fails loudly and says what is allowed: a fault test that
silently injected nothing would pass for the wrong reason.
"""

from __future__ import annotations

from reference_engine.errors import ConfigurationError, DsmError

__all__ = ["FaultWaitTimeoutError", "InvalidFaultError", "NetFaultError", "ProxyStateError"]


class NetFaultError(DsmError):
    """Root of the errors raised by :mod:`dsm_sim.netfaults`."""


class InvalidFaultError(NetFaultError, ConfigurationError):
    """A fault was asked for with a value the proxy cannot honour."""

    def __init__(self, control: str, problem: str, allowed: str) -> None:
        self.control = control
        self.problem = problem
        self.allowed = allowed
        super().__init__(f"FaultProxy.{control}: {problem}; allowed: {allowed}")


class ProxyStateError(NetFaultError):
    """A control was used while the proxy was not listening (not started, or closed)."""

    def __init__(self, control: str, state: str) -> None:
        self.control = control
        self.state = state
        super().__init__(
            f"FaultProxy.{control} needs a listening proxy but it is {state}; "
            "use 'async with FaultProxy(host, port) as proxy:' or await proxy.start() first"
        )


class FaultWaitTimeoutError(NetFaultError):
    """A wait for traffic gave up: the client never sent (or the server never answered).

    Raised instead of letting a test go on, so a fault injected before the
    bytes it was meant to catch shows up as this error, not as a pass.
    """

    def __init__(self, awaited: str, seen: str, timeout: float) -> None:
        self.awaited = awaited
        self.seen = seen
        self.timeout = timeout
        super().__init__(
            f"waited {timeout:g} s for {awaited} but saw {seen}; check that the client "
            "connects through the proxy's port and that the call was started first"
        )
