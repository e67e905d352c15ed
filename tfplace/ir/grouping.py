"""Op groups: ops that share one placement decision.

    grouping = make_grouping(graph, max_groups=200)       # = coarsen(graph, base_groups(graph), 200)
    grouping.op_group[i]        group of op i (int32 [N])
    grouping.group_names[g]     name of the group's anchor op (unique, stable)
    grouping.group_ops(g)       op indices of group g, ascending (int64 [n_g])

`base_groups` joins the ops that must share a decision (colocation, a variable with its handle,
reads and updates, constant/shape side inputs with their only consumer) without ever joining the
two ends of a batched data edge, so every batch-split point of the graph is still a group
boundary. `coarsen` then merges groups greedily, heaviest tensor edges per unit of cost first,
until at most K remain; it is deterministic. The group graph may contain cycles (a group is a
shared decision, not an execution unit: ops still run one by one, in graph order).

Group numbering is canonical: groups are numbered by their first op in topological order, so the
op -> group mapping depends only on which ops are together. Pure numpy; no TensorFlow import.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import OpGraph

_INTEGER_DTYPES = ("int32", "int64", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


@dataclasses.dataclass(frozen=True, eq=False)
class Grouping:
    """A partition of the ops of one OpGraph into G groups.

    Attributes:
      op_group: int32 [N], group of each op, values 0..G-1, every group non-empty.
      group_names: [G] name of each group's anchor op: the variable handle if the group holds one
        (model weights before slots, then the largest), else the op with the largest output bytes
        (ties: first in topological order). Unique.
      group_batch_splittable: bool [G], True if the group holds a batch-dependent op with a
        batched output (it can run on slices of the batch).
    """
    op_group: np.ndarray
    group_names: Tuple[str, ...]
    group_batch_splittable: np.ndarray

    def __post_init__(self):
        g = len(self.group_names)
        counts = np.bincount(self.op_group, minlength=g) if len(self.op_group) else np.zeros(g, int)
        problems = [
            ("op_group", len(self.op_group) and (self.op_group.min() < 0 or self.op_group.max() >= g),
             f"values must be in [0, {g})"),
            ("op_group", len(counts) != g or (counts == 0).any(), "every group must hold at least one op"),
            ("group_names", len(set(self.group_names)) != g, "names must be unique"),
            ("group_batch_splittable", len(self.group_batch_splittable) != g, f"must have {g} entries"),
        ]
        for field, bad, why in problems:
            if bad:
                raise InputError("grouping", field, why, "build groupings with tfplace.ir.grouping")
        order = np.argsort(self.op_group, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)])
        object.__setattr__(self, "_members", (order, starts))

    @property
    def num_groups(self) -> int:
        return len(self.group_names)

    def group_ops(self, g: int) -> np.ndarray:
        """Op indices of group g, ascending (topological order)."""
        order, starts = self._members
        return order[starts[g]:starts[g + 1]]


@dataclasses.dataclass(frozen=True, eq=False)
class GroupGraph:
    """The graph between groups (deduplicated, no self-loops), sorted by (src, dst).

    edge_src_group, edge_dst_group: int32 [M]. edge_bytes: int64 [M], bytes at the reference
    batch size of the distinct tensors that flow from src to dst (a tensor used by several ops of
    dst counts once); 0 for an edge made only of control dependencies.
    """
    num_groups: int
    edge_src_group: np.ndarray
    edge_dst_group: np.ndarray
    edge_bytes: np.ndarray


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            ra, rb = min(ra, rb), max(ra, rb)
            self.parent[rb] = ra
        return ra

    def roots(self) -> np.ndarray:
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)


# ---- base groups ---------------------------------------------------------------------------
def base_groups(graph: OpGraph) -> Grouping:
    """Ops that must share a decision, one group each:

      * colocation (`_class: loc:@x` in the GraphDef) with x, where x is in the step;
      * a variable's handle, readers and updaters (so an optimizer's slots join the update op
        and through it the weight);
      * an op whose outputs are all unbatched and that is either not batch-dependent (constants
        and their arithmetic) or produces only integers (shapes, sizes, indices), with its only
        consumer op, when it has exactly one. Walked in reverse topological order, so whole
        chains fold into their consumer.
    A batched data edge is never folded (only colocation could join one, e.g. a gradient
    `Identity` colocated with its producer; that is TensorFlow's own constraint).
    """
    n = graph.num_ops
    uf = _UnionFind(n)
    for a, b in _colocation_pairs(graph):
        uf.union(a, b)
    in_variable = np.zeros(n, dtype=bool)
    for v in graph.variables:
        members = (v.op,) + v.readers + v.updaters
        in_variable[list(members)] = True
        for m in members:
            uf.union(v.op, m)
    batched_out = np.zeros(n, dtype=bool)
    batched_out[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    non_int = np.zeros(n, dtype=bool)
    is_int = np.array([d in _INTEGER_DTYPES for d in graph.tensor_dtype], dtype=bool)
    non_int[graph.tensor_op[~is_int]] = True
    foldable = ~batched_out & ~in_variable & (~graph.op_batch_dependent | ~non_int)
    foldable[list(graph.inputs)] = False
    src = graph.tensor_op[graph.edge_tensor]
    consumers: Dict[int, set] = {}
    for s, d in zip(src.tolist(), graph.edge_dst.tolist()):
        if foldable[s]:
            consumers.setdefault(s, set()).add(d)
    for op in sorted(consumers, reverse=True):
        if len(consumers[op]) == 1:
            uf.union(op, next(iter(consumers[op])))
    return _grouping_from_roots(graph, uf.roots())


def _colocation_pairs(graph: OpGraph) -> List[Tuple[int, int]]:
    if graph.graph_def is None:
        return []
    pairs = []
    for node in graph.graph_def.node:
        if "_class" not in node.attr or not graph.has_op(node.name):
            continue
        for entry in node.attr["_class"].list.s:
            text = entry.decode("utf-8", "replace")
            if text.startswith("loc:@") and graph.has_op(text[5:]):
                pairs.append((graph.index(node.name), graph.index(text[5:])))
    return pairs


def _op_output_bytes(graph: OpGraph) -> np.ndarray:
    return np.bincount(graph.tensor_op, weights=graph.tensor_bytes.astype(np.float64), minlength=graph.num_ops)


def _grouping_from_roots(graph: OpGraph, roots: np.ndarray) -> Grouping:
    """Canonical numbering (by first op), anchor names and splittability for a partition."""
    _, first, inverse = np.unique(roots, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    op_group = rank[inverse].astype(np.int32)
    g = len(first)
    out_bytes = _op_output_bytes(graph)
    # Largest output bytes first, then topological order: the first op per group is its anchor.
    order = np.lexsort((np.arange(graph.num_ops), -out_bytes, op_group))
    _, first_in_group = np.unique(op_group[order], return_index=True)
    anchor = order[first_in_group].astype(np.int64)
    best_var: Dict[int, Tuple] = {}
    for v in graph.variables:
        key = (v.is_slot, -v.num_bytes, v.op)
        grp = int(op_group[v.op])
        if grp not in best_var or key < best_var[grp]:
            best_var[grp] = key
    for grp, key in best_var.items():
        anchor[grp] = key[2]
    batched_out = np.zeros(graph.num_ops, dtype=bool)
    batched_out[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    splittable = np.zeros(g, dtype=bool)
    splittable[op_group[graph.op_batch_dependent & batched_out]] = True
    return Grouping(op_group=op_group, group_names=tuple(graph.names[a] for a in anchor),
                    group_batch_splittable=splittable)


# ---- coarsening ----------------------------------------------------------------------------
def _group_edges(graph: OpGraph, op_group: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, bytes) between distinct groups: each tensor counted once per consumer group;
    control-only pairs get 0 bytes. Deduplicated and sorted by (src, dst)."""
    g = int(op_group.max()) + 1 if len(op_group) else 1
    t_dst = op_group[graph.edge_dst].astype(np.int64)
    t_src = op_group[graph.tensor_op[graph.edge_tensor]].astype(np.int64)
    keep = t_src != t_dst
    tensor_dst = np.unique(graph.edge_tensor[keep].astype(np.int64) * g + t_dst[keep])
    tensor = tensor_dst // g
    c_src = op_group[graph.control_src].astype(np.int64)
    c_dst = op_group[graph.control_dst].astype(np.int64)
    c_keep = c_src != c_dst
    src = np.concatenate([op_group[graph.tensor_op[tensor]].astype(np.int64), c_src[c_keep]])
    dst = np.concatenate([tensor_dst % g, c_dst[c_keep]])
    nbytes = np.concatenate([graph.tensor_bytes[tensor].astype(np.float64), np.zeros(int(c_keep.sum()))])
    pair, inverse = np.unique(src * g + dst, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=nbytes, minlength=len(pair))
    return (pair // g).astype(np.int32), (pair % g).astype(np.int32), np.rint(total).astype(np.int64)


def group_graph(graph: OpGraph, grouping: Grouping) -> GroupGraph:
    """The deduplicated edges between the groups of `grouping` (see GroupGraph)."""
    src, dst, nbytes = _group_edges(graph, grouping.op_group)
    return GroupGraph(grouping.num_groups, src, dst, nbytes)


def coarsen(graph: OpGraph, grouping: Grouping, max_groups: int,
            op_cost: Optional[Sequence[float]] = None) -> Grouping:
    """Merges groups of `grouping` until at most `max_groups` remain.

    Greedy over the undirected group graph (data edges weighted by tensor bytes, control edges
    by 0). First, groups of negligible cost (below 1% of the average target group cost: NoOps,
    shared constants) are absorbed into their heaviest neighbour. Then the next merge is the pair
    with the highest edge bytes / (cost_a + cost_b) (heavy edges between cheap groups first),
    ties by smaller combined cost, then smaller group ids. A merged group may not exceed a cost
    cap (2 × total cost / max_groups, doubled whenever no allowed merge is left), which keeps
    big-cost groups apart. Deterministic: the result depends only on the arrays.

    Args:
      graph: the OpGraph `grouping` partitions.
      grouping: the starting groups (usually base_groups(graph)); each stays inside one result group.
      max_groups: K >= 1.
      op_cost: float [N] cost per op (seconds, or any proxy); default: output bytes of the op.
    """
    if isinstance(max_groups, bool) or not isinstance(max_groups, (int, np.integer)) or max_groups < 1:
        raise InputError("argument max_groups", "", f"must be an integer >= 1, got {max_groups!r}",
                         "pass the number of groups the policy should see, e.g. 200")
    if len(grouping.op_group) != graph.num_ops:
        raise InputError("argument grouping", "op_group", f"has {len(grouping.op_group)} entries, the graph "
                         f"has {graph.num_ops} ops", "coarsen a grouping of the same OpGraph")
    cost = _op_costs(graph, op_cost)
    g0 = grouping.num_groups
    if g0 <= max_groups:
        return _grouping_from_roots(graph, grouping.op_group.astype(np.int64))
    src, dst, nbytes = _group_edges(graph, grouping.op_group)
    adjacency: List[Dict[int, int]] = [dict() for _ in range(g0)]
    for a, b, w in zip(src.tolist(), dst.tolist(), nbytes.tolist()):
        adjacency[a][b] = adjacency[a].get(b, 0) + w
        adjacency[b][a] = adjacency[b].get(a, 0) + w
    group_cost = np.bincount(grouping.op_group, weights=cost, minlength=g0).tolist()
    total = float(sum(group_cost))
    merger = _Merger(adjacency, group_cost, negligible=0.01 * total / max_groups)
    count, cap = g0, 2.0 * total / max_groups
    while count > max_groups:
        merged = merger.run(count - max_groups, cap)
        count -= merged
        if merged == 0:
            if cap >= total:  # no edges left: join the two cheapest groups
                count -= merger.join_cheapest()
            cap = cap * 2.0 if cap > 0 else float("inf")
    roots = np.array([merger.find(int(g)) for g in grouping.op_group], dtype=np.int64)
    return _grouping_from_roots(graph, roots)


def _op_costs(graph: OpGraph, op_cost) -> np.ndarray:
    if op_cost is None:
        return _op_output_bytes(graph)
    cost = np.asarray(op_cost, dtype=np.float64)
    if cost.shape != (graph.num_ops,) or not np.isfinite(cost).all() or (cost < 0).any():
        raise InputError("argument op_cost", "", f"must be {graph.num_ops} finite costs >= 0 (one per op), "
                         f"got shape {cost.shape}", "pass seconds (or a proxy) per op in OpGraph order")
    return cost


class _Merger:
    """Greedy pairwise merging with a heap of candidate pairs, re-scored lazily on pop."""

    def __init__(self, adjacency: List[Dict[int, int]], cost: List[float], negligible: float):
        self.adj, self.cost, self.negligible = adjacency, cost, negligible
        self.uf = _UnionFind(len(cost))
        self.alive = set(range(len(cost)))

    def find(self, g: int) -> int:
        return self.uf.find(g)

    def _entry(self, a: int, b: int):
        a, b = min(a, b), max(a, b)
        both, w = self.cost[a] + self.cost[b], self.adj[a][b]
        if min(self.cost[a], self.cost[b]) <= self.negligible:
            return (0, -float(w), both, a, b)
        return (1, -w / both, both, a, b)

    def run(self, wanted: int, cap: float) -> int:
        """Performs up to `wanted` merges whose combined cost is <= cap; returns how many.

        Lazy greedy: a merge only raises the cost of the survivor (scores of its old pairs can
        only fall, so they are re-scored when popped) and raises the weight of pairs with the
        absorbed group's neighbours (those are pushed anew)."""
        heap = [self._entry(a, b) for a in sorted(self.alive) for b in self.adj[a] if a < b]
        heapq.heapify(heap)
        done = 0
        while heap and done < wanted:
            entry = heapq.heappop(heap)
            a, b = self.uf.find(entry[3]), self.uf.find(entry[4])
            if a == b or b not in self.adj[a]:
                continue
            current = self._entry(a, b)
            if current != entry:  # stale: ids, costs or weights changed since it was pushed
                heapq.heappush(heap, current)
                continue
            if entry[2] > cap:
                continue
            keep, touched = self._merge(a, b)
            for n in touched:
                heapq.heappush(heap, self._entry(keep, n))
            done += 1
        return done

    def _merge(self, a: int, b: int) -> Tuple[int, List[int]]:
        """Merges the smaller adjacency into the larger; returns (survivor, absorbed neighbours)."""
        keep, gone = (a, b) if (len(self.adj[a]), -a) >= (len(self.adj[b]), -b) else (b, a)
        self.uf.parent[gone] = keep
        self.alive.discard(gone)
        self.cost[keep] += self.cost[gone]
        touched = []
        for n, w in self.adj[gone].items():
            del self.adj[n][gone]
            if n != keep:
                self.adj[keep][n] = self.adj[keep].get(n, 0) + w
                self.adj[n][keep] = self.adj[n].get(keep, 0) + w
                touched.append(n)
        self.adj[gone] = {}
        return keep, touched

    def join_cheapest(self) -> int:
        if len(self.alive) < 2:
            return 0
        a, b = sorted(self.alive, key=lambda g: (self.cost[g], g))[:2]
        self.adj[a].setdefault(b, 0)
        self.adj[b].setdefault(a, 0)
        self._merge(a, b)
        return 1


def make_grouping(graph: OpGraph, max_groups: int, op_cost: Optional[Sequence[float]] = None) -> Grouping:
    """The grouping a strategy's `max_groups` refers to: coarsen(base_groups(graph), max_groups)."""
    return coarsen(graph, base_groups(graph), max_groups, op_cost)
