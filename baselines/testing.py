"""Fakes for the baselines' tests: profiles whose device kinds differ by a known factor, and
small problems over tfplace.testing's graphs and clusters.

  scaled_profile(graph, {"V100": 1.0, "P100": 2.0}, seconds_per_op, fixed_seconds)
      on kind k, an op that is batch-dependent with a batched output costs
      factor_k · seconds_per_op · (samples / reference batch); every other op costs
      factor_k · fixed_seconds whatever the batch (default: seconds_per_op, which is
      tfplace.testing.uniform_profile scaled per kind). Device speeds are exactly proportional
      to 1 / factor (a P100 here is twice as slow).
  small_problem(model="mlp", devices=4, batch=16, max_groups=12, factors=None, ...)
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from tfplace import testing
from tfplace.formats.profile import Profile

from tfplace.baselines.problem import Problem, make_problem

DEFAULT_FACTORS = {"V100": 1.0, "P100": 2.0}


def scaled_profile(graph, factors: Mapping[str, float], seconds_per_op: float = 1e-4,
                   fixed_seconds: Optional[float] = None) -> Profile:
    fixed = seconds_per_op if fixed_seconds is None else fixed_seconds
    ref = graph.reference_batch_size
    batched = np.zeros(graph.num_ops, dtype=bool)
    batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    scaling = graph.op_batch_dependent & batched
    ops = {}
    for i, name in enumerate(graph.names):
        per_kind = {}
        for kind, f in factors.items():
            if scaling[i]:
                per_kind[kind] = ((ref,), (seconds_per_op * f,))
            else:
                per_kind[kind] = ((1, ref), (fixed * f, fixed * f)) if ref > 1 else ((ref,), (fixed * f,))
        ops[name] = per_kind
    return Profile(ops=ops, graph=str(graph.meta.get("model", graph.source)),
                   conditions={"kind": "scaled_uniform", "factors": dict(factors)})


def small_problem(model: str = "mlp", devices: int = 4, batch: int = 16, max_groups: int = 12,
                  factors: Optional[Mapping[str, float]] = None, cluster=None,
                  fixed_seconds: Optional[float] = None) -> Problem:
    """A tiny TF graph (tfplace.testing.tiny_graph) on the two- or four-device V100/P100 cluster."""
    graph = testing.tiny_graph(model, batch)
    if cluster is None:
        cluster = testing.two_device_cluster() if devices == 2 else testing.four_device_cluster()
    profile = scaled_profile(graph, factors or DEFAULT_FACTORS, fixed_seconds=fixed_seconds)
    return make_problem(graph, cluster, profile, max_groups=max_groups)
