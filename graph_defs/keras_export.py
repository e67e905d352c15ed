"""Exports your own Keras model's training step as a tfplace bundle, in one call.

    import tensorflow as tf
    from tfplace.graph_defs import export_keras

    path = export_keras(
        lambda: tf.keras.applications.DenseNet121(weights=None, input_shape=(32, 32, 3), classes=10,
                                                  classifier_activation=None),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer="momentum", batch_size=32, input_shapes=[(32, 32, 3)], out_dir="out", name="densenet121")

The model is one more zoo family: `build()` below wraps it, and the zoo's own path
(models/_train.build_train_graph: placeholders, mean loss, optimizer, `train_op`, `init`, `loss`;
then bundle.with_batch_size and bundle.write_bundle) makes the step. So the bundle has exactly the
zoo's layout and every command reads it like a zoo bundle.

Inputs: `input_0`, `input_1`, ... [N, *shape] (one per entry of `input_shapes` or `input_specs`, in
the model's input order; float32 unless `input_specs` or the model's own `tf.keras.Input` declares
an integer dtype; integer inputs that feed embedding lookups get `max_value` = the table's rows
unless declared) and `labels` [N, *label_shape] of `label_dtype`; integer labels get
`max_value` = the model output's last dimension (class ids the runtime feeds at random).
Loss: `loss(labels, outputs)` per example (a Keras loss object's unreduced `call`, a name such as
"sparse_categorical_crossentropy", or a function), averaged over any axes after the batch and
then over the batch (reduction "mean"), plus the model's regularisation losses (`model.losses`:
kernel and activity regularisers, `add_loss`), as Keras's `fit` trains them (own_losses).

Batch-norm moving averages: `model_fn()` builds the model on Keras's own Input, and Keras records
the moving-average updates of that construction too (`model.updates`); those read Keras's input
placeholder, so a step that ran them would need a feed for it. Only the updates built by the call
on our placeholders (those whose inputs reach them) join `train_op`.

`export_train_step(make_step, *, input_specs, batch_size, out_dir, name)` does the same for a TF2
training step (a `tf.function` with GradientTape and `apply_gradients`): see its docstring and
docs/your_own_model.md section 3. It writes through user_step.write_step (roles as for a bare step).
"""

import os
import time

from tfplace.formats.errors import InputError

from . import bundle

LABELS = "labels"


def _descendants(ops):
    """Names of the ops computed from `ops` (over data and control edges), `ops` included."""
    seen, stack = {op.name for op in ops}, list(ops)
    while stack:
        op = stack.pop()
        for nxt in [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs):
            if nxt.name not in seen:
                seen.add(nxt.name)
                stack.append(nxt)
    return seen


def own_updates(candidates, placeholders):
    """The update ops of `candidates` (ops or tensors) computed from `placeholders` and from no
    other placeholder (Keras's own Input of a functional model)."""
    ours = [p.op for p in placeholders]
    others = [op for op in placeholders[0].graph.get_operations()
              if op.type in ("Placeholder", "PlaceholderV2") and op not in ours]
    from_ours, from_others = _descendants(ours), _descendants(others)
    return [u for u in dict.fromkeys(candidates)
            if getattr(u, "op", u).name in from_ours and getattr(u, "op", u).name not in from_others]


def own_losses(losses, placeholders):
    """The regularisation losses of `losses` (model.losses) that the step can compute: those read
    from no placeholder (weight regularisers) or only from `placeholders` (the activity losses of
    the call on them). Keras also records the activity losses of its construction on its own
    Input, which a step that ran them would have to feed."""
    ours = [p.op for p in placeholders]
    others = [op for op in placeholders[0].graph.get_operations()
              if op.type in ("Placeholder", "PlaceholderV2") and op not in ours]
    from_others = _descendants(others)
    return [l for l in dict.fromkeys(losses) if l.op.name not in from_others]


def _with_regularisation(per_example, losses):
    """per_example [N] plus the sum of the scalar `losses` on every example: the mean over the
    batch then holds them once (mean(l + r) = mean(l) + r), as Keras's fit adds model.losses to
    the loss it trains, and each replica's share of the batch holds them once too."""
    import tensorflow as tf
    if not losses:
        return per_example
    total = tf.add_n([tf.cast(l, per_example.dtype) for l in losses], name="regularization_loss")
    return per_example + total


