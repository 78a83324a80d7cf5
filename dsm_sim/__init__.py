"""dsm_sim: the verification harness for DataStateMachine handlers.

The conformance kit (Hypothesis state machine), the catalogue of broken
handlers, the SimPy chaos simulator, scenarios and reports.
"""
