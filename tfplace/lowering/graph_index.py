"""Static half of the lowering: what every op and tensor of a graph *is*, independent of any
strategy. Computed once per (OpGraph, Grouping) and reused for every strategy.

Op roles (role[N] int8):
  REPLICA  runs once per replica (micro-batch) of its group with that replica's samples: ops that
           depend on the input batch (and the inputs themselves).
  MIRROR   runs once on each device that holds the group (variables, reads, constants, the sink):
           ops that do not depend on the batch.
  UPDATE   runs on the group's *update devices* (every holder with all-reduce, the PS device with
           PS) after gradient aggregation: variable updaters, and batch-dependent ops that only
           transform aggregated values on their way into an updater (e.g. `lr * grad`, `IdentityN`
           over gradients). Such an op has no batched input or output and only UPDATE consumers.

Layout kinds (lkind[N] int8) pick which of the group's four instance layouts an op uses:
  REP (replicas), HOLD (holder devices), UPD (update devices), BOTH (holders + PS device). A
  MIRROR op feeding only UPDATE ops of its group (an optimizer slot, the learning rate) lives on
  the update devices; one feeding both (a weight's handle) lives on both.

Variables are pinned: a weight's readers and updaters take the weight's group, an
optimizer slot (handle and readers) takes its updater's group, whatever the grouping says.
So are readers of partials: a REPLICA op without batched inputs or outputs that reads a
(non-metadata) partial takes its producer's group, so it reads it replica-locally in the same
layout (GraphIndex._pin_partial_readers). And a batch norm's gradient (FusedBatchNormGrad*)
takes its forward op's group, whose saved batch statistics it reads replica by replica
(GraphIndex._pin_batch_norm_gradients).

Tensor classes (tensor_cls[T] int8):
  BATCHED  has a batch axis: replicas hold slices; consumers get re-split slices.
  PARTIAL  no batch axis, produced by a REPLICA op: a per-replica value (a weight gradient, a
           batch statistic, a shape). Into an UPDATE consumer it is aggregated (weighted sum);
           into a REPLICA consumer it is passed replica-locally.
  FULL     no batch axis, produced by a MIRROR/UPDATE op: every copy is equal.
  SMALL_CONST  a FULL tensor of a Const op with at most SMALL_CONST_ELEMENTS elements and no
           control successors: TensorFlow's ReplicateConstantsPass copies such a constant onto
           the task of each of its successors when they are on two or more tasks, so those
           consumers read a copy of their own and no message crosses (tfplace.lowering.patterns).

Run rank (`run_order_rank`): the position of each op in one topological order of the graph, the
last key of every task's priority (tfplace.lowering.assemble): the graph's own order, or, where
the profile recorded the order TensorFlow ran the step in (`Profile.run_order`), the topological
order that follows it.

Tensor signatures: tensors whose (class, producer group and lkind, consumer groups, lkinds and
partial modes) agree get the same signature id, so the strategy-dependent work (choosing the
transfers, sums and collectives) is done once per signature, not once per tensor.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import OpGraph

ROLE_REPLICA, ROLE_MIRROR, ROLE_UPDATE = 0, 1, 2
LK_REP, LK_HOLD, LK_UPD, LK_BOTH = 0, 1, 2, 3
CLS_BATCHED, CLS_PARTIAL, CLS_FULL, CLS_SMALL_CONST = 0, 1, 2, 3
SMALL_CONST_ELEMENTS = 16  # TensorFlow's ReplicateConstantsPass replicates constants up to this size
_CONST_OP_TYPES = frozenset({"Const", "HostConst"})
# Partial mode of a consumer slot: 0 not a partial, 1 replica-local, 2 aggregated.
PM_NONE, PM_LOCAL, PM_AGG = 0, 1, 2
# Outputs that alias the resident variable (counted once as static memory, not as a buffer).
_ALIAS_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable", "ReadVariableOp", "_VarHandlesOp"})
# Ops that put a resource variable in TensorFlow's copy-on-read mode (EnsureSparseVariableAccess in
# resource_variable_ops.cc / training_ops.cc): once one touches the variable, every dense
# ReadVariableOp copies it instead of aliasing it (measured: a real OOM in a 65.5 MB copy
# in softmax/MatMul/ReadVariableOp of the transformer's tied embedding, read by ResourceGather).
_COPY_ON_READ_PREFIXES = ("ResourceGather", "ResourceScatter", "ResourceSparseApply")
# Batch norm forward ops (training mode: they save their batch statistics) and their gradients.
_BN_FORWARD_OP_TYPES = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
_BN_GRAD_OP_TYPES = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})


def carries_gradient_values(dtypes: Sequence[str]) -> np.ndarray:
    """bool[T]: tensors whose dtype can hold a gradient's value (floating or complex), by dtype
    name ("float32", "bfloat16", "int64", ...); integers and booleans are indices, ids, shapes."""
    return np.array([d.startswith(("float", "bfloat", "complex")) for d in dtypes], dtype=bool)


def run_order_rank(graph: OpGraph, run_order: Sequence[str] = ()) -> np.ndarray:
    """rank[N] int64: each op's position in one topological order of `graph` (data and control
    edges): `arange(N)` (the OpGraph's own order) without a `run_order`; else the order that,
    among the ops whose inputs are done, next takes the one `run_order` lists first. A metadata
    clone (tfplace.lowering.meta) stands where its original is listed; an op the order does not
    list (a folded constant, a fed input) goes as soon as its inputs are done; ties by op index.

    Why: ResNet-50's rewritten single-device step on one core ran 4-5% slower chained in the
    graph's order (its updates after the whole backward pass) than chained in the order the
    executor ran the profiled step (tfplace.profiling.profiler rule 8), which ran as fast as the original.
    """
    from tfplace.lowering.meta import kahn_order
    n = graph.num_ops
    if not run_order:
        return np.arange(n, dtype=np.int64)
    at = {name: i for i, name in enumerate(run_order)}
    clone_of = graph.meta.get("tfplace_clone_of", {})
    order = kahn_order(graph, [at.get(clone_of.get(name, name), -1) for name in graph.names])
    if len(order) != n:
        raise InputError(graph.source or "graph", "edges", f"{n - len(order)} ops lie on a dependency cycle",
                         "export an acyclic training step")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank


def gradient_tuple_edges(graph: OpGraph, lkind: np.ndarray) -> np.ndarray:
    """[C] bool: control edges into a gradient tuple's NoOp from an op of the update side.

    TensorFlow's gradients group each op's input gradients with `tf.tuple`: a NoOp
    (`.../tuple/group_deps`) waits for every gradient of the op, and an Identity of each waits
    for the NoOp. A weight's gradient is aggregated before its update-side ops run (its Reshape
    runs on the all-reduced value), so keeping that edge makes the rest of the backward pass wait
    for each layer's all-reduce, and no collective could overlap the backward pass or join a
    bucket. The edge orders pure ops only: the NoOp's control successors are Identities that read
    their values by data, and its source is no variable update. It is dropped (the NoOp still
    waits for the gradients of the replica side)."""
    src, dst = graph.control_src.astype(np.int64), graph.control_dst.astype(np.int64)
    out = np.zeros(len(src), dtype=bool)
    if not len(src):
        return out
    types = np.asarray(graph.op_types, dtype=object)
    updater = np.zeros(graph.num_ops, dtype=bool)
    for v in graph.variables:
        updater[list(v.updaters)] = True
    # NoOps whose control successors are all Identity ops (and that have at least one)
    succ_not_identity = np.zeros(graph.num_ops, dtype=bool)
    succ_not_identity[src[types[dst] != "Identity"]] = True
    has_succ = np.zeros(graph.num_ops, dtype=bool)
    has_succ[src] = True
    data_out = np.zeros(graph.num_ops, dtype=bool)
    data_out[graph.tensor_op[graph.edge_tensor]] = True
    tuple_noop = (types == "NoOp") & has_succ & ~succ_not_identity & ~data_out
    return tuple_noop[dst] & (lkind[src] == LK_UPD) & ~updater[src]


class GraphIndex:
    """Static arrays for one graph and grouping (see the module docstring).

    Attributes (N ops, T tensors, E edges, S signatures, G groups, V variables):
      op_group[N] int32      group after pinning variables
      role[N], lkind[N]      int8
      op_out_ps_bytes[N]     float64, bytes per sample of the op's batched outputs
      op_out_full_bytes[N]   float64, bytes of its unbatched outputs
      tensor_cls[T] int8; tensor_ps_bytes[T] (bytes per sample, batched), tensor_full_bytes[T]
      tensor_mem_scale[T]    1.0, or 0.0 where the output aliases a variable
      tensor_weight_mean[T]  bool, see PlacedGraph
      tensor_mean_scaled[T]  bool, see PlacedGraph
      tensor_batch_rows[T]   int32, see PlacedGraph
      tensor_sig[T] int32; edge_slot[E] int32 (index of the edge's consumer slot in its signature)
      sig_cls[S], sig_pgroup[S], sig_plkind[S]; sig_slot_ptr[S+1] with slot_group, slot_lkind,
      slot_pmode (CSR of consumer slots); group_sig_ptr[G+1], group_sig_idx (signatures touching
      each group)
      op_out_ptr[N+1], op_out_tensors: each op's output tensors in port order (CSR);
      tensor_rank[T]: position of a tensor among its op's outputs
      op_in_ptr[N+1], op_in_edges: each op's data input edges in port order (CSR)
      control_src[C], control_dst[C] (self-loops removed; a gradient tuple's NoOp waits for none
                             of the update side: gradient_tuple_edges)
      var_op[V], var_bytes[V] float64, var_upd_ptr[V+1], var_upd (updater ops, CSR)
    """

    def __init__(self, graph: OpGraph, grouping):
        self.graph = graph
        self.num_ops, self.num_tensors = graph.num_ops, graph.num_tensors
        op_group = np.asarray(grouping.op_group, dtype=np.int32)
        if op_group.shape != (graph.num_ops,):
            raise InputError("grouping", "op_group", f"has {op_group.shape} entries, the graph has "
                             f"{graph.num_ops} ops", "build the grouping from the same OpGraph")
        self.group_names = tuple(grouping.group_names)
        self.num_groups = len(self.group_names)
        self.op_group = self._pin_batch_norm_gradients(graph, self._pin_variables(graph, op_group.copy()))
        self._roles(graph)
        self._tensors(graph)
        self._signatures(graph)
        keep = (graph.control_src != graph.control_dst) & ~gradient_tuple_edges(graph, self.lkind)
        self.control_src = graph.control_src[keep].astype(np.int64)
        self.control_dst = graph.control_dst[keep].astype(np.int64)
        self._csr_views(graph)
        self.var_op = np.array([v.op for v in graph.variables], dtype=np.int64)
        self.var_bytes = np.array([v.num_bytes for v in graph.variables], dtype=np.float64)
        counts = [len(v.updaters) for v in graph.variables]
        self.var_upd_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.var_upd = np.array([u for v in graph.variables for u in v.updaters], dtype=np.int64)

    def _csr_views(self, graph: OpGraph) -> None:
        """Outputs per op (port order) and data inputs per op (port order), as CSR."""
        n = graph.num_ops
        prod = graph.tensor_op.astype(np.int64)
        out_order = np.lexsort((graph.tensor_port, prod))
        self.op_out_ptr = np.concatenate([[0], np.cumsum(np.bincount(prod, minlength=n))]).astype(np.int64)
        self.op_out_tensors = out_order.astype(np.int64)
        self.tensor_rank = np.empty(graph.num_tensors, dtype=np.int64)
        self.tensor_rank[out_order] = np.arange(graph.num_tensors) - self.op_out_ptr[prod[out_order]]
        dst = graph.edge_dst.astype(np.int64)
        in_order = np.lexsort((graph.edge_dst_port, dst))
        self.op_in_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
        self.op_in_edges = in_order.astype(np.int64)

    # ---- ops -----------------------------------------------------------------------------------
    @staticmethod
    def _pin_variables(graph: OpGraph, op_group: np.ndarray) -> np.ndarray:
        for v in graph.variables:
            if not v.is_slot:
                op_group[list(v.readers + v.updaters)] = op_group[v.op]
        for v in graph.variables:
            if v.is_slot:
                home = op_group[v.updaters[0]] if v.updaters else op_group[v.op]
                op_group[[v.op, *v.readers]] = home
        return op_group

    @staticmethod
    def _pin_batch_norm_gradients(graph: OpGraph, op_group: np.ndarray) -> np.ndarray:
        """op_group with each FusedBatchNormGrad* moved into the group of the FusedBatchNorm* whose
        saved batch mean / variance (reserve spaces) it reads.

        Those are partials read replica-locally (PM_LOCAL): gradient replica k takes forward
        replica k's statistics. In a group of another split it would take those of another sample
        range (the first overlapping replica), so the gradient is the derivative of no step at all
        (tests/test_equivalence.py, cnn/bn_grad_apart: 0.07 relative error in bn/beta, silently).
        Unlike _pin_partial_readers' readers this op has batched inputs (dy, x): those are re-split
        into the forward's layout like any batched edge, exactly. Its scale / offset gradients are
        aggregated with its replicas' weights, now the forward's; REPLICA readers of them, if any,
        follow it (_pin_partial_readers runs after this).
        """
        out = op_group
        prod = graph.tensor_op[graph.edge_tensor].tolist()
        for p, c in zip(prod, graph.edge_dst.tolist()):
            if graph.op_types[c] in _BN_GRAD_OP_TYPES and graph.op_types[p] in _BN_FORWARD_OP_TYPES:
                out[c] = out[p]
        return out

    def _roles(self, graph: OpGraph) -> None:
        n = graph.num_ops
        prod = graph.tensor_op[graph.edge_tensor].astype(np.int64)
        dst = graph.edge_dst.astype(np.int64)
        batched_t = graph.tensor_batch_axis >= 0
        batched_in = np.zeros(n, dtype=bool)
        batched_in[dst[batched_t[graph.edge_tensor]]] = True
        batched_out = np.zeros(n, dtype=bool)
        batched_out[graph.tensor_op[batched_t]] = True
        updater = np.zeros(n, dtype=bool)
        for v in graph.variables:
            updater[list(v.updaters)] = True
        is_input = np.zeros(n, dtype=bool)
        is_input[list(graph.inputs)] = True
        consumers: List[List[int]] = [[] for _ in range(n)]
        for p, c in zip(prod.tolist(), dst.tolist()):
            consumers[p].append(c)
        candidate = (graph.op_batch_dependent & ~batched_in & ~batched_out & ~is_input).tolist()
        upd = updater.tolist()
        # Reverse topological order: an op is UPDATE-side when all its consumers already are.
        from tfplace.lowering.meta import topological_order
        for i in reversed(topological_order(graph).tolist()):
            if not upd[i] and candidate[i] and consumers[i] and all(upd[c] for c in consumers[i]):
                upd[i] = True
        upd_side = np.array(upd, dtype=bool)
        role = np.full(n, ROLE_MIRROR, dtype=np.int8)
        role[graph.op_batch_dependent | is_input] = ROLE_REPLICA
        role[upd_side] = ROLE_UPDATE
        self.role = role
        self.op_group = g = self._pin_partial_readers(graph, role, batched_in | batched_out | is_input, self.op_group,
                                                      batched_out)
        feeds_upd = np.zeros(n, dtype=bool)
        feeds_other = np.zeros(n, dtype=bool)
        same = g[prod] == g[dst]
        to_upd = upd_side[dst] & same
        feeds_upd[prod[to_upd]] = True
        feeds_other[prod[~to_upd]] = True
        lkind = np.full(n, LK_HOLD, dtype=np.int8)
        lkind[feeds_upd & feeds_other] = LK_BOTH
        lkind[feeds_upd & ~feeds_other] = LK_UPD
        lkind[role == ROLE_REPLICA] = LK_REP
        lkind[role == ROLE_UPDATE] = LK_UPD
        self.lkind = lkind

    @staticmethod
    def _pin_partial_readers(graph: OpGraph, role: np.ndarray, batched: np.ndarray,
                             op_group: np.ndarray, batched_out: np.ndarray) -> np.ndarray:
        """op_group with each *partial reader* moved into the group of its partial input's producer.

        A partial reader is a REPLICA op without batched inputs or outputs that reads a partial
        (a per-replica value of a REPLICA op, not metadata): e.g. the gradient of a masked weight
        (drop-connect: MatMul grad -> SelectV2 grad -> ... -> update). Its replica k reads producer
        replica k replica-locally, and its own partials are aggregated with ITS replicas' weights
        (samples_k / B). That is right only when both run in the same layout: in another group
        with other shares, replica k would read a partial summed over other samples, and the
        aggregated gradient is wrong (tests/test_equivalence.py, drop_connect under a random
        strategy, kernel error 0.69). Such an op computes nothing per sample of its own, so it
        follows its producer's split, as variable readers follow their variable. Pinned in
        topological order, so a chain of readers follows its head. Left as is: readers with
        batched inputs (a batch statistic normalising activations, an approximation per replica
        anyway; batch-norm gradients are pinned by _pin_batch_norm_gradients) and metadata (recomputed in each consumer's group, tfplace.lowering.meta).
        In the forward pass (the loss and what it is computed from), a reader of partials of
        several producers joins them to one layout: the readers and the producers that are
        reductions (no batched output) take the group of the first producer (the first input of
        the first reader, in topological order). Left apart, a partial of another layout reaches
        the reader aggregated with the loss reduction's weight (samples / B), which is a mean's:
        a per-replica *sum* (tf.compat.v1.losses' summed loss and its `num_present`, divided by
        each other) came out halved, and so did the gradient that tiled the division's 1/count
        over the batch (tests/test_equivalence.py, SEED_CASES). A producer with batched outputs
        (a batch norm) and the backward pass (weight gradients, their pinned batch-norm
        gradients) are never moved: elsewhere a reader of several groups' partials keeps the
        first producer's group.
        """
        from tfplace.lowering.meta import metadata_ops, topological_order
        meta = metadata_ops(graph)
        reader = (role == ROLE_REPLICA) & ~batched & ~meta
        if not reader.any():
            return op_group
        partial_src = (role == ROLE_REPLICA) & ~meta  # producers of (non-metadata) partials
        ins: List[List[int]] = [[] for _ in range(graph.num_ops)]
        batched_t = (graph.tensor_batch_axis >= 0).tolist()
        for t, c in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist()):
            if not batched_t[t]:
                ins[c].append(int(graph.tensor_op[t]))
        order = topological_order(graph).tolist()
        forward = ~GraphIndex._backward_ops(graph) if graph.loss_tensor >= 0 else np.zeros(graph.num_ops, dtype=bool)
        joinable = forward & (reader | ~batched_out)  # forward readers and reductions
        first_src: Dict[int, int] = {}  # forward reader -> the producer of its first partial input
        parent: Dict[int, int] = {}  # union-find over forward readers and the reductions they read

        def root(x: int) -> int:
            while parent.setdefault(x, x) != x:
                parent[x] = x = parent[parent[x]]
            return x
        for i in order:
            if reader[i] and forward[i]:
                src = [p for p in ins[i] if partial_src[p]]
                if src:
                    first_src[i] = src[0]
                    for p in src:
                        if joinable[p]:
                            parent[root(p)] = root(i)
        anchor: Dict[int, int] = {}  # component root -> the producer whose group it takes
        for i in order:
            if i in first_src and root(i) not in anchor:
                head = i
                while head in first_src:  # a chain of readers leads back to a producer
                    head = first_src[head]
                anchor[root(i)] = head
        out = op_group.copy()
        for x in parent:
            out[x] = op_group[anchor[root(x)]]
        for i in order:  # the rest: each reader follows its first producer (as moved above)
            if reader[i] and i not in parent:
                src = [p for p in ins[i] if partial_src[p]]
                if src:
                    out[i] = out[src[0]]
        return out

    # ---- tensors -------------------------------------------------------------------------------
    def _tensors(self, graph: OpGraph) -> None:
        batched = graph.tensor_batch_axis >= 0
        prod = graph.tensor_op.astype(np.int64)
        cls = np.full(graph.num_tensors, CLS_FULL, dtype=np.int8)
        cls[self.role[prod] == ROLE_REPLICA] = CLS_PARTIAL
        cls[batched] = CLS_BATCHED
        cls[(cls == CLS_FULL) & self._small_constants(graph)] = CLS_SMALL_CONST
        self.tensor_cls = cls
        nbytes = graph.tensor_bytes.astype(np.float64)
        self.tensor_ps_bytes = np.where(batched, nbytes / graph.reference_batch_size, 0.0)
        self.tensor_full_bytes = np.where(batched, 0.0, nbytes)
        alias = np.array([graph.op_types[p] in _ALIAS_OP_TYPES for p in prod.tolist()], dtype=bool)
        alias &= ~_copied_reads(graph)[prod]
        self.tensor_mem_scale = np.where(alias, 0.0, 1.0)
        self.op_out_ps_bytes = np.bincount(prod, weights=self.tensor_ps_bytes, minlength=graph.num_ops)
        self.op_out_full_bytes = np.bincount(prod, weights=self.tensor_full_bytes, minlength=graph.num_ops)
        # Which tensors follow the loss (the loss itself and the backward pass): their replica
        # values are scaled per the loss reduction; other partials (forward batch statistics)
        # are means over the batch. The backward pass is found as the batch-dependent ops that
        # are not ancestors of the loss: TF seeds the gradients with a constant (`gradients/
        # Fill`), so gradients do not descend from the loss through data edges.
        mean_loss = graph.loss_reduction == "mean"
        backward = self._backward_ops(graph)
        from_loss = self._descends_from_loss(graph) | backward
        self.tensor_weight_mean = np.where(from_loss[prod], mean_loss, True)
        # Batched tensors of a mean loss's backward pass carry 1/s per sample (each replica's
        # loss is a mean over its own s samples): a slice moved to a consumer replica of another
        # size is rescaled by s_producer / s_consumer (PlacedGraph.tensor_mean_scaled). Only
        # floating values do: the backward pass also computes integers from the input alone (an
        # embedding gradient's IndexedSlices indices, the ids flattened), which scaled would
        # name other rows of the table. And only from the mean's division by the replica's count
        # on, not the loss gradient tiled over the batch before it (_after_batch_count).
        after_count = self._after_batch_count(graph, backward)
        self.tensor_mean_scaled = (after_count[prod] & batched & carries_gradient_values(graph.tensor_dtype)
                                   & mean_loss & (graph.loss_tensor >= 0))
        self.tensor_batch_rows = self._batch_rows(graph)

    @staticmethod
    def _after_batch_count(graph: OpGraph, backward: np.ndarray) -> np.ndarray:
        """bool[N]: backward-pass ops that read, through data edges within the backward pass, a
        floating-point value that depends on the replica's samples without a batch axis: a
        metadata value (the count a mean's gradient divides by, `gradients/Mean_grad/Cast` into
        `Mean_grad/truediv`) or a forward reduction over the batch (`num_present` of a
        tf.compat.v1.losses loss, into its `div_no_nan` gradient). Integer metadata are shapes
        (the Tile's multiples, a Reshape's shape), never a value that scales a gradient: TF does
        no arithmetic between an integer and a float tensor without a Cast. So the loss gradient
        tiled over the batch before a mean's division (`gradients/Mean_grad/Tile`: the upstream
        gradient per sample, the same at any replica size) is excluded, and so are backward ops
        that read forward values per sample only (`-x / y**2` of a division's gradient, a
        `Greater` mask)."""
        from tfplace.lowering.meta import metadata_ops, topological_order
        meta = metadata_ops(graph)
        prod = graph.tensor_op
        per_replica = graph.op_batch_dependent[prod] & (graph.tensor_batch_axis < 0) & (meta[prod] | ~backward[prod])
        count = per_replica & carries_gradient_values(graph.tensor_dtype)
        ins: List[List[int]] = [[] for _ in range(graph.num_ops)]
        for t, c in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist()):
            ins[c].append(int(t))
        out = np.zeros(graph.num_ops, dtype=bool)
        for i in topological_order(graph).tolist():
            out[i] = backward[i] and any(count[t] or out[prod[t]] for t in ins[i])
        return out

    @staticmethod
    def _small_constants(graph: OpGraph) -> np.ndarray:
        """bool[T]: outputs of Const ops with known shapes of at most SMALL_CONST_ELEMENTS
        elements whose op has no control successors (CLS_SMALL_CONST)."""
        controls = set(graph.control_src.tolist())
        out = np.zeros(graph.num_tensors, dtype=bool)
        for t, op in enumerate(graph.tensor_op.tolist()):
            shape = graph.tensor_shape[t]
            out[t] = (graph.op_types[op] in _CONST_OP_TYPES and op not in controls
                      and all(x >= 0 for x in shape) and int(np.prod(shape, dtype=np.int64)) <= SMALL_CONST_ELEMENTS)
        return out

    @staticmethod
    def _batch_rows(graph: OpGraph) -> np.ndarray:
        """int32[T]: entries per sample along each batched tensor's batch axis. 1 for a tensor
        batched on its own axis ([N, ...]); L for one whose batch axis folds the batch with other
        dimensions (a transformer's activations flattened to [N*L, d]), so that samples [lo, hi)
        are entries [lo*L, hi*L) of that axis. 1 for unbatched tensors."""
        rows = np.ones(graph.num_tensors, dtype=np.int32)
        batch = int(graph.reference_batch_size)
        if batch <= 0:
            return rows
        for t in np.nonzero(graph.tensor_batch_axis >= 0)[0].tolist():
            axis, shape = int(graph.tensor_batch_axis[t]), graph.tensor_shape[t]
            if shape is None or axis >= len(shape) or shape[axis] is None:
                continue
            length = int(shape[axis])
            if length > batch and length % batch == 0:
                rows[t] = length // batch
        return rows

    @staticmethod
    def _backward_ops(graph: OpGraph) -> np.ndarray:
        """bool[N]: batch-dependent ops that are not ancestors (data or control) of the loss op."""
        n = graph.num_ops
        if graph.loss_tensor < 0:
            return np.zeros(n, dtype=bool)
        parents = [[] for _ in range(n)]
        for t, c in zip(graph.tensor_op[graph.edge_tensor].tolist(), graph.edge_dst.tolist()):
            parents[c].append(t)
        for s, d in zip(graph.control_src.tolist(), graph.control_dst.tolist()):
            parents[d].append(s)
        forward = np.zeros(n, dtype=bool)
        stack = [int(graph.tensor_op[graph.loss_tensor])]
        while stack:
            i = stack.pop()
            if not forward[i]:
                forward[i] = True
                stack.extend(parents[i])
        return graph.op_batch_dependent & ~forward

    @staticmethod
    def _descends_from_loss(graph: OpGraph) -> np.ndarray:
        n = graph.num_ops
        if graph.loss_tensor < 0:
            return np.ones(n, dtype=bool)
        reached = np.zeros(n, dtype=bool)
        succ = [[] for _ in range(n)]
        for s, d in zip(graph.tensor_op[graph.edge_tensor].tolist(), graph.edge_dst.tolist()):
            succ[s].append(d)
        stack = [int(graph.tensor_op[graph.loss_tensor])]
        while stack:  # order-free (metadata clones are appended after their consumers)
            i = stack.pop()
            if not reached[i]:
                reached[i] = True
                stack.extend(succ[i])
        return reached

    # ---- signatures ----------------------------------------------------------------------------
    def _signatures(self, graph: OpGraph) -> None:
        g, lk, role, cls = (x.tolist() for x in (self.op_group, self.lkind, self.role, self.tensor_cls))
        order = np.argsort(graph.edge_tensor, kind="stable")
        e_tensor = graph.edge_tensor[order].tolist()
        e_dst = graph.edge_dst[order].tolist()
        edge_slot = np.zeros(len(order), dtype=np.int32)
        slots_of: List[List[Tuple[int, int, int]]] = [[] for _ in range(graph.num_tensors)]
        edge_key: List[Tuple[int, int, int]] = []
        for t, c in zip(e_tensor, e_dst):
            pmode = PM_NONE if cls[t] != CLS_PARTIAL else (PM_LOCAL if role[c] == ROLE_REPLICA else PM_AGG)
            key = (g[c], lk[c], pmode)
            edge_key.append(key)
            slots_of[t].append(key)
        sig_id: Dict[tuple, int] = {}
        tensor_sig = np.zeros(graph.num_tensors, dtype=np.int32)
        slot_index: List[Dict[tuple, int]] = []
        prod = graph.tensor_op.tolist()
        for t in range(graph.num_tensors):
            slots = tuple(sorted(set(slots_of[t])))
            key = (cls[t], g[prod[t]], lk[prod[t]], slots)
            s = sig_id.get(key)
            if s is None:
                s = sig_id[key] = len(sig_id)
                slot_index.append({k: i for i, k in enumerate(slots)})
            tensor_sig[t] = s
        sig_list = tensor_sig.tolist()
        edge_slot[order] = [slot_index[sig_list[t]][key] for t, key in zip(e_tensor, edge_key)]
        keys = list(sig_id)
        self.sig_keys = keys  # (cls, producer group, producer lkind, ((group, lkind, pmode), ...))
        self.tensor_sig, self.edge_slot = tensor_sig, edge_slot
        self.num_sigs = len(keys)
        self.sig_cls = np.array([k[0] for k in keys], dtype=np.int8)
        self.sig_pgroup = np.array([k[1] for k in keys], dtype=np.int64)
        self.sig_plkind = np.array([k[2] for k in keys], dtype=np.int64)
        self.sig_slot_ptr = np.concatenate([[0], np.cumsum([len(k[3]) for k in keys])]).astype(np.int64)
        flat = [s for k in keys for s in k[3]]
        self.slot_group = np.array([s[0] for s in flat], dtype=np.int64)
        self.slot_lkind = np.array([s[1] for s in flat], dtype=np.int64)
        self.slot_pmode = np.array([s[2] for s in flat], dtype=np.int64)
        touch_sig = np.concatenate([np.arange(self.num_sigs), np.repeat(np.arange(self.num_sigs),
                                                                         np.diff(self.sig_slot_ptr))])
        touch_group = np.concatenate([self.sig_pgroup, self.slot_group])
        pairs = np.unique(touch_group * max(self.num_sigs, 1) + touch_sig)
        grp, sig = pairs // max(self.num_sigs, 1), pairs % max(self.num_sigs, 1)
        self.group_sig_ptr = np.concatenate([[0], np.cumsum(np.bincount(grp, minlength=self.num_groups))])
        self.group_sig_idx = sig.astype(np.int64)

    def sigs_of_groups(self, groups) -> np.ndarray:
        """Signature ids that involve any of `groups` (as producer or consumer)."""
        parts = [self.group_sig_idx[self.group_sig_ptr[g]:self.group_sig_ptr[g + 1]] for g in groups]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _copied_reads(graph: OpGraph) -> np.ndarray:
    """bool[N]: the ReadVariableOps of variables in copy-on-read mode (a sparse op reads or
    updates them, _COPY_ON_READ_PREFIXES), whose output is a copy of the variable, not an alias."""
    types = graph.op_types
    handle_of = np.full(graph.num_ops, -1, dtype=np.int64)  # the handle op an op reads, if any
    src = graph.tensor_op[graph.edge_tensor].astype(np.int64)
    is_handle = np.zeros(graph.num_ops, dtype=bool)
    is_handle[[v.op for v in graph.variables]] = True
    from_handle = is_handle[src]
    handle_of[graph.edge_dst[from_handle]] = src[from_handle]
    sparse = np.array([t.startswith(_COPY_ON_READ_PREFIXES) for t in types], dtype=bool)
    cow = np.zeros(graph.num_ops, dtype=bool)
    cow[src[from_handle & sparse[graph.edge_dst]]] = True  # every handle a sparse op takes
    reads = np.array([t == "ReadVariableOp" for t in types], dtype=bool)
    return reads & (handle_of >= 0) & cow[np.maximum(handle_of, 0)]
