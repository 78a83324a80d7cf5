"""Invariants checked over a :class:`~dsm_sim.history.History`, per key.

Exact linearizability checking is exponential in the concurrency, so these
are direct, per-key checks in the spirit of Jepsen's checkers and of
deterministic-simulation practice: safety (one live lock, allowed
transitions, fencing, no double effect, sweeps spare live locks, nothing
lost) apart from liveness (nothing stays Processing once faults stop).

Every check is conservative about uncertainty: an ``info`` operation may
have happened, and an operation without a ``store_time`` took effect
somewhere in ``[invoke, complete]``.  A violation is only reported when the
history proves it.  Leases are reasoned about on the store's clock
(``store_time``) because that is the clock lock expiry is decided on.

The order of operations depends on who recorded them.  The simulator knows
when each call landed, so its order is the timeline's (completion time, then
index).  A wall-clock history (no ``store_time`` anywhere) orders two calls
only when one completed before the other was invoked; the checks that replay
a key's writes then try the orders the windows allow and report a violation
only if none explains the observations (:mod:`dsm_sim.checker.orders`).

A history can be judged under a semantics profile
(:mod:`dsm_sim.conformance.judge.semantics`), as ``dsm verify`` judges a handler:
the model judge replays against :class:`~dsm_sim.conformance.judge.semantics.
ProfiledModel`, the invariants follow the profile's lock, failure and
retention rules, and an invariant or property the profile waives is reported
as waived, with its reason.  Ownership stays judged under every profile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from dsm_sim.checker.history_rows import superseded_rows_expire
from dsm_sim.checker.leases import (
    InvariantResult,
    Lease,
    Violation,
    leases_for,
    one_per_property,
    waived_result,
)
from dsm_sim.checker.liveness import every_delivery_settles
from dsm_sim.checker.model_judge import JUDGED, model_agreement
from dsm_sim.checker.orders import MAX_CONCURRENT, UNPROVEN, is_wall_clock
from dsm_sim.checker.safety import (
    at_most_one_live_lock,
    errors_agree_with_model,
    no_duplicate_side_effect,
    stale_write_rejected,
    sweep_only_expired,
)
from dsm_sim.checker.state import (
    allowed_transitions_only,
    exists_agrees_with_model,
    no_record_lost,
    terminal_within_deadline,
)
from dsm_sim.checker.sweeps import (
    sweep_count_claims_nothing_more,
    sweep_count_hides_nothing,
    sweeps_succeed,
)
from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile
from dsm_sim.history import History

__all__ = [
    "INVARIANTS",
    "JUDGED",
    "MAX_CONCURRENT",
    "UNPROVEN",
    "Invariant",
    "InvariantResult",
    "Lease",
    "Violation",
    "all_passed",
    "allowed_transitions_only",
    "at_most_one_live_lock",
    "check_history",
    "errors_agree_with_model",
    "every_delivery_settles",
    "exists_agrees_with_model",
    "is_wall_clock",
    "leases_for",
    "model_agreement",
    "no_duplicate_side_effect",
    "no_record_lost",
    "stale_write_rejected",
    "sweep_only_expired",
    "terminal_within_deadline",
]


class Invariant(Protocol):
    """A check over a whole history, under a semantics profile (the spec's by default)."""

    __name__: str

    def __call__(self, history: History, semantics: SemanticsProfile = ...) -> InvariantResult: ...


#: The invariants in report order.
INVARIANTS: tuple[Invariant, ...] = (
    no_duplicate_side_effect,
    at_most_one_live_lock,
    stale_write_rejected,
    allowed_transitions_only,
    exists_agrees_with_model,
    sweep_only_expired,
    sweep_count_claims_nothing_more,
    sweep_count_hides_nothing,
    errors_agree_with_model,
    sweeps_succeed,
    superseded_rows_expire,
    terminal_within_deadline,
    no_record_lost,
    every_delivery_settles,
)


def check_history(history: History, semantics: SemanticsProfile = DSM) -> list[InvariantResult]:
    """Run every invariant; pure, so the same history always gives the same verdicts.

    A history whose calls were read around (the simulator's) is also judged
    call by call against the reference model, one result per kit property;
    where a check of the history judges the same property, the two make one
    result under the kit's name (failed if either found a violation).
    Under ``semantics`` each check follows the library's declared rules, and
    a result whose name the profile waives (a kit property or an invariant
    of this checker) is reported as waived, with the profile's reason.
    """
    results = [check(history, semantics) for check in INVARIANTS]
    results = one_per_property([*results, *model_agreement(history, semantics)])
    waived = semantics.waived
    return [waived_result(r, waived[r.name]) if r.name in waived else r for r in results]


def all_passed(results: Iterable[InvariantResult]) -> bool:
    return all(r.passed for r in results)
