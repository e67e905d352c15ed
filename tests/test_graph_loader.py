"""Tests of tfplace.ir.loader: loading tiny TF training steps built here, batch-axis
detection against shapes at two batch sizes and against real runs, variables/updaters/slots,
TF1 ref variables, control edges, and one clear InputError per kind of bad input."""

import glob
import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from tfplace.formats.errors import InputError, UnsupportedGraphError
from tfplace.graph_defs.models import model_names as zoo_model_names
from tfplace.ir.loader import load_op_graph
from tfplace.testing import tiny_graph, tiny_graph_def

v1 = tf.compat.v1
MODELS = ("mlp", "cnn", "attention")
OPTIMIZERS = ("sgd", "momentum", "adam")
INPUT_NAMES = {"mlp": ("features", "labels"), "cnn": ("images", "labels"), "attention": ("tokens", "labels")}
ZOO = os.path.join(os.path.dirname(__file__), os.pardir, "graph_defs", "zoo")


def _names(graph, ops):
    return sorted(graph.names[i] for i in ops)


# ---- loading good graphs -----------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_loads_tiny_models(model):
    g = tiny_graph(model, 4, "sgd")
    assert g.names[g.sink] == "train_op"
    assert _names(g, g.inputs) == sorted(INPUT_NAMES[model])
    assert g.names[g.tensor_op[g.loss_tensor]] == "loss" and g.tensor_shape[g.loss_tensor] == ()
    assert g.loss_reduction == "mean"
    assert not g.has_op("init")  # initializers are not part of the step
    assert g.graph_def is not None and any(n.name == "init" for n in g.graph_def.node)
    # Topological order over data and control edges.
    assert (g.tensor_op[g.edge_tensor] < g.edge_dst).all()
    assert (g.control_src < g.control_dst).all()
    # Bytes from real dtype sizes: int32 labels are 4 bytes, resource handles 8.
    labels = g.index("labels")
    t = int(np.flatnonzero(g.tensor_op == labels)[0])
    assert g.tensor_dtype[t] == "int32" and g.tensor_bytes[t] == 4 * 4


@pytest.mark.parametrize("model", MODELS)
def test_batch_axes_agree_with_shapes_at_two_batch_sizes(model):
    small, large = tiny_graph(model, 4, "momentum"), tiny_graph(model, 8, "momentum")
    assert small.names == large.names and (small.tensor_batch_axis == large.tensor_batch_axis).all()
    batched = 0
    for t in range(small.num_tensors):
        a, s, l = small.tensor_batch_axis[t], small.tensor_shape[t], large.tensor_shape[t]
        if a >= 0:
            batched += 1
            assert l[a] == 2 * s[a] and s[:a] + s[a + 1:] == l[:a] + l[a + 1:], small.names[small.tensor_op[t]]
            assert large.tensor_bytes[t] == 2 * small.tensor_bytes[t]
            assert small.op_batch_dependent[small.tensor_op[t]]
        elif -1 not in s:
            assert s == l and small.tensor_bytes[t] == large.tensor_bytes[t]
    assert batched >= 15
    # Weights (reads) and weight gradients (apply inputs) have no batch axis; inputs have axis 0.
    for v in small.variables:
        for r in v.readers:
            assert (small.tensor_batch_axis[small.tensor_op == r] < 0).all()
    updater_inputs = np.isin(small.edge_dst, [u for v in small.variables for u in v.updaters])
    assert (small.tensor_batch_axis[small.edge_tensor[updater_inputs]] < 0).all()
    for i in small.inputs:
        assert (small.tensor_batch_axis[small.tensor_op == i] == 0).all()


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_static_shapes_match_a_real_run(model):
    """Reference: run the step once at batch 4 and compare every float tensor's real shape."""
    g = tiny_graph(model, 4, "sgd")
    rng = np.random.default_rng(0)
    fetch = [t for t in range(g.num_tensors)
             if g.tensor_dtype[t] == "float32" and g.op_types[g.tensor_op[t]] not in ("VarHandleOp",)
             and not g.op_types[g.tensor_op[t]].startswith("FusedBatchNorm")]
    with tf.Graph().as_default() as graph:
        v1.import_graph_def(tiny_graph_def(model, "sgd"), name="")
        feeds = {}
        for i in g.inputs:
            t = int(np.flatnonzero(g.tensor_op == i)[0])
            shape, dtype = g.tensor_shape[t], g.tensor_dtype[t]
            feeds[f"{g.names[i]}:0"] = (rng.integers(0, 4, shape) if dtype == "int32"
                                        else rng.standard_normal(shape)).astype(dtype)
        names = [f"{g.names[g.tensor_op[t]]}:{g.tensor_port[t]}" for t in fetch]
        with v1.Session(graph=graph) as sess:
            sess.run("init")
            values = sess.run(names, feeds)
    for t, value in zip(fetch, values):
        assert tuple(value.shape) == g.tensor_shape[t], names[fetch.index(t)]


