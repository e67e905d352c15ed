"""HAP-style linear program for per-device batch ratios, as a post-pass on any fixed strategy.

The strategy fixes which devices each group uses (and how many micro-batches each runs); the LP
chooses what fraction r_{s,d} of the global batch B every device d of segment s processes.
A segment is the set of groups that share one device set: their replicas run independently
between re-splits, so their compute adds up per device, and the segment ends at a barrier.
HAP's cost (barrier per step, no overlap) summed over segments:

    minimise  Σ_s (u_s + v_s)
    s.t.      u_s >= α_{s,d} + β_{s,d}·B·r_{s,d}        for every d in s   (compute)
              v_s >= c_s + γ_{s,d}·B·r_{s,d}            for every d in s   (communication)
              Σ_d r_{s,d} = 1,  0 <= r <= 1

  α_{s,d}: seconds independent of the share on d: per group, the intercept of its batch-split
           cost times d's micro-batch count, plus its mirrored/update ops;
  β_{s,d}: seconds per sample of the segment's batch-split ops on d's kind (the profile's cost
           is piecewise linear in the samples; the line is the secant around the current share
           and the LP is re-solved around its own answer, HAP's alternation, `iterations` times);
  γ_{s,d}: seconds per sample to receive the batched tensors entering the segment (bytes per
           sample over the slowest path into d from the producing devices);
  c_s:     gradient aggregation of the segment's weights, independent of r (ring all-reduce
           2(n-1)/n·S/B_min, or S/B_min to a PS).

Shares are rounded with `proportional_shares` (largest remainder), each device keeps its
micro-batch count (split as evenly as possible), and a device rounded to 0 samples is dropped.
Solved with scipy's HiGHS (`linprog(method="highs")`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

import numpy as np
from scipy.optimize import linprog

from tfplace.formats.errors import InputError
from tfplace.formats.strategy import GroupDecision, Strategy, proportional_shares

from tfplace.baselines.problem import Problem


@dataclasses.dataclass(frozen=True)
class Segment:
    """LP data of one segment; arrays over its devices. constant_s is c_s."""
    devices: Tuple[int, ...]
    alpha_s: np.ndarray
    beta_s_per_sample: np.ndarray
    gamma_s_per_sample: np.ndarray
    constant_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class RatioSolution:
    """ratios[s] over segment s's devices; objective_s: the LP's estimated step time."""
    ratios: Tuple[np.ndarray, ...]
    objective_s: float


def solve_ratios(segments: Sequence[Segment], global_batch_size: int) -> RatioSolution:
    """The LP of the module docstring."""
    sizes = [len(s.devices) for s in segments]
    nr = sum(sizes)
    ns = len(segments)
    nvar = nr + 2 * ns
    c = np.concatenate([np.zeros(nr), np.ones(2 * ns)])
    a_ub, b_ub, a_eq, b_eq = [], [], [], []
    off = 0
    big_b = float(global_batch_size)
    for k, seg in enumerate(segments):
        row_eq = np.zeros(nvar)
        row_eq[off:off + sizes[k]] = 1.0
        a_eq.append(row_eq), b_eq.append(1.0)
        for i in range(sizes[k]):
            for coef, extra, const in ((seg.beta_s_per_sample[i], nr + k, seg.alpha_s[i]),
                                       (seg.gamma_s_per_sample[i], nr + ns + k, seg.constant_s)):
                row = np.zeros(nvar)
                row[off + i] = coef * big_b
                row[extra] = -1.0
                a_ub.append(row), b_ub.append(-const)
        off += sizes[k]
    bounds = [(0.0, 1.0)] * nr + [(0.0, None)] * (2 * ns)
    res = linprog(c, A_ub=np.array(a_ub), b_ub=np.array(b_ub), A_eq=np.array(a_eq), b_eq=np.array(b_eq),
                  bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"ratio LP failed: {res.message}")
    ratios, off = [], 0
    for n in sizes:
        ratios.append(np.clip(res.x[off:off + n], 0.0, 1.0))
        off += n
    return RatioSolution(tuple(ratios), float(res.fun))


# ---- from a strategy -----------------------------------------------------------------------------
def _segments_of(problem: Problem, strategy: Strategy) -> Dict[Tuple[int, ...], List[int]]:
    """Device set (sorted indices) -> groups using exactly that set."""
    out: Dict[Tuple[int, ...], List[int]] = {}
    for g, name in enumerate(problem.group_names):
        d = strategy.decision_for(name)
        key = tuple(sorted(problem.cluster.device_index(x) for x in d.devices))
        out.setdefault(key, []).append(g)
    return out


def _microbatches(decision: GroupDecision, device: str) -> Tuple[int, ...]:
    return next(mb for d, mb in decision.shares if d == device)


def _segment(problem: Problem, strategy: Strategy, devices: Tuple[int, ...], groups: List[int]) -> Segment:
    costs, cluster = problem.costs, problem.cluster
    names = problem.device_names
    alpha, beta, gamma = np.zeros(len(devices)), np.zeros(len(devices)), np.zeros(len(devices))
    in_seg = np.zeros(problem.num_groups, dtype=bool)
    in_seg[groups] = True
    entering = in_seg[costs.edge_dst] & ~in_seg[costs.edge_src]
    for i, dev in enumerate(devices):
        kind = costs.device_kind[dev]
        fixed = costs.fixed_seconds(kind)
        for g in groups:
            mb = _microbatches(strategy.decision_for(problem.group_names[g]), names[dev])
            per_mb = max(1, int(round(sum(mb) / len(mb))))
            lo, hi = max(1, per_mb // 2), max(2, 2 * per_mb)
            a, b = costs.linear_fit(kind, lo, hi)
            alpha[i] += a[g] * len(mb) + fixed[g]
            beta[i] += b[g]
        for e in np.nonzero(entering)[0]:
            src = _devices_of_group(problem, strategy, int(costs.edge_src[e]))
            bw = min([cluster.path_bandwidth_bytes_per_s(s, dev) for s in src if s != dev], default=np.inf)
            gamma[i] += costs.edge_bytes_per_sample[e] / bw
    grad = float(costs.grad_bytes[groups].sum())
    return Segment(devices, alpha, beta, gamma, _aggregation_s(problem, strategy, devices, groups, grad))


def _devices_of_group(problem: Problem, strategy: Strategy, g: int) -> List[int]:
    d = strategy.decision_for(problem.group_names[g])
    return [problem.cluster.device_index(x) for x in d.devices]


def _aggregation_s(problem: Problem, strategy: Strategy, devices: Tuple[int, ...], groups: List[int],
                   grad_bytes: float) -> float:
    n = len(devices)
    if n < 2 or grad_bytes <= 0:
        return 0.0
    cluster = problem.cluster
    d0 = strategy.decision_for(problem.group_names[groups[0]])
    if d0.sync == "ps":
        ps = cluster.device_index(d0.ps_device)
        bw = min(cluster.path_bandwidth_bytes_per_s(w, ps) for w in devices if w != ps) if \
            any(w != ps for w in devices) else np.inf
        return grad_bytes / bw
    bw = min(cluster.path_bandwidth_bytes_per_s(a, b) for a in devices for b in devices if a != b)
    return 2.0 * (n - 1) / n * grad_bytes / bw


def _split(total: int, parts: int) -> List[int]:
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def apply_ratios(problem: Problem, strategy: Strategy, segments: Dict[Tuple[int, ...], List[int]],
                 solution: RatioSolution) -> Strategy:
    """The strategy with every segment's shares replaced by its rounded ratios."""
    names = problem.device_names
    batch = problem.global_batch_size
    groups: Dict[str, GroupDecision] = {}
    for (devices, members), ratios in zip(segments.items(), solution.ratios):
        weights = ratios if ratios.sum() > 0 else np.ones(len(ratios))
        shares = proportional_shares(list(weights), batch) if len(devices) > 1 else [batch]
        for g in members:
            old = strategy.decision_for(problem.group_names[g])
            new_shares = []
            for dev, s in zip(devices, shares):
                if s > 0:
                    new_shares.append((names[dev], tuple(_split(s, len(_microbatches(old, names[dev]))))))
            groups[problem.group_names[g]] = dataclasses.replace(old, shares=tuple(new_shares))
    return Strategy(batch, strategy.max_groups, None, groups, strategy.graph or problem.graph_name)


