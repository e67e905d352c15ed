"""The rewrite pass: emits the PlacedGraph of a strategy as a TensorFlow GraphDef.

    step = rewrite_step(graph, strategy, cluster)       # RewrittenStep: GraphDef + names to run
    graph_def = rewrite(graph, strategy, cluster)       # the GraphDef alone

Every decision comes from `tfplace.lowering.lower.lower`; this module only translates tasks to ops:

  COMPUTE    op i's instance k becomes `<op>/replica_<k>` on the instance's device (the cluster's
             `tf_device`), a copy of the original NodeDef whose data inputs are the buffers the
             PlacedGraph lists in port order. Variable handles get `shared_name` = their new name,
             so mirrors are distinct resources. An update op reads the handle instance on its own
             device (checked: every updater is pinned with its variable). A random op's instance
             k > 0 gets its own seeds, derived from the original's and k
             (`nodes.reseed_replica`): replicas never draw the same mask.
  inputs     the original placeholders stay, under their names, on the *feed device* (the device
             of the first input's first replica); the runtime feeds the global batch and replica
             k is a StridedSlice [lo, hi) of it on the feed device, so only the slice travels (the
             lowering's feed-slice TRANSFER, which emits nothing of its own); an instance on
             another device is an Identity there of that slice, read by all of its readers.
  TRANSFER   an Identity on the destination device (gRPC Send/Recv); a batched slice of a larger
             buffer is cut (StridedSlice) on the source device first. Resource handles are never
             copied: the reader refers to the handle directly. A bucket of whole gradients (to a
             PS) is packed on the source, sent as one tensor and split on the destination.
  RESPLIT    slices of the overlapping inputs, concatenated on the task's device.
  SUM        AddN on its device. COLLECTIVE: among GPUs (or with cpu_all_reduce="collective") one
             CollectiveReduceV2 (merge Add, final Id; "nccl" hint on GPUs) per participant, one
             group key per participant set, one instance key per collective task; among CPU
             devices an exchange over Send/Recv (`nodes.exchange_all_reduce`: each participant's
             packed gradients cut into n shards, shard j summed on participant j, every sum sent
             to every participant, and each gradient sliced out of the sums that hold it), which
             TF's gRPC runtime moves faster than its collectives. A bucket of several gradients is
             packed (flattened, concatenated) first and unpacked after.
  weights    where a replica's partial value (a weight gradient, a batch statistic) first enters
             an aggregation (SUM, COLLECTIVE or an update instance), it is multiplied by the
             PlacedGraph's task_weight (samples/B) if tensor_weight_mean, else used as is.
  PS         the send-back of a PS group is ReadVariableOp on the server (after the updates)
             and AssignVariableOp into each other mirror; a bucket of variables is read, packed,
             sent as one tensor, split and assigned.
  control    dependencies of the PlacedGraph that are not data reads become control inputs
             (original control edges per replica, send-back after updates); a control message
             task (an edge across devices) becomes the control input it stands for.
  priorities one topological order of all tasks, ties broken by the PlacedGraph's priority
             then task id; on every device consecutive tasks are chained by control edges
             (handles, constants and inputs excluded, they are shared with the init op).
  init       the original init op's subgraph runs once, on the devices of instance 0; then every
             other mirror is assigned from instance 0 (`<init>` runs all of it).
  step       `<sink>` (the original train op name) is a NoOp on the feed device after every task
             without successors; a device's "done" message is a NoOp on that device after the
             tasks it waits for (one control message per device), and after every collective
             participant there whose result nothing reads (a participant TF prunes never joins
             its all-reduce: the others wait forever); `<loss>` (original name when
             it is output 0) is the weighted sum of the replicas' losses: one step equals
             single-device training.
"""

from __future__ import annotations

import dataclasses
import heapq
import zlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from tfplace.rewrite import nodes as rn
from tfplace.formats.cluster import Cluster, is_cpu_kind, tf_device_string
from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import OpGraph
from tfplace.lowering.placed_graph import (TASK_COLLECTIVE, TASK_COMPUTE, TASK_RESPLIT, TASK_SUM, TASK_TRANSFER,
                                  PlacedGraph)
from tfplace.formats.strategy import Strategy