@pytest.mark.parametrize("optimizer,apply_type,slots_per_weight,extra_slots", [
    ("sgd", "ResourceApplyGradientDescent", 0, 0),
    ("momentum", "ResourceApplyMomentum", 1, 0),
    ("adam", "ResourceApplyAdam", 2, 2),  # m and v per weight; beta1_power, beta2_power
])
def test_variables_updaters_and_slots(optimizer, apply_type, slots_per_weight, extra_slots):
    g = tiny_graph("mlp", 8, optimizer)
    weights = [v for v in g.variables if v.trainable]
    slots = [v for v in g.variables if v.is_slot]
    assert sorted(v.name for v in weights) == ["dense_0/bias", "dense_0/kernel", "dense_1/bias", "dense_1/kernel"]
    assert len(slots) == slots_per_weight * len(weights) + extra_slots
    assert not any(v.trainable and v.is_slot for v in g.variables)
    for v in weights:
        assert [g.op_types[u] for u in v.updaters] == [apply_type]
        assert {g.op_types[r] for r in v.readers} == {"ReadVariableOp"}
        assert v.num_bytes == 4 * int(np.prod(v.shape))
    apply_ops = {v.updaters[0] for v in weights}
    for v in slots:
        if v.shape:  # per-weight slots are updated by their weight's apply op
            assert set(v.updaters) <= apply_ops, v.name
    assert g.trainable_param_count == 16 * 32 + 32 + 32 * 4 + 4


def test_batch_norm_moving_averages_are_neither_trainable_nor_slots():
    g = tiny_graph("cnn", 4, "adam")
    stats = {v.name: v for v in g.variables if "moving" in v.name}
    assert sorted(stats) == ["bn/moving_mean", "bn/moving_variance"]
    for v in stats.values():
        assert not v.trainable and not v.is_slot
        assert [g.op_types[u] for u in v.updaters] == ["AssignSubVariableOp"]
        assert g.op_batch_dependent[v.updaters[0]]  # the update value comes from batch statistics


def _tf1_graph_def(optimizer):
    """MLP with TF1 ref variables (VariableV2) and Apply* (not Resource*) updates."""
    with tf.Graph().as_default() as graph:
        v1.disable_resource_variables()
        try:
            x = v1.placeholder(tf.float32, [None, 5], name="x")
            y = v1.placeholder(tf.float32, [None, 1], name="y")
            w = v1.get_variable("w", [5, 3])
            b = v1.Variable(tf.zeros([3]), name="b")
            out = v1.get_variable("out", [3, 1])
            pred = tf.matmul(tf.tanh(tf.matmul(x, w) + b), out)
            loss = tf.identity(tf.reduce_sum(tf.square(pred - y)), name="loss")
            opt = (v1.train.GradientDescentOptimizer(0.1) if optimizer == "sgd"
                   else v1.train.MomentumOptimizer(0.1, 0.9))
            opt.minimize(loss, name="train_op")
        finally:
            v1.enable_resource_variables()
    return graph.as_graph_def()


