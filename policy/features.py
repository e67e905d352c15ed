"""Features of one (op-group graph, cluster, profile) for the placement policy.

Layout (G groups, M directed edges incl. reverse and self edges, D devices); every array is
float32 unless noted, and no width depends on G or D, so one policy serves any graph and cluster:

  nodes     [G, NODE_FEATURES]   per group:
              op-category histogram over OP_CATEGORIES (fractions of the group's ops, sum 1),
              log10(1 + ops), compute: group share of the graph's compute (mean over device kinds)
              and log10 of its seconds on the fastest kind at the global batch, bytes in / out
              (log10(1 + bytes) / 10 and share of the graph's cut bytes), parameter bytes
              (log10 / 10 and share of all params), memory (log10 of output bytes / 10),
              batch-splittable flag, topological position in [0, 1].
  edges     [M, EDGE_FEATURES]   log10(1 + tensor bytes at the global batch) / 10, forward flag,
                                 reverse flag, self-loop flag.
  senders, receivers  int32 [M]  group indices.
  devices   [D, DEVICE_FEATURES] log2 of speed relative to the fastest device, speed share,
                                 memory log10(GB) / 2, memory relative to the largest, NIC and
                                 intra-host bandwidth (log10 B/s / 10), mean and min path bandwidth
                                 to the other devices (log10 B/s / 10), share of devices on its host,
                                 and (last column, DEVICE_RANK_COLUMN) the device's rank among the
                                 devices identical to it (same kind, host and memory) over the
                                 class size: 0 for the first or only one. The rank is read only by
                                 networks built with NetworkConfig.device_rank_feature (see
                                 identical_device_classes).
  pairs     [G, D, PAIR_FEATURES] per (group, device): log2 of the group's seconds on this
                                 device over its fastest-device seconds, log10 seconds (shifted),
                                 group params / device memory.
  globals   [GLOBAL_FEATURES]    log2 batch / 10, log2 D / 4, log2 G / 8, log10 total seconds
                                 (shifted), total params / smallest device memory.
Everything is pure numpy (no TensorFlow).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster
from tfplace.ir.graph_ir import OpGraph
from tfplace.ir.grouping import Grouping, group_graph
from tfplace.formats.profile import Profile

from tfplace.profiling.device_model import device_speed

# Fixed vocabulary of op categories; an op type maps to the first category whose keyword it
# contains (case-sensitive TF op names), else "other". Order matters ("Grad" before "Conv").
OP_CATEGORIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("input", ("Placeholder", "IteratorGetNext")),
    ("variable", ("VarHandleOp", "VariableV2", "ReadVariableOp", "Variable")),
    ("optimizer", ("Apply", "AssignAdd", "AssignSub", "AssignVariableOp", "Assign")),
    ("conv_grad", ("Conv2DBackprop", "Conv3DBackprop", "DepthwiseConv2dNativeBackprop")),
    ("conv", ("Conv", "DepthwiseConv")),
    ("matmul", ("MatMul", "Einsum")),
    ("norm", ("BatchNorm", "LayerNorm", "Rsqrt", "Moments")),
    ("activation_grad", ("ReluGrad", "SigmoidGrad", "TanhGrad", "SoftmaxCrossEntropy", "EluGrad", "Relu6Grad")),
    ("activation", ("Relu", "Sigmoid", "Tanh", "Softmax", "Elu", "Gelu", "Erf", "Selu")),
    ("pool", ("Pool",)),
    ("reduce", ("Sum", "Mean", "Max", "Min", "Prod", "BiasAddGrad", "AddN", "ArgMax")),
    ("elementwise", ("Add", "Sub", "Mul", "Div", "Sqrt", "Square", "Exp", "Log", "Neg", "Pow", "Maximum",
                     "Minimum", "Cast", "Select", "Equal", "Greater", "Less", "BiasAdd")),
    ("shape", ("Reshape", "Transpose", "Shape", "Squeeze", "ExpandDims", "Concat", "Split", "Slice", "Pack",
               "Unpack", "Tile", "Gather", "Pad", "Fill", "ZerosLike", "OnesLike", "BroadcastTo", "Range")),
    ("const", ("Const", "Identity", "NoOp", "StopGradient")),
    ("other", ()),
)
CATEGORY_NAMES = tuple(name for name, _ in OP_CATEGORIES)
NODE_FEATURES = len(OP_CATEGORIES) + 11
EDGE_FEATURES = 4
DEVICE_FEATURES = 10
DEVICE_RANK_COLUMN = 9  # the last device column; older policies read the columns before it
PAIR_FEATURES = 3
GLOBAL_FEATURES = 5


def op_category(op_type: str) -> int:
    """Index into OP_CATEGORIES of an op type."""
    for i, (_, keys) in enumerate(OP_CATEGORIES):
        if any(k in op_type for k in keys):
            return i
    return len(OP_CATEGORIES) - 1


@dataclasses.dataclass(frozen=True, eq=False)
class GraphFeatures:
    """Feature arrays of one (graph, cluster); see the module docstring for the layout."""
    nodes: np.ndarray
    edges: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    devices: np.ndarray
    pairs: np.ndarray
    globals: np.ndarray

    def __post_init__(self):
        g, d = self.nodes.shape[0], self.devices.shape[0]
        checks = {"nodes": (g, NODE_FEATURES), "edges": (len(self.senders), EDGE_FEATURES),
                  "receivers": (len(self.senders),), "devices": (d, DEVICE_FEATURES),
                  "pairs": (g, d, PAIR_FEATURES), "globals": (GLOBAL_FEATURES,)}
        for name, shape in checks.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"GraphFeatures.{name}: shape {getattr(self, name).shape}, expected {shape}")
            if not np.all(np.isfinite(getattr(self, name))):
                raise ValueError(f"GraphFeatures.{name}: non-finite values")

    @property
    def num_groups(self) -> int:
        return self.nodes.shape[0]

    @property
    def num_devices(self) -> int:
        return self.devices.shape[0]

    def as_observation(self) -> Dict[str, np.ndarray]:
        """The dict the environment emits (keys = `observation_keys()`)."""
        return {k: getattr(self, k) for k in observation_keys()}


def observation_keys() -> Tuple[str, ...]:
    return ("nodes", "edges", "senders", "receivers", "devices", "pairs", "globals")


def _log_bytes(x) -> np.ndarray:
    return np.log10(1.0 + np.asarray(x, dtype=np.float64)) / 10.0


def group_seconds(graph: OpGraph, grouping: Grouping, profile: Profile, kinds, batch_size: int) -> np.ndarray:
    """[G, K] seconds of each group on one device of each kind running the whole batch."""
    out = np.zeros((grouping.num_groups, len(kinds)))
    for k, kind in enumerate(kinds):
        per_op = np.array([profile.seconds(n, kind, batch_size) if profile.has(n, kind) else 0.0
                           for n in graph.names])
        out[:, k] = np.bincount(grouping.op_group, weights=per_op, minlength=grouping.num_groups)
    return out


def _node_features(graph: OpGraph, grouping: Grouping, seconds: np.ndarray, gg, batch: int) -> np.ndarray:
    g = grouping.num_groups
    hist = np.zeros((g, len(OP_CATEGORIES)))
    cats = np.array([op_category(t) for t in graph.op_types])
    np.add.at(hist, (grouping.op_group, cats), 1.0)
    n_ops = hist.sum(axis=1)
    hist /= np.maximum(n_ops, 1.0)[:, None]
    mean_s = seconds.mean(axis=1)
    fast_s = seconds.min(axis=1)
    tbytes = graph.tensor_bytes_at(batch)
    cut = tbytes_cut(graph, grouping, tbytes, gg)
    b_in = np.bincount(gg.edge_dst_group, weights=cut, minlength=g)
    b_out = np.bincount(gg.edge_src_group, weights=cut, minlength=g)
    total_cut = max(cut.sum(), 1.0)
    params = np.zeros(g)
    for v in graph.variables:
        params[grouping.op_group[v.op]] += v.num_bytes
    out_bytes = np.bincount(grouping.op_group[graph.tensor_op], weights=tbytes, minlength=g)
    cols = [hist, np.log10(1 + n_ops)[:, None] / 3,
            (mean_s / max(mean_s.sum(), 1e-12))[:, None], (np.log10(fast_s + 1e-9) + 9)[:, None] / 9,
            _log_bytes(b_in)[:, None], _log_bytes(b_out)[:, None],
            ((b_in + b_out) / (2 * total_cut))[:, None],
            _log_bytes(params)[:, None], (params / max(params.sum(), 1.0))[:, None],
            _log_bytes(out_bytes)[:, None], grouping.group_batch_splittable.astype(np.float64)[:, None],
            (np.arange(g) / max(g - 1, 1))[:, None]]
    return np.concatenate(cols, axis=1)


def tbytes_cut(graph: OpGraph, grouping: Grouping, tbytes: np.ndarray, gg) -> np.ndarray:
    """Edge bytes of the group graph at the global batch (group_graph gives reference-batch bytes)."""
    scale = tbytes.sum() / max(graph.tensor_bytes.sum(), 1)
    return gg.edge_bytes.astype(np.float64) * scale


def _edges(gg, g: int, cut: np.ndarray):
    fwd = np.stack([_log_bytes(cut), np.ones_like(cut), np.zeros_like(cut), np.zeros_like(cut)], axis=1)
    rev = fwd.copy()
    rev[:, 1], rev[:, 2] = 0.0, 1.0
    selfs = np.zeros((g, EDGE_FEATURES))
    selfs[:, 3] = 1.0
    senders = np.concatenate([gg.edge_src_group, gg.edge_dst_group, np.arange(g)]).astype(np.int32)
    receivers = np.concatenate([gg.edge_dst_group, gg.edge_src_group, np.arange(g)]).astype(np.int32)
    return np.concatenate([fwd, rev, selfs]), senders, receivers


def identical_device_classes(cluster: Cluster) -> Tuple[Tuple[int, ...], ...]:
    """The cluster's devices grouped into classes of identical ones (same kind, host and memory:
    same speed and the same links), each in device order; singletons included.

    A permutation-equivariant network gives identical devices identical outputs, so its greedy
    strategy cannot put one group on the first of two identical GPUs and the next group on the
    second (op-level model parallelism). The rank inside the class (a device feature) lets it,
    and pre-training orders each target's identical devices the same way
    (tfplace.policy.actions.canonical_device_order) so that the rank means the same thing in
    every target."""
    classes: Dict[tuple, list] = {}
    for i, dev in enumerate(cluster.devices):
        classes.setdefault((dev.kind, dev.host, int(cluster.memory_bytes[i])), []).append(i)
    return tuple(tuple(c) for c in classes.values())


def _class_rank(cluster: Cluster) -> np.ndarray:
    """[D] rank of each device inside its identical class over the class size, in [0, 1)."""
    out = np.zeros(cluster.num_devices)
    for members in identical_device_classes(cluster):
        for rank, i in enumerate(members):
            out[i] = rank / len(members)
    return out


def device_features(cluster: Cluster) -> np.ndarray:
    d = cluster.num_devices
    speed = np.array([float(device_speed(x)) for x in cluster.devices])
    mem = cluster.memory_bytes.astype(np.float64)
    bw = np.array([[cluster.path_bandwidth_bytes_per_s(i, j) if i != j else np.nan for j in range(d)]
                   for i in range(d)]) if d > 1 else np.full((1, 1), np.nan)
    mean_bw = np.nan_to_num(np.nanmean(bw, axis=1), nan=1e12) if d > 1 else np.array([1e12])
    min_bw = np.nan_to_num(np.nanmin(bw, axis=1), nan=1e12) if d > 1 else np.array([1e12])
    hosts = [x.host for x in cluster.devices]
    host_share = np.array([hosts.count(h) / d for h in hosts])
    nic = np.array([cluster.host_of(i).nic_bandwidth_bytes_per_s for i in range(d)])
    intra = np.array([cluster.host_of(i).intra_bandwidth_bytes_per_s for i in range(d)])
    cols = [np.log2(speed / speed.max()), speed / speed.sum(), np.log10(mem / 1e9 + 1e-3) / 2, mem / mem.max(),
            np.log10(nic) / 10, np.log10(intra) / 10, np.log10(mean_bw) / 10, np.log10(min_bw) / 10, host_share,
            _class_rank(cluster)]
    return np.stack(cols, axis=1)


def build_features(graph: OpGraph, grouping: Grouping, cluster: Cluster, profile: Profile,
                   batch_size: int) -> GraphFeatures:
    """All feature arrays for the policy (see the module docstring)."""
    kinds = cluster.kinds
    seconds = group_seconds(graph, grouping, profile, kinds, batch_size)  # [G, K]
    gg = group_graph(graph, grouping)
    cut = tbytes_cut(graph, grouping, graph.tensor_bytes_at(batch_size), gg)
    nodes = _node_features(graph, grouping, seconds, gg, batch_size)
    edges, senders, receivers = _edges(gg, grouping.num_groups, cut)
    kind_idx = np.array([kinds.index(d.kind) for d in cluster.devices])
    per_dev = seconds[:, kind_idx]  # [G, D]
    fastest = np.maximum(per_dev.min(axis=1, keepdims=True), 1e-12)
    params = np.zeros(grouping.num_groups)
    for v in graph.variables:
        params[grouping.op_group[v.op]] += v.num_bytes
    mem = cluster.memory_bytes.astype(np.float64)
    pairs = np.stack([np.log2(np.maximum(per_dev, 1e-12) / fastest) / 4,
                      (np.log10(per_dev + 1e-9) + 9) / 9,
                      params[:, None] / mem[None, :]], axis=2)
    total_s = seconds.min(axis=0).min() if seconds.size else 0.0
    glob = np.array([math.log2(batch_size) / 10, math.log2(cluster.num_devices + 1) / 4,
                     math.log2(grouping.num_groups + 1) / 8, (math.log10(total_s + 1e-9) + 9) / 9,
                     graph.param_bytes / mem.min()])
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    return GraphFeatures(f32(nodes), f32(edges), senders, receivers, f32(device_features(cluster)), f32(pairs),
                         f32(glob))
