"""Delete the steps a failing program does not need, after Hypothesis has shrunk it.

Hypothesis shrinks within a time budget (:mod:`dsm_sim.conformance.shrinking`);
on a busy machine the budget runs out while the program still carries steps
that change nothing, and the story a handler author reads is padded with
them (fifty sweeps that expire nothing around the three steps that matter).
This pass finishes the job deterministically: it replays the printed program
with chunks of steps left out, then single steps, and keeps a deletion when
the shorter program still breaks the *same* property.

It works on the program Hypothesis printed, parsed back into rule calls: each
``state.<rule>(kw=...)`` line is one call whose arguments are evaluated, for
every replay afresh (a handler may change a payload it was given in place),
in the namespace the program's own import lines create.  A replay is exactly
what the pasted program does: build the machine, ``setup(world=...)``, the
rules in order, ``teardown()`` in ``finally``.

The pass is bounded by a number of replays (and by a ``stop`` test the caller
may pass, for a time limit), so the same program gives the same result on any
machine that is not stopped early.  A racy handler may fail a candidate once
by luck: the program finally reported is replayed once more, and is reported
only if that replay breaks the property again; otherwise the original stands.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsm_sim.conformance.machine import ConformanceMachine
from dsm_sim.conformance.properties import PropertyViolation

__all__ = [
    "MAX_REPLAYS",
    "Call",
    "Program",
    "Reduced",
    "UnbuildableMachine",
    "parse_program",
    "reduce_program",
    "replay",
]

#: Replays one reduction may spend, the final confirmation included.
MAX_REPLAYS = 150
#: Import lines whose modules the namespace of the arguments may come from.
_KIT_MODULES = ("dsm_sim.", "reference_engine.")
_INDENT = "    "


@dataclass(frozen=True, slots=True)
class Call:
    """One printed rule call: ``state.<rule>(<name>=<expression>, ...)``."""

    rule: str
    #: (keyword, source of its expression) in printed order.
    arguments: tuple[tuple[str, str], ...]
    #: The line as printed, without its indentation.
    text: str

    def kwargs(self, namespace: dict[str, object]) -> dict[str, object]:
        """The arguments, built afresh: a handler may change a payload in place."""
        return {key: eval(source, dict(namespace)) for key, source in self.arguments}


@dataclass(frozen=True, slots=True)
class Program:
    """A reproduction, split into what every candidate keeps and the steps it may drop."""

    #: Import lines and the lines that build the machine and ``state``.
    header: tuple[str, ...]
    setup: Call
    steps: tuple[Call, ...]
    closing: tuple[str, ...]
    #: The names the import lines define, for evaluating arguments.
    namespace: dict[str, object]

    def setup_on(self, state: ConformanceMachine) -> None:
        """Enter the program's world: ``setup`` is the one call every candidate keeps."""
        getattr(state, self.setup.rule)(**self.setup.kwargs(self.namespace))

    def with_steps(self, steps: Sequence[Call]) -> Program:
        return Program(self.header, self.setup, tuple(steps), self.closing, self.namespace)

    def render(self) -> str:
        """The program in the format it was printed in, with its current steps."""
        body = [self.setup, *self.steps]
        return "\n".join([*self.header, "try:", *(_INDENT + c.text for c in body), *self.closing])


@dataclass(frozen=True, slots=True)
class Reduced:
    """A shorter program that breaks the same property, and the violation its replay raised."""

    program: Program
    violation: PropertyViolation
    replays: int


def _call(text: str) -> Call | None:
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "state"
        and not node.args
        and all(k.arg is not None for k in node.keywords)
    ):
        return None
    arguments = tuple((str(k.arg), ast.unparse(k.value)) for k in node.keywords)
    return Call(node.func.attr, arguments, text)


