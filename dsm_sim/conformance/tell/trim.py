"""Delete the steps a failing program does not need, after Hypothesis has shrunk it.

Hypothesis shrinks within a time budget (:mod:`dsm_sim.conformance.tell.shrink_budget`);
on a busy machine the budget runs out while the program still carries steps
that change nothing, and the story a handler author reads is padded with
them (fifty sweeps that expire nothing around the three steps that matter).
This pass finishes the job deterministically: it replays the program with
chunks of steps left out, then single steps, and keeps a deletion when the
shorter program still breaks the *same* property.

Programs are data (:mod:`dsm_sim.conformance.program`): a replay builds
the machine, runs each step with a fresh copy of its arguments (a handler
may change a payload it was given in place) and tears down in ``finally``,
exactly what the printed program does when pasted.

The pass is bounded by a number of replays (and by a ``stop`` test the caller
may pass, for a time limit), so the same program gives the same result on any
machine that is not stopped early.  A racy handler may fail a candidate once
by luck: the program finally reported is replayed once more, and is reported
only if that replay breaks the property again; otherwise the original stands.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

from dsm_sim.conformance.execute.machine import ConformanceMachine
from dsm_sim.conformance.program import Call, Program
from dsm_sim.conformance.properties import PropertyViolation
from dsm_sim.conformance.tell.replayed import CallTape

__all__ = [
    "MAX_REPLAYS",
    "PAYLOAD_REPLAYS",
    "Trimmed",
    "UnbuildableMachine",
    "lighten_payloads",
    "replay",
    "trim",
]

#: Replays one reduction may spend, the final confirmation included.
MAX_REPLAYS = 150
#: Replays the payload pass may spend, the final confirmation included.
PAYLOAD_REPLAYS = 24
#: The argument a step's payload is passed in.
PAYLOAD = "data"
#: How many last steps fast-forwarding tries to keep alone (the clock jumped to them).
FAST_FORWARD = 6


@dataclass(frozen=True, slots=True)
class Trimmed:
    """A shorter program that breaks the same property, and the violation its replay raised."""

    program: Program
    violation: PropertyViolation
    replays: int


def replay(
    machine: type[ConformanceMachine],
    program: Program,
    *,
    unbuildable: bool = False,
    tape: CallTape | None = None,
) -> PropertyViolation | None:
    """Run the program as pasted; the violation it raised, or None when it raised none.

    With ``unbuildable`` a machine that cannot be built (the factory raised,
    ``open`` failed) raises :class:`UnbuildableMachine` instead of counting
    as no violation.  A ``tape`` listens to the replay (for the explorer)
    without adding a handler call.
    """
    return _replay(machine, program, unbuildable=unbuildable, tape=tape)[0]


class UnbuildableMachine(Exception):
    """The handler could not be built or opened for a replay."""


def _replay(
    machine: type[ConformanceMachine],
    program: Program,
    *,
    unbuildable: bool = False,
    tape: CallTape | None = None,
) -> tuple[PropertyViolation | None, int]:
    """The violation a replay raised, and how many steps (after ``setup``) it ran.

    Anything else a replay raises (a step that no longer makes sense without
    an earlier one, a handler crashing) is no violation: the candidate fails
    to reproduce.  Steps after the one that raised never ran, so a shorter
    candidate can drop them.
    """
    ran = 0
    try:
        state = machine()
    except Exception as exc:
        if unbuildable:
            raise UnbuildableMachine(str(exc)) from exc
        return None, ran
    try:
        try:
            if tape is not None:
                tape.attach(state)
            program.setup.run_on(state)
            if tape is not None:
                tape.entered()
            for call in program.body:
                ran += 1
                if tape is None:
                    call.run_on(state)
                    continue
                tape.step_begins()
                try:
                    call.run_on(state)
                except PropertyViolation:
                    tape.step_ends(broke=True)
                    raise
                tape.step_ends()
        finally:
            state.teardown()
    except PropertyViolation as violation:
        return violation, ran
    except Exception:
        return None, ran
    return None, ran


def _replay_tries(
    machine: type[ConformanceMachine], program: Program, prop: str, tries: int
) -> tuple[PropertyViolation | None, int, int]:
    """Replay up to ``tries`` times until one breaks ``prop``: its violation, steps run, replays."""
    ran = 0
    for attempt in range(1, tries + 1):
        violation, ran = _replay(machine, program)
        if violation is not None and violation.property == prop:
            return violation, ran, attempt
    return None, ran, tries


def trim(
    machine: type[ConformanceMachine],
    program: Program,
    prop: str,
    *,
    max_replays: int = MAX_REPLAYS,
    stop: Callable[[], bool] | None = None,
    tries: int = 1,
) -> Trimmed | None:
    """Delete steps while the program still breaks ``prop``; None when none could go.

    Chunks of half the steps are tried first, then quarters, down to single
    steps, each from the first step on; the single-step pass repeats until it
    deletes nothing.  A candidate that fails before its last step also loses
    the steps that never ran.  No candidate is replayed twice.  The result is
    replayed once more before it is returned (a racy handler may have failed
    a candidate by luck) and must break ``prop`` again; when it does not, or
    nothing could go, the original program is replayed last instead, so the
    last handler built is always one that ran the program reported.

    With ``tries`` above 1 (a race the kit cannot schedule, :mod:`dsm_sim.conformance.tell.repeat`)
    a candidate is kept when any of up to ``tries`` replays breaks ``prop``;
    each replay counts against ``max_replays``.
    """
    replays = 0
    original = program
    tried: set[tuple[int, ...]] = set()
    # Steps are named by their index in the original program, so candidates compare exactly.
    current = list(range(len(program.body)))

    def exhausted() -> bool:
        # One replay is kept for the final confirmation.
        return replays >= max_replays - 1 or (stop is not None and stop())

    def still_fails(kept: list[int]) -> list[int] | None:
        nonlocal replays
        if tuple(kept) in tried or exhausted():
            return None
        tried.add(tuple(kept))
        candidate = program.with_body([program.body[i] for i in kept])
        violation, ran, spent = _replay_tries(machine, candidate, prop, tries)
        replays += spent
        if violation is None:
            return None
        return kept[:ran]

    # A failure that needs only the time the steps before it took: the last few
    # steps, the clock jumped to where they began.
    for back in range(1, min(len(program.body), FAST_FORWARD) + 1):
        if exhausted():
            break
        forwarded = program.fast_forwarded(len(program.body) - back)
        if forwarded is None:
            break
        violation, _, spent = _replay_tries(machine, forwarded, prop, tries)
        replays += spent
        if violation is not None:
            program, current = forwarded, list(range(len(forwarded.body)))
            break
    # A chain of worlds fails in its last one, most often: try that world alone first.
    entered = [i for i in current if program.body[i].rule == "enter_world"]
    if entered:
        kept = still_fails(current[current.index(entered[-1]) :])
        if kept is not None:
            current = kept
    size = max(1, len(current) // 2)
    while current and not exhausted():
        deleted = False
        start = 0
        while start < len(current) and not exhausted():
            kept = still_fails(current[:start] + current[start + size :])
            if kept is not None:
                current, deleted = kept, True
            else:
                start += size
        if size > 1:
            size = max(1, size // 2)
        elif not deleted:
            break
    if program is not original or len(current) < len(program.body):
        reduced = program.with_body([program.body[i] for i in current])
        violation, _, spent = _replay_tries(machine, reduced, prop, tries)
        replays += spent
        if violation is not None:
            return Trimmed(reduced, violation, replays)
    if replays:
        replay(machine, original)
    return None


def _takes_none(machine: type[ConformanceMachine], rule: str) -> bool:
    """Does the step ``rule`` take ``None`` for its payload (a write without data)?"""
    method = getattr(machine, rule, None)
    if method is None:
        return False
    try:
        parameter = inspect.signature(method, eval_str=True).parameters.get(PAYLOAD)
    except (NameError, TypeError, ValueError):
        return False
    if parameter is None:
        return False
    annotation = parameter.annotation
    return annotation is None or types.NoneType in typing.get_args(annotation)


def _lighter(machine: type[ConformanceMachine], call: Call) -> list[object]:
    """The payloads to try in place of ``call``'s, lightest first: none, then the empty object."""
    arguments = dict(call.arguments)
    if PAYLOAD not in arguments:
        return []
    value = arguments[PAYLOAD]
    if value is None or (isinstance(value, dict) and not value):
        return []  # already as light as a payload gets
    lighter: list[object] = []
    if _takes_none(machine, call.rule):
        lighter.append(None)
    if isinstance(value, dict):
        lighter.append({})
    return lighter


