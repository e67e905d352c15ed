"""Roles of ops in a training step: variables (handles, readers, updaters, optimizer slots) and
how the loss reduces over the batch.

Internal to tfplace.ir.loader. Works on the loader's arrays (see graph_shapes.build_arrays);
recognizes every optimizer by op-type *patterns* (Apply*, ResourceApply*, ...), not by a list of
known optimizers.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import Variable
from tfplace.ir.shapes import element_bytes, shape_attr_dims

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
REFERENCE_VARIABLE_OPS = ("VariableV2", "Variable")  # TF1 reference variables (the rewrite reads resources)
# The fix for a step with reference variables, as the hook, the runtime and the plugin give it.
RESOURCE_VARIABLES_FIX = ("call tf.compat.v1.enable_resource_variables() before building the model "
                          "(disable_v2_behavior() turns them off)")
# Ops that write the variable they take: every optimizer's update op (Apply*, SparseApply*,
# ResourceApply*, ResourceSparseApply*: present and future optimizers alike), assigns, scatters.
VARIABLE_WRITER = re.compile(r"^(Resource)?(Sparse)?Apply|^(Resource)?Scatter|^Assign(Add|Sub)?(VariableOp)?$"
                             r"|^(Resource)?StridedSliceAssign$|^(Resource)?CountUpTo$")
_APPLY = re.compile(r"^(Resource)?(Sparse)?Apply")
# Names TF1 and Keras optimizers give their state; only consulted for variables that no
# optimizer trains (a trained weight is never a slot, whatever its name).
_SLOT_NAME = re.compile(r"/(Momentum|Adam(_\d+)?|Adagrad(DA)?|RMSProp(_\d+)?|Ftrl(_\d+)?|Adadelta(_\d+)?"
                        r"|accumulator|momentum|velocity)$|(^|/)(beta[12]_power|iter|iterations)$")


def find_variables(step_nodes, arrays) -> Tuple[Variable, ...]:
    """Variables of the step, in op order.

    readers: ops that take the handle/ref and do not write it (ReadVariableOp, ResourceGather,
    Identity of a ref variable, ...); handle-forwarding ops (Identity of a resource, RefIdentity)
    are readers and their consumers count as the variable's consumers. updaters: the writers
    (VARIABLE_WRITER). trainable: updated at input 0 of an optimizer apply op. is_slot: not trainable and
    either (a) taken by an apply op at an input other than 0 (momentum, Adam m/v), (b) read into
    an apply op (TF1 Adam's beta powers), or (c) named like optimizer state (_SLOT_NAME).
    """
    import tensorflow as tf

    op_types, tensor_of = arrays["op_types"], arrays["tensor_of"]
    consumers: Dict[int, List[Tuple[int, int]]] = {}
    for t, d, p in zip(arrays["edge_tensor"].tolist(), arrays["edge_dst"].tolist(), arrays["edge_dst_port"].tolist()):
        consumers.setdefault(t, []).append((d, p))
    outputs_of: Dict[int, List[int]] = {}
    for (k, _port), t in tensor_of.items():
        outputs_of.setdefault(k, []).append(t)
    variables = []
    for k, node in enumerate(step_nodes):
        if node.op not in _VARIABLE_OPS:
            continue
        readers, updaters, trained, slot_port = set(), set(), False, False
        frontier = list(outputs_of.get(k, []))
        while frontier:
            for dst, port in consumers.get(frontier.pop(), []):
                if VARIABLE_WRITER.match(op_types[dst]):
                    updaters.add(dst)
                    if _APPLY.match(op_types[dst]):
                        trained, slot_port = trained or port == 0, slot_port or port > 0
                elif dst not in readers:
                    readers.add(dst)
                    if op_types[dst] == "RefIdentity" or (op_types[dst] in ("Identity", "IdentityN")
                                                           and arrays["tensor_dtype"][outputs_of[dst][0]] == "resource"):
                        frontier.extend(outputs_of.get(dst, []))
        read_into_apply = any(_APPLY.match(op_types[d]) for r in readers for t in outputs_of.get(r, [])
                              for d, _ in consumers.get(t, []))
        is_slot = not trained and (slot_port or read_into_apply or bool(_SLOT_NAME.search(node.name)))
        dtype = tf.as_dtype(node.attr["dtype"].type).base_dtype
        dims = shape_attr_dims(node) or []
        shape = tuple(int(d) for d in dims)
        num_bytes = element_bytes(dtype) * int(
            np.prod([max(d, 1) for d in shape], dtype=np.int64))
        variables.append(Variable(op=k, name=node.name, dtype=dtype.name, shape=shape, num_bytes=num_bytes,
                                  readers=tuple(sorted(readers)), updaters=tuple(sorted(updaters)),
                                  is_slot=is_slot, trainable=trained))
    return tuple(variables)


# ---- loss reduction ------------------------------------------------------------------------
_DIVISIONS = ("Div", "RealDiv", "DivNoNan", "TrueDiv", "FloorDiv")
# Ops whose output depends on the shape of their input, not on its values: a divisor that reaches
# the batch only through them is a function of the batch size (tf.size, tf.shape(x)[0],
# reduce_sum(ones_like(x))), so the loss is a mean.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike"})


def _reads_batch_values(op, inputs_of, t_op, batch_dependent, op_types) -> bool:
    """Whether the value of `op` depends on the batch's values, not only on its size: the data
    walk back from it over batch-dependent ops reaches an input without passing a shape-only op."""
    seen, stack = set(), [op]
    while stack:
        k = stack.pop()
        if k in seen or op_types[k] in _SHAPE_ONLY:
            continue
        seen.add(k)
        sources = [int(t_op[t]) for _, t in inputs_of.get(k, []) if batch_dependent[t_op[t]]]
        if not sources:  # batch-dependent with no batch-dependent input: an input placeholder
            return True
        stack.extend(sources)
    return False


def detect_reduction(loss_tensor, arrays, batch_dependent, src) -> str:
    """Walks back from the loss over batch-dependent, unbatched tensors to the ops whose inputs
    carry the batch axis: those reduce over the batch. Mean -> "mean"; Sum -> "sum", or "mean"
    when the path to the loss divides by the batch size (Keras SUM_OVER_BATCH_SIZE).

    A division by a value computed from the batch's values (a weighted mean sum(l * w) / sum(w),
    a count of non-zero weights) is refused: each replica's loss would be divided by its own
    part's weights, and neither a mean nor a sum of those gives the single-device loss and
    gradients. The caller may still state the reduction (loss_reduction=) to accept that."""
    fix = 'pass loss_reduction="mean" or "sum" (or set it in the bundle metadata)'
    if loss_tensor < 0:
        raise InputError(src, "loss_reduction", "no loss tensor given, so the reduction cannot be detected",
                         fix + " and loss=...")
    t_op, axis, op_types = arrays["tensor_op"], arrays["tensor_batch_axis"], arrays["op_types"]
    inputs_of: Dict[int, List[Tuple[int, int]]] = {}
    for e, (t, d, p) in enumerate(zip(arrays["edge_tensor"], arrays["edge_dst"], arrays["edge_dst_port"])):
        inputs_of.setdefault(int(d), []).append((int(p), int(t)))
    found, seen = set(), set()
    stack = [(int(t_op[loss_tensor]), False)]
    while stack:
        op, divided = stack.pop()
        if (op, divided) in seen:
            continue
        seen.add((op, divided))
        ins = sorted(inputs_of.get(op, []))
        divisors = [int(t_op[t]) for p, t in ins if p == 1 and batch_dependent[t_op[t]]] \
            if op_types[op] in _DIVISIONS else []
        by_batch = bool(divisors)
        if any(_reads_batch_values(d, inputs_of, t_op, batch_dependent, op_types) for d in divisors):
            raise InputError(src, "loss_reduction", f"the loss divides by {arrays['names'][divisors[0]]!r}, a value "
                             "computed from the batch's values, not the batch size (a weighted mean such as "
                             "sum(loss * w) / sum(w)): split over replicas, such a loss cannot be recombined exactly "
                             "as a mean or a sum", "divide by the batch size instead (e.g. tf.reduce_mean(loss * w)), "
                             "or state the reduction to accept the approximation: --loss_reduction mean|sum "
                             '(Python: loss_reduction="mean"; a config entry or bundle: "loss_reduction")')
        for port, t in ins:
            if not batch_dependent[t_op[t]] or (by_batch and port == 1):
                continue
            if axis[t] >= 0:
                kind = op_types[op]
                found.add("mean" if kind == "Mean" or (kind == "Sum" and divided)
                          else "sum" if kind == "Sum" else f"? ({kind} {arrays['names'][op]!r})")
            else:
                stack.append((int(t_op[t]), divided or by_batch))
    if len(found) == 1 and not next(iter(found)).startswith("?"):
        return found.pop()
    what = ", ".join(sorted(found)) or "no op reducing over the batch"
    raise InputError(src, "loss_reduction", f"cannot tell how the loss reduces over the batch ({what})", fix)
