"""Loads one training step into an `OpGraph` (see tfplace.ir.graph_ir for the array layout).

    load_op_graph("graph_defs/zoo/vgg19_b64_s224_sgd.json")       # a bundle (metadata JSON)
    load_op_graph("step.pb", sinks=["train_op"], batch_size=64)   # a bare GraphDef file
    load_op_graph(graph_def, sinks=["train_op"], batch_size=64)   # a GraphDef proto
    load_op_graph("step.pbtxt") / load_op_graph("step.meta")     # roles inferred (step_roles)

What it does, in order:
  1. reads the source; every bad input (a path that is not a regular file, truncated file,
     missing or unknown sink, no inputs, unknown metadata key, ...) becomes one `InputError`
     naming the file, the field and the fix;
  1b. a bare step (no bundle, no sinks) gets its train op, loss, inputs with batch axes and init
     op inferred by tfplace.ir.step_roles (a MetaGraphDef's collections help);
  2. keeps the step: the sinks (and the loss op) and their ancestors over data + control edges,
     in a deterministic topological order; TF1 control flow and loops in the step are rejected
     with `UnsupportedGraphError` (functional `If`/`StatelessIf` are single ops and fine);
  3. imports the step twice into fresh `tf.Graph`s, with every input's batch dimension set to B
     and to 2B; TensorFlow's C++ shape inference runs on import. A tensor axis is its batch axis
     when its length at 2B is exactly twice its length at B (the first such axis; B·seq-long
     axes count too). Dims unknown at either size mean "no batch axis" (shape inference is the
     only evidence we trust; no op-name lists). dtype, shape and bytes come from the import at B
     (real dtype sizes; unknown dims fall back to the GraphDef's `_output_shapes`, and are
     counted as 1 element if still unknown, so bytes are then a lower bound). Functional
     conds get their output shapes re-derived from their branch bodies (tfplace.ir.shapes);
  4. finds variables with their readers, updaters and optimizer slots (by op-type patterns
     that cover every optimizer), the loss tensor and its batch reduction (tfplace.ir.roles).

Known limits: a batch size baked into a reshape that still succeeds at 2B (e.g. to [B, -1])
silently marks the wrong axis; `op_batch_dependent` is true for ops whose *value* depends on the
batch size without carrying a batch axis (Shape, the 1/B of a mean's gradient): the lowering must
treat those as batch-size dependent, not as partial sums.
"""

from __future__ import annotations

import heapq
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tfplace.formats.errors import InputError, UnsupportedGraphError
from tfplace.formats.files import require_regular_file
from tfplace.ir import roles as graph_roles, shapes as graph_shapes, step_roles
from tfplace.ir.graph_ir import OpGraph
from tfplace.ir.shapes import shape_attr_dims
from tfplace.formats.jsonio import FieldReader

META_FORMAT = "tfplace.graph"
# Global batch of an inferred step whose placeholders leave the batch unknown (None) and whose
# caller gives none: shapes and bytes are then per this many samples (reports print the batch).
DEFAULT_BATCH_SIZE = 32
# TF1 (v1 control flow) loop and cond primitives, and functional loops. A loop's trip count and
# its per-iteration accumulators are invisible to placement; v1 Switch/Merge cannot be split.
_CONTROL_FLOW_OPS = frozenset({
    "Enter", "Exit", "NextIteration", "Switch", "Merge", "LoopCond", "RefEnter", "RefExit",
    "RefNextIteration", "RefSwitch", "RefMerge", "While", "StatelessWhile", "_While"})

# Ops that call back into the Python of the process that built the graph (tf.numpy_function,
# tf.py_function): a step with one cannot run on a server, and their outputs have no shapes.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})

GraphSource = Union[str, os.PathLike, "object"]