def lighten_payloads(
    machine: type[ConformanceMachine],
    program: Program,
    prop: str,
    *,
    max_replays: int = PAYLOAD_REPLAYS,
    stop: Callable[[], bool] | None = None,
) -> Trimmed | None:
    """Replace each payload that plays no part in the finding by the lightest one.

    A story found with a payload at the size limit (or a deep, many-named one)
    is told with it, though another would break the property as well.  Each
    step's payload, the largest first, is replaced by ``None`` (where the step
    takes one) or ``{}``, and the replacement kept when the program still
    breaks ``prop``.  The result is replayed once more, as :func:`trim`'s is;
    None when no payload could be lightened.
    """
    replays = 0
    body = list(program.body)
    order = sorted(
        (index for index, call in enumerate(body) if _lighter(machine, call)),
        key=lambda index: -len(ascii(body[index].argument(PAYLOAD))),
    )
    changed = False
    for index in order:
        for value in _lighter(machine, body[index]):
            if replays >= max_replays - 1 or (stop is not None and stop()):
                break
            candidate = [
                *body[:index],
                body[index].replaced(**{PAYLOAD: value}),
                *body[index + 1 :],
            ]
            replays += 1
            violation = replay(machine, program.with_body(candidate))
            if violation is not None and violation.property == prop:
                body, changed = candidate, True
                break
    if not changed:
        return None
    lightened = program.with_body(body)
    violation = replay(machine, lightened)
    replays += 1
    if violation is None or violation.property != prop:
        return None
    return Trimmed(lightened, violation, replays)
