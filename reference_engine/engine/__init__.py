"""A minimal but real workflow engine driving nodes that use the DataStateMachine."""