def load_op_graph(path_or_graph_def: GraphSource, *, sinks: Optional[Sequence[str]] = None,
                  batch_size: Optional[int] = None, loss: Optional[str] = None,
                  loss_reduction: Optional[str] = None, source: Optional[str] = None,
                  inputs: Optional[Sequence[str]] = None) -> OpGraph:
    """Builds the OpGraph of one training step.

    Args:
      path_or_graph_def: bundle metadata `.json`, `.pb` (binary) / `.pbtxt` (text) GraphDef
        file, `.meta` MetaGraphDef file, or a `GraphDef` proto.
      sinks: train op name(s); overrides a bundle's `sink`. Without a bundle and without sinks,
        the train op, loss, inputs and init op are inferred (tfplace.ir.step_roles; an
        ambiguous role is one InputError naming the argument to give). The first sink is
        `OpGraph.sink`; all are kept in the step.
      batch_size: global batch size the shapes and bytes refer to; default: the bundle's
        `global_batch_size`, else the placeholders' concrete batch dimension, else
        DEFAULT_BATCH_SIZE for a bare step (not a bundle).
      loss: loss op name (or "op:port"); default: the bundle's `loss`, or the inferred one. With
        sinks and loss_reduction given and no loss, the graph's `loss_tensor` is -1.
      inputs: batched input placeholders, "name" or "name:batch_axis" each (a bare step only;
        default: every placeholder of rank >= 1, batch axis = its one None dimension, else 0).
      loss_reduction: "mean" or "sum"; default: the bundle's, else detected from the op that
        reduces the loss over the batch (Mean -> mean, Sum -> sum, Sum / batch size -> mean; Sum / a value
        of the batch's values, a weighted mean, is refused: tfplace.ir.roles.detect_reduction).
      source: name for error messages when a proto is passed (default "GraphDef").
    Raises:
      InputError (UnsupportedGraphError for control flow / cycles).
    """
    graph_def, meta, src = read_graph_source(path_or_graph_def, source)
    bare = "sink" not in meta  # a step of the user's own, not a bundle: an unknown batch is DEFAULT_BATCH_SIZE
    if loss_reduction is not None and loss_reduction not in ("mean", "sum"):
        raise InputError(src, "loss_reduction", f"is {loss_reduction!r}", 'use "mean" or "sum"')
    hints = meta.pop("hints", None)
    if "sink" not in meta and (sinks is None or inputs is not None or (loss is None and loss_reduction is None)):
        # a bare step: infer the roles not given
        for name in ([sinks] if isinstance(sinks, str) else sinks or []):
            _NodeTable(graph_def, src).lookup(name, "train_op", _TRAIN_OP_FIX)
        roles = step_roles.infer_step(graph_def, train_ops=_sink_names(sinks, {"sink": ""}, src) if sinks else None,
                                      loss=loss, inputs=inputs, loss_reduction=loss_reduction, hints=hints, src=src)
        graph_def, inferred = step_roles.step_meta(graph_def, roles)
        meta.update(inferred)
        if isinstance(path_or_graph_def, (str, os.PathLike)):
            meta.setdefault("model", os.path.basename(src).rsplit(".", 1)[0])
    sink_names = _sink_names(sinks, meta, src)
    loss_name = loss if loss is not None else meta.get("loss")
    reduction = loss_reduction if loss_reduction is not None else meta.get("loss_reduction")
    if reduction is not None and reduction not in ("mean", "sum"):
        raise InputError(src, "loss_reduction", f"is {reduction!r}", 'use "mean" or "sum"')
    nodes = _NodeTable(graph_def, src)
    roots = [nodes.lookup(s, "train_op", _TRAIN_OP_FIX) if sinks is not None else nodes.lookup(s, "sink")
             for s in sink_names]
    loss_op, loss_port = (None, 0)
    if loss_name:
        loss_op, loss_port = nodes.lookup_tensor(loss_name, "loss")
        roots.append(loss_op)
    order = nodes.step_order(roots)
    inputs = _find_inputs(nodes, order, meta, src)
    batch = _batch_size(nodes, inputs, batch_size, meta, src, bare)
    import_b = graph_shapes.import_at(nodes, order, inputs, batch, src)
    import_2b = graph_shapes.import_at(nodes, order, inputs, 2 * batch, src, doubled=True)
    arrays = graph_shapes.build_arrays(nodes, order, inputs, import_b, import_2b, batch)
    pos = {name: i for i, name in enumerate(arrays["names"])}
    input_ops = tuple(sorted(pos[nodes.names[i]] for i, _ in inputs))
    batch_dependent = graph_shapes.batch_dependent(len(order), input_ops, arrays)
    variables = graph_roles.find_variables(nodes.graph_def_nodes(order), arrays)
    loss_tensor = -1
    if loss_op is not None:
        key = (pos[nodes.names[loss_op]], loss_port)
        if key not in arrays["tensor_of"]:
            raise InputError(src, "loss", f"op {loss_name!r} has no output {loss_port}", "name the loss tensor's op")
        loss_tensor = arrays["tensor_of"][key]
    if reduction is None:
        reduction = graph_roles.detect_reduction(loss_tensor, arrays, batch_dependent, src)
    return OpGraph(
        names=arrays["names"], op_types=arrays["op_types"], tensor_op=arrays["tensor_op"],
        tensor_port=arrays["tensor_port"], tensor_dtype=arrays["tensor_dtype"],
        tensor_shape=arrays["tensor_shape"], tensor_bytes=arrays["tensor_bytes"],
        tensor_batch_axis=arrays["tensor_batch_axis"], edge_tensor=arrays["edge_tensor"],
        edge_dst=arrays["edge_dst"], edge_dst_port=arrays["edge_dst_port"],
        control_src=arrays["control_src"], control_dst=arrays["control_dst"],
        op_batch_dependent=batch_dependent, variables=variables, inputs=input_ops,
        sink=pos[nodes.names[roots[0]]], loss_tensor=loss_tensor, loss_reduction=reduction,
        reference_batch_size=batch, source=src, meta=meta, graph_def=graph_def)