def _per_example(loss, labels, outputs):
    import tensorflow as tf

    if isinstance(loss, str):
        try:
            loss = tf.keras.losses.get(loss)
        except ValueError:
            raise InputError("export_keras", "loss", f"{loss!r} is no Keras loss",
                             "give a Keras loss name (e.g. 'sparse_categorical_crossentropy'), a Keras loss object "
                             "or fn(labels, outputs)") from None
    fn = loss.call if isinstance(loss, tf.keras.losses.Loss) else loss  # unreduced: [N, ...]
    try:
        value = tf.convert_to_tensor(fn(labels, outputs))
    except (ValueError, TypeError) as err:  # e.g. one-hot labels expected, class ids given
        classes = outputs.shape[-1] if outputs.shape.rank else None
        example = (f" (one-hot labels of these {classes} classes: label_shape=({classes},), label_dtype='float32')"
                   if classes else "")
        raise InputError("export_keras", "loss", f"fails on labels {labels.shape} {labels.dtype.name} and outputs "
                         f"{outputs.shape} ({str(err).splitlines()[0][:200]})",
                         f"give the label_shape and label_dtype the loss expects{example}, or fix the loss "
                         "function") from None
    if value.shape.rank is None or value.shape.rank < 1:
        raise InputError("export_keras", "loss", f"returns shape {value.shape}, not one value per example",
                         "return the unreduced loss, [batch] or [batch, ...] (a Keras loss object is called so)")
    return tf.reduce_mean(value, axis=list(range(1, value.shape.rank))) if value.shape.rank > 1 else value


class _Retype(Exception):
    """The model's own Input declares integer dtypes the placeholders lack: {input index: dtype}."""

    def __init__(self, dtypes):
        super().__init__(dtypes)
        self.dtypes = dtypes


def _check_inputs(model, specs, field):
    """Refuses `specs` [(name, shape, dtype or None, max_value)] that do not fit the Keras inputs
    `model.inputs` declares (none for a subclassed or an unbuilt Sequential model: nothing to check)."""
    declared = getattr(model, "inputs", None) or []
    if not declared:
        return
    want = [tuple(t.shape[1:]) for t in declared]
    example = [tuple(d if d is not None else 1 for d in s) for s in want]
    anything = " (None: any length)" if any(d is None for s in want for d in s) else ""
    if len(declared) != len(specs):
        raise InputError("export_keras", field, f"gives {len(specs)} input(s), the model takes {len(declared)} of "
                         f"shapes {want}{anything}", f"give one entry per model input, in its input order, "
                         f"with the shapes {example}")
    for i, ((_, shape, _, _), need) in enumerate(zip(specs, want)):
        if len(shape) != len(need) or any(n is not None and n != d for d, n in zip(shape, need)):
            raise InputError("export_keras", f"{field}[{i}]", f"is {shape}, the model's input {i} is {need}"
                             f"{anything}", f"give {example[i]} (without the batch axis)")


def _keras_int_dtypes(model, specs):
    """{input index: dtype name} of the inputs `specs` leave undeclared (dtype None) whose
    tf.keras.Input in `model` declares an integer dtype."""
    declared = getattr(model, "inputs", None) or []
    return {i: t.dtype.name for i, (t, spec) in enumerate(zip(declared, specs))
            if spec[2] is None and t.dtype.is_integer}


def _lookup_rows(tensor):
    """[(table op name, rows)] of the gathers (embedding lookups) that take `tensor`, or a cast of
    it, as their indices: valid values are in [0, rows)."""
    import tensorflow as tf

    found, stack = [], [tensor]
    while stack:
        t = stack.pop()
        for op in t.consumers():
            if op.type in ("Cast", "Identity"):
                stack.extend(op.outputs)
            elif op.type in ("ResourceGather", "GatherV2") and op.inputs[1] is t:
                table = op.inputs[0]
                shape = (tf.TensorShape(table.op.get_attr("shape")) if op.type == "ResourceGather"
                         and table.op.type == "VarHandleOp" else table.shape)  # a resource handle has no shape
                if shape.rank and shape[0] is not None:
                    found.append((table.op.name, int(shape[0])))
    return found


