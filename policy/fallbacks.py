"""LOCAL FALLBACKS — stand-ins for interfaces other issues own, removed once those land.

  * `relative_speed(kind)`  stands in for `tfplace.profiling.device_model.relative_speed`
  * `default_profile(graph, kinds)` stands in for `tfplace.profiling.device_model.default_profile`
  * `baseline_strategies(...)` calls `tfplace.baselines.registry.baseline_factories` (landed;
    the local list below is only used if it is missing)

Each public function first tries the real module and only falls back when it is missing
(ImportError), so nothing here shadows the real implementation once it exists. The fallback
numbers are coarse on purpose: they only have to make heterogeneity visible to the policy.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Sequence

import numpy as np

from tfplace.formats.cluster import Cluster
from tfplace.ir.graph_ir import OpGraph
from tfplace.formats.profile import Profile
from tfplace.formats.strategy import Strategy, even_strategy, proportional_strategy, decision

# Peak FP32 TFLOP/s from the vendors' datasheets (V100 SXM2 15.7, P100 PCIe 9.3, GTX 1080 Ti
# 11.3, T4 8.1, A100 19.5, H100 SXM 67, H200 67, K80 per GPU 4.4); CPU: a few-core host ~1.
_PEAK_TFLOPS: Dict[str, float] = {"V100": 15.7, "P100": 9.3, "GTX1080Ti": 11.3, "1080Ti": 11.3, "T4": 8.1,
                                  "A100": 19.5, "H100": 67.0, "H200": 67.0, "K80": 4.4, "CPU": 1.0}
_HEAVY = ("Conv", "MatMul", "BatchMatMul", "Einsum")


def _real(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def relative_speed(kind: str) -> float:
    """Relative compute speed of a device kind (unitless; only ratios matter)."""
    real = _real("tfplace.profiling.device_model", "relative_speed")
    if real is not None:
        return float(real(kind))
    return _PEAK_TFLOPS.get(kind, 5.0)


def device_speed(device) -> float:
    """Relative compute speed of one cluster device (a quota-emulated CPU device: a CPU's times
    its quota; stands in for `tfplace.profiling.device_model.device_speed`)."""
    real = _real("tfplace.profiling.device_model", "device_speed")
    if real is not None:
        return float(real(device))
    return relative_speed(device.kind)


def default_profile(graph: OpGraph, kinds: Sequence[str]) -> Profile:
    """Roofline-ish derived profile when no measured one is given.

    FALLBACK model: seconds = 5 µs launch + traffic / memory bandwidth, where traffic is the op's
    output bytes (x20 for conv/matmul, a crude arithmetic-intensity factor), divided by the
    kind's relative speed normalised to V100. Batch-dependent ops with batched outputs scale
    linearly with the per-device batch; others are constant.
    """
    real = _real("tfplace.profiling.device_model", "default_profile")
    if real is not None:
        return real(graph, kinds)
    ref = graph.reference_batch_size
    out_bytes = np.bincount(graph.tensor_op, weights=graph.tensor_bytes.astype(float), minlength=graph.num_ops)
    batched = np.zeros(graph.num_ops, dtype=bool)
    batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    scaling = graph.op_batch_dependent & batched
    ops = {}
    for i, name in enumerate(graph.names):
        factor = 20.0 if any(h in graph.op_types[i] for h in _HEAVY) else 1.0
        per = {}
        for kind in kinds:
            s = 5e-6 + factor * out_bytes[i] / 9e11 * (15.7 / relative_speed(kind))
            per[kind] = ((ref,), (s,)) if scaling[i] else (((1, ref), (s, s)) if ref > 1 else ((ref,), (s,)))
        ops[name] = per
    return Profile(ops=ops, graph=str(graph.meta.get("model", graph.source)),
                   conditions={"kind": "policy.fallbacks.default_profile"})


def baseline_strategies(graph: OpGraph, cluster: Cluster, batch_size: int, max_groups: int,
                        label: str = "", profile: Profile = None, grouping=None,
                        overheads=None) -> Dict[str, Callable[[], Strategy]]:
    """name -> zero-argument factory of every baseline strategy (real registry if present; it
    gets the task's profile, grouping and runtime overheads so baselines and policy see the same
    costs)."""
    real = _real("tfplace.baselines.registry", "baseline_factories")
    if real is not None:
        return dict(real(graph, cluster, batch_size, max_groups, profile=profile, grouping=grouping,
                         overheads=overheads))
    names = cluster.device_names
    speeds = [device_speed(d) for d in cluster.devices]
    fastest = names[int(np.argmax(speeds))]
    out: Dict[str, Callable[[], Strategy]] = {
        "single": lambda: Strategy(batch_size, max_groups, decision({fastest: batch_size}), {}, label),
        "dp_proportional_allreduce": lambda: proportional_strategy(names, speeds, batch_size, max_groups, graph=label),
        "dp_proportional_ps": lambda: proportional_strategy(names, speeds, batch_size, max_groups, "ps", fastest,
                                                            graph=label),
    }
    if batch_size >= len(names):
        out["dp_even_allreduce"] = lambda: even_strategy(names, batch_size, max_groups, graph=label)
        out["dp_even_ps"] = lambda: even_strategy(names, batch_size, max_groups, "ps", fastest, graph=label)
    return out
