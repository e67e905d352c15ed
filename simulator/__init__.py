"""The event simulator: `simulate(placed, cluster, options) -> SimReport`.

Pure and deterministic for a seed; imports neither TensorFlow nor (until the first fast
simulation) numba. See simulator.core for the model and simulator.trace for the trace layout.
"""

from tfplace.simulator.core import ENGINES, Schedule, SimOptions, schedule, simulate, straggle_factors
from tfplace.simulator.trace import chrome_trace, write_trace

__all__ = ["ENGINES", "Schedule", "SimOptions", "chrome_trace", "schedule", "simulate", "straggle_factors",
           "write_trace"]
