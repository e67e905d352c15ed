"""Naive model parallelism (HeteroG's `model_parallel` / `model_parallel2` seeds): every group on
one device with the whole batch, groups taken in topological order (group numbering of the
grouping: by each group's first op).

  round_robin(problem)            group g on device g mod n
  contiguous(problem, balance)    n consecutive blocks of groups, block k on device k (cluster
                                  order, so blocks follow the hosts)

contiguous's `balance`:
  "count": HeteroG's rule, block of group g = floor(g / ceil(G / n)).
  "cost":  cut where the cumulative compute (on the fastest kind, at the global batch) crosses
           each device's share of the total, the share ∝ device throughput, so a fast device
           gets a longer block. Every block gets at least one group while G >= n.
"""

from __future__ import annotations

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.strategy import Strategy, decision

from tfplace.baselines.problem import Problem


def placement_strategy(problem: Problem, device_of_group) -> Strategy:
    """Strategy that runs group g on device index device_of_group[g] with the whole batch."""
    names = problem.device_names
    batch = problem.global_batch_size
    per_device = {i: decision({names[i]: batch}) for i in set(int(d) for d in device_of_group)}
    groups = {problem.group_names[g]: per_device[int(d)] for g, d in enumerate(device_of_group)}
    return problem.strategy(groups=groups)


def round_robin(problem: Problem) -> Strategy:
    n = problem.cluster.num_devices
    return placement_strategy(problem, [g % n for g in range(problem.num_groups)])


def contiguous_blocks(weights_per_group: np.ndarray, device_weights: np.ndarray) -> np.ndarray:
    """Block index per group: cuts where the cumulative group weight crosses the cumulative
    device weight fractions; each block non-empty while there are enough groups."""
    g, n = len(weights_per_group), len(device_weights)
    total = float(weights_per_group.sum())
    cum = np.cumsum(weights_per_group) - 0.5 * weights_per_group  # group midpoints
    frac = cum / total if total > 0 else (np.arange(g) + 0.5) / g
    bounds = np.cumsum(device_weights)[:-1] / float(np.sum(device_weights))
    raw = np.minimum(np.searchsorted(bounds, frac, side="right"), n - 1)
    if g < n:
        return raw
    # Non-decreasing, steps of at most one block, and enough groups left for the later blocks.
    block = np.zeros(g, dtype=np.int64)
    for i in range(1, g):
        block[i] = min(max(int(raw[i]), int(block[i - 1]), n - g + i), int(block[i - 1]) + 1)
    return block


def contiguous(problem: Problem, balance: str = "cost") -> Strategy:
    n, g = problem.cluster.num_devices, problem.num_groups
    if balance == "count":
        size = -(-g // n)
        return placement_strategy(problem, [i // size for i in range(g)])
    if balance != "cost":
        raise InputError("argument", "balance", f"is {balance!r}", 'use "count" or "cost"')
    costs = problem.costs
    speed = costs.device_throughput(problem.global_batch_size)
    fastest = costs.device_kind[int(np.argmax(speed))]
    work = costs.group_seconds(fastest, problem.global_batch_size)
    return placement_strategy(problem, contiguous_blocks(work, speed))
