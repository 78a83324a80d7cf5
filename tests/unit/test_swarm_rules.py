"""The conformance machine's rule choice keeps Hypothesis' swarm testing: per test case, some rules off.

:class:`~dsm_sim.conformance.generate.swarm.SwarmRules` draws which rules a
test case runs once, then one rule per step among those; these tests pin
what that choice must keep: only rules switched on run (unless none on may
run), a false precondition is honoured, every rule is reached across a
search, and test cases differ in which rules they leave out.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from dsm_sim.conformance.execute.machine import build_machine
from dsm_sim.conformance.generate.swarm import SwarmRules
from reference_engine.handlers.memory import in_memory_handler

SEARCH = settings(
    database=None,
    derandomize=True,
    max_examples=60,
    stateful_step_count=20,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
NAMES = ("one", "two", "three", "four", "five", "never")


class _Machine(RuleBasedStateMachine):
    cases: list[tuple[set[str], set[str]]] = []

    def __init__(self) -> None:
        super().__init__()
        self._rules_strategy = SwarmRules(self)  # type: ignore[assignment]
        self.ran: set[str] = set()
        type(self).cases.append((self.ran, set()))

    def _ran(self, name: str) -> None:
        self.ran.add(name)
        strategy = self._rules_strategy
        assert isinstance(strategy, SwarmRules) and strategy.on is not None
        switched = zip(strategy.rules, strategy.on, strict=True)
        on = {r.function.__name__ for r, is_on in switched if is_on}
        type(self).cases[-1][1].update(set(NAMES) - on)
        # A rule that is off runs only when no rule that is on may run.
        assert name in on or not on - {"never"}, (name, on)

    @rule()
    def one(self) -> None:
        self._ran("one")

    @rule(n=st.integers(0, 3))
    def two(self, n: int) -> None:
        self._ran("two")

    @rule(flag=st.booleans())
    def three(self, flag: bool) -> None:
        self._ran("three")

    @rule()
    def four(self) -> None:
        self._ran("four")

    @rule(text=st.sampled_from("ab"))
    def five(self, text: str) -> None:
        self._ran("five")

    @precondition(lambda self: False)
    @rule()
    def never(self) -> None:
        raise AssertionError("a rule whose precondition is false ran")


def test_only_rules_switched_on_run_and_every_rule_is_reached() -> None:
    _Machine.cases = []
    run_state_machine_as_test(_Machine, settings=SEARCH)
    ran = set().union(*(ran for ran, _ in _Machine.cases))
    assert ran == set(NAMES) - {"never"}
    # Swarm testing: some test cases leave rules out, and not always the same ones.
    left_out = [frozenset(off - {"never"}) for _, off in _Machine.cases if off - {"never"}]
    assert len(left_out) >= 10
    assert len(set(left_out)) >= 5


def test_the_conformance_machine_chooses_its_rules_so() -> None:
    state = build_machine(in_memory_handler)()
    try:
        assert isinstance(state._rules_strategy, SwarmRules)
        names = [r.function.__name__ for r in state._rules_strategy.rules]
        # Hypothesis' order: the sweeps (no arguments) first, the race (most) last.
        assert names[:2] == ["expire_past_retention", "reset_expired_locks"]
        assert names[-1] == "race"
    finally:
        state.teardown()