def _namespace(header: Sequence[str]) -> dict[str, object] | None:
    namespace: dict[str, object] = {}
    for line in header:
        words = line.split()
        if len(words) < 2 or words[0] not in ("from", "import"):
            continue
        if not words[1].startswith(_KIT_MODULES):
            continue  # the factory's module: the caller passes the machine itself
        try:
            exec(line, namespace)
        except ImportError:
            return None
    return namespace


def parse_program(text: str) -> Program | None:
    """The reproduction as calls, or None when it is not in the kit's printed format.

    The format is :func:`dsm_sim.conformance.explain.render_reproduction`'s:
    a header, ``try:``, one indented ``state.<rule>(...)`` line per step
    (``setup`` first), ``finally:`` and the teardown.
    """
    lines = text.splitlines()
    if "try:" not in lines or "finally:" not in lines:
        return None
    start, end = lines.index("try:"), lines.index("finally:")
    body = [line.removeprefix(_INDENT) for line in lines[start + 1 : end]]
    calls = [_call(line) for line in body if line != "pass"]
    if not calls or any(c is None for c in calls):
        return None
    parsed = [c for c in calls if c is not None]
    if parsed[0].rule != "setup":
        return None
    namespace = _namespace(lines[:start])
    if namespace is None:
        return None
    return Program(
        tuple(lines[:start]), parsed[0], tuple(parsed[1:]), tuple(lines[end:]), namespace
    )


def replay(
    machine: type[ConformanceMachine], program: Program, *, unbuildable: bool = False
) -> PropertyViolation | None:
    """Run the program as pasted; the violation it raised, or None when it raised none.

    With ``unbuildable`` a machine that cannot be built (the factory raised,
    ``open`` failed) raises :class:`UnbuildableMachine` instead of counting
    as no violation.
    """
    return _replay(machine, program, unbuildable=unbuildable)[0]


class UnbuildableMachine(Exception):
    """The handler could not be built or opened for a replay."""


def _replay(
    machine: type[ConformanceMachine], program: Program, *, unbuildable: bool = False
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
            program.setup_on(state)
            for call in program.steps:
                ran += 1
                getattr(state, call.rule)(**call.kwargs(program.namespace))
        finally:
            state.teardown()
    except PropertyViolation as violation:
        return violation, ran
    except Exception:
        return None, ran
    return None, ran


def reduce_program(
    machine: type[ConformanceMachine],
    program: Program,
    prop: str,
    *,
    max_replays: int = MAX_REPLAYS,
    stop: Callable[[], bool] | None = None,
) -> Reduced | None:
    """Delete steps while the program still breaks ``prop``; None when none could go.

    Chunks of half the steps are tried first, then quarters, down to single
    steps, each from the first step on; the single-step pass repeats until it
    deletes nothing.  A candidate that fails before its last step also loses
    the steps that never ran.  No candidate is replayed twice.  The result is
    replayed once more before it is returned (a racy handler may have failed
    a candidate by luck) and must break ``prop`` again; when it does not, or
    nothing could go, the original program is replayed last instead, so the
    last handler built is always one that ran the program reported.
    """
    replays = 0
    tried: set[tuple[int, ...]] = set()
    # Steps are named by their index in the original program, so candidates compare exactly.
    current = list(range(len(program.steps)))

    def exhausted() -> bool:
        # One replay is kept for the final confirmation.
        return replays >= max_replays - 1 or (stop is not None and stop())

    def still_fails(kept: list[int]) -> list[int] | None:
        nonlocal replays
        if tuple(kept) in tried or exhausted():
            return None
        tried.add(tuple(kept))
        replays += 1
        violation, ran = _replay(machine, program.with_steps([program.steps[i] for i in kept]))
        if violation is None or violation.property != prop:
            return None
        return kept[:ran]

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
    if len(current) < len(program.steps):
        reduced = program.with_steps([program.steps[i] for i in current])
        violation = replay(machine, reduced)
        replays += 1
        if violation is not None and violation.property == prop:
            return Reduced(reduced, violation, replays)
    if replays:
        replay(machine, program)
    return None
