"""Plain-language rendering of a failing run.

Hypothesis prints the shrunk program, which a handler author can paste and
run; this module prints the same run as a story ("09:00 worker 1 acquired
INV-1 ...") with the violated property last, because that is what people
read first when a CI job goes red.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from dsm_sim.conformance.reading import at

__all__ = ["Step", "render_reproduction", "render_steps"]


@dataclass(frozen=True, slots=True)
class Step:
    """One rule of the run as it happened: when, who, what, and what came of it."""

    index: int
    now: dt.datetime
    actor: str
    action: str
    outcome: str

    def render(self) -> str:
        result = f" -> {self.outcome}" if self.outcome else ""
        return f"{self.index:>3}. [{at(self.now)}] {self.actor}: {self.action}{result}"


def render_steps(steps: Sequence[Step], violation: str) -> str:
    """The run as numbered lines, then the violation in one sentence."""
    lines = [step.render() for step in steps]
    lines.append(f"  => {violation}")
    return "\n".join(lines)


def render_reproduction(
    notes: Sequence[str], factory_path: str, semantics: str | None = None
) -> str:
    """Hypothesis' shrunk program, prefixed with the line that builds the machine.

    The program Hypothesis prints starts with ``state = <MachineName>()``; the
    prefix defines that name from the factory, so the snippet runs as pasted.
    The steps run inside ``try`` with ``state.teardown()`` in ``finally``: the
    violation raised half-way must still close the handler, or a store that
    made a schema or key prefix for the run keeps it.  ``semantics`` names the
    profile the run was judged by, when it was given rather than declared.
    """
    lines = [line for note in notes for line in str(note).splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return ""
    program: list[str] = []
    for line in lines[starts[-1] :]:
        program.append(line)
        if line.startswith("state.teardown()"):
            break
    first, steps = program[0], program[1:]
    teardown = [line for line in steps if line.startswith("state.teardown()")]
    steps = [line for line in steps if not line.startswith("state.teardown()")]
    name = first.split("=", 1)[1].strip().removesuffix("()") if "=" in first else "Machine"
    module, _, attr = factory_path.partition(":")
    judged = f", semantics={semantics!r}" if semantics is not None else ""
    header = [
        "from dsm_sim.conformance.execute.machine import build_machine",
        "from dsm_sim.conformance.generate.steps import ClockMove, Instant, LandedWrite, NodeCall, RaceOp, RefusedKey",
        "from dsm_sim.conformance.generate.worlds import Role, World",
        "from dsm_sim.model import ItemRef",
        "from reference_engine.scope import Scope",
        "from reference_engine.status import IdempotencyStatus",
    ]
    if module and attr and "<" not in attr:
        header.append(f"from {module} import {attr.split('.')[0]}")
        header.append(f"{name} = build_machine({attr}, name={name!r}{judged})")
    else:
        header.append(f"{name} = build_machine(your_factory, name={name!r}{judged})")
    body = [f"    {line}" for line in steps] or ["    pass"]
    closing = [f"    {line}" for line in teardown] or ["    state.teardown()"]
    return "\n".join([*header, first, "try:", *body, "finally:", *closing])