# ---- reading the source ---------------------------------------------------------------------
# Bundle metadata keys (graph_defs/bundle.py). Unknown keys are rejected: a typo must not be
# silently ignored. Add a key here when the bundle format grows (and bump its version).
_META_OPTIONAL = {
    "model": str, "image_size": (int, type(None)), "seq_len": (int, type(None)),
    "num_layers": (int, type(None)), "optimizer": str, "learning_rate": float, "init_op": str,
    "loss": str, "loss_reduction": str, "op_count": int, "variable_count": int,
    "param_count": int, "trainable_param_count": int, "param_bytes": int, "graph_bytes": int,
    "tf_version": str, "seed": int, "num_classes": (int, type(None)), "variant": (str, type(None)),
    "source_hash": str, "export_seconds": float,
}


def check_placeable(graph_def, roots: Sequence[str], source: str) -> None:
    """Raises the error `load_op_graph` would raise for the step that computes the ops `roots`
    (names) of `graph_def`: UnsupportedGraphError for loops, TF1 control flow, Python ops or a
    cycle, InputError for a missing root. For an exporter that must not write what no command
    can load; `source` names it in the message (e.g. "export_keras")."""
    nodes = _NodeTable(graph_def, source)
    nodes.step_order([nodes.lookup(name, "roots") for name in roots])


def read_graph_source(obj, source):
    """Returns (graph_def, meta dict, source name)."""
    if not isinstance(obj, (str, os.PathLike)):
        if not hasattr(obj, "node"):
            raise InputError(source or "argument path_or_graph_def", "",
                             f"expected a path or a GraphDef, got {type(obj).__name__}",
                             "pass a bundle .json, a .pb/.pbtxt file or a tf.compat.v1.GraphDef")
        return obj, {}, source or "GraphDef"
    path = os.fspath(obj)
    if path.endswith(".json"):
        return _read_bundle(path)
    if path.endswith(".meta"):
        return _read_meta_graph(path)
    return _read_graph_def(path, path), {}, path


