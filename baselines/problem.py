"""The placement problem every baseline and planner works on, and the group-level cost model
the planners reason with.

    problem = make_problem(graph, cluster, profile, max_groups=64)
    strategy = dp_proportional(problem)          # any generator in this package
    report = problem.evaluate(strategy)          # lowering + simulator, the one true cost

Planners need cheap estimates before they commit to a strategy; `GroupCosts` gives them per
group g (G groups, K device kinds, numbering of the grouping = topological order of each group's
first op):

  replica_seconds(kind, samples)[G]  seconds of the group's batch-split ops on one device of
                                     `kind` processing `samples` samples (profile, interpolated)
  fixed_seconds(kind)[G]             seconds of its mirrored / update ops (batch independent;
                                     costed at the global batch, as the lowering does)
  param_bytes[G]                     variables resident with the group (weights + optimizer slots)
  grad_bytes[G], grad_tensors[G]     trainable weight bytes and count (what all-reduce / PS moves)
  act_bytes_per_sample[G], act_full_bytes[G]   outputs of its batch-split ops (activations, and
                                     per-replica partial values such as weight gradients)
  edge_src/edge_dst/edge_bytes_per_sample/edge_full_bytes   distinct tensors between groups

The op -> group map, op roles and byte sizes come from the lowering's own static analysis
(`Lowerer.index`, with variables pinned to their weight's group, over `Problem.lowered_graph`)
and op seconds from the lowering's `ComputeCosts`, so the planners cost what the simulator will
run.

Memory estimate (`GroupCosts.memory_bytes`): params + act_scale · (activations at the samples +
partial values). act_scale calibrates "every output stays live" against the simulator: it is the
ratio of simulated peak activation memory to the summed outputs for the whole graph on one
device (computed once, clamped to [0.05, 1]).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster
from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import OpGraph
from tfplace.ir.grouping import Grouping, make_grouping
from tfplace.lowering.lower import Lowerer, LoweringOptions
from tfplace.lowering.graph_index import ROLE_REPLICA
from tfplace.lowering.placed_graph import PlacedGraph
from tfplace.formats.profile import Profile
from tfplace.formats.reports import SimReport
from tfplace.simulator import SimOptions, simulate
from tfplace.formats.strategy import Strategy, decision

if TYPE_CHECKING:  # the overhead pass is imported only where a problem has overheads
    from tfplace.overheads.model import RuntimeOverheads

# Planners rank strategies by their expected step over the cluster's straggler draws (a plan that
# gives less work to a device that often runs slow is the better plan).
PLANNING_SIM_OPTIONS = SimOptions(seed=0, stragglers="expected")
EVALUATIONS_KEPT = 256  # reports a Problem keeps (a few MB at most: no traces unless sim_options asks)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """One graph on one cluster at one global batch size, with its profile and grouping.

    Attributes:
      graph, grouping, cluster, profile: the inputs (grouping made at `max_groups`).
      global_batch_size: samples per step (defaults to the graph's reference batch).
      max_groups: the coarsening level K the grouping (and every strategy) refers to.
      lowering_options, sim_options: passed to the lowering and the simulator.
      overheads: the runtime overheads of a CPU-emulated cluster (tfplace.overheads), applied to
        every lowered strategy before it is simulated; None (GPU clusters): none.
    """
    graph: OpGraph
    grouping: Grouping
    cluster: Cluster
    profile: Profile
    global_batch_size: int
    max_groups: int
    lowering_options: Optional[LoweringOptions] = None
    sim_options: SimOptions = PLANNING_SIM_OPTIONS
    overheads: Optional["RuntimeOverheads"] = None

    def __post_init__(self):
        if self.global_batch_size < 1:
            raise InputError("argument", "global_batch_size", f"must be >= 1, got {self.global_batch_size}",
                             "give the samples per training step")

    @property
    def device_names(self) -> Tuple[str, ...]:
        return self.cluster.device_names

    @property
    def group_names(self) -> Tuple[str, ...]:
        return self.grouping.group_names

    @property
    def num_groups(self) -> int:
        return self.grouping.num_groups

    @functools.cached_property
    def lowerer(self) -> Lowerer:
        return Lowerer(self.graph, self.grouping, self.cluster, self.profile, self.lowering_options)

    @property
    def lowered_graph(self) -> OpGraph:
        """The graph the lowering works on: the input graph, plus the per-group copies of
        metadata ops the lowering appends after the original ops (tfplace.lowering.meta)."""
        return getattr(self.lowerer, "graph", self.graph)

    @functools.cached_property
    def costs(self) -> "GroupCosts":
        return GroupCosts(self)

    @property
    def graph_name(self) -> str:
        return self.graph.name

    def placed(self, strategy: Strategy) -> PlacedGraph:
        """What the simulator runs for `strategy`: the lowering's PlacedGraph of the strategy as
        the planners keep it (batch-statistics replicas raised to the minimum batch,
        `Lowerer.legalize`, as `registry.generate` returns it), with the runtime overheads when
        the problem has them."""
        return with_overheads(self.lowerer.lower(self.lowerer.legalize(strategy)), self.cluster, self.overheads)

    def evaluate(self, strategy: Strategy) -> SimReport:
        """Simulated iteration of `strategy` (lowering, overheads, simulator; OOM is in the report).
        The last EVALUATIONS_KEPT reports are kept: the baselines share starts (the best subset of
        devices is both a baseline and the hybrid's start), about a quarter of their strategies."""
        key = (strategy.global_batch_size, strategy.max_groups, strategy.default,
               tuple(sorted(strategy.groups.items())), strategy.bucket_bytes, strategy.min_batch_per_replica)
        kept = self._evaluations
        if key not in kept:
            if len(kept) >= EVALUATIONS_KEPT:
                del kept[next(iter(kept))]
            kept[key] = simulate(self.placed(strategy), self.cluster, self.sim_options)
        return kept[key]

    @functools.cached_property
    def _evaluations(self) -> Dict[tuple, SimReport]:
        return {}

    def strategy(self, groups: Dict[str, object] = None, default=None) -> Strategy:
        """A Strategy for this problem from per-group decisions and/or a default."""
        return Strategy(self.global_batch_size, self.max_groups, default, dict(groups or {}), self.graph_name)

    def single_device_strategy(self, device: str) -> Strategy:
        return self.strategy(default=decision({device: self.global_batch_size}))


def make_problem(graph: OpGraph, cluster: Cluster, profile: Profile, max_groups: int = 64,
                 global_batch_size: Optional[int] = None, grouping: Optional[Grouping] = None,
                 lowering_options: Optional[LoweringOptions] = None,
                 sim_options: SimOptions = PLANNING_SIM_OPTIONS,
                 overheads: Optional["RuntimeOverheads"] = None) -> Problem:
    """Builds the grouping (unless given) and the Problem."""
    if grouping is None:
        grouping = make_grouping(graph, max_groups)
    batch = graph.reference_batch_size if global_batch_size is None else int(global_batch_size)
    return Problem(graph, grouping, cluster, profile, batch, max_groups, lowering_options, sim_options, overheads)


def with_overheads(placed: PlacedGraph, cluster: Cluster, overheads: Optional["RuntimeOverheads"]) -> PlacedGraph:
    """`placed` through the runtime-overhead pass when there are overheads (imported only then:
    GPU clusters never load it), else `placed` itself."""
    if overheads is None:
        return placed
    from tfplace.overheads.apply import apply
    return apply(placed, cluster, overheads)


class GroupCosts:
    """Group-level costs for the planners (see the module docstring). Arrays are [G]."""

    def __init__(self, problem: Problem):
        self.problem = problem
        lowerer = problem.lowerer
        ix = lowerer.index
        graph = problem.lowered_graph
        self.num_groups = g = problem.num_groups
        self.op_group = ix.op_group.astype(np.int64)
        self.replica_ops = np.nonzero(ix.role == ROLE_REPLICA)[0]
        self.fixed_ops = np.nonzero(ix.role != ROLE_REPLICA)[0]
        self._compute = lowerer.compute
        cluster = problem.cluster
        self.kinds = cluster.kinds
        self.device_kind = tuple(d.kind for d in cluster.devices)
        # A representative device per kind: op seconds depend on the kind only.
        self._kind_device = {k: self.device_kind.index(k) for k in self.kinds}
        var_group = self.op_group[ix.var_op] if len(ix.var_op) else np.zeros(0, dtype=np.int64)
        self.param_bytes = np.bincount(var_group, weights=ix.var_bytes, minlength=g)
        weights = [(self.op_group[v.op], v.num_bytes) for v in graph.variables if v.trainable and not v.is_slot]
        self.grad_bytes = np.bincount([w[0] for w in weights], weights=[w[1] for w in weights], minlength=g) \
            if weights else np.zeros(g)
        self.grad_tensors = np.bincount([w[0] for w in weights], minlength=g).astype(float) if weights else np.zeros(g)
        rep = self.replica_ops
        self.act_bytes_per_sample = np.bincount(self.op_group[rep], weights=ix.op_out_ps_bytes[rep], minlength=g)
        self.act_full_bytes = np.bincount(self.op_group[rep], weights=ix.op_out_full_bytes[rep], minlength=g)
        self._edges(graph, ix)
        self._replica_cache: Dict[Tuple[str, int], np.ndarray] = {}
        self._fixed_cache: Dict[str, np.ndarray] = {}
        self._act_scale: Optional[float] = None

    def _edges(self, graph: OpGraph, ix) -> None:
        """Distinct (tensor, consumer group) pairs between different groups, summed per group pair."""
        t = graph.edge_tensor.astype(np.int64)
        src = self.op_group[graph.tensor_op[t]]
        dst = self.op_group[graph.edge_dst.astype(np.int64)]
        cross = src != dst
        pairs = np.unique(np.stack([t[cross], dst[cross]], axis=1), axis=0) if cross.any() \
            else np.zeros((0, 2), dtype=np.int64)
        tt, dd = pairs[:, 0], pairs[:, 1]
        ss = self.op_group[graph.tensor_op[tt]]
        g = self.num_groups
        key = ss * g + dd
        uniq, inv = np.unique(key, return_inverse=True)
        self.edge_src, self.edge_dst = uniq // g, uniq % g
        self.edge_bytes_per_sample = np.bincount(inv, weights=ix.tensor_ps_bytes[tt], minlength=len(uniq))
        self.edge_full_bytes = np.bincount(inv, weights=ix.tensor_full_bytes[tt], minlength=len(uniq))

    # ---- compute ---------------------------------------------------------------------------------
    def replica_seconds(self, kind: str, samples: int) -> np.ndarray:
        """[G] seconds of each group's batch-split ops at `samples` samples on one `kind` device."""
        key = (kind, int(samples))
        hit = self._replica_cache.get(key)
        if hit is None:
            ops = self.replica_ops
            sec = self._compute.seconds(ops, np.full(len(ops), self._kind_device[kind]),
                                        np.full(len(ops), float(samples))) if samples > 0 else np.zeros(len(ops))
            hit = self._replica_cache[key] = np.bincount(self.op_group[ops], weights=sec, minlength=self.num_groups)
        return hit

    def fixed_seconds(self, kind: str) -> np.ndarray:
        """[G] seconds of each group's mirrored and update ops on one `kind` device."""
        hit = self._fixed_cache.get(kind)
        if hit is None:
            ops = self.fixed_ops
            batch = float(self.problem.global_batch_size)
            sec = self._compute.seconds(ops, np.full(len(ops), self._kind_device[kind]), np.full(len(ops), batch))
            hit = self._fixed_cache[kind] = np.bincount(self.op_group[ops], weights=sec, minlength=self.num_groups)
        return hit

    def group_seconds(self, kind: str, samples: int) -> np.ndarray:
        """[G] seconds of the whole group (batch-split part at `samples`, plus the fixed part)."""
        return self.replica_seconds(kind, samples) + self.fixed_seconds(kind)

    def linear_fit(self, kind: str, lo: int, hi: int) -> Tuple[np.ndarray, np.ndarray]:
        """(intercept_s[G], slope_s_per_sample[G]) of replica_seconds through samples lo and hi."""
        a, b = self.replica_seconds(kind, lo), self.replica_seconds(kind, hi)
        slope = (b - a) / (hi - lo) if hi != lo else b / max(hi, 1)
        return np.maximum(a - slope * lo, 0.0), np.maximum(slope, 0.0)

    def throughput(self, kind: str, samples: int) -> float:
        """Samples per second of one `kind` device running the whole step on `samples` samples."""
        t = float(self.group_seconds(kind, samples).sum())
        return samples / t if t > 0 else float("inf")

    def device_throughput(self, samples: Optional[int] = None) -> np.ndarray:
        """[D] samples/s of every device alone at `samples` per device (default: the even share)."""
        n = self.problem.cluster.num_devices
        s = samples if samples is not None else max(1, self.problem.global_batch_size // n)
        per_kind = {k: self.throughput(k, s) for k in self.kinds}
        return np.array([per_kind[k] for k in self.device_kind])

    # ---- memory ----------------------------------------------------------------------------------
    @property
    def act_scale(self) -> float:
        """Simulated peak activations / summed outputs, on the single largest-memory device."""
        if self._act_scale is None:
            p = self.problem
            dev = int(np.argmax(p.cluster.memory_bytes))
            placed = p.lowerer.lower(p.single_device_strategy(p.device_names[dev]))
            report = simulate(placed, p.cluster, p.sim_options)
            live = report.peak_memory_bytes[dev] - float(placed.static_bytes[dev])
            total = float(self.act_bytes_per_sample.sum() * p.global_batch_size + self.act_full_bytes.sum())
            self._act_scale = float(np.clip(live / total, 0.05, 1.0)) if total > 0 else 1.0
        return self._act_scale

    def memory_bytes(self, groups: Sequence[int], samples: int) -> float:
        """Estimated bytes a device needs to hold `groups` while processing `samples` samples."""
        idx = np.asarray(groups, dtype=np.int64)
        act = self.act_bytes_per_sample[idx].sum() * samples + self.act_full_bytes[idx].sum()
        return float(self.param_bytes[idx].sum() + self.act_scale * act)

    # ---- communication ---------------------------------------------------------------------------
    def transfer_seconds(self, src_device: int, dst_device: int, num_bytes: float) -> float:
        return self.problem.cluster.transfer_seconds(src_device, dst_device, num_bytes)
