"""Sample nodes built on the DataStateMachine."""
