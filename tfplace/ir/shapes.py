"""Shapes of a training step at two batch sizes, and the arrays of an OpGraph built from them.

Internal to tfplace.ir.loader (which documents the method): `import_at` imports the step with
every input's batch dimension set to a given size (TensorFlow's C++ shape inference runs on
import; functional conds get their output shapes re-derived from their branch bodies),
`build_arrays` turns the imports at B and 2B into the op/tensor/edge arrays with batch axes, and
`batch_dependent` marks the descendants of the inputs.
"""

from __future__ import annotations

import re
from typing import Dict, Tuple

import numpy as np

from tfplace.formats.errors import INT32_OVERFLOW, InputError, size_overflow_problem
from tfplace.ir.graph_ir import DTYPE_BYTES

_NODE_NAME_IN_TF_ERROR = re.compile(r"\{\{node ([^}]+)\}\}|node '?([\w/.\-]+)'?")


def shape_attr_dims(node):
    """Dims of a NodeDef's `shape` attr (-1 unknown), or None for unknown rank / no attr."""
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    if shape is None or shape.unknown_rank:
        return None
    return [d.size for d in shape.dim]


def element_bytes(dtype) -> int:
    """Bytes per element of a tf.DType (real sizes; 8 for handles and strings)."""
    return DTYPE_BYTES.get(dtype.name) or max(int(dtype.size), 1)


