"""Single-device and data-parallel baselines (HeteroG's seeds, HAP's DP-EV / DP-CP).

  single_device(problem)                fastest device whose simulated step fits in memory
  dp_even(problem, sync)                every device the same samples (DP-EV)
  dp_proportional(problem, sync)        samples in proportion to device speed (DP-CP)
  ps_device(problem, devices)           where a PS baseline aggregates

Device speed is the profile's: samples per second of one device running the whole step on the
even share B/n (`GroupCosts.device_throughput`), so a roofline-derived profile gives roofline
speeds and a measured one measured speeds. Rounding of proportional shares is
`tfplace.formats.strategy.proportional_shares` (largest remainder: floor, then the leftover samples one
by one to the largest shortfall; no device left at 0 when B >= n).

PS placement: the device with the best link, i.e. the largest sum over the other devices of the
bottleneck bandwidth in both directions min(bw(i->j), bw(j->i)) — every worker sends its
gradients to the PS and receives the weights back, so the PS's aggregate bandwidth decides the
step. Ties go to the faster device, then the earlier one. On the HeteroG testbed this is a V100
(its host has the 100 GbE NIC).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.strategy import Strategy, decision, proportional_shares

from tfplace.baselines.problem import Problem

SYNCS = ("allreduce", "ps")


def speed_order(problem: Problem) -> list:
    """Device indices, fastest first (ties: more memory, then earlier)."""
    speed = problem.costs.device_throughput()
    memory = problem.cluster.memory_bytes
    return sorted(range(problem.cluster.num_devices), key=lambda i: (-speed[i], -memory[i], i))


def single_device(problem: Problem) -> Strategy:
    """Everything on the fastest device whose simulated step does not run out of memory; if no
    device fits, the fastest one (the simulator then reports the OOM)."""
    order = speed_order(problem)
    for i in order:
        strategy = problem.single_device_strategy(problem.device_names[i])
        if not problem.evaluate(strategy).oom:
            return strategy
    return problem.single_device_strategy(problem.device_names[order[0]])


def ps_device(problem: Problem, devices: Optional[Sequence[str]] = None) -> str:
    """The PS for a data-parallel strategy over `devices` (default: all); see module docstring."""
    cluster = problem.cluster
    idx = [cluster.device_index(d) for d in (devices or cluster.device_names)]
    speed = problem.costs.device_throughput()

    def link_score(i: int) -> float:
        return sum(min(cluster.path_bandwidth_bytes_per_s(i, j), cluster.path_bandwidth_bytes_per_s(j, i))
                   for j in idx if j != i)

    best = max(idx, key=lambda i: (link_score(i), speed[i], -i))
    return cluster.device_names[best]


def _check_sync(sync: str) -> None:
    if sync not in SYNCS:
        raise InputError("argument", "sync", f"unknown sync method {sync!r}", f"use one of {list(SYNCS)}")


def data_parallel(problem: Problem, weights: Sequence[float], sync: str = "allreduce",
                  devices: Optional[Sequence[str]] = None) -> Strategy:
    """Every group on `devices` (default: all) with shares ∝ `weights` (largest remainder)."""
    _check_sync(sync)
    names = list(devices or problem.device_names)
    if len(weights) != len(names):
        raise InputError("argument", "weights", f"{len(weights)} weights for {len(names)} devices",
                         "pass one weight per device")
    shares = proportional_shares(weights, problem.global_batch_size)
    kept = {d: s for d, s in zip(names, shares) if s > 0}
    ps = ps_device(problem, list(kept)) if sync == "ps" else None
    return problem.strategy(default=decision(kept, sync, ps))


def dp_even(problem: Problem, sync: str = "allreduce") -> Strategy:
    """DP-EV: equal shares on every device (64 over 3 -> 22, 21, 21)."""
    n = problem.cluster.num_devices
    if problem.global_batch_size < n:
        raise InputError("argument", "global_batch_size",
                         f"{problem.global_batch_size} samples cannot cover {n} devices",
                         "use a batch of at least one sample per device")
    return data_parallel(problem, [1.0] * n, sync)


def dp_proportional(problem: Problem, sync: str = "allreduce") -> Strategy:
    """DP-CP: shares in proportion to each device's profiled throughput."""
    return data_parallel(problem, list(problem.costs.device_throughput()), sync)


def dp_best_subset(problem: Problem, sync: str = "allreduce", proportional: bool = True) -> Strategy:
    """Data parallelism over the best subset of devices, as a user would try by hand: the k
    fastest devices (speed_order) for every k, shares even or ∝ throughput, the fastest simulated
    step that does not run out of memory (every k out of memory: the fastest). On a cluster with a
    few fast devices behind fast links and slow ones behind slow links, leaving the slow ones out
    beats every all-device baseline. Costs one simulation per device count."""
    _check_sync(sync)
    order = speed_order(problem)
    speed = problem.costs.device_throughput()
    best, best_key = None, None
    for k in range(1, len(order) + 1):
        if problem.global_batch_size < k:
            break
        idx = order[:k]
        names = [problem.device_names[i] for i in idx]
        weights = [float(speed[i]) for i in idx] if proportional else [1.0] * k
        strategy = data_parallel(problem, weights, sync, names)
        report = problem.evaluate(strategy)
        key = (report.oom, report.iteration_time_s)
        if best_key is None or key < best_key:
            best, best_key = strategy, key
    return best


def device_weights(problem: Problem) -> np.ndarray:
    """Relative speed of every device (the proportional baseline's weights), summing to 1."""
    w = problem.costs.device_throughput()
    return w / w.sum()
