"""DAPPLE-style pipeline planner: stages over topologically ordered groups, each stage replicated
(data parallel) over a slice of the devices, the global batch cut into micro-batches.

Search (every candidate costed by the analytic model below, the best one returned):
  * devices in hierarchical order: by host (cluster host order), fastest first inside a host;
    stage s takes the next n_s devices of that order, so small stages stay inside one host
    and neighbouring stages sit on neighbouring hosts. Every composition n = n_1 + ... + n_S
    with S <= max_stages is tried;
  * micro-batch counts M from `micro_batches`;
  * for each (composition, M) a dynamic program over the group order picks the stage cuts that
    minimise the bottleneck stage time per micro-batch (DAPPLE's objective), subject to memory;
  * the model's best plan per stage count and per micro-batch count, and plain data
    parallelism, are simulated, and the fastest in the simulator is returned (verify=True).

Cost model (seconds; r_d = device d's fraction of its stage's samples, proportional_shares over
device speeds; m_d = ceil(B·r_d / M) samples per micro-batch on d):
  t_s = max_{d in s} Σ_{g in s} replica_seconds(g, kind_d, m_d)          compute per micro-batch
  x_s = max_{d in s} r_d·(B/M)·cut_bytes_per_sample(s) / bw(d -> stage s+1)  boundary transfer
        (forward activations and backward gradients crossing the cut)
  a_s = 2(n_s-1)/n_s · grad_bytes(s) / bw_min(s) + 2(n_s-1)·lat_max(s)·tensors(s)
        + max_d Σ fixed ops        gradient all-reduce (a ring per gradient tensor) and updates
  T   = Σ_s (t_s + x_s) + (M-1)·max_s (t_s + x_s) + max_s a_s            (GPipe/DAPPLE latency)
Memory: per device, stage params + act_scale·(activations of all its M micro-batches) must fit.

The strategy: every group of stage s gets shares {d: [micro-batch sizes]} over the stage's
devices (device share split into M near-equal micro-batches) and all-reduce among them.
`plan_pipeline` also reports the estimate of plain data parallelism (S = 1, M = 1, same model)
and prints the estimated speed-up (and the simulated one). How far the simulator follows the
estimate depends on the execution order the lowering gives micro-batches: with every
micro-batch of an op run before the next op (op-major), a stage hands its first micro-batch on
only near its end, and micro-batching does not overlap stages.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.strategy import Strategy, decision, proportional_shares

from tfplace.baselines.problem import Problem


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """stages: ((first group, end group), device indices) per stage; estimate_s: model T;
    dp_estimate_s: the same model for one stage over all devices, M = 1; simulated_s /
    dp_simulated_s: the simulator's times for both when the plan was verified."""
    strategy: Strategy
    stages: Tuple[Tuple[Tuple[int, int], Tuple[int, ...]], ...]
    micro_batches: int
    estimate_s: float
    dp_estimate_s: float
    simulated_s: Optional[float] = None
    dp_simulated_s: Optional[float] = None

    @property
    def estimated_speedup(self) -> float:
        return self.dp_estimate_s / self.estimate_s if self.estimate_s > 0 else float("inf")

    def summary(self) -> str:
        sizes = "+".join(str(len(devs)) for _, devs in self.stages)
        line = (f"pipeline planner: {len(self.stages)} stage(s) over {sizes} devices, {self.micro_batches} "
                f"micro-batch(es): estimated {self.estimate_s * 1e3:.3f} ms vs data parallel "
                f"{self.dp_estimate_s * 1e3:.3f} ms -> estimated speed-up {self.estimated_speedup:.2f}x")
        if self.simulated_s is not None and self.dp_simulated_s:
            line += (f" (simulated {self.simulated_s * 1e3:.3f} ms vs {self.dp_simulated_s * 1e3:.3f} ms: "
                     f"{self.dp_simulated_s / self.simulated_s:.2f}x)")
        return line


