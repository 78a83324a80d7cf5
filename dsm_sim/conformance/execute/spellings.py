"""Keys through the node API: what the project refuses, and what it must treat as equal.

Item keys reach a handler through the contextual machine, which validates
them once (``StateHandlerContext.for_item``): an empty key, a NUL, a key
over the documented maximum, text that is not valid Unicode, anything that
is not text.  Those must be refused the same way whatever the handler, with
:class:`~reference_engine.errors.InvalidItemError`, and nothing may change
in the store.  And a key that equals another as text — a ``str`` subclass
such as a ``(str, Enum)`` member — is the same key: it must reach the same
record.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from dsm_sim.conformance import properties as P
from dsm_sim.conformance.execute.operations import OperationRules
from dsm_sim.conformance.execute.recording import step
from dsm_sim.conformance.generate import draws as W
from dsm_sim.conformance.generate.steps import NodeCall, RefusedKey
from dsm_sim.conformance.generate.worlds import Role
from dsm_sim.model import ItemRef, Outcome
from reference_engine.context import StateHandlerContext
from reference_engine.errors import InvalidItemError
from reference_engine.machine import ContextualDataStateMachine
from reference_engine.status import IdempotencyStatus

__all__ = ["KeyText", "NodeCall", "RefusedKey", "SpellingRules"]

S = IdempotencyStatus


class KeyText(str):
    """A key spelled as a ``str`` subclass: equal to its text, formatted differently."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"KeyText({str.__repr__(self)})"

    def __format__(self, spec: str) -> str:
        return f"KeyText.{str.__str__(self)}"


def _base_context(ref: ItemRef, worker: int, execution: str) -> StateHandlerContext:
    ctx = ref.context(worker, execution=execution)
    return StateHandlerContext(
        scope_id=ctx.scope_id,
        scope_code=ctx.scope_code,
        entity_id=ctx.entity_id,
        entity_execution_id=ctx.entity_execution_id,
        tenant_id=ctx.tenant_id,
        source_app_id=ctx.source_app_id,
        handler_config=ctx.handler_config,
    )


class SpellingRules(OperationRules):
    """Refused keys and equal spellings, sent the way a node sends them."""

    def _node_api(self, ref: ItemRef, worker: int) -> ContextualDataStateMachine:
        return ContextualDataStateMachine(
            self.handler, _base_context(ref, worker, self._execution(worker))
        )

    @rule(
        worker=W.WORKER,
        key=st.sampled_from(tuple(RefusedKey)),
        call=st.sampled_from(tuple(NodeCall)),
    )
    @step
    def node_sends_refused_key(self, worker: int, key: RefusedKey, call: NodeCall) -> None:
        if self.diverged:
            return
        machine = self._node_api(self.world[Role.HOT], worker)
        bad: Any = key.value
        calls = {
            NodeCall.EXISTS: lambda: machine.exists(bad),
            NodeCall.GET: lambda: machine.get(bad),
            NodeCall.ACQUIRE: lambda: machine.try_acquire_lock(bad),
            NodeCall.SKIP: lambda: machine.set(bad, S.SKIPPED),
            NodeCall.UPSERT: lambda: machine.upsert(bad, {"amount": 1}),
        }
        got = self.driver.outcome(calls[call])
        self._step(
            f"worker {worker}",
            f"{call.value}({key.name} item key) through the node API",
            got.describe(),
        )
        self._checked("invalid_keys_refused")
        if not isinstance(got.error, InvalidItemError):
            came = "was accepted" if got.error is None else f"raised {got.describe()}: {got.error}"
            self._report(
                P.Finding(
                    "invalid_keys_refused",
                    f"{call.value} with the item key {ascii(bad)[:40]} ({key.name}) {came}; the "
                    "project refuses such keys with InvalidItemError before any store is touched",
                )
            )
        self._after_step(call.value)

    @rule(worker=W.WORKER, item=W.ITEMS)
    @step
    def node_spells_key_as_subclass(self, worker: int, item: Role) -> None:
        """The node passes its key as a ``str`` subclass (an enum member): the same item.

        The handler must answer exactly as it does for the plain text.
        """
        if self.diverged:
            return
        ref = self._ref(item)
        machine = self._node_api(ref, worker)
        spelled = KeyText(ref.item), KeyText(ref.entity_key)
        plain = ref.item, ref.entity_key

        def answers(key: str, entity_key: str) -> tuple[Outcome, Outcome]:
            return (
                self.driver.outcome(lambda: machine.exists(key, entity_key)),
                self.driver.outcome(lambda: machine.get(key, entity_key)),
            )

        want_exists, want_record = answers(*plain)
        got_exists, got_record = answers(*spelled)
        self._step(
            f"worker {worker}",
            f"exists and get({ref.label}), the key once as text, once as a str subclass",
            f"{_read(want_exists, want_record)}; {_read(got_exists, got_record)}",
        )
        self._checked("key_identity")
        if (_read(got_exists, got_record), _key(got_record)) != (
            _read(want_exists, want_record),
            _key(want_record),
        ):
            self._report(
                P.Finding(
                    "key_identity",
                    f"{ref.label} answered exists/get {_read(want_exists, want_record)} for its "
                    f"key as text but {_read(got_exists, got_record)} for the same key as a str "
                    "subclass equal to it: equal keys must reach the same record",
                )
            )


def _read(exists: Outcome, record: Outcome) -> str:
    if record.error is not None:
        return f"{exists.describe()}/{record.describe()}"
    seen = record.value
    shown = "no record" if seen is None else f"{seen.status.label} token {seen.attempt}"
    return f"{exists.describe()}/{shown}"


def _key(record: Outcome) -> object:
    return None if record.error is not None or record.value is None else record.value.key