# Step ops that must not join priority chains: the init op shares them.
_UNCHAINED_TYPES = frozenset({"VarHandleOp", "Const", "Placeholder", "PlaceholderWithDefault"})
# Placeholders the script may feed that are not batch inputs: kept once under their own names.
FED_TYPES = ("Placeholder", "PlaceholderWithDefault")
_DROP_ATTRS = ("_class", "_output_shapes")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One placeholder the runtime feeds with the global batch."""
    tensor: str
    dtype: str
    shape: Tuple[int, ...]
    batch_axis: int
    max_value: Optional[int] = None


@dataclasses.dataclass(frozen=True, eq=False)
class RewrittenStep:
    """A rewritten training step.

    Attributes:
      graph_def: the GraphDef (step + init + variable reads).
      train_op: op name that runs one step; init_op: op name that initialises every mirror.
      loss: tensor name of the global loss ("" if the graph names no loss).
      inputs: placeholders to feed with the global batch.
      feeds: the other placeholders, under their own names (a learning rate, keep_prob): tensor
        name -> True when it must be fed (Placeholder), False when it has a default.
      variables: original variable name -> read tensors of its mirrors (instance order).
      placed: the PlacedGraph that was emitted.
    """
    graph_def: Any
    train_op: str
    init_op: str
    loss: str
    inputs: Tuple[InputSpec, ...]
    variables: Mapping[str, Tuple[str, ...]]
    placed: PlacedGraph
    feeds: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    source: str = ""


def rewrite(graph, strategy: Strategy, cluster: Cluster, **kwargs):
    """The rewritten GraphDef; see `rewrite_step` for the arguments."""
    return rewrite_step(graph, strategy, cluster, **kwargs).graph_def


def rewrite_step(graph, strategy: Strategy, cluster: Cluster, *, grouping=None, profile=None,
                 placed: Optional[PlacedGraph] = None, key_base: Optional[int] = None,
                 init_op: Optional[str] = None, cpu_all_reduce: str = rn.CPU_ALL_REDUCE[0],
                 private_functions: bool = True) -> RewrittenStep:
    """Lowers `strategy` (unless `placed` is given) and emits it as TF ops.

    Args:
      graph: an OpGraph with its graph_def, or a bundle path (`load_op_graph`).
      grouping: the grouping the strategy's group names refer to (default: make_grouping at
        strategy.max_groups); profile: only its run_order affects the graph, through
        priority ties (default: tfplace.profiling.structural, ties in the graph's op order).
      key_base: first collective instance key (default: derived from graph and strategy).
      init_op: the variable initializer op (default: the bundle's `init_op`, else "init").
      cpu_all_reduce: how an all-reduce among CPU devices is emitted: "exchange" (shards over
        Send/Recv, the default) or "collective" (CollectiveReduceV2, as on GPUs).
      private_functions: rename the library's functions and drop their bodies' colocation
        (nodes.private_function_library: wherever TensorFlow inlines the replicas' function
        calls). The Grappler plugin keeps them: its session runs If ops as functions
        (grappler.session_config) and knows only the library it was given.
    """
    if cpu_all_reduce not in rn.CPU_ALL_REDUCE:
        raise InputError("argument", "cpu_all_reduce", f"unknown value {cpu_all_reduce!r}",
                         f"use one of {', '.join(rn.CPU_ALL_REDUCE)}")
    if not isinstance(graph, OpGraph):
        from tfplace.ir.loader import load_op_graph
        graph = load_op_graph(graph)
    if graph.graph_def is None:
        raise InputError(graph.source or "graph", "graph_def", "the OpGraph carries no GraphDef",
                         "load it with tfplace.ir.loader.load_op_graph")
    check_batch(graph, strategy)
    from tfplace.ir.grouping import make_grouping
    if grouping is None and (placed is None or len(placed.op_names) != graph.num_ops):
        grouping = make_grouping(graph, strategy.max_groups)
    if placed is None:
        from tfplace.lowering.lower import Lowerer
        if profile is None:  # the rewrite needs the tasks, not their costs
            from tfplace.profiling.structural import structural_profile
            profile = structural_profile(graph, cluster.kinds)
        lowerer = Lowerer(graph, grouping, cluster, profile)
        placed = lowerer.lower(strategy)
        graph = lowerer.graph  # with the lowering's metadata clones (tfplace.lowering.meta)
    elif len(placed.op_names) != graph.num_ops:
        from tfplace.lowering.meta import split_metadata
        graph = split_metadata(graph, grouping.op_group)[0]
    if placed.has_runtime_overheads:
        raise InputError(graph.source or "graph", "placed", "the PlacedGraph went through the runtime-overhead pass",
                         "pass the lowering's own PlacedGraph (tfplace.lowering.lower), before tfplace.overheads.apply")
    if tuple(placed.op_names) != tuple(graph.names):
        raise InputError(graph.source or "graph", "placed", "the PlacedGraph was lowered from another graph",
                         "pass the OpGraph and grouping the strategy was lowered with")
    if key_base is None:
        key_base = 1 + zlib.crc32(repr((graph.names, strategy.to_json())).encode()) % (2 ** 29)
    step = _Emitter(graph, placed, cluster, key_base, init_op, cpu_all_reduce).run()
    if private_functions:
        rn.private_function_library(step.graph_def)
    return step


def check_batch(graph: OpGraph, strategy: Strategy) -> None:
    """Raises InputError naming the strategy's global_batch_size when it is not the batch the
    graph is built for: the rewritten step feeds the graph's own inputs, whole, and splits them
    (a simulation may scale a graph to another batch; a real step cannot)."""
    if strategy.global_batch_size != graph.reference_batch_size:
        b, ref = strategy.global_batch_size, graph.reference_batch_size
        raise InputError(strategy.source or "strategy", "global_batch_size",
                         f"is {b}, but the graph{' ' + graph.source if graph.source else ''} is built for a "
                         f"global batch of {ref}",
                         f"use a strategy made for batch {ref} (e.g. python -m tfplace.plan --graph with that graph), "
                         f"or a graph exported at batch {b}")


class _Emitter:
    def __init__(self, graph: OpGraph, placed: PlacedGraph, cluster: Cluster, key_base: int,
                 init_op: Optional[str] = None, cpu_all_reduce: str = rn.CPU_ALL_REDUCE[0]):
        self.g, self.p, self.key_base, self.init_override = graph, placed, key_base, init_op
        self.cpu_all_reduce = cpu_all_reduce
        self.dev = [cluster.devices[cluster.device_index(n)].tf_device for n in placed.device_names]
        self.gpu = [not is_cpu_kind(cluster.devices[cluster.device_index(n)].kind) for n in placed.device_names]
        # the host CPU of each device's task (seed arithmetic of random ops: host-memory inputs)
        self.host = [tf_device_string(cluster.devices[cluster.device_index(n)].task, "CPU", 0)
                     for n in placed.device_names]
        self.orig = {n.name: n for n in graph.graph_def.node}
        self.variable_of = {v.op: v for v in graph.variables}  # handle op -> Variable (send-backs)
        self.nodes: Dict[str, Any] = {}
        self.feeds: Dict[str, bool] = {}  # RewrittenStep.feeds, filled by _fed_placeholder
        self.extra_ctrl: Dict[str, List[str]] = {}
        self.task_node: Dict[Tuple[int, int], str] = {}  # (task, device) -> node (chains, control)
        self._buf_names: Dict[int, str] = {}
        self._weighted: Dict[Tuple[int, int], str] = {}
        # the aggregation weights, (buffer, device) -> weight: the same reads the lowering costs
        w_buf, w_dev, w_val, _ = placed.weighted_reads(graph.tensor_batch_axis)
        self._weights = {(int(b), int(d)): float(w) for b, d, w in zip(w_buf, w_dev, w_val)}
        p = placed
        self.buf_tensor_dtype = lambda b: graph.tensor_dtype[p.buf_tensor[b]]
        self.loss_mean = placed.tensor_mean_scaled  # decided by the lowering
        if len(self.loss_mean) != graph.num_tensors:
            raise InputError(graph.source or "graph", "placed", "the PlacedGraph has no tensor_mean_scaled",
                             "lower it with this version of tfplace.lowering.lower")
        # Entries per sample along each batch axis (decided by the lowering; empty: 1 everywhere).
        rows = placed.tensor_batch_rows
        self.rows = (np.asarray(rows, dtype=np.int64) if len(rows) == graph.num_tensors
                     else np.ones(graph.num_tensors, dtype=np.int64))
        first_input = graph.inputs[0]
        self.feed_dev = self.dev[p.task_device[p.op_task_ptr[first_input]]]

    # ---- names ---------------------------------------------------------------------------------
    def inst(self, t: int) -> str:
        op = int(self.p.task_op[t])
        return f"{self.g.names[op]}/replica_{t - int(self.p.op_task_ptr[op])}"

    def bname(self, b: int) -> str:
        """TF tensor name of buffer b."""
        name = self._buf_names.get(b)
        if name is None:
            p = self.p
            t = int(p.buf_task[b])
            kind = p.task_kind[t]
            if kind == TASK_COMPUTE:
                name = f"{self.inst(t)}:{int(self.g.tensor_port[p.buf_tensor[b]])}"
            elif kind == TASK_TRANSFER and self.buf_tensor_dtype(b) == "resource":
                name = self.bname(int(p.in_buf[p.in_ptr[t]]))
            elif kind == TASK_COLLECTIVE and self._bucketed(t):
                name = f"tfplace/allreduce_{t}/d{int(p.buf_device[b])}/t{int(p.buf_tensor[b])}:0"
            elif kind == TASK_TRANSFER and self._bucketed(t):
                name = f"tfplace/transfer_{t}/t{int(p.buf_tensor[b])}:0"
            elif kind == TASK_COLLECTIVE:
                name = f"tfplace/allreduce_{t}/d{int(p.buf_device[b])}:0"
            else:
                name = f"tfplace/{('', 'resplit', 'sum', 'transfer')[kind]}_{t}:0"
            self._buf_names[b] = name
        return name

    def add(self, *nodes) -> None:
        for n in nodes:
            for key in _DROP_ATTRS:
                if key in n.attr:
                    del n.attr[key]
            self.nodes[n.name] = n

    def reads(self, t: int) -> np.ndarray:
        return self.p.in_buf[self.p.in_ptr[t]:self.p.in_ptr[t + 1]]

    def weighted(self, b: int, d: int) -> str:
        """Buffer b as an aggregation input on device d: a raw replica partial (possibly after
        transfers) is scaled by its task weight where the tensor is mean-weighted
        (PlacedGraph.weighted_reads decides which, for the rewrite and the costs alike)."""
        w = self._weights.get((b, d))
        if w is None:
            return self.bname(b)
        if (b, d) not in self._weighted:
            name = f"tfplace/weighted_{b}_d{d}"
            self.add(*rn.scaled(name, self.dev[d], self.bname(b), w, self.buf_tensor_dtype(b)))
            self._weighted[(b, d)] = name + ":0"
        return self._weighted[(b, d)]

    # ---- tasks ---------------------------------------------------------------------------------
    def run(self) -> RewrittenStep:
        p = self.p
        for t in range(p.num_tasks):
            kind = p.task_kind[t]
            if kind == TASK_COMPUTE:
                self.compute(t)
            elif kind == TASK_TRANSFER:
                self.transfer(t)
            elif kind == TASK_RESPLIT:
                self.resplit(t)
            elif kind == TASK_SUM:
                d = int(p.task_device[t])
                name = f"tfplace/sum_{t}"
                ins = [self.weighted(int(b), d) for b in self.reads(t)]
                self.add(rn.add_n(name, self.dev[d], ins, self.g.tensor_dtype[p.task_tensor[t]]))
                self.task_node[(t, d)] = name
            else:
                self.collective(t)
        self.control_edges()
        self.priority_chains()
        init_op = self.init_subgraph()
        loss = self.global_loss()
        train_op = self.train_op()
        variables = self.variable_reads()
        for name, ctrl in self.extra_ctrl.items():
            have = set(self.nodes[name].input)
            self.nodes[name].input.extend(c for c in dict.fromkeys(ctrl) if c not in have)
        from tensorflow.core.framework import graph_pb2
        out = graph_pb2.GraphDef()
        out.versions.CopyFrom(self.g.graph_def.versions)
        out.library.CopyFrom(self.g.graph_def.library)
        out.node.extend(self.nodes.values())
        inputs = tuple(self.input_spec(i) for i in self.g.inputs)
        return RewrittenStep(out, train_op, init_op, loss, inputs, variables, p, self.feeds, self.g.source or "")

    def compute(self, t: int) -> None:
        p, g = self.p, self.g
        op = int(p.task_op[t])
        d = int(p.task_device[t])
        orig = self.orig[g.names[op]]
        name = self.inst(t)
        self.task_node[(t, d)] = name
        if op in g.inputs:
            lo, hi = int(p.task_lo[t]), int(p.task_hi[t])
            if g.names[op] not in self.nodes:
                feed = type(orig)()
                feed.CopyFrom(orig)
                feed.device = self.feed_dev
                self.add(feed)
            t0 = int(np.nonzero(g.tensor_op == op)[0][0])
            axis, k = int(g.tensor_batch_axis[t0]), int(self.rows[t0])
            # the slice is cut on the feed device; an instance elsewhere is an Identity on its own
            # device (the lowering's feed-slice message), so its readers on other devices get it
            # from there, as the PlacedGraph says, not from the feed device
            cut = name if self.dev[d] == self.feed_dev else name + "/feed_slice"
            self.add(*rn.batch_slice(cut, self.feed_dev, g.names[op] + ":0", max(axis, 0), lo * k, hi * k,
                                     g.tensor_dtype[t0]))
            if cut != name:
                self.add(rn.identity(name, self.dev[d], cut + ":0", g.tensor_dtype[t0]))
            return
        r0, r1 = int(p.in_ptr[t]), int(p.in_ptr[t + 1])
        order = np.argsort(g.edge_dst_port[p.in_edge[r0:r1]], kind="stable")
        bufs = p.in_buf[r0:r1][order]
        mirror = p.task_samples[t] == 0
        data = [self.weighted(int(b), d) if mirror else self.bname(int(b)) for b in bufs]
        n_data = sum(1 for x in orig.input if not x.startswith("^"))
        if n_data != len(data):
            raise InputError(g.source or "graph", g.names[op], f"{len(data)} data inputs in the PlacedGraph, "
                             f"{n_data} in the NodeDef", "lower the same OpGraph that carries this GraphDef")
        node = type(orig)()
        node.CopyFrom(orig)
        node.name, node.device = name, self.dev[d]
        del node.input[:]
        node.input.extend(data)
        if node.op in FED_TYPES:
            self._fed_placeholder(t, op, node)
            return
        if node.op == "VarHandleOp":
            node.attr["shared_name"].s = name.encode()
        self._check_pinned(t, node, bufs)
        self.add(*rn.reseed_replica(node, t - int(p.op_task_ptr[op]), self.host[d]))
        self.add(node)

    def _fed_placeholder(self, t: int, op: int, node) -> None:
        """A placeholder that is not a batch input (a learning rate, keep_prob, is_training): the
        script feeds it by its own name, so it is one node under that name, instance 0's (on its
        device, with its default value's instance 0 when it has one); every instance, 0 too, is an
        Identity of it on its own device, which the instance's readers read."""
        g = self.g
        original = g.names[op]
        if t == int(self.p.op_task_ptr[op]):
            node.name = original
            self.add(node)
            self.feeds[original + ":0"] = node.op == "Placeholder"
        dtype = g.tensor_dtype[int(np.nonzero(g.tensor_op == op)[0][0])]
        self.add(rn.identity(self.inst(t), node.device, original + ":0", dtype))

    def _check_pinned(self, t: int, node, bufs) -> None:
        """A resource input must be a handle instance on the op's own device."""
        p = self.p
        for b in bufs:
            if self.buf_tensor_dtype(int(b)) == "resource" and p.buf_device[b] != p.task_device[t]:
                raise InputError(self.g.source or "graph", node.name, "reads a variable on another device",
                                 "the lowering must pin readers and updaters with their variable")

    def transfer(self, t: int) -> None:
        p, g = self.p, self.g
        d = int(p.task_device[t])
        if p.is_control_message(t):
            return  # emitted as the control edge itself (control_edges), or a "done" (train_op)
        if p.is_step_message(t):
            return  # a feed slice: TF sends the slice the input's instance cuts on the feed device
        if p.out_ptr[t] == p.out_ptr[t + 1]:
            self.send_back(t)
            return
        b_out = int(p.out_ptr[t])
        dtype = self.buf_tensor_dtype(b_out)
        if dtype == "resource":
            return
        if self._bucketed(t):
            self.transfer_bucket(t, dtype)
            return
        src = int(self.reads(t)[0])
        name = f"tfplace/transfer_{t}"
        tensor = int(p.task_tensor[t])
        axis = int(g.tensor_batch_axis[tensor])
        s_task = int(p.buf_task[src])
        lo, hi = int(p.task_lo[t]), int(p.task_hi[t])
        s_lo, s_hi = int(p.task_lo[s_task]), int(p.task_hi[s_task])
        value = self.bname(src)
        if axis >= 0 and p.task_samples[t] > 0 and (lo, hi) != (s_lo, s_hi):
            cut = name + "/slice"
            k = int(self.rows[tensor])
            self.add(*rn.batch_slice(cut, self.dev[int(p.buf_device[src])], value, axis, (lo - s_lo) * k,
                                     (hi - s_lo) * k, dtype))
            value = cut + ":0"
        self.add(rn.identity(name, self.dev[d], value, dtype))
        self.task_node[(t, d)] = name

    def transfer_bucket(self, t: int, dtype: str) -> None:
        """A bucket of whole gradients from one device to another (tfplace.lowering.buckets): packed
        on the sender, one tensor sent, split on the receiver with the static shapes (so that the
        receiver reads nothing else of the sender's)."""
        p, g = self.p, self.g
        d, s = int(p.task_device[t]), int(p.task_src_device[t])
        by_tensor = {int(p.buf_tensor[b]): int(b) for b in self.reads(t)}
        tensors = sorted(by_tensor)
        name = f"tfplace/transfer_{t}"
        self.add(*rn.packed_send(name, self.dev[s], self.dev[d], [self.bname(by_tensor[x]) for x in tensors],
                                 [f"t{x}" for x in tensors], dtype, [g.tensor_shape[x] for x in tensors]))
        self.task_node[(t, d)] = name + "/split"

    def send_back(self, t: int) -> None:
        """PS send-back: the updated variable from the server into the mirror on task_device. A
        bucket of variables (PlacedGraph.send_back_ops): each read on the server after the NoOp
        `name/read` (which waits for the updates), packed, sent as one tensor, split on the mirror's
        device with the variables' static shapes and assigned; the NoOp `name` there waits for every
        assignment."""
        p = self.p
        d, s = int(p.task_device[t]), int(p.task_src_device[t])
        name = f"tfplace/sendback_{t}"
        members = [self.variable_of[h] for h in p.send_back_ops(t)]

        def handle(h: int, dev: int) -> str:
            return self.inst(next(k for k in p.tasks_of_op(h) if int(p.task_device[k]) == dev))
        if len(members) == 1:
            var = members[0]
            self.add(rn.read_variable(name + "/read", self.dev[s], handle(var.op, s), var.dtype),
                     rn.assign_variable(name, self.dev[d], handle(var.op, d), name + "/read", var.dtype))
        else:
            dtype = members[0].dtype
            reads = [f"{name}/read_{i}" for i in range(len(members))]
            outs = [f"value_{i}" for i in range(len(members))]
            self.add(rn.no_op(name + "/read", self.dev[s], []),
                     *[rn.read_variable(r, self.dev[s], handle(v.op, s), dtype, [name + "/read"])
                       for r, v in zip(reads, members)],
                     *rn.packed_send(name, self.dev[s], self.dev[d], reads, outs, dtype, [v.shape for v in members]),
                     *[rn.assign_variable(f"{name}/assign_{i}", self.dev[d], handle(v.op, d), f"{name}/{o}", dtype)
                       for i, (v, o) in enumerate(zip(members, outs))],
                     rn.no_op(name, self.dev[d], [f"{name}/assign_{i}" for i in range(len(members))]))
        self.task_node[(t, d)] = name
        self.task_node[(t, s)] = name + "/read"

    def resplit(self, t: int) -> None:
        p, g = self.p, self.g
        d, lo, hi = int(p.task_device[t]), int(p.task_lo[t]), int(p.task_hi[t])
        tensor = int(p.task_tensor[t])
        axis, dtype = int(g.tensor_batch_axis[tensor]), g.tensor_dtype[tensor]
        name = f"tfplace/resplit_{t}"
        pieces = []
        for i, b in enumerate(self.reads(t)):
            s_task = int(p.buf_task[b])
            a, z = int(p.task_lo[s_task]), int(p.task_hi[s_task])
            piece = self.bname(int(b))
            if (max(lo, a), min(hi, z)) != (a, z):
                cut = f"{name}/piece_{i}"
                k = int(self.rows[tensor])
                self.add(*rn.batch_slice(cut, self.dev[d], piece, axis, (max(lo, a) - a) * k, (min(hi, z) - a) * k,
                                         dtype))
                piece = cut + ":0"
            factor = self._loss_scale(int(b), hi - lo) if self.loss_mean[tensor] else 1.0
            if factor != 1.0:
                self.add(*rn.scaled(f"{name}/rescaled_{i}", self.dev[d], piece, factor, dtype))
                piece = f"{name}/rescaled_{i}:0"
            pieces.append(piece)
        self.add(*rn.concat(name, self.dev[d], pieces, axis, dtype))
        self.task_node[(t, d)] = name

    def _loss_scale(self, b: int, consumer_samples: int) -> float:
        """A slice of a gradient of a mean-reduced loss carries 1/s_r per sample, s_r the samples
        of the replica that computed it; a consumer replica of s_c samples expects 1/s_c (its own
        share then weighs s_c/B when aggregated), so the slice is scaled by s_r / s_c."""
        p = self.p
        while p.task_kind[p.buf_task[b]] == TASK_TRANSFER:
            b = int(p.in_buf[p.in_ptr[p.buf_task[b]]])
        src = int(p.buf_task[b])
        s_r = int(p.task_samples[src]) if p.task_kind[src] == TASK_COMPUTE else 0
        return s_r / consumer_samples if s_r > 0 else 1.0

    def _bucketed(self, t: int) -> bool:
        """Whether collective or transfer task t moves a bucket of several gradients
        (tfplace.lowering.buckets)."""
        p = self.p
        outs = p.buf_tensor[p.out_ptr[t]:p.out_ptr[t + 1]]
        return len(np.unique(outs)) > 1

    def collective(self, t: int) -> None:
        p = self.p
        parts = [int(x) for x in p.part_dev[p.part_ptr[t]:p.part_ptr[t + 1]]]
        dtype = self.g.tensor_dtype[p.task_tensor[t]]
        # on every participant the same gradients (one, or a bucket's) in the same (tensor) order
        by_dev_tensor = {(int(p.buf_device[b]), int(p.buf_tensor[b])): int(b) for b in self.reads(t)}
        tensors = sorted({x for _, x in by_dev_tensor})
        names = [f"tfplace/allreduce_{t}/d{d}" for d in parts]
        srcs = [[self.weighted(by_dev_tensor[(d, x)], d) for x in tensors] for d in parts]
        out_names = [f"t{x}" for x in tensors] if self._bucketed(t) else None
        pads = self._pads([by_dev_tensor[(parts[0], x)] for x in tensors], dtype)
        if self.cpu_all_reduce == "exchange" and len(parts) > 1 and not any(self.gpu[d] for d in parts):
            # TF's CPU collectives move every ring step through a RecvBuf RPC, slower than its
            # Send/Recv on the same link (benchmarks/parity_bench.md)
            self.add(*rn.exchange_all_reduce(names, [self.dev[d] for d in parts], srcs, out_names, dtype, pads,
                                             self._elements([by_dev_tensor[(parts[0], x)] for x in tensors], dtype)))
        else:
            gkey, ikey = rn.group_key([self.dev[d] for d in parts]), self.key_base + t
            for d, name, src in zip(parts, names, srcs):
                self.add(*(rn.all_reduce(name, self.dev[d], src[0], len(parts), gkey, ikey, dtype, self.gpu[d])
                           if out_names is None else
                           rn.bucket_all_reduce(name, self.dev[d], src, out_names, len(parts), gkey, ikey, dtype,
                                                self.gpu[d], pads)))
        for d, name in zip(parts, names):
            self.task_node[(t, d)] = name

    def _pads(self, bufs: List[int], dtype: str) -> List[int]:
        """Zeros after each packed buffer (nodes.padding_elements of its elements, from the
        PlacedGraph's bytes): every piece of a packed bucket starts aligned."""
        item = rn.dtype_size(dtype)
        return [rn.padding_elements(int(self.p.buf_bytes[b]) // item if int(self.p.buf_bytes[b]) % item == 0 else -1)
                for b in bufs]

    def _elements(self, bufs: List[int], dtype: str) -> Optional[List[int]]:
        """Each buffer's element count when every one is known for sure: the tensor's static
        shape (no batch axis, no unknown dim) agreeing with the PlacedGraph's bytes; else None."""
        item, out = rn.dtype_size(dtype), []
        for b in bufs:
            count = self.g.static_elements(int(self.p.buf_tensor[b]))
            if count < 0 or count * item != int(self.p.buf_bytes[b]):
                return None
            out.append(count)
        return out

    # ---- dependencies --------------------------------------------------------------------------
    def nodes_of(self, t: int) -> List[str]:
        return [n for (task, _), n in self._by_task().get(t, [])]

    def _by_task(self):
        if not hasattr(self, "_task_index"):
            idx: Dict[int, List] = {}
            for (task, d), n in self.task_node.items():
                idx.setdefault(task, []).append(((task, d), n))
            self._task_index = idx
        return self._task_index

    def control_edges(self) -> None:
        p = self.p
        readers = np.repeat(np.arange(p.num_tasks), np.diff(p.in_ptr))
        data = set(zip(p.buf_task[p.in_buf].tolist(), readers.tolist()))
        deps = set(zip(p.dep_src.tolist(), p.dep_dst.tolist())) - data
        # a control message stands for the control edges through it: source -> message -> dest
        msg_src = {d: s for s, d in deps if p.is_control_message(d)}
        deps = {(msg_src.get(s, s), d) for s, d in deps if not p.is_control_message(d)}
        for s, d in deps:
            dsts = self.nodes_of(d)
            if p.task_kind[d] == TASK_TRANSFER and p.out_ptr[d] == p.out_ptr[d + 1]:
                dsts = [n for n in dsts if n.endswith("/read")]  # a send-back waits on the server side
            for dst in dsts:
                self.extra_ctrl.setdefault(dst, []).extend("^" + n for n in self.nodes_of(s))

    def priority_chains(self) -> None:
        p = self.p
        succ_ptr, succ_idx, indeg = p.successors()
        indeg = indeg.copy()
        heap = [(int(p.task_priority[t]), t) for t in np.nonzero(indeg == 0)[0].tolist()]
        heapq.heapify(heap)
        last: Dict[int, str] = {}
        while heap:
            _, t = heapq.heappop(heap)
            for (task, d), name in self._by_task().get(t, []):
                if self._chainable(t, name):
                    if d in last:
                        self.extra_ctrl.setdefault(name, []).append("^" + last[d])
                    last[d] = name
            for s in succ_idx[succ_ptr[t]:succ_ptr[t + 1]].tolist():
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(heap, (int(p.task_priority[s]), s))

    def _chainable(self, t: int, name: str) -> bool:
        p = self.p
        if p.task_kind[t] == TASK_TRANSFER:
            return False
        if p.task_kind[t] == TASK_COMPUTE:
            op = int(p.task_op[t])
            return self.g.op_types[op] not in _UNCHAINED_TYPES and op not in self.g.inputs \
                and self.g.names[op] not in self._init_refs()
        return True

    # ---- init, loss, train op, reads -------------------------------------------------------------
    def _init_name(self) -> str:
        name = self.init_override or self.g.meta.get("init_op") or "init"
        if name not in self.orig:
            raise InputError(self.g.source or "graph", "init_op", f"no op {name!r} in the GraphDef",
                             "export the graph with its variable initializer")
        return name

    def _init_nodes(self) -> List[str]:
        """Non-step ancestors of the init op (inputs and control inputs), the init op included."""
        if not hasattr(self, "_init_list"):
            step, seen, stack, refs = set(self.g.names), set(), [self._init_name()], set()
            while stack:
                n = stack.pop()
                if n in seen:
                    continue
                seen.add(n)
                for x in self.orig[n].input:
                    src = x.lstrip("^").split(":")[0]
                    (refs.add(src) if src in step else stack.append(src))
            self._init_list, self._init_ref_set = sorted(seen), refs
        return self._init_list

    def _init_refs(self):
        self._init_nodes()
        return self._init_ref_set

    def _inst0(self, op_name: str) -> Tuple[str, int]:
        op = self.g.index(op_name)
        t = int(self.p.op_task_ptr[op])
        return self.inst(t), int(self.p.task_device[t])

    def _init_read_orders(self, assigns: Dict[str, List[str]]) -> Dict[str, List[str]]:
        """Init node -> the initializers (AssignVariableOp of the init subgraph) it must wait for:
        a read of variable A inside the initial value of variable B waits for A's initializer.
        TensorFlow orders neither (a new Keras optimizer with a learning-rate schedule starts
        `current_learning_rate` at schedule(iteration)); on one device the executor's order
        happened to win, while the rewritten init, with the handles on their devices, read A
        before it existed ("Could not find variable"). `assigns`: _init_assigns()."""
        out: Dict[str, List[str]] = {}
        for n in self._init_nodes():
            node = self.orig[n]
            if node.op == "ReadVariableOp" and node.input:
                waits = self._init_waits(assigns, node.input[0], n)
                if waits:
                    out[n] = waits
        return out

    def _init_assigns(self) -> Dict[str, List[str]]:
        """Variable handle name -> the AssignVariableOp nodes of the init subgraph that write it."""
        assigns: Dict[str, List[str]] = {}
        for n in self._init_nodes():
            node = self.orig[n]
            if node.op == "AssignVariableOp" and node.input:
                assigns.setdefault(node.input[0].split(":")[0], []).append(n)
        return assigns

    def _init_waits(self, assigns: Dict[str, List[str]], handle: str, user: str) -> List[str]:
        """The initializers of the variable `handle` that a read used by the init node `user` waits
        for: not where `user` leads to one of them (its own initial value: a cycle)."""
        return [a for a in assigns.get(handle.split(":")[0], []) if a != user and user not in self._init_ancestors(a)]

    def _init_only_read(self, src: str, user: str, assigns: Dict[str, List[str]]) -> Optional[str]:
        """For a read of the step (`src`, a ReadVariableOp) that the init node `user` uses (an
        initial value computed from a variable the step also reads): the name of a copy for the
        init only, which waits for that variable's initializer as _init_read_orders' reads do
        (the step's own read cannot: each step would run the initializer again). None where
        there is nothing to wait for."""
        node = self.orig[src]
        if node.op != "ReadVariableOp" or not node.input:
            return None
        handle = node.input[0].split(":")[0]
        waits = self._init_waits(assigns, handle, user)
        if not waits or handle not in self.g.names:
            return None
        name = f"tfplace/init_read/{src}"
        if name not in self.nodes:  # one copy, whichever init nodes use it
            handle_inst, d = self._inst0(handle)
            copy = type(node)()
            copy.CopyFrom(node)
            copy.name, copy.device = name, self.dev[d]
            del copy.input[:]
            copy.input.extend([handle_inst] + ["^" + a for a in waits])
            self.add(copy)
        return name

    def _init_ancestors(self, name: str) -> set:
        """Init-subgraph nodes `name` depends on (data and control inputs)."""
        nodes, seen, stack = set(self._init_nodes()), set(), [name]
        while stack:
            for x in self.orig[stack.pop()].input:
                src = x.lstrip("^").split(":")[0]
                if src in nodes and src not in seen:
                    seen.add(src)
                    stack.append(src)
        return seen

    def init_subgraph(self) -> str:
        init = self._init_name()
        step = set(self.g.names)
        assigns = self._init_assigns()
        orders = self._init_read_orders(assigns)
        for n in self._init_nodes():
            node = type(self.orig[n])()
            node.CopyFrom(self.orig[n])
            node.device = self.feed_dev
            del node.input[:]
            for x in self.orig[n].input:
                ctrl, body = x.startswith("^"), x.lstrip("^")
                src, _, port = body.partition(":")
                init_read = self._init_only_read(src, n, assigns) if src in step and not ctrl else None
                if init_read:
                    body = init_read + (":" + port if port else "")
                elif src in step:
                    new, d = self._inst0(src)
                    if self.g.op_types[self.g.index(src)] == "VarHandleOp":
                        node.device = self.dev[d]
                    body = new + (":" + port if port else "")
                node.input.append(("^" if ctrl else "") + body)
            node.input.extend("^" + a for a in orders.get(n, ()) if "^" + a not in node.input)
            if n == init:
                node.name = "tfplace/init_once"
            self.add(node)
        copies = []
        for v in self.g.variables:
            tasks = self.p.tasks_of_op(v.op).tolist()
            if len(tasks) < 2:
                continue
            base = f"tfplace/init_copy/{v.name}"
            d0 = int(self.p.task_device[tasks[0]])
            self.add(rn.read_variable(base + "/read", self.dev[d0], self.inst(tasks[0]), v.dtype, ["tfplace/init_once"]))
            for k, t in enumerate(tasks[1:], start=1):
                self.add(rn.assign_variable(f"{base}/replica_{k}", self.dev[int(self.p.task_device[t])],
                                            self.inst(t), base + "/read:0", v.dtype))
                copies.append(f"{base}/replica_{k}")
        self.add(rn.no_op(init, self.feed_dev, ["tfplace/init_once"] + copies))
        return init

    def global_loss(self) -> str:
        g, p = self.g, self.p
        lt = int(g.loss_tensor)
        if lt < 0:
            return ""
        op, port = int(g.tensor_op[lt]), int(g.tensor_port[lt])
        name = g.names[op] if port == 0 else "tfplace/loss"
        dtype = g.tensor_dtype[lt]
        parts = []
        for t in p.tasks_of_op(op).tolist():
            b = self._out_buffer(t, lt)
            if p.task_samples[t] == 0:
                parts = [self.bname(b)]
                break
            w = float(p.task_weight[t]) if p.tensor_weight_mean[lt] else 1.0
            parts.append(self.bname(b) if w == 1.0 else self._scaled_loss(b, t, w, dtype))
        if len(parts) > 1 and not p.tensor_weight_mean[lt]:
            # a summed loss plus terms that do not depend on the batch (a weight decay): every
            # replica's loss holds each such term once, so the sum of R replicas holds it R times
            replicas = len(parts)
            for k, b in enumerate(self._batch_free_terms(lt)):
                term = f"tfplace/loss_batch_free_{k}"
                self.add(*rn.scaled(term, self.feed_dev, self.bname(b), 1.0 - replicas, dtype))
                parts.append(term + ":0")
        self.add(rn.add_n(name, self.feed_dev, parts, dtype))
        return name + ":0"

    def _out_buffer(self, task: int, tensor: int) -> int:
        """The buffer of `tensor` that `task` makes."""
        p = self.p
        return next(int(b) for b in range(p.out_ptr[task], p.out_ptr[task + 1]) if p.buf_tensor[b] == tensor)

    def _batch_free_terms(self, tensor: int) -> List[int]:
        """Buffers (instance 0's) of the addends of `tensor` that do not depend on the batch,
        following Identity and Add/AddV2/AddN ops back from it (loss = sum(ce) + 0.5 * l2)."""
        g, p = self.g, self.p
        terms: List[int] = []
        todo = [tensor]
        while todo:
            t = todo.pop()
            op = int(g.tensor_op[t])
            if not g.op_batch_dependent[op]:
                terms.append(self._out_buffer(int(p.op_task_ptr[op]), t))
            elif g.op_types[op] in ("Identity", "Add", "AddV2", "AddN"):
                todo.extend(int(e) for e in g.edge_tensor[g.edge_dst == op])
        return terms

    def _scaled_loss(self, b: int, t: int, w: float, dtype: str) -> str:
        name = f"tfplace/loss_part_{t}"
        self.add(*rn.scaled(name, self.feed_dev, self.bname(b), w, dtype))
        return name + ":0"

    def train_op(self) -> str:
        """The step's NoOp on the feed device, after every task without successors: a device's
        "done" message (lowering: one per other device) becomes a NoOp there after the tasks it
        waits for, so one control message per device reaches the train op; other leaves join
        with their node on their own device. Collective participants join per device
        (`_unread_participants`): through their device's "done" where it has one, else directly."""
        p, g = self.p, self.g
        succ_ptr, _, _ = p.successors()
        dep_src, dep_dst = p.dep_src, p.dep_dst
        by_task = self._by_task()
        unread = self._unread_participants()
        ctrl = []
        for t in np.nonzero(np.diff(succ_ptr) == 0)[0].tolist():
            if p.is_step_message(t) and p.is_control_message(t):
                src = int(p.task_src_device[t])
                waits = dep_src[dep_dst == t].tolist()
                name = f"tfplace/step_done_{t}"
                self.add(rn.no_op(name, self.dev[src], [n for s in waits for (_, d), n in by_task.get(s, []) if d == src]
                                  + unread.pop(src, [])))
                ctrl.append(name)
            elif p.task_kind[t] != TASK_COLLECTIVE:  # a leaf collective's participants are all unread
                own = int(p.task_device[t])
                ctrl += [n for (_, d), n in by_task.get(t, []) if d == own]
        ctrl += [n for names in unread.values() for n in names]
        name = g.names[g.sink]
        self.add(rn.no_op(name, self.feed_dev, ctrl))
        return name

    def _unread_participants(self) -> Dict[int, List[str]]:
        """Device -> the participant nodes there of collectives whose output on that device no
        task reads. The lowering's dependencies are per task, and one reader on one device makes
        a collective no leaf; but TF runs only the ancestors of what the step fetches, so such a
        participant (a gradient all-reduced among the devices that computed its partials, then
        read on one of them) would be pruned and its peers would wait for it forever."""
        p = self.p
        read = np.zeros(len(p.buf_task), bool)
        read[p.in_buf] = True
        out: Dict[int, List[str]] = {}
        for t in np.nonzero(p.task_kind == TASK_COLLECTIVE)[0].tolist():
            bufs = np.arange(p.out_ptr[t], p.out_ptr[t + 1])
            for d in p.part_dev[p.part_ptr[t]:p.part_ptr[t + 1]].tolist():
                if not read[bufs[p.buf_device[bufs] == d]].any():
                    out.setdefault(int(d), []).append(self.task_node[(t, int(d))])
        return out

    def variable_reads(self) -> Dict[str, Tuple[str, ...]]:
        out = {}
        for v in self.g.variables:
            names = []
            for k, t in enumerate(self.p.tasks_of_op(v.op).tolist()):
                name = f"tfplace/read/{v.name}/replica_{k}"
                self.add(rn.read_variable(name, self.dev[int(self.p.task_device[t])], self.inst(t), v.dtype))
                names.append(name + ":0")
            out[v.name] = tuple(names)
        return out

    def input_spec(self, op: int) -> InputSpec:
        g = self.g
        t = int(np.nonzero(g.tensor_op == op)[0][0])
        meta = {m.get("name"): m for m in g.meta.get("inputs", [])}.get(g.names[op], {})
        return InputSpec(g.names[op] + ":0", g.tensor_dtype[t], tuple(g.tensor_shape[t]),
                         int(g.tensor_batch_axis[t]), meta.get("max_value"))