def hierarchical_order(problem: Problem) -> List[int]:
    """Device indices by host (cluster host order), fastest first inside a host."""
    cluster = problem.cluster
    host_rank = {h.name: i for i, h in enumerate(cluster.hosts)}
    speed = problem.costs.device_throughput()
    return sorted(range(cluster.num_devices), key=lambda i: (host_rank[cluster.devices[i].host], -speed[i], i))


def compositions(n: int, max_parts: int):
    """Every tuple of positive parts summing to n with at most max_parts parts."""
    for parts in range(1, min(n, max_parts) + 1):
        for cuts in itertools.combinations(range(1, n), parts - 1):
            bounds = (0,) + cuts + (n,)
            yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


class _Model:
    """Prefix sums and per-stage matrices of the cost model for one problem."""

    def __init__(self, problem: Problem):
        self.p = problem
        c = problem.costs
        self.c = c
        g = problem.num_groups
        self.g = g
        self.speed = c.device_throughput()
        self.cap = problem.cluster.memory_bytes.astype(float)
        # cut_bytes[j]: bytes per sample crossing the cut before group j (j = 0..G).
        diff = np.zeros(g + 2)
        lo, hi = np.minimum(c.edge_src, c.edge_dst), np.maximum(c.edge_src, c.edge_dst)
        np.add.at(diff, lo + 1, c.edge_bytes_per_sample)
        np.add.at(diff, hi + 1, -c.edge_bytes_per_sample)
        self.cut_bytes = np.cumsum(diff)[:g + 1]
        self.param_pre = np.concatenate([[0.0], np.cumsum(c.param_bytes)])
        self.grad_pre = np.concatenate([[0.0], np.cumsum(c.grad_bytes)])
        self.grad_count_pre = np.concatenate([[0.0], np.cumsum(c.grad_tensors)])
        self.actps_pre = np.concatenate([[0.0], np.cumsum(c.act_bytes_per_sample)])
        self.actfull_pre = np.concatenate([[0.0], np.cumsum(c.act_full_bytes)])
        self._pre: Dict[Tuple[str, int], np.ndarray] = {}
        # The search asks for the same stage (devices, next stage's devices, M) under many
        # compositions: each is built once (read-only arrays, shared by the callers).
        self._shares: Dict[Tuple[int, ...], List[int]] = {}
        self._stage: Dict[tuple, np.ndarray] = {}
        self._links: Dict[Tuple[int, ...], Tuple[float, float]] = {}

    def prefix(self, kind: str, samples: int) -> np.ndarray:
        key = (kind, samples)
        if key not in self._pre:
            self._pre[key] = np.concatenate([[0.0], np.cumsum(self.c.replica_seconds(kind, samples))])
        return self._pre[key]

    def shares(self, devices: Sequence[int]) -> List[int]:
        key = tuple(devices)
        if key not in self._shares:
            self._shares[key] = proportional_shares([self.speed[d] for d in devices], self.p.global_batch_size)
        return list(self._shares[key])

    def stage_matrix(self, devices: Sequence[int], nxt: Optional[Sequence[int]], m: int) -> np.ndarray:
        """tau[i, j] = t_s + x_s for groups [i, j) on `devices` (inf where i >= j or memory fails);
        read-only, built once per (devices, nxt, m)."""
        key = (tuple(devices), tuple(nxt) if nxt else None, m)
        if key not in self._stage:
            mat = self._stage_matrix(devices, nxt, m)
            mat.setflags(write=False)
            self._stage[key] = mat
        return self._stage[key]

    def _stage_matrix(self, devices: Sequence[int], nxt: Optional[Sequence[int]], m: int) -> np.ndarray:
        g, batch, cluster = self.g, self.p.global_batch_size, self.p.cluster
        shares = self.shares(devices)
        tau = np.zeros((g + 1, g + 1))
        comm = np.zeros(g + 1)
        ok = np.ones((g + 1, g + 1), dtype=bool)
        scale = self.c.act_scale
        for d, share in zip(devices, shares):
            if share == 0:
                continue
            mb = math.ceil(share / m)
            pre = self.prefix(self.c.device_kind[d], mb)
            tau = np.maximum(tau, pre[None, :] - pre[:, None])
            mem = (self.param_pre[None, :] - self.param_pre[:, None]) + scale * (
                share * (self.actps_pre[None, :] - self.actps_pre[:, None])
                + m * (self.actfull_pre[None, :] - self.actfull_pre[:, None]))
            ok &= mem <= self.cap[d]
            if nxt:
                bw = min(cluster.path_bandwidth_bytes_per_s(d, e) for e in nxt)
                comm = np.maximum(comm, (share / batch) * (batch / m) * self.cut_bytes / bw)
        tau = tau + comm[None, :]
        i, j = np.indices(tau.shape)
        return np.where((i < j) & ok, tau, np.inf)

    def _slowest_link(self, devices: Tuple[int, ...]) -> Tuple[float, float]:
        """(least bandwidth in bytes/s, largest latency in s) between any two of `devices`."""
        if devices not in self._links:
            cluster = self.p.cluster
            pairs = [(a, b) for a in devices for b in devices if a != b]
            self._links[devices] = (min(cluster.path_bandwidth_bytes_per_s(a, b) for a, b in pairs),
                                    max(cluster.path_latency_s(a, b) for a, b in pairs))
        return self._links[devices]

    def fixed_and_allreduce(self, devices: Sequence[int], lo: int, hi: int) -> float:
        fixed = max(float(self.c.fixed_seconds(self.c.device_kind[d])[lo:hi].sum()) for d in devices)
        n = len(devices)
        if n < 2:
            return fixed
        bw, lat = self._slowest_link(tuple(devices))
        count = self.grad_count_pre[hi] - self.grad_count_pre[lo]  # one ring per gradient tensor
        return fixed + 2.0 * (n - 1) / n * (self.grad_pre[hi] - self.grad_pre[lo]) / bw + 2.0 * (n - 1) * lat * count


