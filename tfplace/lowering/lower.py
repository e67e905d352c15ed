"""The lowering: the one place where a Strategy's meaning lives.

    placed = lower(graph, grouping, cluster, strategy, profile)          # one-off
    lowerer = Lowerer(graph, grouping, cluster, profile)                 # in a search loop
    placed = lowerer.lower(strategy)       # re-lowers only what changed since the last call

What a strategy means, task by task (PlacedGraph documents the arrays):
  * compute: every op of a group runs per its role (tfplace.lowering.graph_index): batch-dependent ops
    once per replica (each micro-batch is its own task) with that many samples and the profile's
    seconds at that per-device batch; batch-independent ops once per holder device (mirrors,
    costed at the measured batch nearest the global batch, never extrapolated);
    variable updates (and the aggregated-gradient arithmetic feeding them) on the update devices.
  * data: each tensor reaches each consumer instance through its edge pattern
    (tfplace.lowering.patterns): transfers de-duplicated per (tensor, slice, destination), with
    bytes proportional to the samples of a batched slice and the full size for everything else
    (partial gradients included); re-splits between groups with different shares; aggregation of
    partial values by ring all-reduce among the producing devices or by a PS (reduce there,
    update there, send the updated variable back to every mirror).
  * weights: combining replica r's partial value uses weight samples_r / B when the tensor
    follows a mean-reduced loss (or is a batch statistic), else 1, so one step equals
    single-device training on the global batch (PlacedGraph.task_weight, tensor_weight_mean).
  * order: priority key = (group `priority` (default 0; its rank among the strategy's distinct
    priorities, priority_ranks), micro-batch index on its device, run rank), so micro-batch 0
    flows through pipeline stages first (tfplace.lowering.assemble); the run rank is a
    topological order that follows the profile's `run_order` where it has one
    (tfplace.lowering.graph_index.run_order_rank).
  * legal strategies: a batch-statistics group's micro-batches hold at least
    `min_batch_per_replica` samples, and a group that deduplicates a sparse gradient (Unique
    before a Momentum/Adam update of an embedding) runs as one replica (check_min_batch,
    check_whole_groups refuse a strategy file otherwise; Lowerer.legalize is how the planners,
    the policy and the search keep to both).
  * control edges: per replica where both ends share a layout, else all-to-all.
  * memory: every copy of a variable is resident; optimizer slots only where updates run.

Auxiliary tasks (re-split, sum) cost `aux_launch_s + traffic * bytes / memory bandwidth` on
their device, never 0. So does each multiply of a partial by its aggregation weight that the
rewrite emits (traffic 2: read and written; PlacedGraph.weighted_reads), charged to the
op that made the partial on that device, else to the aggregating task.
What a CPU runtime adds beyond kernels and links (message handlers, dispatch, collective CPU) is
not costed here: the optional pass tfplace.overheads.apply adds it to the PlacedGraph afterwards.
Pure: no files, no globals, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster
from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import OpGraph
from tfplace.lowering.assemble import assemble
from tfplace.lowering.buckets import bucket_gradients
from tfplace.lowering.costs import ComputeCosts, LinkCosts, cpu_fractions, memory_bandwidth
from tfplace.lowering.graph_index import LK_UPD, PM_AGG, ROLE_UPDATE, GraphIndex, run_order_rank
from tfplace.lowering.layouts import LayoutTable
from tfplace.lowering.meta import split_metadata
from tfplace.lowering.patterns import PatternStore
from tfplace.lowering.placed_graph import PlacedGraph
from tfplace.formats.profile import Profile
from tfplace.formats.strategy import (GroupDecision, Strategy, made_for, micro_batch_shortfall, splits,
                                      whole_on_one_device, with_min_batch)

# Ops that normalise with the statistics of their own batch when training (attr is_training).
BATCH_STATISTICS_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def batch_statistics_groups(graph: OpGraph, op_group) -> Dict[int, str]:
    """Group index -> name of its first op that normalises with batch statistics (training-mode
    FusedBatchNorm*: `is_training` true in the GraphDef; without a GraphDef every one counts).
    Such a group's replicas each normalise their own micro-batch (Strategy.min_batch_per_replica)."""
    training = None
    if graph.graph_def is not None:
        training = {n.name for n in graph.graph_def.node if n.op in BATCH_STATISTICS_OPS
                    and ("is_training" not in n.attr or n.attr["is_training"].b)}
    out: Dict[int, str] = {}
    for op, op_type in enumerate(graph.op_types):
        if op_type in BATCH_STATISTICS_OPS and (training is None or graph.names[op] in training):
            out.setdefault(int(op_group[op]), graph.names[op])
    return out


