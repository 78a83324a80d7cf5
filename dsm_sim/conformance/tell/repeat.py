"""Shrinking a race the kit cannot schedule, by repetition, and measuring how often it breaks.

The kit decides every interleaving of a handler in its own process (the
scheduler), so a finding there replays exactly.  A handler in another
process (``--exec``, and more so its peers: several processes on one store)
interleaves as the operating system and the store decide.  Its race breaks a
property in some replays of the same steps and not in others; Hypothesis,
which needs every replay to fail, then gives up (``Flaky``) with the long,
unshrunk run that happened to fail, and the kit's two confirmations miss it
as often as they catch it.

So such a finding is shrunk by repetition: a shorter program is kept when
any of up to :data:`TRIES` replays breaks the same property (the steps
:mod:`dsm_sim.conformance.tell.trim` deletes, with each candidate tried up
to that many times), within :data:`REPEAT_SECONDS` of the profile.  The
program reported is then replayed :data:`RATE_REPLAYS` times, and the
finding says how often it broke ("failed 7 of 10 replays"); the last replay
is one that broke it, when any did, so the protocol requests written for
it (``--replay-dir``) are those of a failing run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.program import Program
from dsm_sim.conformance.properties import PropertyViolation
from dsm_sim.conformance.tell.replayed import CallTape
from dsm_sim.conformance.tell.trim import Trimmed, replay, trim
from dsm_sim.wall import wall_now

__all__ = [
    "RATE_REPLAYS",
    "REPEAT_SECONDS",
    "TRIES",
    "Rate",
    "failure_rate",
    "shrink_by_repetition",
]

#: Replays a shorter candidate gets to break the property before it is given up.
TRIES = 6
#: Replays of the program reported, counted for the failure rate.
RATE_REPLAYS = 10
#: Seconds a finding may spend shrinking by repetition, by profile.
REPEAT_SECONDS: dict[str, float] = {"dev": 20.0, "ci": 30.0, "thorough": 120.0}
#: Replays a finding may spend shrinking by repetition (each try counts).
MAX_REPEAT_REPLAYS = 400


def shrink_by_repetition(
    machine: type[ConformanceMachine], program: Program, prop: str, seconds: float
) -> Trimmed | None:
    """A shorter program that still breaks ``prop`` in some of :data:`TRIES` replays, or None."""
    deadline = wall_now() + seconds
    return trim(
        machine,
        program,
        prop,
        tries=TRIES,
        max_replays=MAX_REPEAT_REPLAYS,
        stop=lambda: wall_now() > deadline,
    )


@dataclass(frozen=True, slots=True)
class Rate:
    """How often the program broke ``prop``, and what the last replay that broke it showed."""

    hits: int
    replays: int
    #: The violation of a replay that broke it (the last one), or None when none did.
    violation: PropertyViolation | None
    #: That replay as the explorer plays it, when one was recorded.
    tape: CallTape | None


def failure_rate(
    machine: type[ConformanceMachine],
    program: Program,
    prop: str,
    *,
    replays: int = RATE_REPLAYS,
    record: bool = False,
    tape: Callable[[], CallTape] = CallTape,
) -> Rate:
    """Replay ``program`` ``replays`` times and count those that break ``prop``.

    When some did and the last did not, it is replayed again (not counted)
    until one breaks it, at most ``replays`` more times: the last handler
    built is then one whose run broke the property.
    """
    hits = 0
    last: PropertyViolation | None = None
    shown: CallTape | None = None
    broke_last = False
    for attempt in range(2 * replays):
        if attempt >= replays and (hits == 0 or broke_last):
            break
        listening = tape() if record else None
        violation = replay(machine, program, tape=listening)
        broke_last = violation is not None and violation.property == prop
        if broke_last:
            last, shown = violation, listening
            if attempt < replays:
                hits += 1
    return Rate(hits, replays, last, shown)
