"""The sweeps answer truthfully: each one succeeds, and its count is what it changed.

Judged under the kit's names: a sweep that raises or answers something that
is no count breaks ``errors_agree_with_model``; a lock sweep whose count
hides locks it reset breaks ``sweep_resets_expired``, one that claims more
than it reset ``sweep_only_expired``.

The catch-up worker trusts a sweep's answer.  A lock sweep that raises
leaves every expired lock in place until one succeeds, so the items behind
them wait for their deadline; one that answers a broken value (``None``, a
negative number, a count of records it did not change, or one that hides
records it did) makes the operator's dashboard and the worker's own logic
lie.  A sweep that silently does nothing is caught by the liveness checks;
these answers were not, so they are judged here, each with its story.

The count is compared with the records the recorder saw the sweep change
only where the recorder read around it (the simulator); a wall-clock history
(``dsm stress``) cannot tell, and a sweep there that fails with
``StoreError`` may be an injected network fault, so only other exceptions
count as findings on such a history.  Only the lock sweep's count is
compared: the retention sweep also expires superseded records, which no
read of a current key shows.
"""

from __future__ import annotations

from dsm_sim.checker.leases import InvariantResult, Violation, fmt, result_of
from dsm_sim.checker.liveness import CRASH_REASON as CRASH
from dsm_sim.checker.orders import is_wall_clock
from dsm_sim.conformance.judge.semantics import DSM, SemanticsProfile
from dsm_sim.conformance.properties import get_property
from dsm_sim.history import History, Op, OpName, Outcome

__all__ = ["sweep_count_claims_nothing_more", "sweep_count_hides_nothing", "sweeps_succeed"]

ERRORS = "errors_agree_with_model"

_SWEEPS = {
    OpName.RESET_EXPIRED_LOCKS: "the lock sweep",
    OpName.EXPIRE_PAST_RETENTION: "the retention sweep",
}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _story(op: Op, what: str) -> str:
    return f"{_SWEEPS[op.op]} (op #{op.index}, at {fmt(op.invoke)}) {what}"


def _judge(op: Op, wall_clock: bool) -> tuple[str, str] | None:
    """The property this sweep's answer breaks, and why it cannot be trusted; or None."""
    if op.outcome in (Outcome.INFO, Outcome.FAIL) and op.error is not None:
        if op.error == CRASH:
            return None  # still in flight when the run ended: it never answered
        if wall_clock and op.error == "StoreError":
            return None  # a store fault the run may have injected
        return ERRORS, _story(
            op,
            f"raised {op.error}: until a sweep succeeds, every expired lock stays in place "
            "and the items behind it wait",
        )
    if not op.ok:
        return None
    if not _count(op.result):
        return ERRORS, _story(
            op,
            f"answered {op.result!r}, which is not a count (a non-negative integer of the "
            "records it changed)",
        )
    if wall_clock or op.op is not OpName.RESET_EXPIRED_LOCKS:
        return None
    changed = len(op.keys)
    if op.result != changed:
        keys = ", ".join(op.keys) if op.keys else "none"
        claims_more = isinstance(op.result, int) and op.result > changed
        name = "sweep_only_expired" if claims_more else "sweep_resets_expired"
        return name, _story(
            op,
            f"answered {op.result} but changed {changed} record(s) (keys: {keys}); its count "
            "must be the number of locks it reset",
        )
    return None


def _sweep_findings(history: History, name: str) -> InvariantResult:
    wall_clock = is_wall_clock(history)
    violations = [
        Violation(judged[1], key="", ops=(op.index,))
        for op in history.ops
        if op.op in _SWEEPS and (judged := _judge(op, wall_clock)) is not None and judged[0] == name
    ]
    return result_of(name, get_property(name).summary, violations)


def sweeps_succeed(history: History, semantics: SemanticsProfile = DSM) -> InvariantResult:
    """Every sweep succeeds and answers a count (``errors_agree_with_model``)."""
    return _sweep_findings(history, ERRORS)


def sweep_count_hides_nothing(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """A lock sweep's count covers every lock it reset (``sweep_resets_expired``)."""
    return _sweep_findings(history, "sweep_resets_expired")


def sweep_count_claims_nothing_more(
    history: History, semantics: SemanticsProfile = DSM
) -> InvariantResult:
    """A lock sweep's count claims no lock it did not reset (``sweep_only_expired``)."""
    return _sweep_findings(history, "sweep_only_expired")
