"""A factory that hands every test case the same store is told so plainly."""

from __future__ import annotations

from dsm_sim.conformance.runner import verify
from reference_engine.clock import Clock
from reference_engine.handlers.memory import InMemoryStateHandler

_SHARED: dict[str, InMemoryStateHandler] = {}


class Reused(InMemoryStateHandler):
    """One store for every handler built: the records of one test case stay for the next."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        first = _SHARED.setdefault("store", self)
        if first is not self:
            self.__dict__.update({k: v for k, v in first.__dict__.items() if k != "clock"})


def reused(clock: Clock) -> Reused:
    return Reused(clock)


def test_a_store_that_is_not_empty_on_open_is_reported_plainly() -> None:
    _SHARED.clear()
    report = verify(reused, profile="dev", seed=0, matrix=False, volume=False, stop_on_first=True)
    assert report.violations
    message = report.violations[0].message
    assert "the store was not empty when the test case opened it" in message
    assert "each open must start from an empty store" in message


def test_a_fresh_store_per_open_passes_the_check() -> None:
    from reference_engine.handlers.memory import in_memory_handler

    report = verify(in_memory_handler, profile="dev", seed=0, max_examples=10, matrix=False)
    assert not report.violations
