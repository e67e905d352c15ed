"""Data parallelism with the heaviest layers model-parallel (HeteroG's hybrid, by hand).

    strategy = dp_mp_hybrid(problem)

On a heterogeneous cluster with slow links, the layers that hold most of the weights (VGG-19's
fully connected layers: 120 M of its 143 M parameters) make data parallelism pay for an
all-reduce of their gradients every step, while the convolutions that do most of the compute
carry few weights. Running each heavy layer whole on one device sends its (small) activations
instead of its (large) gradients. A single-group move of the search rarely finds this: the
layer's weight, its forward product and its weight gradient sit in different groups, and moving
one of them alone only adds transfers.

The planner, for each start (proportional data parallelism over all devices, and over the best
subset of the fastest devices, data_parallel.dp_best_subset), takes the heavy variables in
order of size (trainable weights of at least HEAVY_FRACTION of the trainable bytes, at most
MAX_LAYERS) and, for each, the groups of its layer (`layer_groups`: the variable, its reads and
their consumers, its updates and the ops that make their gradients); it tries the layer whole on
each device and keeps the fastest simulated step that fits (first-improvement per layer, greedy
over the layers). Of devices that are interchangeable and treated alike so far, it tries one
(candidate_devices). Costs at most 2 x MAX_LAYERS x devices simulations.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tfplace.formats.strategy import Strategy, decision

from tfplace.baselines.data_parallel import dp_best_subset, dp_proportional
from tfplace.baselines.problem import Problem

HEAVY_FRACTION = 0.02  # a variable under 2% of the weights is not worth a device of its own
MAX_LAYERS = 6         # VGG-19's three FC layers and BERT's embeddings are within the first six


def layer_groups(problem: Problem, variable) -> Tuple[int, ...]:
    """Group indices of one variable's layer: its handle, reads, updates, the ops that consume
    its reads (the forward product, the input gradient) and the batch-dependent ops whose outputs
    its updates consume (the weight gradient)."""
    g, op_group = problem.graph, problem.grouping.op_group
    ops = {variable.op, *variable.readers, *variable.updaters}
    read_tensors = np.isin(g.tensor_op, list(variable.readers))
    ops |= set(g.edge_dst[np.isin(g.edge_tensor, np.nonzero(read_tensors)[0])].tolist())
    into_updates = g.edge_tensor[np.isin(g.edge_dst, list(variable.updaters))]
    ops |= {int(o) for o in g.tensor_op[into_updates] if g.op_batch_dependent[o]}
    return tuple(sorted({int(op_group[o]) for o in ops}))


def heavy_layers(problem: Problem) -> List[Tuple[int, ...]]:
    """The layers (layer_groups) of the heaviest trainable weights, largest first, each once."""
    weights = [v for v in problem.graph.variables if v.trainable and not v.is_slot]
    total = sum(v.num_bytes for v in weights)
    layers: List[Tuple[int, ...]] = []
    for v in sorted(weights, key=lambda v: (-v.num_bytes, v.name)):
        if total == 0 or v.num_bytes < HEAVY_FRACTION * total or len(layers) == MAX_LAYERS:
            break
        groups = layer_groups(problem, v)
        if groups not in layers and len(groups) < problem.num_groups:  # never the whole step
            layers.append(groups)
    return layers


def _with_layer_on(problem: Problem, strategy: Strategy, groups: Sequence[int], device: str) -> Strategy:
    names = problem.group_names
    whole = decision({device: problem.global_batch_size})
    return problem.strategy(groups={**strategy.groups, **{names[g]: whole for g in groups}},
                            default=strategy.default)


def _role(strategy: Strategy, device: str, group_names: Sequence[str]) -> tuple:
    """What `strategy` gives `device` in every group: its micro-batches and whether it is the
    group's parameter server."""
    out = []
    for name in group_names:
        d = strategy.groups.get(name, strategy.default)
        out.append((tuple(mb for dev, mb in d.shares if dev == device), d.ps_device == device))
    return tuple(out)


def candidate_devices(problem: Problem, strategy: Strategy) -> List[str]:
    """The devices a layer is tried on, in device order: of the devices the cluster can swap
    (Cluster.interchangeable_devices) and `strategy` treats alike, the first; its image under the
    swap would simulate the same step. 16 devices of 5 kinds-and-hosts: 5 tries, not 16."""
    names = problem.device_names
    keep = []
    for members in problem.cluster.interchangeable_devices():
        seen = set()
        for i in members:
            role = _role(strategy, names[i], problem.group_names)
            if role not in seen:
                seen.add(role)
                keep.append(i)
    return [names[i] for i in sorted(keep)]


def _greedy(problem: Problem, start: Strategy, layers: Sequence[Tuple[int, ...]]) -> Tuple[Strategy, tuple]:
    report = problem.evaluate(start)
    best, best_key = start, (report.oom, report.iteration_time_s)
    for groups in layers:
        base = best
        for device in candidate_devices(problem, base):
            candidate = _with_layer_on(problem, base, groups, device)
            report = problem.evaluate(candidate)
            key = (report.oom, report.iteration_time_s)
            if key < best_key:
                best, best_key = candidate, key
    return best, best_key


def dp_mp_hybrid(problem: Problem) -> Strategy:
    """The fastest of the greedy hybrids from each start (module docstring); a start unchanged
    when no layer on one device is faster."""
    layers = heavy_layers(problem)
    results = [_greedy(problem, start, layers) for start in (dp_proportional(problem, "allreduce"),
                                                              dp_best_subset(problem, "allreduce", True))]
    return min(results, key=lambda r: r[1])[0]