@pytest.mark.parametrize("optimizer,apply_type,num_slots", [("sgd", "ApplyGradientDescent", 0),
                                                            ("momentum", "ApplyMomentum", 3)])
def test_tf1_ref_variables(optimizer, apply_type, num_slots):
    g = load_op_graph(_tf1_graph_def(optimizer), sinks="train_op", batch_size=6, loss="loss")
    assert {g.op_types[v.op] for v in g.variables} == {"VariableV2"}
    weights = {v.name: v for v in g.variables if v.trainable}
    assert sorted(weights) == ["b", "out", "w"]
    assert sum(v.is_slot for v in g.variables) == num_slots
    for v in weights.values():
        assert [g.op_types[u] for u in v.updaters] == [apply_type]
        assert "Identity" in {g.op_types[r] for r in v.readers}  # the `w/read` snapshot
        assert v.dtype == "float32"
    assert g.loss_reduction == "sum"  # detected from reduce_sum
    matmul = g.index("MatMul")
    t = int(np.flatnonzero(g.tensor_op == matmul)[0])
    assert g.tensor_shape[t] == (6, 3) and g.tensor_batch_axis[t] == 0


def test_control_edges_are_kept():
    gd = tiny_graph_def("cnn", "sgd")
    g = tiny_graph("cnn", 4, "sgd")
    expected = {(i.lstrip("^"), n.name) for n in gd.node if g.has_op(n.name) for i in n.input if i.startswith("^")}
    got = {(g.names[s], g.names[d]) for s, d in zip(g.control_src, g.control_dst)}
    assert got == expected and len(expected) > 5
    # The batch-norm moving-average updates hang off train_op by control edges.
    sink_inputs = {g.names[s] for s, d in zip(g.control_src, g.control_dst) if d == g.sink}
    assert any(g.op_types[g.index(s)] == "AssignSubVariableOp" for s in sink_inputs)


@pytest.mark.parametrize("reduce,expected", [
    (lambda per: tf.reduce_mean(per), "mean"),
    (lambda per: tf.reduce_sum(per), "sum"),
    (lambda per: tf.reduce_sum(per) / tf.cast(tf.size(per), tf.float32), "mean"),  # Keras SUM_OVER_BATCH_SIZE
    (lambda per: 0.5 * tf.reduce_sum(per), "sum"),
    # divisors that depend on the batch's size only
    (lambda per: tf.reduce_sum(per) / tf.cast(tf.shape(per)[0], tf.float32), "mean"),
    (lambda per: tf.reduce_sum(per) / tf.reduce_sum(tf.ones_like(per)), "mean"),
    (lambda per: v1.losses.compute_weighted_loss(per), "mean"),  # SUM_BY_NONZERO_WEIGHTS of weight 1.0
])
def test_loss_reduction_detection(reduce, expected):
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", [3, 1], use_resource=True)
        loss = tf.identity(reduce(tf.reshape(tf.matmul(x, w), [-1])), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    g = load_op_graph(graph.as_graph_def(), sinks=["train_op"], batch_size=4, loss="loss")
    assert g.loss_reduction == expected


def test_functional_cond_is_a_single_op():
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", [3, 2], use_resource=True)
        h = tf.matmul(x, w)
        h = tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h)
        loss = tf.identity(tf.reduce_mean(h), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    g = load_op_graph(graph.as_graph_def(), sinks=["train_op"], batch_size=4, loss="loss")
    conds = [i for i, t in enumerate(g.op_types) if t in ("If", "StatelessIf")]
    assert conds
    t = int(np.flatnonzero(g.tensor_op == conds[0])[0])
    assert g.tensor_shape[t] == (4, 2) and g.tensor_batch_axis[t] == 0


# ---- bundles -----------------------------------------------------------------------------
def _write_bundle(folder, graph_def=None, **overrides):
    graph_def = graph_def if graph_def is not None else tiny_graph_def("mlp", "sgd")
    data = graph_def.SerializeToString()
    (folder / "mlp.pb").write_bytes(data)
    meta = {"format": "tfplace.graph", "version": 1, "model": "tiny_mlp", "graph_file": "mlp.pb",
            "global_batch_size": 8, "sink": "train_op", "init_op": "init", "loss": "loss",
            "loss_reduction": "mean", "optimizer": "sgd", "graph_bytes": len(data),
            "inputs": [{"name": "features", "dtype": "float32", "shape": [-1, 16], "batch_axis": 0},
                       {"name": "labels", "dtype": "int32", "shape": [-1], "batch_axis": 0, "max_value": 4}]}
    meta.update(overrides)
    path = folder / "mlp.json"
    path.write_text(json.dumps(meta))
    return str(path)


def test_bundle_loads(tmp_path):
    g = load_op_graph(_write_bundle(tmp_path))
    assert g.reference_batch_size == 8 and g.meta["model"] == "tiny_mlp" and g.source.endswith("mlp.json")
    assert g.names[g.sink] == "train_op" and g.loss_reduction == "mean"
    assert g.summary()["batched_tensors"] == tiny_graph("mlp", 8, "sgd").summary()["batched_tensors"]


# ---- bad inputs: one InputError naming the file and the field ----------------------------
def _graph_with_while_loop(v2):
    if not v2:
        v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as graph:
            x = v1.placeholder(tf.float32, [None, 3], name="x")
            w = v1.get_variable("w", [3, 3], use_resource=True)
            _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.matmul(h, w)), (0, x))
            loss = tf.identity(tf.reduce_mean(h), name="loss")
            v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    finally:
        v1.enable_control_flow_v2()
    return graph.as_graph_def()


