"""Fakes for the lowering and simulator tests and docs: small hand-built graphs, groupings,
profiles and clusters (no TensorFlow). `tfplace.testing` holds the fakes shared by all parts.

`op_graph` builds an OpGraph from a readable op list; every op has at most one output (port 0).
`profile_table` builds a Profile from seconds at the reference batch: ops marked batched scale
linearly with the per-device batch, others cost the same at every batch.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from tfplace.formats.cluster import Device, Host, build_cluster
from tfplace.ir.graph_ir import OpGraph, Variable
from tfplace.ir.grouping import Grouping
from tfplace.formats.profile import Profile


def op_graph(ops: Sequence[Tuple], edges: Sequence[Tuple[str, str]], batch: int = 8,
             variables: Sequence[Tuple] = (), control: Sequence[Tuple[str, str]] = (),
             loss: str = "", loss_reduction: str = "mean") -> OpGraph:
    """ops: (name, type, out_bytes at `batch` or None for no output, batched output, batch dependent),
    in topological order; edges: (producer, consumer) of the producer's output; variables:
    (handle, readers, updaters, bytes, is_slot); control: (src, dst)."""
    names = [o[0] for o in ops]
    idx = {n: i for i, n in enumerate(names)}
    with_out = [o for o in ops if o[2] is not None]
    tensor_of = {o[0]: t for t, o in enumerate(with_out)}
    batch_dep = np.array([o[4] for o in ops], dtype=bool)
    inputs = tuple(idx[o[0]] for o in ops if o[1] == "Placeholder")
    vs = tuple(Variable(op=idx[h], name=h, dtype="float32", shape=(int(b) // 4,), num_bytes=int(b),
                        readers=tuple(idx[r] for r in rd), updaters=tuple(idx[u] for u in up), is_slot=slot)
               for h, rd, up, b, slot in variables)
    return OpGraph(
        names=tuple(names), op_types=tuple(o[1] for o in ops),
        tensor_op=np.array([idx[o[0]] for o in with_out], dtype=np.int32),
        tensor_port=np.zeros(len(with_out), dtype=np.int32),
        tensor_dtype=tuple("float32" for _ in with_out),
        tensor_shape=tuple((int(o[2]) // 4,) for o in with_out),
        tensor_bytes=np.array([o[2] for o in with_out], dtype=np.int64),
        tensor_batch_axis=np.array([0 if o[3] else -1 for o in with_out], dtype=np.int8),
        edge_tensor=np.array([tensor_of[p] for p, _ in edges], dtype=np.int32),
        edge_dst=np.array([idx[c] for _, c in edges], dtype=np.int32),
        edge_dst_port=np.zeros(len(edges), dtype=np.int32),
        control_src=np.array([idx[s] for s, _ in control], dtype=np.int32),
        control_dst=np.array([idx[d] for _, d in control], dtype=np.int32),
        op_batch_dependent=batch_dep, variables=vs, inputs=inputs, sink=len(names) - 1,
        loss_tensor=tensor_of[loss] if loss else -1, loss_reduction=loss_reduction,
        reference_batch_size=batch, source="sim_fakes")


def grouping(graph: OpGraph, groups: Sequence[Sequence[str]] = ()) -> Grouping:
    """Listed op sets form groups (named by their first op); every other op is its own group."""
    op_group = np.full(graph.num_ops, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        op_group[[graph.index(m) for m in members]] = g
    nxt = len(groups)
    for i in range(graph.num_ops):
        if op_group[i] < 0:
            op_group[i] = nxt
            nxt += 1
    first = {}
    for i, g in enumerate(op_group.tolist()):
        first.setdefault(g, i)
    names = tuple(graph.names[first[g]] for g in range(nxt))
    return Grouping(op_group=op_group.astype(np.int32), group_names=names,
                    group_batch_splittable=np.zeros(nxt, dtype=bool))


def profile_table(graph: OpGraph, seconds: Dict[str, Dict[str, float]], linear: Sequence[str] = None) -> Profile:
    """seconds[op][kind] at the reference batch; ops in `linear` (default: batch-dependent ops
    with a batched output) scale linearly with the per-device batch, the others are constant."""
    ref = graph.reference_batch_size
    if linear is None:
        batched = np.zeros(graph.num_ops, dtype=bool)
        batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
        scaling = batched & graph.op_batch_dependent
    else:
        scaling = np.isin(np.array(graph.names), list(linear))
    ops = {}
    for i, name in enumerate(graph.names):
        ops[name] = {k: (((ref,), (s,)) if scaling[i] else ((1, ref), (s, s))) for k, s in seconds[name].items()}
    return Profile(ops=ops, graph="fake")


def pair_cluster(bandwidth: float = 1.2e10, latency: float = 5e-6, memory=(16 * 10**9, 12 * 10**9),
                 straggle=(0.0, 1.0)):
    """One host, a V100 and a P100, intra-host links of `bandwidth` and `latency`."""
    host = Host("h0", intra_bandwidth_bytes_per_s=bandwidth, intra_latency_s=latency)
    return build_cluster("pair", [host], [
        Device("v100_0", "V100", "h0", memory[0], straggle_probability=straggle[0], straggle_factor=straggle[1]),
        Device("p100_0", "P100", "h0", memory[1])])


def quad_cluster(intra: float = 1.2e10, nic: float = 1.25e9, memory: int = 16 * 10**9):
    """Two hosts with two V100s each; NICs of `nic` bytes/s."""
    hosts = [Host(h, nic_bandwidth_bytes_per_s=nic, intra_bandwidth_bytes_per_s=intra) for h in ("h0", "h1")]
    devs = [Device(f"v100_{i}", "V100", "h0" if i < 2 else "h1", memory, task=i // 2) for i in range(4)]
    return build_cluster("quad", hosts, devs)


def dp_graph(weight_bytes: int = 1_200_000, batch: int = 8, reduction: str = "mean") -> OpGraph:
    """x -> f = MatMul(x, read(w)) -> g = MatMul(x, f) (the weight gradient, a partial value)
    -> apply(w, lr, g) -> train_op. Activations 8000 bytes at batch 8."""
    ops = [("x", "Placeholder", 8000, True, True), ("w", "VarHandleOp", 8, False, False),
           ("r", "ReadVariableOp", weight_bytes, False, False), ("lr", "Const", 4, False, False),
           ("f", "MatMul", 8000, True, True), ("g", "MatMul", weight_bytes, False, True),
           ("apply", "ResourceApplyGradientDescent", None, False, True), ("train_op", "NoOp", None, False, False)]
    edges = [("w", "r"), ("x", "f"), ("r", "f"), ("x", "g"), ("f", "g"), ("w", "apply"), ("lr", "apply"), ("g", "apply")]
    return op_graph(ops, edges, batch=batch, variables=[("w", ["r"], ["apply"], weight_bytes, False)],
                    control=[("apply", "train_op")], loss="f", loss_reduction=reduction)


def dp_profile(graph: OpGraph, v100_per_sample: float = 1e-4, p100_per_sample: float = 2e-4,
               apply_s: float = 1e-4) -> Profile:
    """f and g cost per_sample × batch on each kind; apply costs apply_s; everything else 0."""
    ref = graph.reference_batch_size
    table = {n: {"V100": 0.0, "P100": 0.0} for n in graph.names}
    for n in ("f", "g"):
        table[n] = {"V100": v100_per_sample * ref, "P100": p100_per_sample * ref}
    table["apply"] = {"V100": apply_s, "P100": apply_s}
    return profile_table(graph, table, linear=("f", "g"))


def random_graph(rng: np.random.Generator, num_ops: int = 12, num_vars: int = 2, batch: int = 8) -> OpGraph:
    """A random training-step-like DAG: an input, random batched/unbatched ops, and per variable
    a read, a use, a partial gradient and an update; the sink has control inputs from every
    update."""
    ops = [("x", "Placeholder", 64 * batch, True, True)]
    edges = []
    dep = {"x": True}
    for k in range(num_ops):
        name = f"op{k}"
        srcs = sorted(set(rng.choice([o[0] for o in ops if o[2] is not None], size=min(2, len(ops)), replace=True).tolist()))
        bdep = any(dep[s] for s in srcs) or rng.random() < 0.2
        batched = bdep and rng.random() < 0.7
        nbytes = int(rng.integers(1, 64)) * (4 * batch if batched else 16)
        ops.append((name, "Op", nbytes, batched, bdep))
        dep[name] = bdep
        edges += [(s, name) for s in srcs]
    variables, applies = [], []
    batched_ops = [o[0] for o in ops if o[3]]
    for v in range(num_vars):
        w, r, use, grad, apply = f"w{v}", f"r{v}", f"use{v}", f"grad{v}", f"apply{v}"
        wbytes = int(rng.integers(1, 200)) * 64
        ops += [(w, "VarHandleOp", 8, False, False), (r, "ReadVariableOp", wbytes, False, False),
                (use, "MatMul", 32 * batch, True, True), (grad, "MatMul", wbytes, False, True),
                (apply, "ResourceApplyGradientDescent", None, False, True)]
        src = str(rng.choice(batched_ops))
        edges += [(w, r), (src, use), (r, use), ("x", grad), (use, grad), (w, apply), (grad, apply)]
        variables.append((w, [r], [apply], wbytes, False))
        applies.append(apply)
    ops.append(("train_op", "NoOp", None, False, False))
    return op_graph(ops, edges, batch=batch, variables=variables, control=[(a, "train_op") for a in applies])


def random_strategy(rng: np.random.Generator, group_names, device_names, batch: int = 8):
    """Random shares (some micro-batched), random sync and PS device, random priorities."""
    from tfplace.testing import random_strategy as shared_random_strategy
    return shared_random_strategy(rng, group_names, device_names, batch)


def lower_with_overheads(graph, grouping_, cluster, strategy, profile, overheads: Dict):
    """The PlacedGraph the simulator runs for `strategy` on a CPU-emulated cluster: the lowering's,
    through the runtime-overhead pass with `overheads` (a tfplace.runtime_overheads object as
    JSON; validated as a file would be)."""
    from tfplace.lowering.lower import lower
    from tfplace.overheads.apply import apply
    from tfplace.overheads.model import overheads_from_json
    typed = overheads_from_json(overheads, "overheads.json")
    return apply(lower(graph, grouping_, cluster, strategy, profile), cluster, typed)