def _read_meta_graph(path):
    """(graph_def, {"hints": train_op collection and variable initializers}, path) of a MetaGraphDef."""
    require_regular_file(path, field="")
    from google.protobuf import message, text_format
    from tensorflow.core.framework import variable_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_graph = meta_graph_pb2.MetaGraphDef()
    with open(path, "rb") as f:
        data = f.read()
    try:
        meta_graph.ParseFromString(data)
    except (message.DecodeError, RuntimeError):
        try:
            text_format.Parse(data.decode("utf-8"), meta_graph)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise InputError(path, "", f"not a valid MetaGraphDef ({str(e).splitlines()[0][:120]})",
                             "write it with tf.compat.v1.train.export_meta_graph") from None
    if not meta_graph.graph_def.node:
        raise InputError(path, "graph_def", "the MetaGraphDef has no graph nodes", "export a non-empty training step")
    collections = meta_graph.collection_def
    hints = {"train_op": list(collections["train_op"].node_list.value) if "train_op" in collections else []}
    inits = []
    for key in ("variables", "local_variables"):
        for raw in (collections[key].bytes_list.value if key in collections else []):
            var = variable_pb2.VariableDef()
            var.ParseFromString(raw)
            inits.append(var.initializer_name.split(":")[0])
    hints["initializers"] = inits
    return meta_graph.graph_def, {"hints": hints}, path


def _read_bundle(path):
    r = FieldReader.from_file(path, expected_format=META_FORMAT)
    meta = {"format": META_FORMAT, "version": r.get("version", int, default=1)}
    graph_file = r.get("graph_file", str)
    meta["graph_file"] = graph_file
    meta["global_batch_size"] = r.get("global_batch_size", int, check=lambda v: v > 0, must="be > 0")
    meta["sink"] = r.get("sink", str)
    inputs = []
    for item in r.items("inputs", min_len=1):
        spec = {"name": item.get("name", str), "dtype": item.get("dtype", str, default="float32"),
                "shape": item.get("shape", list, default=None),
                "batch_axis": item.get("batch_axis", int, default=0, check=lambda v: v >= 0, must="be >= 0")}
        if item.has("max_value"):
            spec["max_value"] = item.get("max_value", int)
        item.reject_unknown(also_allowed=("comment",))
        inputs.append(spec)
    meta["inputs"] = inputs
    for key, kind in _META_OPTIONAL.items():
        if r.has(key):
            meta[key] = r.get(key, kind)
    r.reject_unknown()
    graph_path = os.path.join(os.path.dirname(path), graph_file)
    if not os.path.exists(graph_path):
        raise InputError(path, "graph_file", f"{graph_file!r} not found next to the metadata",
                         "put the .pb beside the .json or fix graph_file")
    require_regular_file(graph_path, path, "graph_file")
    size = os.path.getsize(graph_path)
    if "graph_bytes" in meta and meta["graph_bytes"] != size:
        raise InputError(path, "graph_bytes", f"is {meta['graph_bytes']} but {graph_path} has {size} bytes "
                         "(truncated or replaced file?)", "re-export the bundle")
    return _read_graph_def(graph_path, path), meta, path


def _read_graph_def(path, source):
    require_regular_file(path, field="")  # before TensorFlow loads; never opens a FIFO
    from google.protobuf import message, text_format
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        data = f.read()
    try:
        if path.endswith(".pbtxt"):
            text_format.Parse(data.decode("utf-8"), graph_def)
        else:
            graph_def.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, RuntimeError) as e:
        where = source if source == path else f"{source} -> {path}"
        raise InputError(where, "", f"not a valid GraphDef ({str(e).splitlines()[0][:120]})",
                         "re-export the graph (truncated or not a GraphDef? binary files must "
                         "end in .pb, text files in .pbtxt)") from None
    if not graph_def.node:
        raise InputError(path, "node", "the GraphDef has no nodes", "export a non-empty training step")
    return graph_def


