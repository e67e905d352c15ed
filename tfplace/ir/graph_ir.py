"""OpGraph: the typed, array-based view of one training step that every part of tfplace shares.

Built by `tfplace.ir.loader.load_op_graph` from an exported bundle (GraphDef + metadata JSON)
or from a GraphDef plus explicit sinks. This module does not import TensorFlow, so the lowering
and the simulator can use it freely.

Layout (N ops, T tensors, E data edges, C control edges, V variables):

  ops        names[N], op_types[N]            in a topological order (data + control edges)
  tensors    tensor_op[T], tensor_port[T]     producer op index and output index
             tensor_dtype[T], tensor_shape[T] dtype name ("float32") and shape at the reference
                                              batch size (-1 where unknown)
             tensor_bytes[T]                  bytes at the reference batch size (real dtype sizes)
             tensor_batch_axis[T]             axis whose length is proportional to the batch size,
                                              -1 if the tensor has no batch dimension
  edges      edge_tensor[E], edge_dst[E], edge_dst_port[E]   tensor -> consumer op, input index
             control_src[C], control_dst[C]                  control dependency src -> dst
  ops        op_batch_dependent[N]            True if the op's outputs depend on the input batch
                                              (it descends from an input through data edges). A
                                              batch-dependent op whose output has no batch axis
                                              (a weight gradient, the loss) yields a *partial*
                                              value when the op runs on a slice of the batch.
  variables  variables[V]                     `Variable` records (handle op, readers, updaters)

Only the ops of one step are kept: the sink and its ancestors (data and control edges). The
initializer subgraph stays in `graph_def` (needed by the rewrite) but not in the arrays.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from tfplace.formats.errors import InputError

# Bytes per element for the dtypes that appear in training graphs (TF DataType names).
DTYPE_BYTES: Mapping[str, int] = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "half": 2, "float": 4, "double": 8,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16, "string": 8, "resource": 8,
    "variant": 8,
}


@dataclasses.dataclass(frozen=True)
class Variable:
    """One model or optimizer-slot variable.

    Attributes:
      op: index of the handle op (`VarHandleOp` / `VariableV2`) in OpGraph.names.
      name: its op name.
      dtype: element dtype name.
      shape: full shape.
      num_bytes: bytes of one copy.
      readers: op indices that read it (`ReadVariableOp`, or the ref edges of a TF1 variable).
      updaters: op indices that write it (`ResourceApply*`, `Apply*`, `AssignVariableOp`, ...).
      is_slot: True for optimizer state (momentum, Adam m/v, ...) rather than a model weight.
      trainable: True if gradients update it.
    """
    op: int
    name: str
    dtype: str
    shape: Tuple[int, ...]
    num_bytes: int
    readers: Tuple[int, ...]
    updaters: Tuple[int, ...]
    is_slot: bool = False
    trainable: bool = True


@dataclasses.dataclass(frozen=True, eq=False)
class OpGraph:
    """One training step as arrays. See the module docstring for the layout.

    Attributes beyond the arrays:
      inputs: op indices of the data inputs (Placeholder / IteratorGetNext).
      sink: op index of the train op.
      loss_tensor: tensor index of the loss, or -1 if unknown.
      loss_reduction: "mean" or "sum": how the loss reduces over the batch (decides the
        gradient aggregation weights).
      reference_batch_size: the global batch size the shapes and bytes refer to.
      source: file the graph came from (for error messages).
      meta: the bundle metadata (model name, optimizer, ...), empty for a bare GraphDef.
      graph_def: the original `GraphDef` proto (kept for the rewrite), or None.
    """
    names: Tuple[str, ...]
    op_types: Tuple[str, ...]
    tensor_op: np.ndarray          # int32 [T]
    tensor_port: np.ndarray        # int32 [T]
    tensor_dtype: Tuple[str, ...]  # [T]
    tensor_shape: Tuple[Tuple[int, ...], ...]  # [T]
    tensor_bytes: np.ndarray       # int64 [T], at reference_batch_size
    tensor_batch_axis: np.ndarray  # int8 [T], -1 = no batch dimension
    edge_tensor: np.ndarray        # int32 [E]
    edge_dst: np.ndarray           # int32 [E]
    edge_dst_port: np.ndarray      # int32 [E]
    control_src: np.ndarray        # int32 [C]
    control_dst: np.ndarray        # int32 [C]
    op_batch_dependent: np.ndarray  # bool [N]
    variables: Tuple[Variable, ...]
    inputs: Tuple[int, ...]
    sink: int
    loss_tensor: int
    loss_reduction: str
    reference_batch_size: int
    source: str = ""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    graph_def: Any = None

    def __post_init__(self):
        n, t = len(self.names), len(self.tensor_op)
        src = self.source or "graph"
        checks = [
            ("op_types", len(self.op_types) == n),
            ("tensor_port", len(self.tensor_port) == t),
            ("tensor_dtype", len(self.tensor_dtype) == t),
            ("tensor_shape", len(self.tensor_shape) == t),
            ("tensor_bytes", len(self.tensor_bytes) == t),
            ("tensor_batch_axis", len(self.tensor_batch_axis) == t),
            ("edge_dst", len(self.edge_dst) == len(self.edge_tensor)),
            ("edge_dst_port", len(self.edge_dst_port) == len(self.edge_tensor)),
            ("control_dst", len(self.control_dst) == len(self.control_src)),
            ("op_batch_dependent", len(self.op_batch_dependent) == n),
        ]
        for field, ok in checks:
            if not ok:
                raise InputError(src, field, "array length does not match the op/tensor/edge count",
                                 "build the OpGraph with tfplace.ir.loader.load_op_graph")
        if not 0 <= self.sink < n:
            raise InputError(src, "sink", f"op index {self.sink} out of range", "name an existing train op")
        if self.loss_reduction not in ("mean", "sum"):
            raise InputError(src, "loss_reduction", f"is {self.loss_reduction!r}", 'use "mean" or "sum"')
        if self.reference_batch_size <= 0:
            raise InputError(src, "reference_batch_size", "must be > 0", "give the global batch size")
        # Cached lookups (the dataclass is frozen, so set through object.__setattr__).
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The graph's name, as strategies made for it record it ("graph"): the bundle's model
        name (a zoo model's, or a bare step's file name), else the file's stem."""
        return str(self.meta.get("model") or os.path.splitext(os.path.basename(self.source))[0])

    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_op)

    def static_elements(self, tensor: int) -> int:
        """Elements of `tensor` when its shape is fully known and the same at every batch size (no
        batch axis, no -1 dim), else -1."""
        shape = self.tensor_shape[tensor]
        if self.tensor_batch_axis[tensor] >= 0 or -1 in shape:
            return -1
        return int(np.prod(shape, dtype=np.int64))

    def index(self, op_name: str) -> int:
        """Op index of `op_name`; raises InputError naming the graph if absent."""
        try:
            return self._index[op_name]
        except KeyError:
            raise InputError(self.source or "graph", "op", f"no op named {op_name!r} in the training step",
                             "check the op name (ops outside the step, e.g. initializers, are not kept)") from None

    def has_op(self, op_name: str) -> bool:
        return op_name in self._index

    def tensor_bytes_at(self, batch_size: int) -> np.ndarray:
        """Bytes of every tensor when the step runs on `batch_size` samples (float64 [T]).

        Tensors with a batch axis scale linearly with the batch; the others keep their size.
        """
        scale = np.where(self.tensor_batch_axis >= 0, batch_size / self.reference_batch_size, 1.0)
        return self.tensor_bytes * scale

    @property
    def param_bytes(self) -> int:
        """Bytes of all variables, model weights and optimizer slots."""
        return int(sum(v.num_bytes for v in self.variables))

    @property
    def trainable_param_count(self) -> int:
        return int(sum(int(np.prod(v.shape)) for v in self.variables if v.trainable and not v.is_slot))

    def summary(self) -> Dict[str, Any]:
        """A few numbers that describe the graph (for CLIs and the manifest)."""
        types: Dict[str, int] = {}
        for op_type in self.op_types:
            types[op_type] = types.get(op_type, 0) + 1
        return {
            "model": self.meta.get("model", self.source),
            "ops": self.num_ops,
            "tensors": self.num_tensors,
            "data_edges": int(len(self.edge_tensor)),
            "control_edges": int(len(self.control_src)),
            "variables": len(self.variables),
            "trainable_params": self.trainable_param_count,
            "param_bytes": self.param_bytes,
            "batched_tensors": int((self.tensor_batch_axis >= 0).sum()),
            "reference_batch_size": self.reference_batch_size,
            "loss_reduction": self.loss_reduction,
            "top_op_types": sorted(types.items(), key=lambda kv: -kv[1])[:8],
        }
