"""Building a node's DataStateMachine from its settings: the step node authors never write."""

from __future__ import annotations

from reference_engine.config import DataStateMachineConfig
from reference_engine.context import StateHandlerContext, validate_key
from reference_engine.engine.definitions import Element, ExecutionThread
from reference_engine.errors import InvalidItemError
from reference_engine.machine import NULL_MACHINE, ContextualDataStateMachine, DataStateMachine
from reference_engine.registry import HandlerRegistry
from reference_engine.scope import Scope

__all__ = ["ENTITY_FIELDS", "DataStateMachineFactory", "entity_id_for"]


#: The field of the execution or the element each scope keys records under, as errors name it.
ENTITY_FIELDS: dict[Scope, str] = {
    Scope.TENANT: "tenant_id",
    Scope.APPLICATION: "source_app_id",
    Scope.WORKFLOW: "workflow_id",
    Scope.ELEMENT: "element_id",
    Scope.THREAD: "execution_id",
}


def entity_id_for(scope: Scope, element: Element, thread: ExecutionThread) -> str:
    """The entity a scope keys records under (see the scope table in ``scope.py``)."""
    match scope:
        case Scope.TENANT:
            return thread.tenant_id
        case Scope.APPLICATION:
            return thread.source_app_id
        case Scope.WORKFLOW:
            return element.workflow_id
        case Scope.ELEMENT:
            return element.id
        case Scope.THREAD:
            return thread.execution_id


class DataStateMachineFactory:
    """Resolves handler and scope, builds the base context, returns the machine."""

    def __init__(self, registry: HandlerRegistry) -> None:
        self.registry = registry

    def base_context(
        self, element: Element, thread: ExecutionThread, config: DataStateMachineConfig
    ) -> StateHandlerContext:
        # Ids from the execution become key parts and stamps in every record:
        # refuse what a store could not hold before anything is written.
        # The tenant first, then the entity under the name of the field it comes
        # from: "source_app_id must not be empty" says what to fix, where
        # "entity_id" would name a column the caller never set.
        tenant_id = validate_key(thread.tenant_id, field_name="tenant_id", allow_blank=False)
        field_name = ENTITY_FIELDS[config.scope]
        try:
            entity_id = validate_key(
                entity_id_for(config.scope, element, thread),
                field_name=field_name,
                allow_blank=False,
            )
        except InvalidItemError as exc:
            exc.add_note(f"scope {config.scope.code} keys its records under the {field_name}")
            raise
        return StateHandlerContext(
            scope_id=int(config.scope),
            scope_code=config.scope.code,
            entity_id=entity_id,
            entity_execution_id=validate_key(thread.execution_id, field_name="execution_id"),
            tenant_id=tenant_id,
            source_app_id=validate_key(
                thread.source_app_id, field_name="source_app_id", allow_empty=True
            ),
            handler_config=config.handler_config,
        )

    async def create(
        self,
        element: Element,
        thread: ExecutionThread,
        config: DataStateMachineConfig | None,
    ) -> DataStateMachine:
        """The node's machine; :data:`NULL_MACHINE` when it has no ``dataStateMachine`` block."""
        if config is None:
            return NULL_MACHINE
        handler = await self.registry.resolve(config.handler)
        return ContextualDataStateMachine(handler, self.base_context(element, thread, config))