# the train ops given (sinks=) are the user's --train_op (a config's graph entry: "train_ops", named
# by graph_defs.export.bundle_for_entry): the error names that role, not this function's argument
_TRAIN_OP_FIX = "name an existing op with --train_op (Python: sinks=)"


def _sink_names(sinks, meta, src) -> List[str]:
    if sinks is None:
        if "sink" not in meta:
            raise InputError(src, "sinks", "no sink (train op) given",
                             "pass sinks=['train_op'] (or use a bundle whose metadata names its sink)")
        return [meta["sink"]]
    names = [sinks] if isinstance(sinks, str) else list(sinks)
    if not names or not all(isinstance(s, str) and s for s in names):
        raise InputError(src, "train_op", f"must be a non-empty list of op names, got {sinks!r}",
                         "name the train op with --train_op NAME (Python: sinks=['train_op'])")
    return names


class _NodeTable:
    """The GraphDef's nodes by index, with parsed inputs (built lazily, per node)."""

    def __init__(self, graph_def, src):
        self.graph_def, self.src = graph_def, src
        self.nodes = list(graph_def.node)
        self.names = [n.name for n in self.nodes]
        self.index: Dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise InputError(src, f"node[{i}].name", f"duplicate node name {name!r}", "re-export the graph")
            self.index[name] = i
        self._inputs: Dict[int, Tuple[List[Tuple[int, int]], List[int]]] = {}

    def lookup(self, name, field, fix="name an existing op"):
        name = name.lstrip("^")
        if name not in self.index:
            close = [n for n in self.names if n.endswith(name.split("/")[-1])][:3]
            raise InputError(self.src, field, f"no node named {name!r} in the graph",
                             fix + (f", e.g. one of {close}" if close else ""))
        return self.index[name]

    def lookup_tensor(self, name, field):
        op, _, port = name.partition(":")
        return self.lookup(op, field), int(port) if port.isdigit() else 0

    def inputs(self, i) -> Tuple[List[Tuple[int, int]], List[int]]:
        """([(producer, port)] data inputs in order, [producer] control inputs) of node i."""
        if i not in self._inputs:
            data, control = [], []
            for k, spec in enumerate(self.nodes[i].input):
                if spec.startswith("^"):
                    control.append(self.lookup(spec[1:], f"node[{self.names[i]}].input[{k}]"))
                else:
                    op, _, port = spec.partition(":")
                    data.append((self.lookup(op, f"node[{self.names[i]}].input[{k}]"), int(port or 0)))
            self._inputs[i] = (data, control)
        return self._inputs[i]

    def step_order(self, roots) -> List[int]:
        """Ancestors of `roots` (data + control), topologically sorted; ties by GraphDef order."""
        step, stack = set(roots), list(roots)
        while stack:
            data, control = self.inputs(stack.pop())
            for j in [p for p, _ in data] + control:
                if j not in step:
                    step.add(j)
                    stack.append(j)
        python = sorted(i for i in step if self.nodes[i].op in _PYTHON_OPS)
        if python:
            raise UnsupportedGraphError(
                self.src, f"node[{self.names[python[0]]}].op",
                f"is {self.nodes[python[0]].op} (tf.numpy_function / tf.py_function): it runs Python of the process "
                f"that built the graph, which no TensorFlow server can run, and its outputs have no shapes"
                + (f" ({len(python)} such ops)" if len(python) > 1 else ""),
                "write that part with TensorFlow ops, or compute it outside the step and feed it as an input")
        flow = sorted(i for i in step if self.nodes[i].op in _CONTROL_FLOW_OPS)
        if flow:
            kinds = sorted({self.nodes[i].op for i in flow})
            loop = any(self.nodes[i].op not in ("Switch", "Merge", "RefSwitch", "RefMerge") for i in flow)
            raise UnsupportedGraphError(
                self.src, f"node[{self.names[flow[0]]}].op",
                f"the training step contains {'a loop' if loop else 'TF1 control flow'} "
                f"({', '.join(kinds)}; {len(flow)} ops), which cannot be placed or batch-split",
                "unroll loops (e.g. unroll=True for Keras RNNs) and build conditionals with control "
                "flow v2 (tf.compat.v1.enable_control_flow_v2()), which makes tf.cond a single If op")
        consumers: Dict[int, List[int]] = {i: [] for i in step}
        indegree = dict.fromkeys(step, 0)
        for i in step:
            data, control = self.inputs(i)
            for j in set([p for p, _ in data] + control):
                consumers[j].append(i)
                indegree[i] += 1
        ready = [i for i in step if indegree[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in consumers[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(step):
            stuck = sorted(i for i in step if indegree[i] > 0)[:5]
            raise UnsupportedGraphError(self.src, "node", "the training step has a cycle through "
                                        f"{[self.names[i] for i in stuck]}", "export an acyclic training step")
        return order

    def graph_def_nodes(self, order):
        return [self.nodes[i] for i in order]


# ---- inputs and batch size -----------------------------------------------------------------

def _find_inputs(nodes, order, meta, src) -> List[Tuple[int, int]]:
    """[(node index, batch axis)] of the step's batched inputs."""
    in_step = set(order)
    if meta.get("inputs"):
        found = []
        for k, spec in enumerate(meta["inputs"]):
            i = nodes.lookup(spec["name"], f"inputs[{k}].name")
            if nodes.nodes[i].op not in ("Placeholder", "PlaceholderV2"):
                raise InputError(src, f"inputs[{k}].name", f"{spec['name']!r} is a {nodes.nodes[i].op}, "
                                 "not a Placeholder", "name an input placeholder")
            dims = shape_attr_dims(nodes.nodes[i])
            if dims is None or spec["batch_axis"] >= len(dims):
                raise InputError(src, f"inputs[{k}].batch_axis", f"is {spec['batch_axis']} but the placeholder "
                                 f"has shape {dims}", "point batch_axis at the batch dimension of the shape")
            if i in in_step:
                found.append((i, spec["batch_axis"]))
    else:
        found = []
        for i in order:
            if nodes.nodes[i].op in ("Placeholder", "PlaceholderV2"):
                dims = shape_attr_dims(nodes.nodes[i])
                if dims is None:
                    raise InputError(src, f"node[{nodes.names[i]}].attr.shape", "placeholder of unknown rank",
                                     "give the placeholder a shape with None only at the batch axis")
                if dims:
                    found.append((i, 0))  # a bare GraphDef has its batch on axis 0 by convention
    if not found:
        raise step_roles.no_placeholders_error(src, tf_data=any(n.op.startswith("IteratorGetNext")
                                                                for n in nodes.nodes))
    return found


def _batch_size(nodes, inputs, batch_size, meta, src, bare: bool) -> int:
    """The global batch size: `batch_size` when given, else the bundle's, else the placeholders'
    one concrete batch dimension, else (a bare step whose batch dimensions are all None)
    DEFAULT_BATCH_SIZE. Raises InputError when the placeholders disagree."""
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise InputError(src, "batch_size", f"must be a positive integer, got {batch_size!r}", "pass e.g. 64")
        return int(batch_size)
    if "global_batch_size" in meta:
        return int(meta["global_batch_size"])
    sizes = {shape_attr_dims(nodes.nodes[i])[axis] for i, axis in inputs}
    if sizes == {-1} and bare:  # the user's own step with a None batch
        return DEFAULT_BATCH_SIZE
    if len(sizes) != 1 or min(sizes) <= 0:
        raise InputError(src, "batch_size", f"cannot tell the batch size from the placeholders (batch dims {sorted(sizes)})",
                         "pass batch_size=... (the global batch size; --batch-size or the strategy's on the command line)")
    return sizes.pop()