def _bound_ids(specs, placeholders, recorded, field):
    """Sets `max_value` of integer inputs that feed embedding lookups to the smallest table's rows
    (in `recorded`, the Inputs' spec dicts), and refuses float inputs that feed lookups (the
    runtime would feed them N(0, 1) values, negative ids) and bounds past a table's rows."""
    for i, ((_, shape, _, max_value), tensor, spec) in enumerate(zip(specs, placeholders, recorded)):
        rows = _lookup_rows(tensor)
        if not rows:
            continue
        table, bound = min(rows, key=lambda r: r[1])
        if not tensor.dtype.is_integer:
            raise InputError("export_keras", f"{field}[{i}]", f"is a {tensor.dtype.name} input, but its values are "
                             f"the ids of the {bound}-row table {table!r}, and float inputs are fed at random",
                             f"declare it as ids with input_specs=[..., ({shape}, 'int32', {bound}), ...] (or "
                             "tf.keras.Input(..., dtype='int32') in the model)")
        if max_value is not None and max_value > bound:
            raise InputError("export_keras", f"input_specs[{i}]", f"has max_value {max_value}, past the {bound} rows "
                             f"of the table {table!r} it indexes", f"give max_value <= {bound}")
        spec.setdefault("max_value", bound)


def make_build(model_fn, loss, input_specs, label_shape=(), label_dtype="int32", field="input_shapes"):
    """A zoo family `build(cfg, inputs) -> Built` that wraps `model_fn()` (see the module docstring).

    input_specs: [(name, shape without the batch axis, dtype or None, max_value or None)]; dtype
    None is float32 unless the model's Input declares an integer dtype (then _Retype is raised:
    build again with it). `field` names the argument the specs came from in errors."""
    import tensorflow as tf

    from .models._train import Built, keras_updates

    def build(cfg, inputs):
        del cfg
        placeholders = [inputs.add(name, dtype or tf.float32, [None, *shape], max_value=max_value)
                        for name, shape, dtype, max_value in input_specs]
        model = model_fn()
        _check_inputs(model, input_specs, field)
        retype = _keras_int_dtypes(model, input_specs)
        if retype:
            raise _Retype(retype)
        try:
            outputs = model(placeholders if len(placeholders) > 1 else placeholders[0], training=True)
        except ValueError as err:  # a model without declared inputs (subclassed, Sequential) whose call fails
            raise InputError("export_keras", field, f"is {[s[1] for s in input_specs]}, which the model refuses "
                             f"({str(err).splitlines()[0][:200]})", "give the shapes the model takes, one per "
                             "input, without the batch axis") from None
        if not isinstance(outputs, tf.Tensor):
            count = len(outputs) if isinstance(outputs, (list, tuple, dict)) else type(outputs).__name__
            raise InputError("export_keras", "model_fn", f"builds a model with {count} outputs; the training step "
                             "takes one loss of one output", "wrap it so that it returns one tensor, e.g. "
                             "tf.keras.Model(m.inputs, m.outputs[0]), or export a step that sums the losses with "
                             "export_train_step")
        _bound_ids(input_specs, placeholders, inputs.specs, field)
        max_value = int(outputs.shape[-1]) if tf.as_dtype(label_dtype).is_integer and outputs.shape[-1] else None
        labels = inputs.add(LABELS, label_dtype, [None, *label_shape], max_value=max_value)
        per_example = _with_regularisation(_per_example(loss, labels, outputs),
                                           own_losses(model.losses, placeholders))
        return Built(per_example, own_updates(keras_updates(model), placeholders))

    return build


