"""Finds the roles of a bare training step: train op, loss, inputs and their batch axes, init op.

A bundle's metadata names these (graph_defs/bundle.py); a bare GraphDef or MetaGraphDef does not,
so `infer_step` reads them off the graph's structure (no op-name lists):

  * **train op(s)**: ops nothing consumes (no data or control edge out) that run, directly or
    through control edges, an *update*: an op that writes a variable (tfplace.ir.roles.VARIABLE_WRITER:
    every optimizer's Apply*, assigns, scatters) from a value that depends on an input
    placeholder. Initializers and restore ops write values that depend on no input, so the
    `init` and `save/restore_all` ops are never candidates. Of several, one that runs nothing the
    other does not run besides itself gives way (`_outermost`). A MetaGraphDef's `train_op`
    collection, when present, wins, each entry lifted to the tf.group a script runs it in.
  * **loss**: the scalar the gradients flow from. `tf.gradients` seeds the backward pass with
    ones (a `Fill` of 1, or `OnesLike`) shaped like the loss: `Fill(Shape(loss), 1)` names the
    loss directly; when the shape was folded to a constant, the seed's consumers are the loss
    producer's gradient (TensorFlow names it `<scope>gradients/<loss op>_grad/...`).
  * **inputs**: the placeholders of rank >= 1 the step reads; the batch axis is the one unknown
    (None) dimension, else axis 0. The loader confirms batch axes by shape inference at two
    batch sizes (tfplace.ir.shapes). A step with no such placeholder (one that reads tf.data) is
    refused for that, before any train op is looked for (no update can depend on an input).
  * **initializers**: per variable of the step, the write that needs no input and is not part
    of the step (a MetaGraphDef's `variables` collection names them); grouped under an existing
    NoOp that runs them all (e.g. `init`) or a new `tfplace_init`.

When a role has several candidates, `infer_step` raises one InputError that lists them and names
the flag to pass (`--train_op`, `--loss`, `--inputs`; Python: `train_ops=`, `loss=`, `inputs=`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from tfplace.formats.errors import InputError
from tfplace.ir.roles import VARIABLE_WRITER
from tfplace.ir.shapes import shape_attr_dims


def unfed_placeholders_error(source: str, names: Sequence[str]) -> InputError:
    """The error of a run that feeds only the batch (activate, profile, plan --confirm_real) on a
    step with placeholders `names` that are not batch inputs and have no default."""
    return InputError(source or "training step", "placeholders",
                      f"{', '.join(repr(n) for n in names)} must be fed and hold no batch: a run without your "
                      "script's feeds cannot know their values",
                      "give each a default (tf.compat.v1.placeholder_with_default(value, shape)) and export again, "
                      "or run the strategy from your script with PlacementHook, which takes its feeds")

INIT_OP = "tfplace_init"
TRAIN_OP = "tfplace_train_op"
_PLACEHOLDERS = ("Placeholder", "PlaceholderV2")
_VARIABLES = ("VarHandleOp", "VariableV2", "Variable")
_GRAD_SCOPE = re.compile(r"(?:^|/)gradients(?:_\d+)?/(.+?)_grad/")
# Update op type -> bundle optimizer name (graph_defs/bundle.OPTIMIZERS); others keep their type.
_OPTIMIZER_OF = (("GradientDescent", "sgd"), ("Momentum", "momentum"), ("Adam", "adam"))


@dataclasses.dataclass(frozen=True)
class StepRoles:
    """What `infer_step` found. Names are op names ("op:port" for the loss tensor).

    inputs: one dict per batched input {name, dtype, shape (-1 where unknown), batch_axis}.
    initializers: the ops that initialize the step's variables (empty when some variable has
      none: the graph then has no init op). optimizer: "sgd", "momentum", "adam", or the update
      op type (e.g. "ResourceApplyRMSProp"); learning_rate: the constant rate, or None.
    """

    train_ops: Tuple[str, ...]
    loss: Optional[str]
    inputs: Tuple[dict, ...]
    initializers: Tuple[str, ...]
    init_op: Optional[str]
    optimizer: str
    learning_rate: Optional[float]


class _Graph:
    """Node table with data/control inputs and consumers by name."""

    def __init__(self, graph_def):
        self.node = {n.name: n for n in graph_def.node}
        self.data: Dict[str, List[str]] = {}
        self.control: Dict[str, List[str]] = {}
        self.consumers: Dict[str, Set[str]] = {name: set() for name in self.node}
        for n in graph_def.node:
            self.data[n.name] = [x.split(":")[0] for x in n.input if not x.startswith("^")]
            self.control[n.name] = [x[1:] for x in n.input if x.startswith("^")]
            for src in self.data[n.name] + self.control[n.name]:
                if src in self.consumers:
                    self.consumers[src].add(n.name)

    def ancestors(self, roots: Sequence[str], control: bool = True) -> Set[str]:
        seen, stack = set(roots), list(roots)
        while stack:
            n = stack.pop()
            for src in self.data.get(n, []) + (self.control.get(n, []) if control else []):
                if src in self.node and src not in seen:
                    seen.add(src)
                    stack.append(src)
        return seen

    def descendants(self, roots: Sequence[str], control: bool = True) -> Set[str]:
        seen, stack = set(roots), list(roots)
        while stack:
            n = stack.pop()
            for dst in self.consumers.get(n, ()):
                if dst not in seen and (control or n in self.data[dst]):
                    seen.add(dst)
                    stack.append(dst)
        return seen


def infer_step(graph_def, *, train_ops: Optional[Sequence[str]] = None, loss: Optional[str] = None,
               inputs: Optional[Sequence[str]] = None, loss_reduction: Optional[str] = None,
               hints: Optional[dict] = None, src: str = "GraphDef") -> StepRoles:
    """Infers the roles `train_ops`, `loss` and `inputs` do not name (see the module docstring).

    Args:
      inputs: "name" or "name:batch_axis" per batched input placeholder.
      loss_reduction: when given, a step whose loss cannot be found is accepted (loss None).
      hints: from a MetaGraphDef: {"train_op": [names], "initializers": [names]}.
    Raises:
      InputError naming the flag to pass when a role is missing or ambiguous.
    """
    g, hints = _Graph(graph_def), hints or {}
    batched, updates = _updates(g)
    sinks = _train_ops(g, train_ops, updates, hints, src)
    step = g.ancestors(sinks)
    if loss is not None and loss.split(":")[0] not in g.node:
        seeds = _seeded(g, step)
        raise InputError(src, "loss", f"no op named {loss.split(':')[0]!r}" +
                         (f"; the gradients flow from {_listing(seeds)}" if seeds else ""),
                         "name the scalar loss's op with --loss NAME (Python: loss=)")
    loss_name = loss if loss is not None else _loss(g, step, src, required=loss_reduction is None)
    roots = list(sinks) + ([loss_name.split(":")[0]] if loss_name else [])
    step |= g.ancestors(roots)
    specs = _inputs(g, step, inputs, src)
    inits = _initializers(g, step, batched, hints)
    optimizer, rate = _optimizer(g, [u for u in updates if u in step])
    return StepRoles(tuple(sinks), loss_name, tuple(specs), tuple(inits), _init_op(g, inits), optimizer, rate)


def infer_train_ops(graph_def, *, collection: Sequence[str] = (), src: str = "GraphDef") -> List[str]:
    """The train op(s) of a step as infer_step finds them, `collection` standing for a
    MetaGraphDef's train_op collection (e.g. the names in a live graph's TRAIN_OP collection).
    Raises InputError when there is none or several could be."""
    g = _Graph(graph_def)
    return _train_ops(g, None, _updates(g)[1], {"train_op": list(collection)}, src)


def _updates(g) -> Tuple[Set[str], List[str]]:
    """(the ops that depend on an input placeholder through data edges, the variable writes among them)."""
    fed = [n for n, node in g.node.items() if node.op in _PLACEHOLDERS]
    batched = g.descendants(fed, control=False)
    return batched, [n for n, node in g.node.items() if VARIABLE_WRITER.match(node.op) and n in batched]


def _listing(names: Sequence[str], limit: int = 6) -> str:
    names = sorted(names)
    return ", ".join(repr(n) for n in names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _train_ops(g, given, updates, hints, src) -> List[str]:
    if given:
        for name in given:
            if name not in g.node:
                raise InputError(src, "train_op", f"no op named {name!r}", "name an existing op with --train_op")
        return list(given)
    collected = [n for n in dict.fromkeys(hints.get("train_op", [])) if n in g.node]
    if collected:  # minimize() adds its op too: keep those no other entry runs
        lifted = list(dict.fromkeys(_lift(g, n) for n in collected))
        return [n for n in lifted if not any(n in g.ancestors([m]) for m in lifted if m != n)]
    if not updates:
        if not any(g.node[n].op in _PLACEHOLDERS and shape_attr_dims(g.node[n]) != [] for n in g.node):
            # nothing is fed, so no update can depend on an input: say that, not "name the train op"
            # (naming it only leads to this same error from the loader)
            raise no_placeholders_error(src, tf_data=any(node.op.startswith("IteratorGetNext")
                                                         for node in g.node.values()))
        raise InputError(src, "train_op", "no op updates a variable from the inputs (no optimizer apply or assign "
                         "that depends on a placeholder)", "export the training step (loss + optimizer.minimize), "
                         "or name the train op with --train_op (Python: train_ops=)")
    found = _outermost(g, sorted(n for n in g.descendants(updates) if not g.consumers[n]))
    if len(found) > 1:
        raise InputError(src, "train_op", f"{len(found)} ops could be the train op ({_listing(found)})",
                         "name it with --train_op NAME, or several comma-separated to run them together "
                         "(Python: train_ops=[...])")
    return found


def no_placeholders_error(src: str, tf_data: bool = False) -> InputError:
    """The error of a step that reads no batch from a placeholder (of rank >= 1); `tf_data`: it
    reads it from a tf.data iterator instead."""
    how = " (it reads its batch from a tf.data iterator)" if tf_data else ""
    return InputError(src, "inputs", f"the training step has no input placeholders{how}",
                      "feed the batch through tf.compat.v1.placeholder ops (with a None batch dimension)")


def _lift(g, name: str) -> str:
    """The op a script runs for the collected train op `name`: `name` itself when nothing consumes
    it, else the one outermost NoOp nothing consumes that runs it (`tf.group(opt.minimize(...),
    name="train_op")` puts minimize's op in the collection and the script runs the group); `name`
    when there is no such group or several. A value computed after the step (a loss read again, a
    summary) is no group the script trains with."""
    if not g.consumers[name]:
        return name
    groups = _outermost(g, sorted(n for n in g.descendants([name]) if not g.consumers[n] and g.node[n].op == "NoOp"))
    return groups[0] if len(groups) == 1 else name


def _outermost(g, sinks: Sequence[str]) -> List[str]:
    """The train-op candidates among `sinks` (ops nothing consumes): without those that run nothing
    besides themselves that another candidate does not run, unless that one runs no more than they
    do. So a read nobody consumes of what the step updated (Adam's reads of its beta powers) gives
    way to the op that runs the update, a train op to an EMA group run after it; two groups of the
    same updates both stay (ambiguous), and so do ops that each run something the other does not."""
    runs = {n: g.ancestors([n]) for n in sinks}
    before = {n: runs[n] - {n} for n in sinks}
    return [n for n in sinks
            if not any(before[n] <= runs[o] and not before[o] <= runs[n] for o in sinks if o != n)]


def _const_value(node) -> Optional[float]:
    if node is None or node.op != "Const":
        return None
    from tensorflow.python.framework import tensor_util
    try:
        value = tensor_util.MakeNdarray(node.attr["value"].tensor)
    except (TypeError, ValueError):
        return None
    return float(value.reshape(-1)[0]) if value.size >= 1 and (value == value.reshape(-1)[0]).all() else None


def _loss(g, step, src, required) -> Optional[str]:
    found = _seeded(g, step)
    if len(found) == 1:
        return found.pop()
    if not found and not required:
        return None
    problem = (f"{len(found)} tensors seed gradients ({_listing(found)})" if found
               else "no gradient seed (tf.gradients' Fill of ones) in the step, so the loss is unknown")
    raise InputError(src, "loss", problem, "name the scalar loss with --loss NAME (Python: loss=)"
                     + ("" if found else ", or give --loss_reduction mean|sum to go without one"))


def _seeded(g, step) -> Set[str]:
    """The tensors of `step` that seed gradients (see the module docstring: the loss candidates)."""
    found = set()
    for name in step:
        node = g.node[name]
        if _inside_an_op_gradient(name):
            continue
        if node.op == "OnesLike" and "grad" in name.lower():  # a GradientTape / gradients seed
            found.add(node.input[0])
        elif node.op == "Fill" and _const_value(g.node.get(g.data[name][1])) == 1.0:
            shape = g.node.get(g.data[name][0])
            if shape is not None and shape.op == "Shape":
                found.add(shape.input[0])
                continue
            for consumer in g.consumers[name]:
                match = _GRAD_SCOPE.search(consumer)
                if match and match.group(1) in g.node:
                    found.add(match.group(1))
    return {n[:-2] if n.endswith(":0") else n for n in found}


def _inside_an_op_gradient(name: str) -> bool:
    """Whether the node `name` was built by one op's gradient function (`gradients/<op>_grad/...`).
    A seed is made by tf.gradients itself, beside those scopes (`gradients/grad_ys_0`); a gradient
    function may build ones of its own (the Mean gradient of a partly unknown shape fills
    `gradients/Mean_grad/ones` for its DynamicStitch), which seed nothing."""
    return _GRAD_SCOPE.search(name) is not None


def _inputs(g, step, given, src) -> List[dict]:
    import tensorflow as tf

    if given:
        picked = []
        for item in given:
            name, _, axis = item.partition(":")
            node = g.node.get(name)
            if node is None or node.op not in _PLACEHOLDERS:
                raise InputError(src, "inputs", f"{name!r} is not a placeholder of the graph",
                                 "name input placeholders with --inputs NAME[:BATCH_AXIS],...")
            if axis and not axis.isdigit():
                raise InputError(src, "inputs", f"{item!r}: batch axis {axis!r} is not an integer", "write NAME:AXIS")
            picked.append((name, int(axis) if axis else None))
    else:
        picked = [(n, None) for n in sorted(step) if g.node[n].op in _PLACEHOLDERS]
    specs = []
    for name, axis in picked:
        dims = shape_attr_dims(g.node[name])
        if dims is None:
            raise InputError(src, f"node[{name}].attr.shape", "placeholder of unknown rank",
                             "give it a shape with None only at the batch axis, or list the batched inputs "
                             "with --inputs NAME[:AXIS],... (Python: inputs=)")
        if not dims and not given:
            continue  # a scalar (learning rate, keep probability) is not batched
        unknown = [k for k, d in enumerate(dims) if d < 0]
        axis = axis if axis is not None else (unknown[0] if len(unknown) == 1 else 0)
        if axis >= len(dims):
            raise InputError(src, "inputs", f"batch axis {axis} of {name!r} but its shape is {dims}",
                             "give an axis of the shape with --inputs NAME:AXIS")
        dtype = tf.as_dtype(g.node[name].attr["dtype"].type).name
        specs.append({"name": name, "dtype": dtype, "shape": [-1 if k == axis else d for k, d in enumerate(dims)],
                      "batch_axis": axis})
    return specs


def _initializers(g, step, batched, hints) -> List[str]:
    if hints.get("initializers"):
        return [n for n in hints["initializers"] if n in g.node]
    restored = g.descendants([n for n, node in g.node.items() if node.op.startswith("Restore")], control=False)
    inits = []
    for var in sorted(n for n in step if g.node[n].op in _VARIABLES):
        writers = sorted(c for c in g.consumers[var] if VARIABLE_WRITER.match(g.node[c].op) and c not in step
                         and c not in batched and c not in restored and g.data[c][:1] == [var])
        if not writers:
            return []
        inits.append(writers[0])
    return inits


def _init_op(g, inits) -> Optional[str]:
    """An existing NoOp whose control inputs are exactly the initializers, else INIT_OP (None without any)."""
    if not inits:
        return None
    want = set(inits)
    for name in sorted(g.node):
        if g.node[name].op == "NoOp" and not g.data[name] and set(g.control[name]) == want:
            return name
    return INIT_OP


def _optimizer(g, updates) -> Tuple[str, Optional[float]]:
    from tensorflow.python.framework import op_def_registry

    applies = sorted({g.node[u].op for u in updates if "Apply" in g.node[u].op})
    if not applies:
        return "sgd", None  # hand-written updates (assign_sub of lr * grad)
    kind = applies[0]
    name = next((opt for key, opt in _OPTIMIZER_OF if all(key in a for a in applies)), kind)
    op_def = op_def_registry.get(kind)
    args = [a.name for a in op_def.input_arg] if op_def else []
    port = next((args.index(a) for a in ("alpha", "lr") if a in args), None)
    first = next(u for u in updates if g.node[u].op == kind)
    rate = _const_value(g.node.get(g.data[first][port])) if port is not None and port < len(g.data[first]) else None
    return name, (float(f"{rate:.7g}") if rate is not None else None)  # float32 constant -> its decimal


def add_role_ops(graph_def, roles: StepRoles):
    """A copy of graph_def with the NoOps the roles need: INIT_OP over the initializers (when no
    existing op groups them) and TRAIN_OP over several train ops. Returns (graph_def, sink name)."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    names = {n.name for n in out.node}
    if roles.init_op == INIT_OP and INIT_OP not in names:
        node = out.node.add(name=INIT_OP, op="NoOp")
        node.input.extend("^" + n for n in roles.initializers)
    sink = roles.train_ops[0]
    if len(roles.train_ops) > 1:
        sink = TRAIN_OP
        if TRAIN_OP not in names:
            node = out.node.add(name=TRAIN_OP, op="NoOp")
            node.input.extend("^" + n for n in roles.train_ops)
    return out, sink


def step_meta(graph_def, roles: StepRoles, loss_reduction: Optional[str] = None):
    """(graph_def with add_role_ops, loader metadata {sink, loss, inputs, init_op, ...})."""
    graph_def, sink = add_role_ops(graph_def, roles)
    meta = {"sink": sink, "inputs": [dict(s) for s in roles.inputs], "optimizer": roles.optimizer}
    for key, value in (("loss", roles.loss), ("init_op", roles.init_op), ("loss_reduction", loss_reduction),
                       ("learning_rate", roles.learning_rate)):
        if value is not None:
            meta[key] = value
    return graph_def, meta
