"""Wraps a zoo model's forward pass into one TF1 training step.

The resulting GraphDef has, by contract (see ../bundle.py):
  * input placeholders with batch dimension None (nothing bakes the batch size in),
  * `loss`: scalar float32, the mean over the batch of per-example losses,
  * `train_op`: NoOp grouping the optimizer update and the Keras batch-norm updates,
  * `init`: NoOp initializing every variable (model and optimizer slots),
  * resource variables only (VarHandleOp / ResourceApply*), never VariableV2.
Dead nodes (Keras bookkeeping such as VarIsInitializedOp) are pruned.
"""

import dataclasses
import warnings
from typing import List

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

SINK, INIT_OP, LOSS = "train_op", "init", "loss"


class Inputs:
    """Creates input placeholders and records their bundle metadata.

    add(name, dtype, shape, batch_axis=0, max_value=None): `shape` is given WITHOUT the batch
    axis size (use None there); the recorded shape has -1 at batch_axis. `max_value` is the
    exclusive upper bound of valid values of an integer input (token ids, labels).
    """

    def __init__(self):
        self.specs: List[dict] = []

    def add(self, name, dtype, shape, batch_axis=0, max_value=None):
        if shape[batch_axis] is not None:
            raise ValueError(f"input {name}: batch axis {batch_axis} of {shape} must be None")
        tensor = v1.placeholder(dtype, shape, name=name)
        if tensor.op.name != name:
            raise ValueError(f"input {name}: name already taken in the graph")
        spec = {"name": name, "dtype": tf.as_dtype(dtype).name,
                "shape": [-1 if d is None else int(d) for d in shape], "batch_axis": batch_axis}
        if max_value is not None:
            spec["max_value"] = int(max_value)
        self.specs.append(spec)
        return tensor


@dataclasses.dataclass
class Built:
    """What a family's build() returns: per-example loss [N] and extra ops the step must run."""

    per_example_loss: tf.Tensor
    update_ops: list = dataclasses.field(default_factory=list)


def keras_updates(model):
    """Batch-norm moving-average assigns of a Keras model built on our placeholders.

    In TF1 graph mode Keras does not run these itself; they must hang off train_op.
    """
    return list(model.updates) + list(v1.get_collection(v1.GraphKeys.UPDATE_OPS))


def make_optimizer(optimizer, learning_rate):
    if optimizer == "sgd":
        return v1.train.GradientDescentOptimizer(learning_rate)
    if optimizer == "momentum":
        return v1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    if optimizer == "adam":
        return v1.train.AdamOptimizer(learning_rate)
    raise ValueError(f"unknown optimizer {optimizer!r}; choose sgd, momentum or adam")


def _variable_stats(variables):
    counts = [int(np.prod(v.shape.as_list())) for v in variables]
    nbytes = [c * v.dtype.base_dtype.size for c, v in zip(counts, variables)]
    return sum(counts), sum(nbytes)


def build_train_graph(build_fn, cfg, optimizer, learning_rate, seed):
    """Builds the training step of `build_fn(cfg, inputs)` in a fresh graph.

    Returns (graph_def with batch None, info) where info has 'inputs' (bundle input specs),
    'variable_count', 'param_count', 'param_bytes' (model variables incl. batch-norm moving
    statistics, excluding optimizer slots) and 'trainable_param_count'.
    """
    # Keras keeps global state (name uids, learning phase); reset it so names are deterministic.
    tf.keras.backend.clear_session()
    # Keras draws seeds for unseeded initializers from Python's `random`; seeding it (and
    # numpy, and TF's global seed) makes re-exports byte-identical.
    tf.keras.utils.set_random_seed(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        inputs = Inputs()
        # Learning phase 1 makes Keras batch norm use batch statistics and emit its moving-mean
        # updates statically, instead of a tf.cond on a `keras_learning_phase` placeholder.
        with warnings.catch_warnings():  # learning_phase_scope is deprecated, still needed
            warnings.simplefilter("ignore", UserWarning)
            with tf.keras.backend.learning_phase_scope(1):
                built = build_fn(cfg, inputs)
        per_example = built.per_example_loss
        if per_example.shape.rank != 1:
            raise ValueError(f"{cfg.name}: per-example loss must be [N], got {per_example.shape}")
        loss = tf.identity(tf.reduce_mean(per_example), name=LOSS)
        model_vars = v1.global_variables()
        trainable = v1.trainable_variables()
        opt = make_optimizer(optimizer, learning_rate)
        grads = opt.compute_gradients(loss, var_list=trainable)
        unused = [v.name for g, v in grads if g is None]
        if unused:
            raise ValueError(f"{cfg.name}: variables without gradient: {unused[:5]}")
        apply = opt.apply_gradients(grads, name="apply_gradients")
        train_op = tf.group(apply, *built.update_ops, name=SINK)
        init = v1.variables_initializer(v1.global_variables(), name=INIT_OP)
        for op, want in ((loss.op, LOSS), (train_op, SINK), (init, INIT_OP)):
            if op.name != want:
                raise ValueError(f"{cfg.name}: op {want!r} got name {op.name!r} (name clash)")
    graph_def = v1.graph_util.extract_sub_graph(graph.as_graph_def(), [SINK, INIT_OP, LOSS])
    bad = sorted({n.op for n in graph_def.node if n.op in ("VariableV2", "Variable")})
    if bad:
        raise ValueError(f"{cfg.name}: graph has ref variables {bad}; use resource variables")
    params, nbytes = _variable_stats(model_vars)
    info = {"inputs": inputs.specs, "variable_count": len(model_vars), "param_count": params,
            "param_bytes": nbytes, "trainable_param_count": _variable_stats(trainable)[0]}
    return graph_def, info