def export_keras(model_fn, loss, optimizer="sgd", *, batch_size, out_dir, name, input_shapes=None,
                 input_specs=None, learning_rate=0.01, label_shape=(), label_dtype="int32", seed=0):
    """Builds the training step of the Keras model `model_fn()` and writes its bundle.

    Args:
      model_fn: () -> tf.keras.Model, called once inside the export graph (build the model there,
        e.g. `lambda: tf.keras.applications.DenseNet121(weights=None, ...)`).
      loss: a Keras loss object, a Keras loss name, or `fn(labels, outputs) -> [N, ...]`.
      optimizer: "sgd", "momentum" (0.9) or "adam" (tf.compat.v1.train optimizers).
      batch_size: global batch size the bundle is shaped at (> 0; re-shaped on demand later).
      input_shapes: one shape per model input, without the batch axis, e.g. [(32, 32, 3)]; each
        input is float32, or the integer dtype the model's `tf.keras.Input` declares.
      input_specs: instead of input_shapes, one `(shape, dtype)` or `(shape, dtype, max_value)` per
        model input, as export_train_step takes them, e.g. [((10,), "int32", 50)] for 10 token ids
        of a 50-row Embedding. An integer input that feeds embedding lookups gets `max_value` = the
        smallest table's rows unless given; the runtime feeds integers in [0, max_value).
      out_dir: folder of the bundle (created); name: its stem prefix and `model`.
      label_shape, label_dtype: the labels without the batch axis (default: class ids, int32).
    Returns:
      The path of `<out_dir>/<name>_b<batch>_<optimizer>.json`.
    Raises:
      InputError for bad arguments: inputs that do not fit the model, a float input that feeds an
      embedding lookup, a model with several outputs; UnsupportedGraphError for a step no command
      can load (a loop, e.g. a Keras RNN without unroll=True); ValueError from the build (e.g. a
      variable without gradient).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InputError("export_keras", "batch_size", f"must be a positive integer, got {batch_size!r}", "pass e.g. 32")
    if optimizer not in bundle.OPTIMIZERS:
        raise InputError("export_keras", "optimizer", f"is {optimizer!r}", f"use one of {list(bundle.OPTIMIZERS)}")
    specs, field = _keras_input_specs(input_shapes, input_specs)
    if not name or os.sep in name:
        raise InputError("export_keras", "name", f"is {name!r}", "give a file stem such as 'densenet121'")
    if not (isinstance(loss, str) or callable(loss)):
        raise InputError("export_keras", "loss", f"is {loss!r}",
                         "give a Keras loss name, a Keras loss object or fn(labels, outputs)")
    start = time.time()
    import tensorflow as tf
    if isinstance(model_fn, tf.keras.Model) or not callable(model_fn):
        raise InputError("export_keras", "model_fn", f"is {type(model_fn).__name__}, not a function that builds the "
                         "model", "pass a function, e.g. lambda: make_model(): the model must be built inside the "
                         "export's graph")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise InputError("export_keras", "out_dir", f"{out_dir!r} cannot be made ({err.strerror or err})",
                         "give a folder this process may write") from None

    from tfplace.ir.loader import check_placeable

    from . import models
    from .models import _train
    from .export import quiet_tf_warnings

    shapes = [s[1] for s in specs]
    image = shapes[0][0] if len(shapes) == 1 and len(shapes[0]) == 3 and shapes[0][0] == shapes[0][1] else None
    cfg = models.ModelConfig(name, image, None, None, None, None)
    with quiet_tf_warnings():
        try:
            graph_def, info = _train.build_train_graph(
                make_build(model_fn, loss, specs, tuple(label_shape), label_dtype, field), cfg, optimizer,
                float(learning_rate), seed)
        except _Retype as retype:  # built again with the integer dtypes of the model's own Input
            specs = [(n, s, retype.dtypes.get(i, dtype), m) for i, (n, s, dtype, m) in enumerate(specs)]
            graph_def, info = _train.build_train_graph(
                make_build(model_fn, loss, specs, tuple(label_shape), label_dtype, field), cfg, optimizer,
                float(learning_rate), seed)
    check_placeable(graph_def, [_train.SINK, _train.INIT_OP, _train.LOSS], "export_keras")  # as every command will
    graph_def = bundle.with_batch_size(graph_def, info["inputs"], batch_size)
    meta = {
        "format": bundle.FORMAT_NAME, "version": bundle.FORMAT_VERSION, "model": name,
        "global_batch_size": batch_size, "image_size": image, "seq_len": None, "num_layers": None,
        "optimizer": optimizer, "learning_rate": float(learning_rate), "inputs": info["inputs"],
        "sink": _train.SINK, "init_op": _train.INIT_OP, "loss": _train.LOSS, "loss_reduction": "mean",
        "variable_count": info["variable_count"], "param_count": info["param_count"],
        "param_bytes": info["param_bytes"], "tf_version": tf.__version__, "seed": seed,
        "trainable_param_count": info["trainable_param_count"], "export_seconds": round(time.time() - start, 2),
    }
    return bundle.write_bundle(out_dir, f"{name}_b{batch_size}_{optimizer}", graph_def, meta)


def _keras_input_specs(input_shapes, input_specs):
    """([(name, shape, dtype or None, max_value or None)], the argument they came from) of
    export_keras's input_shapes or input_specs (exactly one of them)."""
    if (input_shapes is None) == (input_specs is None):
        raise InputError("export_keras", "input_shapes", "and input_specs are both given" if input_shapes is not None
                         else "is missing", "give one of them: input_shapes=[(32, 32, 3)], or input_specs="
                         "[((10,), 'int32', 50)] to declare dtypes and integer ranges")
    if input_specs is not None:
        return _input_specs(input_specs, "export_keras"), "input_specs"
    try:
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
    except (TypeError, ValueError):
        shapes = []
    if not shapes or any(not s for s in shapes):
        raise InputError("export_keras", "input_shapes", f"is {input_shapes!r}",
                         "give one shape per model input without the batch axis, e.g. [(32, 32, 3)]")
    return [(f"input_{i}", s, None, None) for i, s in enumerate(shapes)], "input_shapes"


