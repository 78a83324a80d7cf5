"""The ``--netfault`` grammar: which network fault a stress run injects, when, and for how long.

A fault given on the command line must be checked before any process is
spawned: a typo that silently injected nothing would make a run pass for the
wrong reason.  So a spec is parsed into a frozen :class:`NetFault` (which
pickles into the settings every process gets), and anything the grammar does
not allow is a :class:`NetFaultSpecError` that prints the whole grammar.

One spec is ``KIND:PARAM=VALUE,...``; times are seconds since the workers
started (``2s``, ``250ms``, a bare number is seconds)::

    partition:at=T,for=T[,heal=resume|reset]
    stall:at=T,for=T[,direction=to_server|to_client|both]
    latency:[to_server=T][,to_client=T][,at=T][,for=T]
    reset:at=T
    refuse:at=T,for=T

Windows that act on the same switch of the proxy must not overlap: the end of
one would undo the other (a stall's resume ends a partition).
"""

from __future__ import annotations

import enum
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dsm_sim.netfaults import Direction, FaultKind, Heal
from reference_engine.errors import ConfigurationError, InvalidOptionError, echo

__all__ = [
    "GRAMMAR",
    "MAX_SECONDS",
    "NetFault",
    "NetFaultSpecError",
    "StallDirection",
    "check_overlaps",
    "parse_netfault",
    "parse_netfaults",
]

#: The longest offset, window or delay a spec may name (the proxy's own bound).
MAX_SECONDS = 3600.0

GRAMMAR: tuple[str, ...] = (
    "partition:at=T,for=T[,heal=resume|reset]",
    "stall:at=T,for=T[,direction=to_server|to_client|both]",
    "latency:[to_server=T][,to_client=T][,at=T][,for=T] (at least one delay; "
    "without for= until the workers finish)",
    "reset:at=T",
    "refuse:at=T,for=T",
)
_UNITS = "T is seconds since the workers started: 2s, 1.5s, 250ms or a bare number of seconds"
_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>ms|s)?")


class NetFaultSpecError(InvalidOptionError):
    """A ``--netfault`` spec the grammar does not allow; the message lists what it does."""

    def __init__(self, spec: str, problem: str) -> None:
        self.option = "netfault"
        self.spec = spec
        self.problem = problem
        self.allowed = GRAMMAR
        ConfigurationError.__init__(
            self,
            f"--netfault {echo(spec)}: {problem}; allowed: " + " | ".join(GRAMMAR) + f" ({_UNITS})",
        )


class StallDirection(enum.Enum):
    """Which way a stall holds bytes; ``both`` is a partition that still lets connects through."""

    TO_SERVER = "to_server"
    TO_CLIENT = "to_client"
    BOTH = "both"

    @property
    def direction(self) -> Direction | None:
        """The proxy's direction (``None``: both)."""
        return None if self is StallDirection.BOTH else Direction(self.value)


@dataclass(frozen=True, slots=True)
class NetFault:
    """One scheduled fault; ``duration`` is ``None`` for an instant (reset) or an open latency."""

    kind: FaultKind
    at: float
    duration: float | None = None
    heal: Heal = "resume"
    direction: StallDirection = StallDirection.BOTH
    to_server: float = 0.0
    to_client: float = 0.0
    spec: str = ""

    @property
    def end(self) -> float | None:
        return None if self.duration is None else self.at + self.duration

    @property
    def switch(self) -> str:
        """The proxy switch this fault turns on and off; two on one switch must not overlap."""
        if self.kind in (FaultKind.PARTITION, FaultKind.STALL):
            return "flow"
        return str(self.kind.value)

    def overlaps(self, other: NetFault) -> bool:
        if self.kind is FaultKind.RESET or other.kind is FaultKind.RESET:
            return False
        if self.switch != other.switch:
            return False
        mine = math.inf if self.end is None else self.end
        theirs = math.inf if other.end is None else other.end
        return self.at < theirs and other.at < mine

    def describe(self) -> str:
        return self.spec or self.kind.value