def data_dependent_update_ops(graph: OpGraph) -> Dict[int, str]:
    """Op -> the variable whose update it feeds, for the ops whose output has a shape that
    depends on the values of the batch, not only on its size (a -1 dimension at the reference
    batch, no batch axis), on the way into a variable's update: an optimizer's Momentum, Adam, ...
    deduplicates a sparse (IndexedSlices) gradient with Unique (one row per distinct id of the
    samples) and sums its rows with UnsortedSegmentSum; a step's own Unique of the ids, in the
    forward pass, before such an update counts too. Such values are not sums of per-replica
    parts, so these ops run as one replica (Lowerer.check_whole_groups). Of the variables one
    update writes (a table and its slots), the shortest name; of a slot (`<table>/Adam`) its table."""
    names = {v.name for v in graph.variables}

    def owner(name: str) -> str:
        parent = name.rpartition("/")[0]
        return owner(parent) if parent in names else name

    def value_dependent(t: int) -> bool:
        shape = graph.tensor_shape[t]
        return (graph.tensor_batch_axis[t] < 0 and shape is not None and any(d is None or d < 0 for d in shape)
                and bool(graph.op_batch_dependent[graph.tensor_op[t]]))

    writes: Dict[int, str] = {}
    for v in graph.variables:
        for op in v.updaters:
            writes[op] = min(writes.get(op, owner(v.name)), owner(v.name), key=len)
    into_update = np.isin(graph.edge_dst, np.fromiter(writes, dtype=np.int64, count=len(writes)))
    edges = zip(graph.edge_tensor[into_update].tolist(), graph.edge_dst[into_update].tolist())
    todo = [(t, writes[c]) for t, c in edges if value_dependent(t)]
    out: Dict[int, str] = {}
    while todo:  # and the ops before them that make values of such shapes (Unique before the sum)
        t, var = todo.pop()
        op = int(graph.tensor_op[t])
        if op not in out:
            out[op] = var
            todo += [(u, var) for u in graph.edge_tensor[graph.edge_dst == op].tolist() if value_dependent(u)]
    return out


def whole_groups(graph: OpGraph, op_group) -> Dict[int, Tuple[str, str]]:
    """Group index -> (name of its first op of data_dependent_update_ops, the variable it feeds):
    the groups a strategy must run as one replica (one device, one micro-batch)."""
    out: Dict[int, Tuple[str, str]] = {}
    for op, var in sorted(data_dependent_update_ops(graph).items()):
        out.setdefault(int(op_group[op]), (graph.names[op], var))
    return out


@dataclasses.dataclass(frozen=True)
class LoweringOptions:
    """Knobs of the lowering's cost model.

    Attributes:
      device_ports: model each device's single attachment (port) as a shared link, see
        tfplace.lowering.costs.
      aux_launch_s: fixed cost of one split/concat/sum task (a kernel launch is ~5 µs on
        current GPUs, e.g. NVIDIA's CUDA best-practices guide).
      missing_op_s: cost of ops the profile lists in `missing_ops` (no kernel was seen).
      memory_bandwidth_bytes_per_s: device kind -> bytes/s a copy reaches in device memory;
        None (default): the device model's datasheet table (tfplace.device_model).
      default_memory_bandwidth_bytes_per_s: for kinds the table lacks (a mid-range GPU).
    """
    device_ports: bool = True
    aux_launch_s: float = 5e-6
    missing_op_s: float = 0.0
    memory_bandwidth_bytes_per_s: Optional[Mapping[str, float]] = None
    default_memory_bandwidth_bytes_per_s: float = 2.0e11


@dataclasses.dataclass(frozen=True)
class _RegroupedGrouping:
    op_group: np.ndarray
    group_names: Tuple[str, ...]