def _best_cuts(mats: List[np.ndarray]) -> Tuple[float, List[int]]:
    """Bottleneck DP: cuts 0 = c_0 < c_1 < ... < c_S = G minimising max_s mats[s][c_s, c_{s+1}]."""
    g = mats[0].shape[0] - 1
    best = np.full(g + 1, np.inf)
    best[0] = 0.0
    back = []
    for mat in mats:
        cand = np.maximum(best[:, None], mat)
        arg = np.argmin(cand, axis=0)
        best = cand[arg, np.arange(g + 1)]
        back.append(arg)
    if not np.isfinite(best[g]):
        return np.inf, []
    cuts = [g]
    for arg in reversed(back):
        cuts.append(int(arg[cuts[-1]]))
    return float(best[g]), cuts[::-1]


def _latency(model: _Model, mats, cuts, stage_devs, m: int) -> float:
    taus = [float(mat[cuts[s], cuts[s + 1]]) for s, mat in enumerate(mats)]
    tail = max(model.fixed_and_allreduce(devs, cuts[s], cuts[s + 1]) for s, devs in enumerate(stage_devs))
    return sum(taus) + (m - 1) * max(taus) + tail


def _strategy(problem: Problem, model: _Model, cuts, stage_devs, m: int) -> Strategy:
    names = problem.device_names
    groups = {}
    for s, devs in enumerate(stage_devs):
        shares = model.shares(devs)
        parts = {}
        for d, share in zip(devs, shares):
            if share > 0:
                k = max(1, min(m, share))
                parts[names[d]] = [share // k + (1 if i < share % k else 0) for i in range(k)]
        dec = decision(parts, "allreduce")
        for g in range(cuts[s], cuts[s + 1]):
            groups[problem.group_names[g]] = dec
    return problem.strategy(groups=groups)


MAX_UNITS = 10  # stage boundaries fall between at most this many runs of devices (2^9 compositions)


def unit_bounds(n: int, max_units: int = MAX_UNITS) -> List[int]:
    """Boundaries 0 = b_0 < ... < b_U = n of U = min(n, max_units) runs of near-equal size (the
    longer runs first); stage boundaries may fall only on them."""
    u = min(n, max_units)
    sizes = [n // u + (1 if i < n % u else 0) for i in range(u)]
    return [0] + list(itertools.accumulate(sizes))


def _search(problem: Problem, model: _Model, order: List[int], max_stages: int, micro_batches: Sequence[int]):
    """Best candidate per (stage count, micro-batches): {(S, M): (estimate, cuts, stage devices, M)}."""
    batch = problem.global_batch_size
    units = unit_bounds(len(order))
    best: Dict[Tuple[int, int], tuple] = {}
    for comp in compositions(len(units) - 1, max_stages):
        bounds = [units[i] for i in itertools.accumulate((0,) + comp)]
        stage_devs = [tuple(order[bounds[s]:bounds[s + 1]]) for s in range(len(comp))]
        for m in sorted(set(int(x) for x in micro_batches if 1 <= x <= batch)):
            mats = [model.stage_matrix(devs, stage_devs[s + 1] if s + 1 < len(comp) else None, m)
                    for s, devs in enumerate(stage_devs)]
            _, cuts = _best_cuts(mats)
            if not cuts:
                continue
            t = _latency(model, mats, cuts, stage_devs, m)
            key = (len(comp), m)
            if key not in best or t < best[key][0] - 1e-12:
                best[key] = (t, cuts, stage_devs, m)
    return best


def plan_pipeline(problem: Problem, max_stages: Optional[int] = None,
                  micro_batches: Sequence[int] = (1, 2, 4, 8, 16), verify: bool = True,
                  log: Optional[Callable[[str], None]] = print) -> PipelinePlan:
    """The best pipeline plan (see the module docstring); prints its summary through `log`
    (None: silent).

    verify=False returns the analytic model's optimum. verify=True (default) simulates a short
    list — the model's best plan for every stage count and for every micro-batch count, and
    plain data parallelism — and returns the one the simulator finds fastest: the analytic model
    assumes micro-batches flow through the stages as in DAPPLE's schedule, which the execution
    order of the lowering may not give.
    """
    model = _Model(problem)
    order = hierarchical_order(problem)
    g = problem.num_groups
    cands = _search(problem, model, order, min(max_stages or len(order), len(order), g), micro_batches)
    if not cands:  # nothing fits in memory: plain DP over all devices, the simulator reports OOM
        cands = {(1, 1): (np.inf, [0, g], [tuple(order)], 1)}
    dp = cands.get((1, 1))
    best = min(cands.values(), key=lambda c: c[0])
    sim = dp_sim = None
    if verify:
        short = {}
        for key_fn in (lambda k: k[0], lambda k: k[1]):  # best per stage count, per micro-batches
            for key, c in cands.items():
                k = key_fn(key)
                if k not in short or c[0] < short[k][0]:
                    short[k] = c
        listed = {id(c): c for c in list(short.values()) + ([dp] if dp else [])}.values()
        timed = [(problem.evaluate(_strategy(problem, model, c[1], c[2], c[3])).iteration_time_s, c) for c in listed]
        sim, best = min(timed, key=lambda x: (x[0], x[1][0]))
        dp_sim = next((t for t, c in timed if c is dp), None)
    t, cuts, stage_devs, m = best
    plan = PipelinePlan(_strategy(problem, model, cuts, stage_devs, m),
                        tuple(((cuts[s], cuts[s + 1]), devs) for s, devs in enumerate(stage_devs)),
                        m, t, dp[0] if dp else np.inf, sim, dp_sim)
    if log is not None:
        log(plan.summary())
    return plan


def pipeline(problem: Problem) -> Strategy:
    """Registry entry: the planner's strategy (prints the estimated speed-up)."""
    return plan_pipeline(problem).strategy
