"""Running the edge probes: each fixed program through the same machine and judges as the search.

The probes themselves are data (:mod:`dsm_sim.conformance.generate.probes`);
this module replays each against the handler a machine builds and hands on
the ones that break a property, with the violation their replay raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.generate.probes import PROBES, Probe
from dsm_sim.conformance.program import Program
from dsm_sim.conformance.properties import PropertyViolation
from dsm_sim.conformance.tell.trim import UnbuildableMachine, replay

__all__ = ["ProbeFinding", "UnbuildableMachine", "applicable", "probe_findings"]


@dataclass(frozen=True, slots=True)
class ProbeFinding:
    """A probe that broke a property: the violation its replay raised, and its program."""

    probe: Probe
    violation: PropertyViolation
    program: Program


def applicable(machine: type[ConformanceMachine], probes: Sequence[Probe] = PROBES) -> list[Probe]:
    """The probes ``machine`` can run: those whose required rule it has."""
    return [p for p in probes if p.requires is None or hasattr(machine, p.requires)]


def probe_findings(
    machine: type[ConformanceMachine],
    *,
    found: Callable[[], frozenset[str]],
    probes: Sequence[Probe] = PROBES,
    on_probe: Callable[[Probe], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Iterator[ProbeFinding]:
    """Run each probe against the handler ``machine`` builds; yield the ones that break a property.

    ``found`` says which properties are already known to fail (the caller's
    running tally): they stop a probe quietly, as they stop a test case of
    the search, so each probe can still find something new.  A machine that
    cannot be built raises :class:`~dsm_sim.conformance.tell.trim.UnbuildableMachine`:
    the search reports that failure in its own words.  ``stop`` is asked
    before each probe, and after one that found nothing: True ends the probes
    (a call hung, the deadline passed).
    """
    for probe in applicable(machine, probes):
        if stop is not None and stop():
            return
        machine.stats.disabled = found()
        program = probe.program
        if on_probe is not None:
            on_probe(probe)
        violation = replay(machine, program, unbuildable=True)
        if violation is not None:
            yield ProbeFinding(probe, violation, program)