class Lowerer:
    """Lowers strategies for one (graph, grouping, cluster, profile); caches everything that
    does not depend on the strategy, and the layouts and edge patterns of past strategies, so a
    strategy that differs from the previous one in a few groups re-resolves only the tensors
    touching those groups before the (vectorised) assembly."""

    def __init__(self, graph: OpGraph, grouping, cluster: Cluster, profile: Profile,
                 options: Optional[LoweringOptions] = None):
        # Metadata (shapes and what derives from them) runs in each consumer's group: the
        # lowered graph may carry clones of metadata ops after the original ops (tfplace.lowering.meta).
        self.original_graph = graph
        self.batch_stat_groups = batch_statistics_groups(graph, grouping.op_group)
        self.whole_groups = whole_groups(graph, grouping.op_group)
        graph, op_group = split_metadata(graph, grouping.op_group)
        grouping = _RegroupedGrouping(op_group, tuple(grouping.group_names))
        self.graph, self.cluster, self.profile = graph, cluster, profile
        self.options = options or LoweringOptions()
        self.index = GraphIndex(graph, grouping)
        self.op_rank = run_order_rank(graph, profile.run_order)  # priority ties (tfplace.lowering.assemble)
        self.compute = ComputeCosts(graph, cluster, profile, self.options.missing_op_s)
        self.links = LinkCosts(cluster, profile, self.options.device_ports)
        self.mem_bw = memory_bandwidth(cluster, self.options.memory_bandwidth_bytes_per_s,
                                       self.options.default_memory_bandwidth_bytes_per_s, profile)
        self.cpu_fraction = cpu_fractions(profile, [d.kind for d in cluster.devices])  # [D] PlacedGraph's
        self._sig_static = self.index.sig_keys
        self._group_names = set(self.index.group_names)
        self._tables: Dict[int, Tuple[LayoutTable, PatternStore]] = {}
        self._decision_cache: Dict[int, tuple] = {}
        self._last = None  # (batch, lay_of, sync, sig_pat) of the previous call
        self._update_cache = None  # _update_side
        self._packable_cache = None  # _packable
        self._col_ids: Dict[Tuple[int, int, bool], int] = {}
        self._cols, self._stack = [], None
        self._entry_cols: Dict[int, np.ndarray] = {}
        # Pattern rows kept between strategies before the caches are dropped (~100 bytes each).
        self.max_cache_rows = 4_000_000

    def reset(self) -> None:
        """Forgets every strategy-dependent cache (layouts, patterns, the previous strategy); the
        graph analysis and cost tables stay. The next `lower` is a full lowering."""
        self._tables.clear()
        self._entry_cols.clear()
        self._decision_cache.clear()
        self._last = None

    # ---- tables shared with the assembly -------------------------------------------------------
    def layouts(self, batch: int) -> LayoutTable:
        return self._table(batch)[0]

    def patterns(self, batch: int) -> PatternStore:
        return self._table(batch)[1]

    def _table(self, batch: int):
        if batch not in self._tables:
            self._tables[batch] = (LayoutTable(self.cluster, batch), PatternStore(self.links, batch))
        return self._tables[batch]

    def entry_columns(self, batch: int):
        """(column id per layout entry, cost stack [C, N]): an entry's ops cost stack[col, op],
        the profile at that entry's device kind and per-device batch (for mirrors, which do not
        split the batch: B, clamped to the measured range). Columns are computed once per
        (kind, batch, clamp) and kept."""
        lay_ptr, lay_size, lay_dev, lay_samp, _, _ = self.layouts(batch).arrays()
        cols = self._entry_cols.get(batch, np.zeros(0, dtype=np.int64))
        if len(cols) < len(lay_dev):
            new = []
            for d, s in zip(lay_dev[len(cols):].tolist(), lay_samp[len(cols):].tolist()):
                key = (int(self.compute.dev_kind[d]), s if s > 0 else batch, s == 0)
                cid = self._col_ids.get(key)
                if cid is None:
                    cid = self._col_ids[key] = len(self._cols)
                    self._cols.append(self.compute.column(*key))
                    self._stack = None
                new.append(cid)
            cols = self._entry_cols[batch] = np.concatenate([cols, np.array(new, dtype=np.int64)])
        if self._stack is None:
            self._stack = np.stack(self._cols)
        return cols, self._stack

    def collective_arrays(self):
        """(link_ptr, link_idx, part_ptr, part_idx) over the collective groups made so far."""
        return self.links.collective_table()[4:]

    # ---- lowering ------------------------------------------------------------------------------
    def lower(self, strategy: Strategy) -> PlacedGraph:
        """The PlacedGraph of `strategy` (raises InputError for unknown groups or devices, shares
        that do not add up to the global batch, and ops missing from the profile)."""
        batch = int(strategy.global_batch_size)
        if batch <= 0:
            raise InputError(strategy.source or "strategy", "global_batch_size", "must be > 0", "give the batch size")
        if batch in self._tables and (self.patterns(batch).num_rows > self.max_cache_rows
                                      or len(self.layouts(batch).entries) > self.max_cache_rows // 16):
            self.reset()  # bound the caches in long searches; the next lowering is a full one
        self.check_min_batch(strategy)
        self.check_whole_groups(strategy)
        lay_of, sync, prio = self._decisions(strategy, batch)
        sig_pat = self._resolve(batch, lay_of, sync)
        placed = assemble(self.index, self, lay_of, sync, prio, sig_pat, batch)
        sizes = (strategy.bucket_bytes_among(True), strategy.bucket_bytes_among(False))
        if max(sizes) > 1:
            update_op, after_update = self._update_side()
            placed = bucket_gradients(placed, self.links, update_op, after_update, self.graph.tensor_dtype,
                                      *self._packable(), sizes, self.mem_bw, self.options.aux_launch_s)
        return placed

    def _packable(self) -> Tuple[np.ndarray, np.ndarray]:
        """([T] tensor code, [N] handle-op code): a dtype code (>= 0) for the tensors and the
        variables' handle ops whose values a PS bucket may carry (tfplace.lowering.buckets), -1
        elsewhere. A tensor qualifies with one fully known shape at every batch size (no batch
        axis, no -1 dim; the rewrite splits a packed bucket on the receiver with the static
        shapes), a dtype of numbers; a handle op with its variable's shape fully known."""
        if self._packable_cache is None:
            g = self.graph
            codes: Dict[str, int] = {}
            tensor_code = np.full(g.num_tensors, -1, dtype=np.int64)
            for t in range(g.num_tensors):
                dtype = g.tensor_dtype[t]
                if g.static_elements(t) >= 0 and dtype not in ("resource", "variant"):
                    tensor_code[t] = codes.setdefault(dtype, len(codes))
            handle_code = np.full(g.num_ops, -1, dtype=np.int64)
            for v in g.variables:
                if -1 not in v.shape:
                    handle_code[v.op] = codes.setdefault(v.dtype, len(codes))
            self._packable_cache = (tensor_code, handle_code)
        return self._packable_cache

    def _update_side(self) -> Tuple[np.ndarray, np.ndarray]:
        """([N] ops of the update side, [N] ops downstream of one of them through data or control
        edges): a collective whose gradient is made downstream of an update-side op could wait
        for another collective's result, so it is never packed into a bucket."""
        if self._update_cache is None:
            ix, graph = self.index, self.graph
            update_op = (ix.role == ROLE_UPDATE) | (ix.lkind == LK_UPD)
            src = np.concatenate([graph.tensor_op[graph.edge_tensor], ix.control_src]).astype(np.int64)
            dst = np.concatenate([graph.edge_dst, ix.control_dst]).astype(np.int64)
            order = np.argsort(src, kind="stable")
            ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=graph.num_ops))])
            succ = dst[order]
            after = np.zeros(graph.num_ops, dtype=bool)
            stack = np.nonzero(update_op)[0].tolist()
            while stack:
                u = stack.pop()
                for v in succ[ptr[u]:ptr[u + 1]].tolist():
                    if not after[v]:
                        after[v] = True
                        stack.append(v)
            self._update_cache = (update_op, after)
        return self._update_cache

    def _group_decision(self, strategy: Strategy, g: int) -> Tuple[str, Optional[GroupDecision], str]:
        """(name, decision, field) of group `g` in `strategy`: its own entry ("groups.<name>") or
        the default ("default"); the decision None when it has neither."""
        name = self.index.group_names[g]
        field = f"groups.{name}" if name in strategy.groups else "default"
        return name, strategy.groups.get(name, strategy.default), field

    def check_min_batch(self, strategy: Strategy) -> None:
        """Raises InputError naming the group and the device when a replica of a batch-statistics
        group gets fewer samples than `strategy.effective_min_batch_per_replica`."""
        least = strategy.effective_min_batch_per_replica
        if least <= 1:
            return
        for g, op_name in self.batch_stat_groups.items():
            name, d, field = self._group_decision(strategy, g)
            short = None if d is None else micro_batch_shortfall(d, least)
            if short is not None:
                raise InputError(strategy.source or "strategy", f"{field}.shares.{short[0]}",
                                 f"gives a replica of group {name!r} {short[1]} sample(s), but it normalises with batch "
                                 f"statistics ({op_name}), which needs at least {least}",
                                 f"give each micro-batch of this group at least {least} samples, or set "
                                 f"min_batch_per_replica lower (1 turns the check off)")

    def check_whole_groups(self, strategy: Strategy) -> None:
        """Raises InputError naming the group when the strategy splits a group of `whole_groups`
        over replicas: summed element by element, the replicas' deduplicated sparse gradients
        crash (their row counts differ) or update the wrong rows with no error."""
        for g, (op_name, var) in self.whole_groups.items():
            name, d, field = self._group_decision(strategy, g)
            if d is not None and splits(d):
                raise InputError(strategy.source or "strategy", f"{field}.shares",
                                 f"splits group {name!r} over replicas, but its {op_name!r} makes a value whose shape "
                                 f"depends on the ids its samples hold (feeding the update of {var!r}: a deduplicated "
                                 "sparse gradient, Unique before a Momentum/Adam update), which replicas cannot sum",
                                 f"run group {name!r} on one device (one share, one micro-batch); where an optimizer "
                                 f"deduplicates {var!r}'s sparse gradient, plain SGD for it or a dense gradient (a "
                                 "one-hot matmul instead of the lookup) lets the group split")

    def legalize(self, strategy: Strategy) -> Strategy:
        """`strategy` with every batch-statistics group's micro-batches raised to the minimum
        (`formats.strategy.with_min_batch`) and every group of `whole_groups` whole on the device
        that had most of its samples (`formats.strategy.whole_on_one_device`); the same object
        when nothing changes. How the planners, the policy and the search keep to both."""
        least = strategy.effective_min_batch_per_replica
        raised = {}
        for g in self.batch_stat_groups:
            name, d, _ = self._group_decision(strategy, g)
            if d is not None and micro_batch_shortfall(d, least) is not None:
                raised[name] = with_min_batch(d, least)
        for g in self.whole_groups:
            name, d, _ = self._group_decision(strategy, g)
            d = raised.get(name, d)
            if d is not None and splits(d):
                raised[name] = whole_on_one_device(d)
        return dataclasses.replace(strategy, groups={**strategy.groups, **raised}) if raised else strategy

    def _decisions(self, strategy: Strategy, batch: int):
        src = strategy.source or "strategy"
        unknown = [name for name in strategy.groups if name not in self._group_names]
        if unknown:
            raise InputError(src, f"groups.{unknown[0]}", "no such group in the graph's grouping" + made_for(strategy),
                             "use group names of the same grouping (same max_groups)")
        table = self.layouts(batch)
        cache = self._decision_cache
        if len(cache) > 100_000:
            cache.clear()
        rows = []
        for name in self.index.group_names:
            d = strategy.groups.get(name, strategy.default)
            if d is None:
                raise InputError(src, f"groups.{name}", "no decision and no default", 'add the group or a "default"')
            hit = cache.get(id(d))
            if hit is None or hit[0] is not d or hit[1] != batch:
                field = f"groups.{name}" if name in strategy.groups else "default"
                hit = cache[id(d)] = (d, batch, table.for_decision(d, field, src))
            rows.append(hit[2])
        lay_of = np.array([r[0] for r in rows], dtype=np.int64).reshape(-1, 4)
        sync = np.array([r[1] for r in rows], dtype=np.int64)
        return lay_of, sync, priority_ranks([r[2] for r in rows])

    def _resolve(self, batch: int, lay_of: np.ndarray, sync: np.ndarray) -> np.ndarray:
        """Pattern id per signature; only signatures touching changed groups are recomputed."""
        ix = self.index
        last = self._last
        if last is not None and last[0] == batch and last[1].shape == lay_of.shape:
            changed = np.nonzero((last[1] != lay_of).any(axis=1) | (last[2] != sync))[0]
            dirty = ix.sigs_of_groups(changed.tolist())
            sig_pat = last[3].copy()
        else:
            dirty = np.arange(ix.num_sigs)
            sig_pat = np.zeros(ix.num_sigs, dtype=np.int64)
        if len(dirty):
            sig_pat[dirty] = self._patterns_for(dirty, batch, lay_of, sync)
        self._last = (batch, lay_of, sync, sig_pat)
        return sig_pat

    _NARROW = 3  # signatures with at most this many consumer slots are keyed with numpy

    def _patterns_for(self, sigs: np.ndarray, batch: int, lay_of: np.ndarray, sync: np.ndarray) -> np.ndarray:
        """Pattern ids of `sigs`. A signature's key is (class, producer layout, ((consumer
        layout, mode), ...)); the keys of narrow signatures are rows of a small integer matrix,
        so only distinct rows reach Python (few for data parallelism, where groups share
        layouts)."""
        ix = self.index
        store, entries = self.patterns(batch), self.layouts(batch).entries
        mode = np.where(ix.slot_pmode < PM_AGG, ix.slot_pmode, PM_AGG + sync[ix.slot_group])
        code = lay_of[ix.slot_group, ix.slot_lkind] * 4 + mode
        nslot = ix.sig_slot_ptr[sigs + 1] - ix.sig_slot_ptr[sigs]
        out = np.zeros(len(sigs), dtype=np.int64)
        narrow = nslot <= self._NARROW
        w = self._NARROW
        mat = np.full((int(narrow.sum()), 3 + w), -1, dtype=np.int64)
        ns, nn = sigs[narrow], nslot[narrow]
        mat[:, 0], mat[:, 1], mat[:, 2] = ix.sig_cls[ns], lay_of[ix.sig_pgroup[ns], ix.sig_plkind[ns]], nn
        for j in range(w):
            has = nn > j
            mat[has, 3 + j] = code[ix.sig_slot_ptr[ns[has]] + j]
        if len(mat):
            rows, inverse = _unique_rows(mat)
            ids = [store.get((r[0], r[1], tuple((c >> 2, c & 3) for c in r[3:3 + r[2]])), entries)
                   for r in rows.tolist()]
            out[narrow] = np.array(ids, dtype=np.int64)[inverse]
        wide = np.nonzero(~narrow)[0].tolist()
        lay, sy, static = (lay_of.tolist(), sync.tolist(), self._sig_static) if wide else (None, None, None)
        for k in wide:
            cls, pg, pk, slots = static[int(sigs[k])]
            key = (cls, lay[pg][pk], tuple((lay[cg][ck], pm if pm < PM_AGG else PM_AGG + sy[cg]) for cg, ck, pm in slots))
            out[k] = store.get(key, entries)
        return out


