"""Which rule a test case's next step runs: Hypothesis' swarm testing, without its re-draws.

Hypothesis' own rule choice switches rules off per test case (swarm
testing: a test case that never sweeps lets locks pile up, one that only
races and ticks crosses expiries).  It decides each rule's switch the first
time a step lands on the rule, and records that decision again as a choice
every later time a step lands there; after three landings on rules that are
off, it walks the rules in order, deciding or recording each one's switch,
to pick among those on.  With half of the machine's few dozen rules off, a
step makes a dozen choices or more, each one Hypothesis records, replays and
shrinks, and choosing a step costs more than the handler calls it makes.

:class:`SwarmRules` makes the same choice with the switches drawn once, at
a test case's first step (the probability of a rule being off, then one
switch per rule, at least one on): a step then lands on one of all the
rules, in Hypothesis' order, up to three times, and else picks among the
rules that are on.  A rule is switched off with the chance Hypothesis
gives it, and a landing has Hypothesis' bias towards the ends of the rule
order (the sweeps come first, the race last); only the fallback differs,
picking evenly among the rules on, so the share of a rule that is often
off or waiting on a precondition moves a little (the race 7.4 % of steps
before, 4.2 % after; docs/performance.md).  A step costs one draw, or two
to four when many rules are off.  As in Hypothesis, a switch shrinks towards
on, and a step's choice towards the first rule.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis.errors import InvalidDefinition
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.strategies import SearchStrategy

__all__ = ["SwarmRules"]

#: Landings on all the rules before a step picks among those on (Hypothesis' own count).
TRIES = 3


@functools.cache
def _rules(machine: type[RuleBasedStateMachine]) -> tuple[Any, ...]:
    """The machine's rules in Hypothesis' order: fewest arguments first, then by name."""
    found = machine.setup_state().rules  # type: ignore[no-untyped-call]
    return tuple(
        sorted(
            found,
            key=lambda rule: (sorted(rule.targets), len(rule.arguments), rule.function.__name__),
        )
    )


class SwarmRules(SearchStrategy[tuple[Any, dict[str, Any]]]):
    """One test case's rule choice: which rules are on (drawn once), then a step's rule."""

    def __init__(self, machine: RuleBasedStateMachine) -> None:
        super().__init__()
        self.machine = machine
        self.rules = _rules(type(machine))
        #: Whether each rule (in :attr:`rules` order) is on; drawn at the first step.
        self.on: tuple[bool, ...] | None = None

    def _switches(self, data: ConjectureData) -> tuple[bool, ...]:
        # As Hypothesis' feature flags: 0 switches every rule on, the direction
        # shrinking takes; a switch drawn True is off.
        p_off = data.draw_integer(0, 254) / 255
        on: list[bool] = []
        last = len(self.rules) - 1
        for index in range(len(self.rules)):
            forced = False if index == last and not any(on) else None
            on.append(not data.draw_boolean(p_off, forced=forced))
        return tuple(on)

    def _runs(self, index: int) -> bool:
        """Is rule ``index`` on, and may it run now (its bundles filled, its preconditions true)?"""
        assert self.on is not None
        if not self.on[index]:
            return False
        rule, machine = self.rules[index], self.machine
        return all(machine.bundle(b.name) for b in rule.bundles) and all(  # type: ignore[no-untyped-call]
            precondition(machine) for precondition in rule.preconditions
        )

    def _choose(self, data: ConjectureData) -> Any:
        if self.on is None:
            self.on = self._switches(data)
        last = len(self.rules) - 1
        for _ in range(TRIES):
            index = data.draw_integer(0, last)
            if self._runs(index):
                return self.rules[index]
        ready = [rule for index, rule in enumerate(self.rules) if self._runs(index)]
        if not ready:
            # Every rule on waits for its precondition: any rule that may run.
            machine = self.machine
            ready = [
                rule
                for rule in self.rules
                if all(precondition(machine) for precondition in rule.preconditions)
            ]
        if not ready:
            names = ", ".join(rule.function.__name__ for rule in self.rules)
            raise InvalidDefinition(
                f"no rule of {type(self.machine).__name__} can run: every precondition is "
                f"false ({names})"
            )
        return ready[data.draw_integer(0, len(ready) - 1)] if len(ready) > 1 else ready[0]

    def do_draw(self, data: ConjectureData) -> tuple[Any, dict[str, Any]]:
        rule = self._choose(data)
        arguments = {
            name: data.draw(strategy) for name, strategy in rule.arguments_strategies.items()
        }
        return rule, arguments

    def __repr__(self) -> str:
        return f"SwarmRules({type(self.machine).__name__})"
