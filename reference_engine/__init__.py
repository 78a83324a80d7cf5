"""DataStateMachine reference engine: statuses, handlers, the node-facing machine and a workflow engine.

The names most users need are re-exported here; each lives in a module named
for its concept.
"""

from reference_engine.clock import Clock, ManualClock, SystemClock
from reference_engine.config import DataStateMachineConfig, HandlerConfig, parse_node_settings
from reference_engine.context import RecordKey, StateHandlerContext
from reference_engine.errors import (
    ConfigurationError,
    DsmError,
    ForbiddenTransitionError,
    InvalidItemError,
    InvalidOptionError,
    InvalidSettingsError,
    LockError,
    LockHeldError,
    LockNotHeldError,
    PayloadTooLargeError,
    StaleLockError,
    StoreError,
    UnknownHandlerError,
    UnknownScopeError,
    UnsupportedStatusError,
)
from reference_engine.factory import DataStateMachineFactory
from reference_engine.handler import HandlerFactory, StateHandler
from reference_engine.machine import (
    NULL_MACHINE,
    ContextualDataStateMachine,
    DataStateMachine,
    NullDataStateMachine,
)
from reference_engine.record import StateRecord
from reference_engine.registry import HandlerRegistry
from reference_engine.scope import Scope
from reference_engine.status import TRANSITIONS, IdempotencyStatus

__all__ = [
    "NULL_MACHINE",
    "TRANSITIONS",
    "Clock",
    "ConfigurationError",
    "ContextualDataStateMachine",
    "DataStateMachine",
    "DataStateMachineConfig",
    "DataStateMachineFactory",
    "DsmError",
    "ForbiddenTransitionError",
    "HandlerConfig",
    "HandlerFactory",
    "HandlerRegistry",
    "IdempotencyStatus",
    "InvalidItemError",
    "InvalidOptionError",
    "InvalidSettingsError",
    "LockError",
    "LockHeldError",
    "LockNotHeldError",
    "ManualClock",
    "NullDataStateMachine",
    "PayloadTooLargeError",
    "RecordKey",
    "Scope",
    "StaleLockError",
    "StateHandler",
    "StateHandlerContext",
    "StateRecord",
    "StoreError",
    "SystemClock",
    "UnknownHandlerError",
    "UnknownScopeError",
    "UnsupportedStatusError",
    "parse_node_settings",
]