@dataclasses.dataclass(frozen=True)
class RebalanceResult:
    """strategy: the re-balanced one (or the input, when it simulated better and keep_better);
    lp_estimate_s: the last LP objective; improved: whether the LP strategy was kept."""
    strategy: Strategy
    lp_estimate_s: float
    improved: bool


def rebalance(problem: Problem, strategy: Strategy, iterations: int = 3, keep_better: bool = True) -> RebalanceResult:
    """Re-balances the batch ratios of `strategy` (see the module docstring)."""
    if iterations < 1:
        raise InputError("argument", "iterations", f"must be >= 1, got {iterations}", "use 1 or more")
    current = strategy
    estimate = float("inf")
    for _ in range(iterations):
        segments = _segments_of(problem, current)
        data = [_segment(problem, current, devs, members) for devs, members in segments.items()]
        solution = solve_ratios(data, problem.global_batch_size)
        estimate = solution.objective_s
        nxt = apply_ratios(problem, current, segments, solution)
        same = all(nxt.decision_for(n) == current.decision_for(n) for n in problem.group_names)
        current = nxt
        if same:
            break
    if keep_better and problem.evaluate(current).iteration_time_s > problem.evaluate(strategy).iteration_time_s:
        return RebalanceResult(strategy, estimate, False)
    return RebalanceResult(current, estimate, True)