def import_at(nodes, order, inputs, batch, src, doubled=False):
    """Imports the step with every input's batch dim = `batch`; returns the tf.Graph."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.versions.CopyFrom(nodes.graph_def.versions)
    gd.library.CopyFrom(nodes.graph_def.library)
    axis_of = dict(inputs)
    for i in order:
        node = gd.node.add()
        node.CopyFrom(nodes.nodes[i])
        # Recorded shapes are stale at a new batch, and colocation may name ops outside the step.
        for attr in ("_output_shapes", "_class"):
            if attr in node.attr:
                del node.attr[attr]
        if i in axis_of:
            node.attr["shape"].shape.dim[axis_of[i]].size = batch
    try:
        graph = _import(gd)
        # Functional conds carry the output shapes recorded when they were built (batch None);
        # re-derive them from the branch bodies at this batch, then import again (nested conds
        # may need a second round).
        for _ in range(3):
            if not _refine_cond_shapes(gd, graph):
                break
            graph = _import(gd)
    except (ValueError, tf.errors.OpError, TypeError) as e:
        text = str(e)
        match = _NODE_NAME_IN_TF_ERROR.search(text)
        op = next((g for g in match.groups() if g), "?") if match else "?"
        first = _tf_reason(text, {n.name: n.op for n in gd.node}) if text else type(e).__name__
        if INT32_OVERFLOW in text:  # the batch's fault, not the graph's
            problem = size_overflow_problem(batch // 2 if doubled else batch)
            raise InputError(src, "batch_size", problem + (f" at twice the batch ({batch}), where shapes are "
                                                           "inferred" if doubled else ""),
                             "use a smaller batch size") from None
        if doubled:
            why, fix = _baked_batch(nodes, inputs)
            raise InputError(src, f"node[{op}]", f"shape inference fails at twice the batch size ({batch}): "
                             f"{first}; {why}", fix) from None
        raise InputError(src, f"node[{op}]", f"TensorFlow cannot import the graph: {first}",
                         "re-export the graph with this TensorFlow version") from None
    return graph


def _baked_batch(nodes, inputs) -> Tuple[str, str]:
    """(why the batch is baked in, the fix) for a step that fails shape inference at 2B.

    Placeholders of a fixed batch make TensorFlow fold that batch into constants of the step (the
    gradients' shapes) when it is built, so the fix is at the export: a None batch dimension."""
    fixed = [(nodes.names[i], axis, shape_attr_dims(nodes.nodes[i])) for i, axis in inputs
             if shape_attr_dims(nodes.nodes[i])[axis] > 0]
    if not fixed:
        return ("the batch size is baked into the graph",
                "export the graph with a None batch dimension (no constant batch in reshapes, fills or slices)")
    name, axis, dims = fixed[0]
    example = "[" + ", ".join("None" if k == axis else str(d) for k, d in enumerate(dims)) + "]"
    shapes = ", ".join(f"{n!r} {d}" for n, _, d in fixed[:3])
    shapes += f" and {len(fixed) - 3} more" if len(fixed) > 3 else ""
    return (f"the placeholders fix the batch ({shapes}), so it is baked into the graph",
            f"export the step with a None batch dimension in its placeholders (e.g. shape {example} for {name!r}), "
            "and no constant batch in reshapes, fills or slices")


_TF_NODE_DEF = re.compile(r" for '\{\{node ([^}]+)\}\} = .*?'(?: with input shapes: (.*?))?\.?$")


def _tf_reason(text: str, op_types: Dict[str, str], limit: int = 300) -> str:
    """TensorFlow's import error in words: its first line, with the printed NodeDef (attrs, inputs)
    replaced by the op's name and type, and cut (if at all) between words, never inside one."""
    line = text.splitlines()[0]
    match = _TF_NODE_DEF.search(line)
    if match:
        name, shapes = match.group(1), match.group(2)
        line = (line[:match.start()] + f" in {op_types.get(name, 'an op')} op {name!r}"
                + (f" (input shapes {shapes})" if shapes else ""))
    if len(line) > limit:
        line = line[:limit].rsplit(" ", 1)[0] + " ..."
    return line


def _import(graph_def):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return graph


_CONDS = ("If", "StatelessIf", "Case", "StatelessCase")


def _without_arg_shapes(function_def):
    """A copy whose arguments carry no recorded shapes (they would override the traced ones)."""
    copy = type(function_def)()
    copy.CopyFrom(function_def)
    for arg in copy.arg_attr.values():
        if "_output_shapes" in arg.attr:
            del arg.attr["_output_shapes"]
    return copy


def _refine_cond_shapes(graph_def, graph) -> bool:
    """Sets `output_shapes` of functional conds from their branch bodies traced at the cond's
    current input shapes (a dim stays unknown unless all branches agree). True if any changed."""
    conds = [n for n in graph_def.node if n.op in _CONDS]
    if not conds:
        return False
    from tensorflow.python.framework import function_def_to_graph

    functions = {f.signature.name: f for f in graph_def.library.function}
    changed = False
    for node in conds:
        op = graph.get_operation_by_name(node.name)
        if all(t.shape.is_fully_defined() for t in op.outputs):
            continue
        if node.op.endswith("If"):
            branches = [node.attr["then_branch"].func.name, node.attr["else_branch"].func.name]
        else:
            branches = [f.name for f in node.attr["branches"].list.func]
        try:
            outputs = [function_def_to_graph.function_def_to_graph(
                _without_arg_shapes(functions[name]), input_shapes=[t.shape for t in op.inputs[1:]]).outputs
                for name in branches]
        except Exception:  # best effort: a body we cannot trace keeps its recorded shapes
            continue
        merged = []
        for shapes in zip(*outputs):
            shape = shapes[0].shape
            for other in shapes[1:]:
                shape = shape.most_specific_compatible_shape(other.shape)
            merged.append(shape)
        old = [t.shape for t in op.outputs]
        if len(merged) == len(old) and any(m.as_list() != o.as_list() if m.rank is not None else False
                                           for m, o in zip(merged, old)):
            node.attr["output_shapes"].list.Clear()
            node.attr["output_shapes"].list.shape.extend([m.as_proto() for m in merged])
            changed = True
    return changed


def _shape_of(tensor_shape):
    if tensor_shape.rank is None:
        return None
    return tuple(-1 if d is None else int(d) for d in tensor_shape.as_list())


def _recorded_shapes(node):
    if "_output_shapes" not in node.attr:
        return []
    return [None if s.unknown_rank else tuple(int(d.size) for d in s.dim) for s in node.attr["_output_shapes"].list.shape]


def _batch_axis(shape_b, shape_2b) -> int:
    if shape_b is None or shape_2b is None or len(shape_b) != len(shape_2b):
        return -1
    for axis, (a, b) in enumerate(zip(shape_b, shape_2b)):
        if a > 0 and b == 2 * a:
            return axis
    return -1


def build_arrays(nodes, order, inputs, graph_b, graph_2b, batch):
    """Op, tensor and edge arrays (dict of name -> array) in `order`."""
    # `_output_shapes` recorded in the GraphDef are only valid at the batch it was exported at.
    recorded_batch_ok = all(shape_attr_dims(nodes.nodes[i])[axis] == batch for i, axis in inputs)
    pos = {i: k for k, i in enumerate(order)}
    names = tuple(nodes.names[i] for i in order)
    op_types = tuple(nodes.nodes[i].op for i in order)
    t_op, t_port, t_dtype, t_shape, t_bytes, t_axis = [], [], [], [], [], []
    tensor_of: Dict[Tuple[int, int], int] = {}
    for k, i in enumerate(order):
        op_b, op_2b = graph_b.get_operation_by_name(names[k]), graph_2b.get_operation_by_name(names[k])
        recorded = _recorded_shapes(nodes.nodes[i]) if recorded_batch_ok else []
        for port, (tb, t2) in enumerate(zip(op_b.outputs, op_2b.outputs)):
            dtype = tb.dtype.base_dtype
            shape_b, shape_2b = _shape_of(tb.shape), _shape_of(t2.shape)
            shape = shape_b
            if (shape is None or -1 in shape) and port < len(recorded) and recorded[port] is not None \
                    and -1 not in recorded[port]:
                shape = recorded[port]
            shape = shape if shape is not None else (-1,)
            size = element_bytes(dtype)
            tensor_of[(k, port)] = len(t_op)
            t_op.append(k); t_port.append(port); t_dtype.append(dtype.name); t_shape.append(shape)
            t_bytes.append(size * int(np.prod([max(d, 1) for d in shape], dtype=np.int64)))
            t_axis.append(_batch_axis(shape_b, shape_2b))
    e_tensor, e_dst, e_port, c_src, c_dst = [], [], [], [], []
    for k, i in enumerate(order):
        data, control = nodes.inputs(i)
        for port, (j, out) in enumerate(data):
            e_tensor.append(tensor_of[(pos[j], out)]); e_dst.append(k); e_port.append(port)
        for j in sorted(set(pos[j] for j in control)):
            c_src.append(j); c_dst.append(k)
    i32 = lambda x: np.asarray(x, dtype=np.int32)
    return {"names": names, "op_types": op_types, "tensor_of": tensor_of,
            "tensor_op": i32(t_op), "tensor_port": i32(t_port), "tensor_dtype": tuple(t_dtype),
            "tensor_shape": tuple(t_shape), "tensor_bytes": np.asarray(t_bytes, dtype=np.int64),
            "tensor_batch_axis": np.asarray(t_axis, dtype=np.int8), "edge_tensor": i32(e_tensor),
            "edge_dst": i32(e_dst), "edge_dst_port": i32(e_port), "control_src": i32(c_src),
            "control_dst": i32(c_dst)}


def batch_dependent(num_ops, input_ops, arrays) -> np.ndarray:
    """Descendants of the inputs over data edges. Ops are in topological order, so one forward
    sweep over the edges sorted by consumer suffices. Variable handles have no data inputs, so
    the walk never passes through a variable (an update does not make later reads batch-dependent)."""
    dep = np.zeros(num_ops, dtype=bool)
    dep[list(input_ops)] = True
    src = arrays["tensor_op"][arrays["edge_tensor"]]
    dst = arrays["edge_dst"]
    for e in np.argsort(dst, kind="stable"):
        if dep[src[e]]:
            dep[dst[e]] = True
    return dep
