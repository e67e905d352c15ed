"""Baselines and planners: every peer's strategy in tfplace's strategy space, and
Horovod data parallelism for real.

    from tfplace.baselines import make_problem, generate, names
    problem = make_problem(graph, cluster, profile, max_groups=64)
    strategy = generate("pipeline", problem)       # any of names()
    problem.evaluate(strategy)                     # SimReport (lowering + simulator)

Modules: problem (Problem, GroupCosts), data_parallel, model_parallel, list_scheduling,
pipeline, ratio_lp, bounds, registry, horovod_runner / horovod_worker, testing (fakes).
Importing this package does not import TensorFlow.
"""

from tfplace.baselines.problem import GroupCosts, Problem, make_problem
from tfplace.baselines.registry import baseline_factories, generate, is_runtime, names

__all__ = ["GroupCosts", "Problem", "baseline_factories", "generate", "is_runtime", "make_problem", "names"]