def priority_ranks(priorities) -> np.ndarray:
    """[G] int64: each group's priority as its rank among the distinct priorities (0: the lowest;
    equal priorities keep equal ranks). Only their order means anything, and a file may give any
    integer: the task key (tfplace.lowering.assemble) multiplies a group's priority by the
    micro-batches times the ops, which wrapped int64 silently for large values (2**62 on a 3-op
    graph ran first instead of last) and overflowed it from 2**63 on."""
    rank = {p: r for r, p in enumerate(sorted(set(priorities)))}
    return np.array([rank[p] for p in priorities], dtype=np.int64)


def _unique_rows(mat: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(distinct rows, index of each row's distinct row); np.unique(axis=0) without its slow
    comparison of void records: lexsort on the columns, then compare neighbours."""
    order = np.lexsort(mat.T[::-1])
    srt = mat[order]
    new = np.ones(len(srt), dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    group = np.cumsum(new) - 1
    inverse = np.empty(len(mat), dtype=np.int64)
    inverse[order] = group
    return srt[new], inverse


def lower(graph: OpGraph, grouping, cluster: Cluster, strategy: Strategy, profile: Profile,
          options: Optional[LoweringOptions] = None) -> PlacedGraph:
    """Lowers one strategy (see the module docstring). For many strategies on one graph, keep a
    `Lowerer` instead: it caches the graph analysis and the patterns between calls."""
    return Lowerer(graph, grouping, cluster, profile, options).lower(strategy)
