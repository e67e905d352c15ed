"""Per-replica metadata, recomputed in each consumer's layout (part of the lowering).

A batch-dependent op without a batched output produces one value per replica. Two kinds exist:

  * partial values (a weight gradient, a batch statistic, a replica's loss): functions of the
    replica's *data*; aggregated (weighted sum) where they enter an update, replica-local where
    the consumer runs in the same layout.
  * metadata (`Shape` of a batched tensor, and the small integer/float chains derived from it:
    `GatherV2`, `Prod`, `Cast`, `BroadcastGradientArgs`, `DynamicStitch`, the 1/B of a mean's
    gradient ...): functions of the replica's *size* only.

A consumer replica of c samples needs metadata computed at c samples. When producer and
consumer lie in different groups, their layouts (replica sizes) differ, so no producer replica
can serve it (the rewrite would feed a [5,6,8] shape to a replica of 2 samples). The lowering
therefore runs a metadata op *in its consumer's group*: `split_metadata` gives every metadata op
one copy per consumer group (the op itself serves its first such group, clones
`<op>/tfplace_meta_g<k>` the others), each reading its metadata inputs from the copy in the same
group, so every metadata value is computed per consumer replica, replica-locally. Partial values
are never cloned (they stay aggregated or replica-local as before).

Clones are appended after the original ops and tensors (original op, tensor and edge ids are
kept), their NodeDefs are copies under the new names (the rewrite emits them like any op), and
the profile entry of a clone is the original's (`meta["tfplace_clone_of"]`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.ir.graph_ir import OpGraph

#: Ops whose output depends only on the *shape* of their (batched) input.
SHAPE_OP_TYPES = frozenset({"Shape", "ShapeN", "Size", "Rank"})
#: Ops never treated as metadata (state, randomness, communication).
_NEVER = frozenset({"VarHandleOp", "ReadVariableOp", "Placeholder", "PlaceholderWithDefault", "NoOp",
                    "RandomUniform", "RandomStandardNormal", "TruncatedNormal"})
CLONE_SUFFIX = "/tfplace_meta_g"


def metadata_ops(graph: OpGraph) -> np.ndarray:
    """bool[N]: batch-dependent ops without batched outputs whose value depends only on the
    replica's batch size: a shape op of a batched tensor, or an op all of whose data inputs are
    metadata or batch-independent (constants, variable reads)."""
    n = graph.num_ops
    prod = graph.tensor_op[graph.edge_tensor].astype(np.int64)
    batched_t = graph.tensor_batch_axis >= 0
    has_batched_out = np.zeros(n, dtype=bool)
    has_batched_out[graph.tensor_op[batched_t]] = True
    ins: List[List[int]] = [[] for _ in range(n)]
    for e, (p, d) in enumerate(zip(prod.tolist(), graph.edge_dst.tolist())):
        ins[d].append(e)
    is_input = np.zeros(n, dtype=bool)
    is_input[list(graph.inputs)] = True
    dep = graph.op_batch_dependent
    meta = np.zeros(n, dtype=bool)
    for i in _topological_order(graph).tolist():
        if not dep[i] or has_batched_out[i] or is_input[i] or graph.op_types[i] in _NEVER or not ins[i]:
            continue
        ok = True
        for e in ins[i]:
            t = int(graph.edge_tensor[e])
            p = int(prod[e])
            if batched_t[t]:
                ok = graph.op_types[i] in SHAPE_OP_TYPES
            elif dep[p]:
                ok = bool(meta[p])
            if not ok:
                break
        meta[i] = ok
    return meta


def _topological_order(graph: OpGraph) -> np.ndarray:
    """Op ids in a topological order of data and control edges (Kahn, smallest id first)."""
    out = kahn_order(graph)
    if len(out) != graph.num_ops:  # a cycle (should not happen in a step graph): fall back to id order
        return np.arange(graph.num_ops)
    return np.array(out, dtype=np.int64)


def kahn_order(graph: OpGraph, key: Optional[Sequence[int]] = None) -> List[int]:
    """Op ids in a topological order of data and control edges (self-loops ignored): among the
    ops whose inputs are done, the smallest `key[i]` (default 0) next, ties by the smallest id.
    Shorter than num_ops when ops lie on a cycle (the caller decides what that means)."""
    import heapq
    n = graph.num_ops
    key = [0] * n if key is None else key
    src = np.concatenate([graph.tensor_op[graph.edge_tensor], graph.control_src]).astype(np.int64)
    dst = np.concatenate([graph.edge_dst, graph.control_dst]).astype(np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
    succ = dst[order].tolist()
    heap = [(key[i], i) for i in np.nonzero(indeg == 0)[0].tolist()]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for s in succ[ptr[i]:ptr[i + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (key[s], s))
    return out


def topological_order(graph: OpGraph) -> np.ndarray:
    """Public alias (the static analysis needs an order that holds for appended clones)."""
    return _topological_order(graph)


def split_metadata(graph: OpGraph, op_group: np.ndarray) -> Tuple[OpGraph, np.ndarray]:
    """(graph', op_group'): metadata ops copied into every group that consumes them (see the
    module docstring). Returns the inputs unchanged when no metadata crosses a group."""
    op_group = np.asarray(op_group, dtype=np.int64)
    meta = metadata_ops(graph)
    if not meta.any():
        return graph, op_group
    prod = graph.tensor_op[graph.edge_tensor].astype(np.int64)
    dst = graph.edge_dst.astype(np.int64)
    n = graph.num_ops
    # Groups needing each metadata op: consumers that are not metadata, plus (transitively) the
    # groups needing its metadata consumers. Reverse topological order.
    need: List[set] = [set() for _ in range(n)]
    cons: List[List[int]] = [[] for _ in range(n)]
    for p, d in zip(prod.tolist(), dst.tolist()):
        cons[p].append(d)
    order = _topological_order(graph).tolist()
    for i in reversed(order):
        if not meta[i]:
            continue
        for c in cons[i]:
            need[i] |= need[c] if meta[c] else {int(op_group[c])}
    if all(len(need[i]) <= 1 and (not need[i] or op_group[i] in need[i]) for i in np.nonzero(meta)[0].tolist()):
        return graph, op_group
    # Copy of metadata op i serving group g: the op itself for its home group, else a clone.
    home: Dict[int, int] = {}
    copy_of: Dict[Tuple[int, int], int] = {}
    names, types = list(graph.names), list(graph.op_types)
    new_group = op_group.tolist()
    clone_src: List[int] = []
    for i in order:
        if not meta[i] or not need[i]:
            continue
        groups = sorted(need[i])
        h = int(op_group[i]) if op_group[i] in need[i] else groups[0]
        home[i] = h
        new_group[i] = h
        for g in groups:
            if g == h:
                copy_of[(i, g)] = i
            else:
                copy_of[(i, g)] = len(names)
                names.append(f"{graph.names[i]}{CLONE_SUFFIX}{g}")
                types.append(graph.op_types[i])
                new_group.append(g)
                clone_src.append(i)
    # Tensors of clones (appended), edges: consumers retargeted, clone inputs appended.
    t_op, t_port = graph.tensor_op.tolist(), graph.tensor_port.tolist()
    t_dtype, t_shape = list(graph.tensor_dtype), list(graph.tensor_shape)
    t_bytes, t_axis = graph.tensor_bytes.tolist(), graph.tensor_batch_axis.tolist()
    out_tensors: Dict[int, List[int]] = {}
    for t, o in enumerate(t_op):
        out_tensors.setdefault(o, []).append(t)
    tensor_of_copy: Dict[Tuple[int, int], int] = {}  # (original tensor, copy op) -> tensor
    for c, i in enumerate(clone_src):
        cid = n + c
        for t in out_tensors.get(i, []):
            tensor_of_copy[(t, cid)] = len(t_op)
            t_op.append(cid), t_port.append(t_port[t]), t_dtype.append(t_dtype[t]), t_shape.append(t_shape[t])
            t_bytes.append(t_bytes[t]), t_axis.append(t_axis[t])

    def tensor_for(t: int, g: int) -> int:
        p = t_op[t]
        if p < n and meta[p] and (p, g) in copy_of:
            c = copy_of[(p, g)]
            return t if c == p else tensor_of_copy[(t, c)]
        return t

    e_tensor = graph.edge_tensor.astype(np.int64).tolist()
    e_dst, e_port = dst.tolist(), graph.edge_dst_port.tolist()
    for e in range(len(e_tensor)):
        d = e_dst[e]
        g = new_group[d] if not meta[d] else home.get(d, new_group[d])
        e_tensor[e] = tensor_for(e_tensor[e], g)
    in_edges: Dict[int, List[int]] = {}
    for e, d in enumerate(dst.tolist()):
        in_edges.setdefault(d, []).append(e)
    for c, i in enumerate(clone_src):
        cid, g = n + c, new_group[n + c]
        for e in in_edges.get(i, []):
            e_tensor.append(tensor_for(int(graph.edge_tensor[e]), g))
            e_dst.append(cid), e_port.append(int(graph.edge_dst_port[e]))
    c_src, c_dst = graph.control_src.tolist(), graph.control_dst.tolist()
    for c, i in enumerate(clone_src):
        for s, d in zip(graph.control_src.tolist(), graph.control_dst.tolist()):
            if d == i:
                c_src.append(s), c_dst.append(n + c)
    graph_def = graph.graph_def
    if graph_def is not None:
        by_name = {nd.name: nd for nd in graph_def.node}
        graph_def = type(graph_def)()
        graph_def.CopyFrom(graph.graph_def)
        for c, i in enumerate(clone_src):
            nd = graph_def.node.add()
            nd.CopyFrom(by_name[graph.names[i]])
            nd.name = names[n + c]
    meta_info = dict(graph.meta)
    clone_of = dict(meta_info.get("tfplace_clone_of", {}))
    clone_of.update({names[n + c]: graph.names[i] for c, i in enumerate(clone_src)})
    meta_info["tfplace_clone_of"] = clone_of
    out = dataclasses.replace(
        graph, names=tuple(names), op_types=tuple(types),
        tensor_op=np.array(t_op, dtype=graph.tensor_op.dtype), tensor_port=np.array(t_port, dtype=graph.tensor_port.dtype),
        tensor_dtype=tuple(t_dtype), tensor_shape=tuple(t_shape),
        tensor_bytes=np.array(t_bytes, dtype=graph.tensor_bytes.dtype),
        tensor_batch_axis=np.array(t_axis, dtype=graph.tensor_batch_axis.dtype),
        edge_tensor=np.array(e_tensor, dtype=graph.edge_tensor.dtype), edge_dst=np.array(e_dst, dtype=graph.edge_dst.dtype),
        edge_dst_port=np.array(e_port, dtype=graph.edge_dst_port.dtype),
        control_src=np.array(c_src, dtype=graph.control_src.dtype), control_dst=np.array(c_dst, dtype=graph.control_dst.dtype),
        op_batch_dependent=np.concatenate([graph.op_batch_dependent, graph.op_batch_dependent[clone_src]]).astype(bool),
        meta=meta_info, graph_def=graph_def)
    return out, np.array(new_group, dtype=np.int64)