#: Parameters each kind takes, and which of them it needs.
_PARAMS: dict[FaultKind, tuple[frozenset[str], frozenset[str]]] = {
    FaultKind.PARTITION: (frozenset({"at", "for", "heal"}), frozenset({"at", "for"})),
    FaultKind.STALL: (frozenset({"at", "for", "direction"}), frozenset({"at", "for"})),
    FaultKind.LATENCY: (frozenset({"at", "for", "to_server", "to_client"}), frozenset()),
    FaultKind.RESET: (frozenset({"at"}), frozenset({"at"})),
    FaultKind.REFUSE: (frozenset({"at", "for"}), frozenset({"at", "for"})),
}


def _seconds(spec: str, name: str, text: str) -> float:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise NetFaultSpecError(spec, f"{name}={text!r} is not a time")
    value = float(match["number"]) / (1000.0 if match["unit"] == "ms" else 1.0)
    if not value < MAX_SECONDS:
        raise NetFaultSpecError(spec, f"{name}={text!r} is not below {MAX_SECONDS:g}s")
    return value


def _fields(spec: str, kind: FaultKind, body: str) -> dict[str, str]:
    allowed, required = _PARAMS[kind]
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not value.strip():
            raise NetFaultSpecError(spec, f"{part!r} is not NAME=VALUE")
        if name not in allowed:
            raise NetFaultSpecError(
                spec, f"{kind.value} takes {', '.join(sorted(allowed))}, not {name!r}"
            )
        if name in fields:
            raise NetFaultSpecError(spec, f"{name} is given twice")
        fields[name] = value.strip()
    missing = sorted(required - fields.keys())
    if missing:
        raise NetFaultSpecError(spec, f"{kind.value} needs {' and '.join(missing)}")
    return fields


def parse_netfault(spec: str) -> NetFault:
    """One spec, or :class:`NetFaultSpecError` saying what is wrong and what is allowed."""
    if not isinstance(spec, str) or not spec.strip():
        raise NetFaultSpecError(str(spec), "the spec is empty")
    head, _, body = spec.strip().partition(":")
    try:
        kind = FaultKind(head.strip().lower())
    except ValueError:
        kinds = ", ".join(k.value for k in FaultKind)
        raise NetFaultSpecError(spec, f"unknown fault {head!r} (one of {kinds})") from None
    fields = _fields(spec, kind, body)
    times = {
        name: _seconds(spec, name, fields[name])
        for name in ("at", "for", "to_server", "to_client")
        if name in fields
    }
    duration = times.get("for")
    if duration is not None and duration <= 0:
        raise NetFaultSpecError(spec, "for= must be above 0")
    heal = fields.get("heal", "resume")
    if heal not in ("resume", "reset"):
        raise NetFaultSpecError(spec, f"heal={heal!r}; heal is resume or reset")
    try:
        direction = StallDirection(fields.get("direction", "both"))
    except ValueError:
        raise NetFaultSpecError(
            spec, f"direction={fields['direction']!r}; direction is to_server, to_client or both"
        ) from None
    if kind is FaultKind.LATENCY and not (times.get("to_server") or times.get("to_client")):
        raise NetFaultSpecError(spec, "latency needs to_server= or to_client= above 0")
    return NetFault(
        kind=kind,
        at=times.get("at", 0.0),
        duration=duration,
        heal="reset" if heal == "reset" else "resume",
        direction=direction,
        to_server=times.get("to_server", 0.0),
        to_client=times.get("to_client", 0.0),
        spec=spec.strip(),
    )


def parse_netfaults(specs: Iterable[str]) -> tuple[NetFault, ...]:
    """Every spec, ordered by start; two windows on one switch of the proxy are refused."""
    faults = sorted((parse_netfault(s) for s in specs), key=lambda f: f.at)
    check_overlaps(faults)
    return tuple(faults)


def check_overlaps(faults: Sequence[NetFault]) -> None:
    """Refuse two windows on one switch: ending the first would silently end the second."""
    for first, second in itertools.combinations(faults, 2):
        if first.overlaps(second):
            raise NetFaultSpecError(
                second.describe(),
                f"overlaps {first.describe()!r}; partitions and stalls (one switch), latencies, "
                "and refusals must not overlap others of their switch",
            )
