"""What the conformance machine's rules draw from.

The strategies have small, collision-prone domains on purpose: three workers
and eight items per world (the hot item in two tenants, two scopes, two
entities, a near spelling and a split of its key; see
:mod:`dsm_sim.conformance.generate.worlds`) make races, take-overs and isolation bugs
meet within a few steps.  Rules draw a :class:`~dsm_sim.conformance.generate.worlds.Role`
and act on that role's item in the test case's world.
"""

from __future__ import annotations

from hypothesis import strategies as st

from dsm_sim.conformance.generate.payloads import DATA, ERRORS, OBJECTS, PLAIN_DATA
from dsm_sim.conformance.generate.worlds import Role
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DATA",
    "ERRORS",
    "ITEMS",
    "JUMPS_BACK",
    "OBJECTS",
    "OBSERVER",
    "PLAIN_DATA",
    "SCHEDULES",
    "STATUSES",
    "TICKS",
    "WORKER",
    "WORKERS",
]

S = IdempotencyStatus
WORKERS = (1, 2, 3)
OBSERVER = 0  # the execution id reads are made under; reads never write

#: The hot item is drawn most often, so operations meet on one item; the
#: others are there to collide with it (tenant, scope, entity, key) or to stay apart.
ITEMS = st.sampled_from((Role.HOT, *Role, Role.HOT))
WORKER = st.sampled_from(WORKERS)
STATUSES = st.sampled_from([s for s in IdempotencyStatus if s is not S.NONE])
#: A few telling durations rather than any integer: the shrinker spends its
#: budget removing steps, not walking 900 down to 1.  Seconds matter: some
#: nodes lock for five.
TICKS = st.sampled_from((1, 59, 60, 61, 300, 600, 899, 900, 2, 4, 6))
JUMPS_BACK = st.sampled_from((1, 60, 600, 3600))
#: Which racing call resumes at each choice point (:mod:`dsm_sim.conformance.execute.scheduler`):
#: mostly short, so a race preempts once or twice; empty runs each call to its end in turn.
SCHEDULES = st.lists(st.integers(0, 3), max_size=6).map(tuple)
