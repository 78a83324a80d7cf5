"""Rules for what callers and operators do around the calls: hold on to objects, restart.

Two kinds of bugs pass a kit whose callers are tidy:

* **Aliasing.** A caller builds a payload, passes it to ``set`` or
  ``upsert``, and goes on using the same dict (a node reuses its result
  object for the next item); another changes the data ``get`` returned.  A
  store that keeps the caller's object, or hands out its own, then shows data
  no one wrote.  :meth:`LifecycleRules.caller_reuses_payload` changes both in
  place after the calls and reads the world back.
* **Restarts.** A worker process restarts: ``close()``, then ``open()`` on the
  same instance, over the same store.  A store whose ``open()`` starts from a
  clean table, re-creates an index it keeps in memory, or whose ``close()``
  releases the locks it took, loses records or locks.
  :meth:`LifecycleRules.worker_restarts` restarts the handler and reads every
  record back: all must be as before.

A restart is only meaningful for a handler whose ``close()`` keeps the store:
a factory that drops its schema or key prefix in ``close()`` (as the kit's
own test factories do, so no test case leaks into the next) cannot be
restarted.  The rule therefore runs on handlers that declare
``survives_restart = True`` (an attribute or property), and does nothing on
others.
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping, MutableSequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.worlds import Role
from reference_engine.status import IdempotencyStatus

__all__ = ["LifecycleRules", "scramble", "survives_restart"]

S = IdempotencyStatus
#: What a changed payload holds: a key and a value no drawn payload has.
MARK = "\x00changed by the caller after the call"


def scramble(value: object) -> None:
    """Change ``value`` in place, everywhere it can be changed (objects, lists, nested).

    Immutable values (a ``MappingProxyType``, a tuple) are left alone: a
    store may hand those out.
    """
    if isinstance(value, MutableMapping):
        for key in list(value):
            item = value[key]
            if isinstance(item, MutableMapping | MutableSequence):
                scramble(item)
            else:
                value[key] = MARK
        value[MARK] = 1
    elif isinstance(value, MutableSequence) and not isinstance(value, str | bytes):
        for item in value:
            scramble(item)
        value.append(MARK)


def survives_restart(handler: object) -> bool:
    """Does ``handler`` declare that ``close()`` then ``open()`` keeps its store?"""
    return getattr(handler, "survives_restart", False) is True


class LifecycleRules(OperationRules):
    """Callers that change objects after the call, and workers that restart."""

    @rule(
        worker=W.WORKER,
        item=W.ITEMS,
        upsert=st.booleans(),
        status=W.STATUSES,
        data=W.OBJECTS,
    )
    @step
    def caller_reuses_payload(
        self, worker: int, item: Role, upsert: bool, status: S, data: dict[str, Any]
    ) -> None:
        """Write ``data``, then change that dict and the data ``get`` returns, in place.

        The handler is given a copy (the drawn value stays as the
        reproduction prints it); the copy is what the caller changes.
        """
        if self.diverged:
            return
        ref = self._ref(item)
        payload = copy.deepcopy(data)
        steps = len(self.steps)
        if upsert:
            self._upsert(worker, ref, payload)
        else:
            self._set(worker, ref, status, payload)
        if self.diverged or len(self.steps) == steps:
            return  # the library has no such write: nothing was passed
        scramble(payload)
        for outcome in self._observe().values():
            if outcome.error is None and outcome.value is not None:
                scramble(outcome.value.data)
        self._step(
            f"worker {worker}",
            "changes, in place, the payload it passed and the data get returned",
        )
        self._checked("data_round_trip")
        self._after_step("get")

    # A precondition on what the handler declares, never on what the store
    # answered: the same program always draws the same rules.
    @precondition(lambda self: survives_restart(self.handler))
    @rule()
    @step
    def worker_restarts(self) -> None:
        """The worker process restarts: ``close()`` then ``open()`` on the same handler.

        Locks, tokens and records live in the store, so every execution
        carries on as before and every record must read back unchanged.
        """
        if self.diverged:
            return
        closed = self.driver.outcome(self.handler.close)
        opened = self.driver.outcome(self.handler.open) if closed.error is None else closed
        self._step("worker process", "restarts: close(), then open()", opened.describe())
        # A close that raises is judged where every close is; an open that
        # fails after a clean close is a wrong answer of the store.
        name = "closes_cleanly" if closed.error is not None else "errors_agree_with_model"
        self._checked(name)
        if opened.error is not None:
            call = "close()" if closed.error is not None else "open()"
            self._report(
                P.Finding(
                    name,
                    f"{call} on a restart raised {opened.describe()}: {opened.error}; a handler "
                    "must survive close() then open() on the same instance",
                )
            )
            return
        # Every record, lock and token must read back as before (and as the model says).
        self._after_step("restart")
