"""The handler protocol: verify a handler written in any language, in its own process.

``docs/protocol.md`` is the specification; ``schema.json`` (package data)
its machine-checked form.  :func:`~dsm_sim.protocol.client.exec_factory`
turns a command line into a handler factory the kit accepts, and
``dsm serve MODULE:FACTORY`` (:mod:`dsm_sim.protocol.server`) puts any
Python factory on the other end of the wire; :func:`tcp_factory` reaches a
handler that is a server, and :mod:`dsm_sim.protocol.replay` sends the
requests of a recorded counterexample again.
"""

from __future__ import annotations

from dsm_sim.protocol.client import (
    ExecFactory,
    ExecHandler,
    TcpAddress,
    exec_factory,
    tcp_factory,
)
from dsm_sim.protocol.errors import (
    HandlerExitedError,
    HandlerInternalError,
    HandlerStartError,
    HandlerTimeoutError,
    HandlerUnauthorizedError,
    MalformedResponseError,
    ProtocolError,
    SharedStoreRequiredError,
    UnexpectedResponseError,
    VersionMismatchError,
)
from dsm_sim.protocol.schema import PROTOCOL_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "ExecFactory",
    "ExecHandler",
    "HandlerExitedError",
    "HandlerInternalError",
    "HandlerStartError",
    "HandlerTimeoutError",
    "HandlerUnauthorizedError",
    "MalformedResponseError",
    "ProtocolError",
    "SharedStoreRequiredError",
    "TcpAddress",
    "UnexpectedResponseError",
    "VersionMismatchError",
    "exec_factory",
    "tcp_factory",
]