# ---- a TF2-style tf.function training step ---------------------------------------------------
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")


def _input_specs(input_specs, source="export_train_step"):
    """[(name, shape, dtype, max_value or None)] from `input_specs`' (shape, dtype[, max_value]);
    `source` (the calling function) names them in errors."""
    import tensorflow as tf

    specs = []
    for i, spec in enumerate(input_specs or ()):
        try:
            shape, dtype, *rest = spec
            specs.append((f"input_{i}", tuple(int(d) for d in shape), tf.as_dtype(dtype).name,
                          int(rest[0]) if rest else None))
            if len(rest) > 1:
                raise ValueError(spec)
        except (TypeError, ValueError):
            raise InputError(source, f"input_specs[{i}]", f"is {spec!r}",
                             "give (shape without the batch axis, dtype[, max_value]) per input, "
                             "e.g. ((32,), 'float32') and ((), 'int32', 10) for 10 class ids") from None
    if not specs:
        raise InputError(source, "input_specs", f"is {input_specs!r}",
                         "give one (shape, dtype) per argument of the step, e.g. [((32,), 'float32'), ((), 'int32')]")
    return specs


def _scalar_loss(value):
    import tensorflow as tf

    if not isinstance(value, tf.Tensor) or value.shape.rank != 0 or not value.dtype.is_floating:
        got = (f"a {value.dtype.name} tensor of shape {value.shape}" if isinstance(value, tf.Tensor)
               else f"a {type(value).__name__}")
        raise InputError("export_train_step", "step", f"returns {got}, not the scalar loss",
                         "return only the scalar float loss from the step, e.g. `return tf.reduce_mean(losses)` "
                         "(a per-example loss reduced over the batch; no tuples, dicts or metrics)")
    return value


def _build_step(step_fn, placeholders):
    """(loss, ops the step must run) of one inline call of the step on `placeholders`, with the
    automatic control dependencies tf.function itself adds (stateful ops run, in program order)."""
    import tensorflow as tf
    from tensorflow.python.framework import auto_control_deps  # private: TF 2.15 has no public form of it

    from tfplace.ir.roles import VARIABLE_WRITER

    fn = getattr(step_fn, "python_function", step_fn)
    # Keras builds layers and optimizer slots on the first call; those initializers must not join
    # the step (ordered before its reads they would re-initialize every step), so a first call
    # creates the variables and the second, whose ops alone are kept, is the step.
    fn(*placeholders)
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    with auto_control_deps.AutomaticControlDependencies() as acd:
        loss = _scalar_loss(fn(*placeholders))
    new = graph.get_operations()[first:]
    calls = sorted(op.name for op in new if op.type in _CALLS)
    if calls:
        raise InputError("export_train_step", "step", f"calls another tf.function ({calls[0]}), which tfplace "
                         "cannot place", "call plain Python functions inside the step (drop their @tf.function)")
    if not any(VARIABLE_WRITER.match(op.type) for op in acd.ops_which_must_run):
        raise InputError("export_train_step", "step", "updates no variable",
                         "apply the gradients in the step (optimizer.apply_gradients(zip(grads, variables)))")
    return loss, sorted(acd.ops_which_must_run, key=lambda op: op.name)


