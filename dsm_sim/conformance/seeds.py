"""One run of the search: a seed, run with the properties known at its turn.

The search runs Hypothesis again and again (:meth:`Verification.run_search
<dsm_sim.conformance.verification.Verification.run_search>`): seed after seed
of the profile's budget, and the same seed again after each violation, with
the properties found so far stopping a test case quietly.  A run therefore
depends on the runs before it only through that set of properties, which
:class:`SeedWork` carries.  :func:`run_seed` runs one and hands back a
:class:`SeedRun` (its counters, the violation it stopped at, or why it
stopped), the same in this process and in a worker process of ``dsm verify
--jobs``; the verification books it.

A run in another process draws what a run here draws only if Hypothesis
knows the same constants there.  Hypothesis mixes into its draws the
literals of the local (not installed) modules a process has loaded, so a
worker first imports the modules of the command's process
(:func:`local_modules`), and :func:`constants_fingerprint` says what it then
knows: a worker's run is kept only when it started from the constants the
command's process holds at the run's turn (:mod:`dsm_sim.conformance.parallel`).
A module the run imports on its way (the first failure imports the modules
that shrink and tell it) adds its constants at the same step here as there,
since both processes lacked it; the command's process then imports what the
worker did, so it holds what it would hold had it run the seed itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import seed as hypothesis_seed
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from dsm_sim.conformance.execute.bookkeeping import RunStats
from dsm_sim.conformance.execute.loop import VerificationHalted, call_timeout
from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.properties import Finding, PropertyViolation
from dsm_sim.conformance.report import Gap, HazardSeen
from dsm_sim.conformance.tell.flaky import FLAKY_EXPLANATION, find_violation, is_flaky
from dsm_sim.conformance.tell.shrink_budget import shrink_budget

__all__ = [
    "SearchSettings",
    "SeedRun",
    "SeedWork",
    "constants_fingerprint",
    "hypothesis_home",
    "import_modules",
    "local_modules",
    "run_seed",
    "use_hypothesis_home",
]


@dataclass(frozen=True, slots=True)
class SeedWork:
    """One run of the search: its seed, and the properties that stop its test cases quietly."""

    seed: int
    #: Found before this run, or waived by the semantics profile.
    known: frozenset[str]


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """What every run of one verification's search shares, as plain values."""

    #: Every Hypothesis setting, by name: a settings object does not survive pickling
    #: whole (its ``database=None`` comes back unset), and one built in a worker from
    #: a profile would inherit that process's default profile.
    values: tuple[tuple[str, Any], ...]
    limit: float | None
    shrink_seconds: float
    settle_seconds: float

    @classmethod
    def of(
        cls, chosen: settings, limit: float | None, shrink_seconds: float, settle_seconds: float
    ) -> SearchSettings:
        names = [
            p.name
            for p in inspect.signature(settings.__init__).parameters.values()
            if p.kind is p.KEYWORD_ONLY
        ]
        values = tuple((name, getattr(chosen, name)) for name in names)
        return cls(values, limit, shrink_seconds, settle_seconds)

    def settings(self) -> settings:
        return settings(**dict(self.values))


@dataclass(slots=True)
class SeedRun:
    """What one run of the search gave, before it is booked."""

    work: SeedWork
    test_cases: int = 0
    steps: int = 0
    checks: Counter[str] = field(default_factory=Counter)
    suppressed: Counter[str] = field(default_factory=Counter)
    gaps: list[Gap] = field(default_factory=list)
    hazards: dict[str, HazardSeen] = field(default_factory=dict)
    instances: int = 0
    out_of_process: bool = False
    first_failure_case: int | None = None
    first_failure_property: str | None = None
    #: The violation the run stopped at, and whether Hypothesis found it flaky.
    violation: PropertyViolation | None = None
    flaky: bool = False
    #: How the run stopped when no property names it (a crash of the run itself).
    error: str | None = None
    #: Why the run was stopped from outside (the deadline, a hung call), if it was.
    halt: VerificationHalted | None = None
    #: Calls that hung during the run, in the process that ran it.
    hangs: int = 0
    #: :func:`constants_fingerprint` when a worker started the run, and the local modules
    #: the run imported there (a first failure imports the modules that tell it).
    constants: str | None = None
    loaded: tuple[str, ...] = ()
    #: How the worker process running it died (run alone again, it died again), if it did.
    crashed: str | None = None

    def stats(self) -> RunStats:
        """The run's counters as the stats a verification notes its gaps from."""
        stats = RunStats(self.work.known)
        stats.test_cases, stats.steps = self.test_cases, self.steps
        stats.checks, stats.suppressed = self.checks, self.suppressed
        stats.gaps, stats.hazards = self.gaps, self.hazards
        stats.instances, stats.out_of_process = self.instances, self.out_of_process
        return stats

    def __getstate__(self) -> dict[str, Any]:
        # A PropertyViolation does not rebuild from its args; it travels as its parts.
        state = {name: getattr(self, name) for name in self.__slots__}
        v = self.violation
        if v is not None:
            state["violation"] = (v.finding, v.story, getattr(v, "time_zone", "UTC0"), v.program)
        halt = self.halt
        if halt is not None:
            state["halt"] = (str(halt), halt.deadline)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        violation = state.pop("violation")
        halt = state.pop("halt")
        for name, value in state.items():
            setattr(self, name, value)
        self.violation = None if violation is None else _violation(*violation)
        self.halt = None if halt is None else VerificationHalted(halt[0], deadline=halt[1])