def _graph_baked_batch():
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", [4, 2], use_resource=True)
        h = tf.reshape(tf.matmul(x, w), [8, 2], name="baked_reshape")  # the batch (8) baked in
        loss = tf.identity(tf.reduce_mean(h), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _graph_fixed_batch():
    """Placeholders of a fixed batch (16): TensorFlow folds it into the gradients' constants."""
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [16, 12], name="x")
        y = v1.placeholder(tf.int32, [16], name="y")
        logits = tf.matmul(x, v1.get_variable("w", [12, 4], use_resource=True))
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.reduce_mean(ce, name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _graph_without_inputs():
    with tf.Graph().as_default() as graph:
        w = v1.get_variable("w", [4, 2], use_resource=True)
        loss = tf.identity(tf.reduce_sum(w * w), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _graph_reading_tf_data():
    """A step that reads its batch from a tf.data iterator: no placeholder at all."""
    with tf.Graph().as_default() as graph:
        data = tf.data.Dataset.from_tensor_slices(np.ones([8, 4], np.float32)).repeat().batch(4)
        x = v1.data.make_one_shot_iterator(data).get_next()
        w = v1.get_variable("w", [4, 2], use_resource=True)
        loss = tf.identity(tf.reduce_mean(tf.matmul(x, w)), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _graph_without_optimizer():
    """A forward pass only: inputs, but nothing updates a variable."""
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", [4, 2], use_resource=True)
        tf.identity(tf.reduce_mean(tf.matmul(x, w)), name="loss")
    return graph.as_graph_def()


def _graph_max_loss():
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", [4, 1], use_resource=True)
        loss = tf.identity(tf.reduce_max(tf.matmul(x, w)), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _graph_weighted_loss():
    """sum(ce * w) / sum(w) with per-example weights w from the labels: a weighted mean, whose
    divisor depends on the batch's values (each replica would divide by its own weights)."""
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        logits = tf.matmul(x, v1.get_variable("w", [4, 3], use_resource=True))
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        weights = tf.cast(y, tf.float32) + 1.0
        loss = tf.identity(tf.reduce_sum(ce * weights) / tf.reduce_sum(weights, name="weight_sum"), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph.as_graph_def()


def _pb(folder, graph_def, name="step.pb"):
    path = folder / name
    path.write_bytes(graph_def.SerializeToString())
    return str(path)


def _truncated(folder):
    path = folder / "cut.pb"
    data = tiny_graph_def("mlp", "sgd").SerializeToString()
    path.write_bytes(data[: len(data) // 2 + 3])
    return str(path)


BAD_INPUTS = {
    # case: (build(tmp_path) -> (source, kwargs), expected file fragment, expected field fragment, error type)
    "truncated_pb": (lambda d: (_truncated(d), dict(sinks=["train_op"], batch_size=8)), "cut.pb", "", InputError),
    "garbage_pbtxt": (lambda d: (str(d / "g.pbtxt"), dict(sinks=["t"])), "g.pbtxt", "", InputError),
    "truncated_bundle": (lambda d: (_write_bundle(d, graph_bytes=123), {}), "mlp.json", "graph_bytes", InputError),
    # no sink given and none to infer (no update depends on an input): step_roles names --train_op
    "missing_sink": (lambda d: (_pb(d, _graph_without_optimizer()), dict(batch_size=8)), "step.pb", "train_op",
                     InputError),
    # ... unless nothing is fed at all: that is the cause to name first, with or without a sink
    "no_inputs_nor_sink": (lambda d: (_pb(d, _graph_without_inputs()), dict(batch_size=8)), "step.pb", "inputs",
                           InputError),
    "tf_data_input": (lambda d: (_pb(d, _graph_reading_tf_data()), {}), "step.pb", "inputs", InputError),
    "tf_data_input_with_sink": (lambda d: (_pb(d, _graph_reading_tf_data()), dict(sinks=["train_op"])), "step.pb",
                                "inputs", InputError),
    "unknown_sink": (lambda d: (_pb(d, tiny_graph_def("mlp", "sgd")), dict(sinks=["trian_op"], batch_size=8)),
                     "step.pb", "train_op", InputError),
    "unknown_sink_in_bundle": (lambda d: (_write_bundle(d, sink="nope"), {}), "mlp.json", "sink", InputError),
    "unknown_meta_key": (lambda d: (_write_bundle(d, globl_batch_size=8), {}), "mlp.json", "globl_batch_size", InputError),
    "meta_missing_graph_file": (lambda d: (_write_bundle(d, graph_file="other.pb"), {}), "mlp.json", "graph_file", InputError),
    "meta_bad_input_name": (lambda d: (_write_bundle(d, inputs=[{"name": "feat", "batch_axis": 0}]), {}),
                            "mlp.json", "inputs[0].name", InputError),
    "while_loop_v1": (lambda d: (_pb(d, _graph_with_while_loop(False)), dict(sinks=["train_op"], batch_size=4)),
                      "step.pb", "node[", UnsupportedGraphError),
    "while_loop_v2": (lambda d: (_pb(d, _graph_with_while_loop(True)), dict(sinks=["train_op"], batch_size=4)),
                      "step.pb", "node[", UnsupportedGraphError),
    "no_inputs": (lambda d: (_pb(d, _graph_without_inputs()), dict(sinks=["train_op"], batch_size=4)),
                  "step.pb", "inputs", InputError),
    "batch_baked_in": (lambda d: (_pb(d, _graph_baked_batch()), dict(sinks=["train_op"], batch_size=8)),
                       "step.pb", "baked_reshape", InputError),
    "batch_fixed_by_placeholders": (lambda d: (_pb(d, _graph_fixed_batch()), {}), "step.pb", "node[", InputError),
    "bad_batch_size": (lambda d: (_pb(d, tiny_graph_def("mlp", "sgd")), dict(sinks=["train_op"], batch_size=0)),
                       "step.pb", "batch_size", InputError),
    # (a sink without a loss now gets the loss inferred from the gradient seed: tests/test_your_own_model.py)
    "undecidable_reduction": (lambda d: (_pb(d, _graph_max_loss()), dict(sinks=["train_op"], batch_size=8, loss="loss")),
                              "step.pb", "loss_reduction", InputError),
    "weighted_mean_loss": (lambda d: (_pb(d, _graph_weighted_loss()), dict(batch_size=8)), "step.pb",
                           "loss_reduction", InputError),
    "bad_loss_name": (lambda d: (_write_bundle(d, loss="los"), {}), "mlp.json", "loss", InputError),
}


@pytest.mark.parametrize("kwargs, batch", [
    (dict(sinks=["train_op"]), 32),                # a named train op, None batch dims: the default
    ({}, 32),                                      # everything inferred
    (dict(sinks=["train_op"], batch_size=8), 8),   # the caller's
])
def test_a_bare_step_with_a_none_batch_gets_the_default_batch(tmp_path, kwargs, batch):
    from tfplace.ir.loader import DEFAULT_BATCH_SIZE
    graph = load_op_graph(_pb(tmp_path, tiny_graph_def("mlp", "sgd")), **kwargs)
    assert graph.reference_batch_size == batch and DEFAULT_BATCH_SIZE == 32


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_clear_error(case, tmp_path):
    (tmp_path / "g.pbtxt").write_text("node { name: 'a' op: 'NoOp' } this is not protobuf text")
    build, file_part, field_part, error_type = BAD_INPUTS[case]
    source, kwargs = build(tmp_path)
    with pytest.raises(error_type) as info:
        load_op_graph(source, **kwargs)
    err = info.value
    assert file_part in err.source and file_part in str(err)
    assert field_part in err.field and field_part in str(err)
    assert "Fix:" in str(err) and err.fix
    assert "Traceback" not in str(err) and len(str(err)) < 800


def test_while_loop_message_says_what_to_do(tmp_path):
    with pytest.raises(UnsupportedGraphError, match="loop.*unroll"):
        load_op_graph(_graph_with_while_loop(True), sinks=["train_op"], batch_size=4)


@pytest.mark.parametrize("kwargs", [{}, dict(sinks=["train_op"])])
def test_a_step_reading_tf_data_is_told_to_feed_placeholders(kwargs):
    with pytest.raises(InputError, match="no input placeholders .*tf.data iterator.*Fix: feed the batch through "
                                         "tf.compat.v1.placeholder"):
        load_op_graph(_graph_reading_tf_data(), **kwargs)


def test_a_weighted_mean_loss_is_refused_unless_its_reduction_is_stated():
    with pytest.raises(InputError, match="loss_reduction: the loss divides by 'weight_sum', a value computed from "
                                         "the batch's values.*cannot be recombined exactly.*--loss_reduction"):
        load_op_graph(_graph_weighted_loss(), batch_size=8)
    assert load_op_graph(_graph_weighted_loss(), batch_size=8, loss_reduction="mean").loss_reduction == "mean"


def test_a_fixed_batch_is_named_with_the_op_and_the_placeholders_to_change():
    """TensorFlow's error prints the failing NodeDef; the message names the op and its type
    instead, whole, and says which placeholders to export with a None batch dimension."""
    with pytest.raises(InputError) as info:
        load_op_graph(_graph_fixed_batch())
    message = str(info.value)
    assert "shape inference fails at twice the batch size (32): Dimensions must be equal" in message
    assert re.search(r"in Mul op '[\w/]+_grad/mul' \(input shapes \[16,1\], \[32,4\]\)", message), message
    assert "{{node" not in message and "DT_FLOAT" not in message
    assert "the placeholders fix the batch ('x' [16, 12], 'y' [16])" in message
    assert "Fix: export the step with a None batch dimension in its placeholders (e.g. shape [None, 12] for 'x')" \
        in message


def test_batch_baked_in_message_says_none_batch_dimension():
    with pytest.raises(InputError, match="None batch dimension"):
        load_op_graph(_graph_baked_batch(), sinks=["train_op"], batch_size=8)


# ---- zoo bundles (exported by graph_defs/) --------------------------------------------------
ZOO_BUNDLES = sorted(glob.glob(os.path.join(ZOO, "*.json")))


@pytest.mark.parametrize("meta_path", ZOO_BUNDLES or [pytest.param(None, marks=pytest.mark.skip(
    reason="no zoo bundles in graph_defs/zoo/ yet"))], ids=lambda p: os.path.basename(p) if p else "none")
def test_zoo_bundle_loads_with_plausible_counts(meta_path):
    with open(meta_path) as f:
        meta = json.load(f)
    g = load_op_graph(meta_path)
    assert 0 < g.num_ops <= meta["op_count"]
    assert g.reference_batch_size == meta["global_batch_size"]
    assert g.loss_reduction == meta["loss_reduction"]
    model_vars = [v for v in g.variables if not v.is_slot]
    assert len(model_vars) == meta["variable_count"]
    assert sum(int(np.prod(v.shape)) for v in model_vars) == meta["param_count"]
    assert sum(v.num_bytes for v in model_vars) == meta["param_bytes"]
    assert all(v.updaters for v in g.variables if v.trainable)
    assert (g.tensor_batch_axis >= 0).sum() > g.num_ops // 20  # activations carry the batch


def _shapes_by_tensor(graph_def):
    """{(op name, output index): shape tuple (-1 unknown)} from `_output_shapes`."""
    out = {}
    for node in graph_def.node:
        for port, shape in enumerate(node.attr["_output_shapes"].list.shape):
            if not shape.unknown_rank:
                out[(node.name, port)] = tuple(d.size for d in shape.dim)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model", zoo_model_names())
def test_every_zoo_model_loads_and_batch_axes_double_at_twice_the_batch(model):
    """Every zoo model at its default sizes (exported on demand): plausible counts, and every
    batch axis the loader found has twice the length at twice the batch, while tensors without
    a batch axis keep their shape — checked against an independent export at 2B."""
    from tfplace.graph_defs.bundle import read_bundle, with_batch_size
    from tfplace.graph_defs.export import ensure_bundle
    meta_path = ensure_bundle(model)
    test_zoo_bundle_loads_with_plausible_counts(meta_path)
    g = load_op_graph(meta_path)
    graph_def, meta = read_bundle(meta_path)
    b = meta["global_batch_size"]
    doubled = _shapes_by_tensor(with_batch_size(graph_def, meta["inputs"], 2 * b))
    checked_batched = checked_fixed = 0
    for t in range(g.num_tensors):
        key = (g.names[g.tensor_op[t]], int(g.tensor_port[t]))
        shape, shape2, axis = g.tensor_shape[t], doubled.get(key), int(g.tensor_batch_axis[t])
        if shape2 is None or -1 in shape or -1 in shape2 or len(shape) != len(shape2):
            continue
        if axis >= 0:
            assert shape2[axis] == 2 * shape[axis], (key, shape, shape2, axis)
            checked_batched += 1
        else:
            assert shape2 == shape, (key, shape, shape2)
            checked_fixed += 1
    assert checked_batched > g.num_ops // 20 and checked_fixed > 0


@pytest.mark.parametrize("wrap", ["numpy_function", "py_function"])
def test_a_step_calling_python_is_refused_naming_the_op(wrap):
    """tf.numpy_function / tf.py_function run Python of the building process: no server can run
    them. The error names the op instead of the unknown shapes that follow from it."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        call = getattr(tf, wrap)
        scaled = call(lambda a: a * 2, [x], tf.float32, name="scale")
        scaled = tf.reshape(scaled, [-1, 8])
        logits = v1.layers.Dense(4, name="head")(scaled)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.group(v1.train.GradientDescentOptimizer(0.1).minimize(loss), name="train_op")
        v1.global_variables_initializer()
    with pytest.raises(UnsupportedGraphError) as info:
        load_op_graph(g.as_graph_def(add_shapes=True), sinks=["train_op"], batch_size=8)
    err = info.value
    assert err.field == "node[scale].op" and "tf.numpy_function / tf.py_function" in err.problem, str(err)
    assert "feed it as an input" in err.fix
