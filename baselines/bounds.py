"""Physics checks: step times no strategy can beat (anchors.md §3), used by tests and by the
comparison report's "fraction of ideal" column.

  ideal_compute_s(problem)      compute bound; for devices whose speeds are proportional across
                                ops it is B / Σ_d throughput_d (anchors §3.1)
  allreduce_bound_s(S, n, B)    2(n-1)/n · S / B_min (anchors §3.2, nccl-tests PERFORMANCE.md)
  ps_bound_s(S, ...)            every worker sends S to the PS: S / B_worker, and the PS takes
                                (n-1)·S through its own link (BytePS rationale)
  strategy_bounds(problem, s)   the bounds that apply to one strategy, as a dict

Compute bound, made rigorous for the simulator's cost model. A device processing s samples of a
batch-split op of kind-k cost c_k(s) spends at least s·ρ_k where ρ_k = min over 1 <= s' <= B of
c_k(s')/s' (the cheapest per-sample rate at any micro-batch size). Every sample of every group
runs somewhere, all ops of a group share its split, so with x_{g,k} samples of group g on kind k:

    T >= min  T   s.t.  Σ_g x_{g,k} ρ_{g,k} <= n_k T  (n_k devices of kind k),  Σ_k x_{g,k} = B

a small LP (G·K variables, HiGHS). With proportional speeds, ρ_{g,k} = ρ_g / v_k for every g,
the work B·Σ_g ρ_g must fit in Σ_d v_d·T, so the optimum is B·Σ_g ρ_g / Σ_d v_d = B / Σ_d
throughput_d (throughput_d = v_d / Σ_g ρ_g). Mirrored ops (weights, updates) and communication
only add time, so they are left out; straggler noise only slows devices down.

Communication bounds use link bandwidths as the simulator sees them: a device cannot send faster
than its best path (its port), so B_min = min over participants of that device's best outgoing
path bandwidth; S is the trainable weight bytes aggregated (dense gradients; a sparse embedding
gradient makes this an over-estimate, so use these bounds on dense models).
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
from scipy.optimize import linprog

from tfplace.formats.cluster import Cluster
from tfplace.formats.strategy import Strategy

from tfplace.baselines.problem import Problem


def per_sample_rate(problem: Problem, kind: str) -> np.ndarray:
    """ρ[G]: for each group, Σ over its batch-split ops of min_s c(s)/s on `kind` (seconds/sample)."""
    costs = problem.costs
    batch = problem.global_batch_size
    compute = problem.lowerer.compute
    measured = compute.bat[list(compute.kinds).index(kind)][costs.replica_ops]  # padded with inf
    points = {1, batch} | {int(b) for b in np.unique(measured[np.isfinite(measured)]) if 1 <= b <= batch}
    ops = costs.replica_ops
    best = np.full(len(ops), np.inf)
    dev = np.full(len(ops), costs.device_kind.index(kind))
    for s in sorted(points):
        best = np.minimum(best, compute.seconds(ops, dev, np.full(len(ops), float(s))) / s)
    return np.bincount(costs.op_group[ops], weights=best, minlength=problem.num_groups)


def ideal_compute_s(problem: Problem) -> float:
    """The compute bound of the module docstring (seconds)."""
    costs = problem.costs
    kinds = list(costs.kinds)
    n_k = np.array([costs.device_kind.count(k) for k in kinds], dtype=float)
    rho = np.stack([per_sample_rate(problem, k) for k in kinds], axis=1)  # [G, K]
    g, k = rho.shape
    nvar = g * k + 1  # x[g, k] row-major, then T
    c = np.zeros(nvar)
    c[-1] = 1.0
    a_ub = np.zeros((k, nvar))
    for j in range(k):
        a_ub[j, j:g * k:k] = rho[:, j]
        a_ub[j, -1] = -n_k[j]
    a_eq = np.zeros((g, nvar))
    for i in range(g):
        a_eq[i, i * k:(i + 1) * k] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=np.full(g, float(problem.global_batch_size)),
                  bounds=[(0, None)] * nvar, method="highs")
    if res.status != 0:
        raise RuntimeError(f"compute-bound LP failed: {res.message}")
    return float(res.fun)


def throughput_bound_s(global_batch_size: int, throughputs: Sequence[float]) -> float:
    """B / Σ_d throughput_d (samples / samples-per-second)."""
    return global_batch_size / float(np.sum(throughputs))


def allreduce_bound_s(num_bytes: float, num_devices: int, min_bandwidth_bytes_per_s: float) -> float:
    """2(n-1)/n · S / B_min: every rank sends (and receives) that much in any all-reduce."""
    if num_devices < 2:
        return 0.0
    return 2.0 * (num_devices - 1) / num_devices * num_bytes / min_bandwidth_bytes_per_s


def ps_bound_s(num_bytes: float, worker_bandwidths_bytes_per_s: Sequence[float],
               ps_bandwidth_bytes_per_s: float = float("inf")) -> float:
    """max(S / B_worker for the slowest worker path, (workers · S) / B_ps)."""
    if not len(worker_bandwidths_bytes_per_s):
        return 0.0
    return max(num_bytes / min(worker_bandwidths_bytes_per_s),
               len(worker_bandwidths_bytes_per_s) * num_bytes / ps_bandwidth_bytes_per_s)


def best_out_bandwidth(cluster: Cluster, device: int) -> float:
    """The fastest path out of `device` (what its port allows)."""
    return max((cluster.path_bandwidth_bytes_per_s(device, j) for j in range(cluster.num_devices) if j != device),
               default=float("inf"))


def best_in_bandwidth(cluster: Cluster, device: int) -> float:
    return max((cluster.path_bandwidth_bytes_per_s(j, device) for j in range(cluster.num_devices) if j != device),
               default=float("inf"))


def strategy_bounds(problem: Problem, strategy: Strategy) -> Dict[str, float]:
    """Bounds that hold for `strategy`: always "compute"; "allreduce" / "ps" when one decision
    (the default, or every group alike) is data parallel over several devices."""
    out = {"compute": ideal_compute_s(problem)}
    decisions = {strategy.decision_for(n) for n in problem.group_names}
    if len(decisions) != 1:
        return out
    d = decisions.pop()
    cluster = problem.cluster
    devices = [cluster.device_index(x) for x in d.devices]
    grad = float(problem.costs.grad_bytes.sum())
    if len(devices) < 2 or grad <= 0:
        return out
    if d.sync == "allreduce":
        b_min = min(best_out_bandwidth(cluster, i) for i in devices)
        out["allreduce"] = allreduce_bound_s(grad, len(devices), b_min)
    else:
        ps = cluster.device_index(d.ps_device)
        workers = [w for w in devices if w != ps]
        out["ps"] = ps_bound_s(grad, [cluster.path_bandwidth_bytes_per_s(w, ps) for w in workers],
                               best_in_bandwidth(cluster, ps))
    return out
