"""What goes wrong between the harness and a handler process, each by name.

A handler in another language fails in ways an in-process handler cannot:
it writes something that is not an answer, answers a request it was never
sent, dies, or stops answering.  Each is a :class:`ProtocolError` that names
the request it concerns, so a CI log says which call broke and how, instead
of a hang or a traceback from the JSON decoder.  They derive from
:class:`~reference_engine.errors.DsmError`, whose pickling keeps their
fields when they cross a process boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "HandlerExitedError",
    "HandlerInternalError",
    "HandlerStartError",
    "HandlerTimeoutError",
    "HandlerUnauthorizedError",
    "MalformedResponseError",
    "ProtocolError",
    "SharedStoreRequiredError",
    "UnexpectedResponseError",
    "VersionMismatchError",
]


def _with_stderr(message: str, stderr_tail: str) -> str:
    tail = stderr_tail.strip()
    if not tail:
        return f"{message} (the process wrote nothing to stderr)"
    return f"{message}; last lines of its stderr:\n{tail}"


class ProtocolError(DsmError):
    """The handler process broke the protocol; ``request`` names the call it concerns.

    ``field`` is where in the answer the problem is (``result.attempt``,
    ``error.kind``; empty when the whole line is wrong) and ``expected`` what
    the schema asks for there.
    """

    def __init__(
        self, message: str, *, request: str = "", field: str = "", expected: str = ""
    ) -> None:
        self.request = request
        self.field = field
        self.expected = expected
        super().__init__(message)


class MalformedResponseError(ProtocolError):
    """A line on stdout that is not JSON, or JSON that violates the response schema."""


class UnexpectedResponseError(ProtocolError):
    """An answer whose id was never sent, or was already answered."""

    def __init__(self, message: str, *, response_id: object, request: str = "") -> None:
        self.response_id = response_id
        super().__init__(
            message, request=request, field="id", expected="the id of a request in flight"
        )


class VersionMismatchError(ProtocolError):
    """The process answered ``open`` with a protocol version the harness does not speak.

    ``offered`` is every version the harness offered (and speaks);
    ``answered`` what the process said.
    """

    def __init__(self, *, offered: Sequence[int], answered: object) -> None:
        self.offered = tuple(offered)
        self.answered = answered
        spoken = ", ".join(str(n) for n in self.offered)
        super().__init__(
            f"the handler answered open with protocol version {answered!r}; this harness "
            f"speaks versions {spoken} (it offered them all in open's 'protocols'). Answer "
            "open with one of them: the version the handler was written to "
            "(docs/protocol.md, Versions)",
            request="open",
            field="result.protocol",
            expected=f"one of {spoken}",
        )


class HandlerStartError(ProtocolError):
    """The command could not be started at all (not found, not executable, empty)."""

    def __init__(self, message: str, *, command: str) -> None:
        self.command = command
        super().__init__(message, request="open")


class HandlerUnauthorizedError(HandlerStartError):
    """A handler server refused the connection's ``open``: it did not carry the server's secret."""


class HandlerExitedError(ProtocolError):
    """The process exited (or closed its stdout) while requests were unanswered.

    ``peer`` says what went away: the handler process, or the handler server
    at an address, whose closed connection has no exit status and no stderr.
    """

    def __init__(
        self,
        *,
        request: str,
        returncode: int | None,
        stderr_tail: str,
        peer: str = "handler process",
    ) -> None:
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.peer = peer
        if peer != "handler process":
            super().__init__(
                f"the {peer} closed the connection before answering {request}", request=request
            )
            return
        how = "closed its stdout" if returncode is None else f"exited with status {returncode}"
        super().__init__(
            _with_stderr(f"the handler process {how} before answering {request}", stderr_tail),
            request=request,
        )


class HandlerTimeoutError(ProtocolError):
    """No answer within the timeout: the process is taken to be hung and is killed."""

    def __init__(self, *, request: str, timeout: float, stderr_tail: str) -> None:
        self.timeout = timeout
        self.stderr_tail = stderr_tail
        super().__init__(
            _with_stderr(
                f"the handler process did not answer {request} within {timeout:g}s "
                "(timeout; set it with --exec-timeout); the process was killed",
                stderr_tail,
            ),
            request=request,
        )


class HandlerInternalError(DsmError):
    """The handler answered with error kind ``internal``: it failed in a way it has no kind for.

    Not a protocol violation (the answer is well formed) but never what the
    model raises, so the kit reports it as a disagreeing error.
    """

    def __init__(self, message: str, *, request: str, error_type: str = "") -> None:
        self.request = request
        self.error_type = error_type
        super().__init__(message)


class SharedStoreRequiredError(ConfigurationError):
    """A command that needs many processes on one store got a handler whose store is its own.

    ``dsm stress`` starts a handler process per stress process: a process
    that keeps its records in its own memory would give each one a store
    of its own, and the run would race nothing.  The process says which kind
    it is in its answer to ``open`` (``"shared_store": true``).
    """

    def __init__(self, *, command: str, name: str = "", use: str = "a stress run") -> None:
        self.command = command
        self.name = name
        self.use = use
        called = f" ({name})" if name else ""
        super().__init__(
            f"{use} needs a shared-store handler: the handler {command!r}{called} did not "
            'answer open with "shared_store": true, so each of its processes would keep a '
            "store of its own and no two processes would race on one record. Give a handler "
            "whose processes reach one store (a database, e.g. the run's store named by "
            'DSM_STRESS_DB_URL and DSM_STRESS_SCHEMA) and that says so with "shared_store": '
            "true; dsm serve --shared-store MODULE:FACTORY serves a Python factory that way"
        )