def _reads_of_variables(tensor, handles):
    """(read op, handle op name) for each op `tensor` is computed from that reads a variable of
    `handles` (handle op name -> variable) through its handle."""
    found, seen, stack = [], set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        found += [(op, t.op.name) for t in op.inputs if t.op.name in handles]
        stack.extend(t.op for t in op.inputs if t.op.name not in handles)
        stack.extend(op.control_inputs)
    return found


def order_initializers(variables):
    """Makes each read of a variable that another variable's initial value makes wait for the
    read variable's initializer. TensorFlow orders none of them: a new Keras optimizer with a
    learning-rate schedule starts `current_learning_rate` at schedule(iterations), a read of
    `iteration` that raced its initializer (on one device the executor's order happened to win; a
    rewritten step that put the read and the initializer on different lanes read a variable that
    did not exist yet). The wait is on the read, not on the dependent initializer: the value is
    computed before that initializer runs, whatever it waits for."""
    handles = {v.handle.op.name: v for v in variables if hasattr(v, "handle")}
    for v in handles.values():
        if len(v.initializer.inputs) < 2:
            continue
        for read, handle in _reads_of_variables(v.initializer.inputs[1], handles):
            if handle != v.handle.op.name:
                read._add_control_inputs([handles[handle].initializer])  # pylint: disable=protected-access


def export_train_step(make_step, *, input_specs, batch_size, out_dir, name, seed=0):
    """Builds the TF2-style training step `make_step()` returns and writes its bundle.

    Args:
      make_step: () -> step, where `step(*inputs)` (a `tf.function` or a plain function) runs one
        training step and returns the scalar loss. It is called once inside the export graph, so
        build the model and the optimizer in it. Keras optimizers, legacy
        (`tf.keras.optimizers.legacy.*`) and new (`tf.keras.optimizers.*`), and tf.compat.v1.train
        ones all work: the step gets tf.function's automatic control dependencies.
      input_specs: one `(shape, dtype)` or `(shape, dtype, max_value)` per argument of the step,
        shapes without the batch axis; `max_value` bounds the integer values (class ids) the
        runtime feeds. The placeholders are `input_0`, `input_1`, ... [None, *shape].
      batch_size: global batch size the bundle is shaped at (> 0); out_dir: folder of the bundle
        (created); name: its stem prefix and `model`.
    Returns:
      The path of `<out_dir>/<name>_b<batch>.json`, read like any bundle; train op `train_op`
      (every stateful op of the step), loss `loss`, init op `init`, reduction inferred.
    Raises:
      InputError for bad arguments or a step that returns something other than a scalar loss,
      updates no variable or calls a nested tf.function.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InputError("export_train_step", "batch_size", f"must be a positive integer, got {batch_size!r}",
                         "pass e.g. 32")
    if not name or os.sep in name:
        raise InputError("export_train_step", "name", f"is {name!r}", "give a file stem such as 'my_step'")
    if not callable(make_step):
        raise InputError("export_train_step", "make_step", f"is {make_step!r}",
                         "pass a function that builds the model and optimizer and returns the step")
    specs = _input_specs(input_specs)
    import tensorflow as tf

    from .user_step import write_step

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        placeholders = [v1.placeholder(dtype, [None, *shape], name=n) for n, shape, dtype, _ in specs]
        loss, must_run = _build_step(make_step(), placeholders)
        loss = tf.identity(loss, name="loss")
        train_op = tf.group(*must_run, name="train_op")
        order_initializers(v1.global_variables())
        init = v1.global_variables_initializer()
    hints = {"train_op": [train_op.name], "initializers": [op.name for op in init.control_inputs]}
    return write_step(graph.as_graph_def(add_shapes=True), out_dir, f"{name}_b{batch_size}", model=name,
                      src=f"export_train_step({name})", hints=hints, train_ops=[train_op.name], loss=loss.op.name,
                      inputs=[f"{n}:0" for n, *_ in specs], batch_size=batch_size,
                      max_values={n: m for n, _, _, m in specs if m is not None}, seed=seed)
