"""Multi-process stress runs of a handler against a real database.

N spawned processes x M asyncio workers deliver duplicated messages through
the node flow; their journals and the durable side-effect rows become one
history that the simulator's checker judges.  ``dsm stress`` is the command
line; :func:`run_stress` the API.
"""

from dsm_sim.stress.runner import StressReport, StressRun, run_stress
from dsm_sim.stress.settings import BUILTIN_HANDLER_SPEC, StressSettings

__all__ = ["BUILTIN_HANDLER_SPEC", "StressReport", "StressRun", "StressSettings", "run_stress"]
