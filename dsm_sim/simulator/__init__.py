"""The SimPy chaos simulator: workers, a redelivering broker, a catch-up worker and faults.

The real node executor and the real handler run inside simulated time; see
``docs/simulator.md``.  :func:`dsm_sim.simulator.run.run_scenario` is the entry point.
"""

__all__: list[str] = []