def _violation(finding: Finding, story: str, zone: str, program: Any) -> PropertyViolation:
    violation = PropertyViolation(finding, story, zone)
    violation.program = program
    return violation


def run_seed(
    machine: type[ConformanceMachine],
    work: SeedWork,
    search: SearchSettings,
    *,
    hangs: Callable[[], int],
) -> SeedRun:
    """Run Hypothesis once on ``machine`` (built on stats disabling ``work.known``) from ``work.seed``.

    ``machine.stats.on_test_case`` is the caller's (progress, and raising
    :class:`VerificationHalted` to stop between test cases); ``hangs`` counts
    the calls that hung in this process so far.
    """
    stats = machine.stats
    before = hangs()
    run = SeedRun(work)
    try:
        with (
            call_timeout(search.limit),
            shrink_budget(search.shrink_seconds, search.settle_seconds),
        ):
            run_state_machine_as_test(
                hypothesis_seed(work.seed)(machine), settings=search.settings()
            )  # type: ignore[no-untyped-call,unused-ignore]
    except VerificationHalted as halt:
        run.halt = halt
    except Exception as exc:
        run.violation = find_violation(exc)
        run.flaky = is_flaky(exc)
        if run.violation is None:
            run.error = (
                f"{FLAKY_EXPLANATION.split(',')[0]} and Hypothesis could not tell which "
                f"property broke ({type(exc).__name__}: {exc})"
                if run.flaky
                else f"the run stopped with {type(exc).__name__}: {exc}{_where(exc)}"
            )
    run.test_cases, run.steps = stats.test_cases, stats.steps
    run.checks, run.suppressed = stats.checks, stats.suppressed
    run.gaps, run.hazards = stats.gaps, stats.hazards
    run.instances, run.out_of_process = stats.instances, stats.out_of_process
    run.first_failure_case = stats.first_failure_case
    run.first_failure_property = stats.first_failure_property
    run.hangs = hangs() - before
    return run


def _where(exc: BaseException) -> str:
    """Where an unexpected exception was raised, so a report of it can be acted on."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (raised in {last.name}, {Path(last.filename).name}:{last.lineno})"


# --- the constants Hypothesis draws from ----------------------------------------------------


def _hypothesis_internals() -> tuple[Callable[[str], bool], Callable[[], Any]] | None:
    """Hypothesis' test for a local module and its set of local constants, where it has them."""
    try:
        from hypothesis.internal.conjecture.providers import _get_local_constants
        from hypothesis.internal.constants_ast import is_local_module_file
    except ImportError:  # another Hypothesis: no run is kept from another process
        return None
    return is_local_module_file, _get_local_constants


def local_modules() -> tuple[str, ...]:
    """The names of the local modules this process has loaded, as a worker can import them."""
    internals = _hypothesis_internals()
    if internals is None:
        return ()
    is_local, _ = internals
    names: list[str] = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not is_local(path):
            continue
        if name in ("__main__", "__mp_main__"):
            spec = getattr(module, "__spec__", None)
            name = getattr(spec, "name", None) or ""
        if name and not name.startswith("__"):
            names.append(name)
    return tuple(sorted(set(names)))


def hypothesis_home() -> str:
    """Where Hypothesis keeps its files in this process (``dsm verify`` sets it: the cache)."""
    from hypothesis.configuration import storage_directory

    return str(storage_directory(intent_to_write=False).home_directory)


def use_hypothesis_home(home: str) -> None:
    """Keep Hypothesis' files where the command's process keeps them, never in the cwd.

    Hypothesis caches each module's constants there; a worker reading the
    files the command's process wrote (it scans its modules before it sends
    a run) sees what that process saw.
    """
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(home)


def import_modules(names: tuple[str, ...]) -> None:
    """Import each of ``names`` that imports here (the command's modules, in a worker)."""
    for name in names:
        if name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def constants_fingerprint() -> str | None:
    """A digest of the local constants Hypothesis would draw from now; None if unknown."""
    internals = _hypothesis_internals()
    if internals is None:
        return None
    _, constants = internals
    try:
        known = constants()
        parts = (known.integers, known.floats, known.bytes, known.strings)
        return hashlib.sha256(repr(tuple(tuple(p) for p in parts)).encode()).hexdigest()
    except Exception:  # its shape changed: no run is kept from another process
        return None
