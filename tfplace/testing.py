"""Fakes shared by the tests and docs of every part of tfplace: tiny graphs, small clusters,
uniform profiles. Everything here is small, deterministic and documented; signatures are stable.

  chain_graph(num_ops, tensor_bytes, batch_size)  pure-numpy OpGraph (no TensorFlow)
  tiny_mlp_graph(batch_size, optimizer)           real TF training step, loaded by the loader
  tiny_graph(model, batch_size, optimizer)        same for "mlp", "cnn" (batch norm), "attention",
                                                  "dense_block", "depthwise_se" (batch norm, beyond the zoo)
  tiny_graph_def(model, optimizer)                their GraphDefs (for rewrite/runtime tests)
  dropout_graph(noise, batch_size, optimizer)     the MLP with a random mask (tests of replica seeds)
  two_device_cluster() / four_device_cluster()    V100 + P100 clusters (one / two hosts)
  uniform_profile(graph, kinds, seconds_per_op)   every op costs the same on every kind

Only the tiny_* functions import TensorFlow (lazily, on first call).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from tfplace.formats.cluster import Cluster, Device, Host, build_cluster
from tfplace.ir.graph_ir import DTYPE_BYTES, OpGraph, Variable
from tfplace.formats.profile import Profile

# Memory sizes from the vendor datasheets: Tesla V100 SXM2 16 GB, Tesla P100 PCIe 12 GB.
V100_MEMORY_BYTES = 16 * 10**9
P100_MEMORY_BYTES = 12 * 10**9
# PCIe 3.0 x16 between GPUs of one host (~12 GB/s) and 10 GbE between hosts (1.25 GB/s).
_INTRA_BANDWIDTH_BYTES_PER_S = 1.2e10
_NIC_BANDWIDTH_BYTES_PER_S = 1.25e9


# ---- graphs --------------------------------------------------------------------------------
def chain_graph(num_ops: int = 4, tensor_bytes: int = 4096, batch_size: int = 8) -> OpGraph:
    """A hand-built training step: a chain with one weight, as an OpGraph (no TensorFlow).

    Ops, in topological order (n = num_ops, W = tensor_bytes // (4 * batch_size)):

      0      input      Placeholder                 -> [B, W] float32, batch axis 0
      1      w          VarHandleOp                 -> resource scalar (8 bytes)
      2      w/read     ReadVariableOp(w)           -> [W, W] weight, no batch axis
      3      lr         Const                       -> float32 scalar
      4      op_1       MatMul(input, w/read)       -> [B, W]
      5..    op_k       Relu(op_{k-1}), k = 2..n    -> [B, W]
      n+4    loss       Mean(op_n)                  -> scalar (batch-dependent, no batch axis)
      n+5    loss_grad  Mul(op_n, loss)             -> [B, W]   (stands in for dL/d op_n)
      n+6    w_grad     MatMul(input, loss_grad)    -> [W, W]   (partial sum over the batch)
      n+7    apply      ResourceApplyGradientDescent(w, lr, w_grad)   (no outputs)
      n+8    train_op   NoOp, control input from apply (the sink)

    Every batched activation is exactly `tensor_bytes` bytes at `batch_size`; the weight is
    4·W² bytes. loss_reduction is "mean". Variable 0 is `w` (reader w/read, updater apply).

    Raises ValueError if tensor_bytes is not a positive multiple of 4 * batch_size.
    """
    if num_ops < 1 or batch_size < 1 or tensor_bytes <= 0 or tensor_bytes % (4 * batch_size):
        raise ValueError(f"chain_graph: need num_ops >= 1, batch_size >= 1 and tensor_bytes a positive "
                         f"multiple of 4 * batch_size, got {num_ops}, {tensor_bytes}, {batch_size}")
    width = tensor_bytes // (4 * batch_size)
    names = ["input", "w", "w/read", "lr"] + [f"op_{k}" for k in range(1, num_ops + 1)]
    types = ["Placeholder", "VarHandleOp", "ReadVariableOp", "Const", "MatMul"] + ["Relu"] * (num_ops - 1)
    names += ["loss", "loss_grad", "w_grad", "apply", "train_op"]
    types += ["Mean", "Mul", "MatMul", "ResourceApplyGradientDescent", "NoOp"]
    idx = {name: i for i, name in enumerate(names)}
    act, weight = (batch_size, width), (width, width)
    # (op, dtype, shape, batch axis): one output per op except apply and train_op.
    outputs = [("input", "float32", act, 0), ("w", "resource", (), -1), ("w/read", "float32", weight, -1),
               ("lr", "float32", (), -1)]
    outputs += [(f"op_{k}", "float32", act, 0) for k in range(1, num_ops + 1)]
    outputs += [("loss", "float32", (), -1), ("loss_grad", "float32", act, 0), ("w_grad", "float32", weight, -1)]
    tensor_of = {op: t for t, (op, *_rest) in enumerate(outputs)}
    last = f"op_{num_ops}"
    # (consumer, producer, input port)
    edges = [("w/read", "w", 0), ("op_1", "input", 0), ("op_1", "w/read", 1)]
    edges += [(f"op_{k}", f"op_{k - 1}", 0) for k in range(2, num_ops + 1)]
    edges += [("loss", last, 0), ("loss_grad", last, 0), ("loss_grad", "loss", 1),
              ("w_grad", "input", 0), ("w_grad", "loss_grad", 1),
              ("apply", "w", 0), ("apply", "lr", 1), ("apply", "w_grad", 2)]
    batch_dependent = np.zeros(len(names), dtype=bool)
    batch_dependent[[idx[n] for n in names if n not in ("w", "w/read", "lr", "train_op")]] = True
    weight_bytes = 4 * width * width
    variable = Variable(op=idx["w"], name="w", dtype="float32", shape=weight, num_bytes=weight_bytes,
                        readers=(idx["w/read"],), updaters=(idx["apply"],))
    return OpGraph(
        names=tuple(names), op_types=tuple(types),
        tensor_op=np.array([idx[o[0]] for o in outputs], dtype=np.int32),
        tensor_port=np.zeros(len(outputs), dtype=np.int32),
        tensor_dtype=tuple(o[1] for o in outputs),
        tensor_shape=tuple(o[2] for o in outputs),
        tensor_bytes=np.array([DTYPE_BYTES[o[1]] * int(np.prod(o[2], dtype=np.int64)) for o in outputs],
                              dtype=np.int64),
        tensor_batch_axis=np.array([o[3] for o in outputs], dtype=np.int8),
        edge_tensor=np.array([tensor_of[src] for _, src, _ in edges], dtype=np.int32),
        edge_dst=np.array([idx[dst] for dst, _, _ in edges], dtype=np.int32),
        edge_dst_port=np.array([port for _, _, port in edges], dtype=np.int32),
        control_src=np.array([idx["apply"]], dtype=np.int32),
        control_dst=np.array([idx["train_op"]], dtype=np.int32),
        op_batch_dependent=batch_dependent,
        variables=(variable,), inputs=(idx["input"],), sink=idx["train_op"],
        loss_tensor=tensor_of["loss"], loss_reduction="mean", reference_batch_size=batch_size,
        source="chain_graph", meta={"model": f"chain_{num_ops}"})


_OPTIMIZERS = ("sgd", "momentum", "adam")


def _optimizer(name: str):
    """A tf.compat.v1 optimizer: sgd (lr 0.1), momentum (0.1, 0.9) or adam (1e-3)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    make = {"sgd": lambda: v1.train.GradientDescentOptimizer(0.1),
            "momentum": lambda: v1.train.MomentumOptimizer(0.1, momentum=0.9),
            "adam": lambda: v1.train.AdamOptimizer(1e-3)}
    if name not in make:
        raise ValueError(f"optimizer must be one of {list(_OPTIMIZERS)}, got {name!r}")
    return make[name]()


def _train_step(loss, optimizer, extra_updates=()):
    """Adds `train_op` (optimizer update grouped with `extra_updates`) and `init`."""
    import tensorflow as tf
    v1 = tf.compat.v1
    update = _optimizer(optimizer).minimize(loss)
    tf.group(update, *extra_updates, name="train_op")
    v1.variables_initializer(v1.global_variables(), name="init")


def mlp_training_script(hidden: int = 32, optimizer: str = "momentum", global_step: bool = False):
    """What a user's tf.compat.v1 training script builds (for the hook and Grappler tests), in the
    default graph: placeholders `features` [None, 16] and `labels` [None], Dense(hidden, relu) ->
    Dense(4) (`dense_0`, `dense_1`), a mean cross-entropy `loss`, `train_op` (increments the global
    step when `global_step`). Initializers are seeded: every build starts from the same values (with
    seed None, each build draws a new seed). Returns (x, y, loss, train_op, init, global step or None)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, 16], name="features")
    y = v1.placeholder(tf.int32, [None], name="labels")
    h = v1.layers.dense(x, hidden, activation=tf.nn.relu, name="dense_0",
                        kernel_initializer=v1.glorot_uniform_initializer(seed=1))
    logits = v1.layers.dense(h, 4, name="dense_1", kernel_initializer=v1.glorot_uniform_initializer(seed=2))
    loss = tf.identity(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)),
                       name="loss")
    step = v1.train.get_or_create_global_step() if global_step else None
    train_op = tf.group(_optimizer(optimizer).minimize(loss, global_step=step), name="train_op")
    return x, y, loss, train_op, v1.global_variables_initializer(), step


def batch_norm_training_script():
    """A tf.compat.v1 script whose batch norm takes a `training` placeholder (default True), in the
    default graph: `features` [None, 16] -> Dense(8) `d0` -> batch_normalization `bn` (its moving
    averages updated in v2 conds, through UPDATE_OPS) -> relu -> Dense(4) `d1`, mean cross-entropy
    `loss`, SGD `train_op`. Returns (x, y, loss, train_op, init, training)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, 16], name="features")
    y = v1.placeholder(tf.int32, [None], name="labels")
    training = v1.placeholder_with_default(True, [], name="training")
    h = v1.layers.dense(x, 8, name="d0", kernel_initializer=v1.glorot_uniform_initializer(seed=1))
    h = v1.layers.batch_normalization(h, training=training, momentum=0.5, name="bn")
    logits = v1.layers.dense(tf.nn.relu(h), 4, name="d1", kernel_initializer=v1.glorot_uniform_initializer(seed=2))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
    with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
        train_op = tf.group(v1.train.GradientDescentOptimizer(0.3).minimize(loss), name="train_op")
    return x, y, loss, train_op, v1.global_variables_initializer(), training


def _dense(x, width, name):
    import tensorflow as tf
    v1 = tf.compat.v1
    with v1.variable_scope(name):
        w = v1.get_variable("kernel", [x.shape[-1], width], use_resource=True)
        b = v1.get_variable("bias", [width], initializer=v1.zeros_initializer(), use_resource=True)
    return tf.matmul(x, w) + b if x.shape.rank == 2 else tf.einsum("btd,dk->btk", x, w) + b


def tiny_graph_def(model: str = "mlp", optimizer: str = "sgd"):
    """GraphDef of a tiny training step built with tf.compat.v1 (imports TensorFlow).

    Every model feeds `labels` int32 [None] (4 classes) and has `loss` = mean sparse softmax
    cross entropy, `train_op` (the sink) and `init`; resource variables; batch dims None.
      "mlp":       features float32 [None, 16] -> Dense 32 relu -> Dense 4.
      "cnn":       images float32 [None, 8, 8, 3] -> Conv 3x3x8 -> fused batch norm (batch
                   statistics; moving mean/variance updated by AssignSubVariableOp, grouped into
                   train_op) -> relu -> max pool 2 -> flatten -> Dense 4.
      "attention": tokens float32 [None, 6, 8] -> single-head self-attention (q, k, v Dense 8,
                   softmax(q k^T / sqrt 8) v) -> mean over time -> Dense 4.
      "dense_block": images [None, 8, 8, 3] -> two densely connected layers (Conv 3x3x4 -> batch
                   norm -> relu, concatenated with the layer's input: 3 -> 7 -> 11 channels) ->
                   avg pool 2 -> flatten -> Dense 4 (a DenseNet block in miniature).
      "depthwise_se": images [None, 8, 8, 3] -> depthwise Conv 3x3 (multiplier 2: 6 channels) ->
                   batch norm -> relu -> squeeze-excitation (mean over H, W -> Dense 3 relu ->
                   Dense 6 sigmoid -> multiply) -> flatten -> Dense 4 (a MobileNet/EfficientNet
                   block in miniature).
    Batch norms are as in "cnn": `bn{k}/gamma`, `bn{k}/beta`, `bn{k}/moving_mean`, `bn{k}/moving_variance`.
    optimizer: "sgd", "momentum" or "adam".
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        v1.set_random_seed(0)
        labels = v1.placeholder(tf.int32, [None], name="labels")
        updates = []
        if model == "mlp":
            x = v1.placeholder(tf.float32, [None, 16], name="features")
            logits = _dense(tf.nn.relu(_dense(x, 32, "dense_0")), 4, "dense_1")
        elif model == "cnn":
            x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
            with v1.variable_scope("conv"):
                k = v1.get_variable("kernel", [3, 3, 3, 8], use_resource=True)
            h = tf.nn.conv2d(x, k, strides=1, padding="SAME")
            with v1.variable_scope("bn"):
                gamma = v1.get_variable("gamma", [8], initializer=v1.ones_initializer(), use_resource=True)
                beta = v1.get_variable("beta", [8], initializer=v1.zeros_initializer(), use_resource=True)
                stats = [v1.get_variable(n, [8], initializer=init, trainable=False, use_resource=True)
                         for n, init in (("moving_mean", v1.zeros_initializer()),
                                         ("moving_variance", v1.ones_initializer()))]
            h, mean, var = v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
            updates = [v1.assign_sub(s, 0.1 * (s - m)) for s, m in zip(stats, (mean, var))]
            h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID")
            logits = _dense(tf.reshape(h, [-1, 4 * 4 * 8]), 4, "logits")
        elif model == "dense_block":
            h = x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
            for k in range(2):
                with v1.variable_scope(f"conv{k}"):
                    kernel = v1.get_variable("kernel", [3, 3, int(h.shape[-1]), 4], use_resource=True)
                y = tf.nn.relu(_batch_norm(tf.nn.conv2d(h, kernel, strides=1, padding="SAME"), f"bn{k}", updates))
                h = tf.concat([h, y], axis=-1)
            h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
            logits = _dense(tf.reshape(h, [-1, 4 * 4 * 11]), 4, "logits")
        elif model == "depthwise_se":
            x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
            with v1.variable_scope("depthwise"):
                kernel = v1.get_variable("kernel", [3, 3, 3, 2], use_resource=True)
            h = tf.nn.depthwise_conv2d(x, kernel, strides=[1, 1, 1, 1], padding="SAME")
            h = tf.nn.relu(_batch_norm(h, "bn0", updates))
            squeeze = tf.reduce_mean(h, axis=[1, 2])
            excite = tf.sigmoid(_dense(tf.nn.relu(_dense(squeeze, 3, "se_reduce")), 6, "se_expand"))
            h = h * tf.reshape(excite, [-1, 1, 1, 6])
            logits = _dense(tf.reshape(h, [-1, 8 * 8 * 6]), 4, "logits")
        elif model == "attention":
            x = v1.placeholder(tf.float32, [None, 6, 8], name="tokens")
            q, k, v = (_dense(x, 8, n) for n in ("query", "key", "value"))
            weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / 8 ** 0.5)
            logits = _dense(tf.reduce_mean(tf.matmul(weights, v), axis=1), 4, "logits")
        else:
            raise ValueError(f"model must be mlp, cnn, attention, dense_block or depthwise_se, got {model!r}")
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        _train_step(tf.identity(tf.reduce_mean(per_example), name="loss"), optimizer, updates)
    return graph.as_graph_def()


def _batch_norm(h, scope, updates):
    """Training-mode fused batch norm over the last axis of `h` (NHWC), as in "cnn": appends its
    moving-average updates (momentum 0.9, AssignSubVariableOp) to `updates`."""
    import tensorflow as tf
    v1 = tf.compat.v1
    c = int(h.shape[-1])
    with v1.variable_scope(scope):
        gamma = v1.get_variable("gamma", [c], initializer=v1.ones_initializer(), use_resource=True)
        beta = v1.get_variable("beta", [c], initializer=v1.zeros_initializer(), use_resource=True)
        stats = [v1.get_variable(n, [c], initializer=init, trainable=False, use_resource=True)
                 for n, init in (("moving_mean", v1.zeros_initializer()),
                                 ("moving_variance", v1.ones_initializer()))]
    h, mean, var = v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
    updates.extend(v1.assign_sub(s, 0.1 * (s - m)) for s, m in zip(stats, (mean, var)))
    return h


def tiny_mlp_graph_def(optimizer: str = "sgd"):
    """`tiny_graph_def("mlp", optimizer)`."""
    return tiny_graph_def("mlp", optimizer)


@functools.lru_cache(maxsize=None)
def tiny_graph(model: str = "mlp", batch_size: int = 8, optimizer: str = "sgd") -> OpGraph:
    """`tiny_graph_def(model, optimizer)` loaded at `batch_size` (cached per process)."""
    from tfplace.ir.loader import load_op_graph
    return load_op_graph(tiny_graph_def(model, optimizer), sinks=["train_op"], batch_size=batch_size,
                         loss="loss", source=f"tiny_{model}_{optimizer}")


def tiny_mlp_graph(batch_size: int = 8, optimizer: str = "sgd") -> OpGraph:
    """The tiny MLP training step (see tiny_graph_def) as an OpGraph (cached per process)."""
    return tiny_graph("mlp", batch_size, optimizer)


#: dropout_graph_def's noises: the random op each one draws its mask with.
DROPOUT_NOISES = {"dropout": "RandomUniform", "gaussian": "RandomStandardNormal", "truncated": "TruncatedNormal",
                  "stateless": "StatelessRandomUniformV2", "stateless_v1": "StatelessRandomUniform",
                  "drop_connect": "RandomUniform"}


def dropout_graph_def(noise: str = "dropout", optimizer: str = "sgd"):
    """The tiny MLP (see tiny_graph_def) with random noise on its hidden layer (imports TensorFlow).

    features [None, 16] -> Dense 32 relu -> noise -> Dense 4; `dropout_rate` is a float32 scalar
    PlaceholderWithDefault (default 0.5). Feeding it 0 makes every noise the identity (the random
    op still runs), so the step equals the plain MLP's.
      "dropout":      tf.nn.dropout (RandomUniform mask, seeds from the graph seed 0)
      "gaussian":     h * (1 + rate * N(0, 1))     (RandomStandardNormal)
      "truncated":    h * (1 + rate * truncated N(0, 1))   (TruncatedNormal)
      "stateless":    tf.random.stateless_uniform(seed=[7, 11]) >= rate, scaled  (StatelessRandomUniformV2)
      "stateless_v1": the same with the V1 op StatelessRandomUniform (int64 seed input)
      "drop_connect": dropout on dense_1's kernel ([32, 4], no batch axis), not on activations
    Op names: the noise's random op is the only op of its type in the step (DROPOUT_NOISES).
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    if noise not in DROPOUT_NOISES:
        raise ValueError(f"noise must be one of {sorted(DROPOUT_NOISES)}, got {noise!r}")
    with tf.Graph().as_default() as graph:
        v1.set_random_seed(0)
        labels = v1.placeholder(tf.int32, [None], name="labels")
        x = v1.placeholder(tf.float32, [None, 16], name="features")
        rate = v1.placeholder_with_default(0.5, [], name="dropout_rate")
        h = tf.nn.relu(_dense(x, 32, "dense_0"))

        def keep(u):  # a uniform draw in [0, 1) -> an inverted-dropout mask
            return tf.cast(u >= rate, tf.float32) / (1.0 - rate)

        if noise == "dropout":
            h = tf.nn.dropout(h, rate=rate)
        elif noise == "gaussian":
            h = h * (1.0 + rate * v1.random_normal(tf.shape(h)))
        elif noise == "truncated":
            h = h * (1.0 + rate * v1.truncated_normal(tf.shape(h)))
        elif noise == "stateless":
            h = h * keep(tf.random.stateless_uniform(tf.shape(h), seed=[7, 11]))
        elif noise == "stateless_v1":
            seed = tf.constant([7, 11], tf.int64)
            h = h * keep(tf.raw_ops.StatelessRandomUniform(shape=tf.shape(h), seed=seed, dtype=tf.float32))
        if noise == "drop_connect":
            with v1.variable_scope("dense_1"):
                w = v1.get_variable("kernel", [32, 4], use_resource=True)
                b = v1.get_variable("bias", [4], initializer=v1.zeros_initializer(), use_resource=True)
            logits = tf.matmul(h, tf.nn.dropout(w, rate=rate)) + b
        else:
            logits = _dense(h, 4, "dense_1")
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        _train_step(tf.identity(tf.reduce_mean(per_example), name="loss"), optimizer)
    return graph.as_graph_def()


@functools.lru_cache(maxsize=None)
def dropout_graph(noise: str = "dropout", batch_size: int = 8, optimizer: str = "sgd") -> OpGraph:
    """`dropout_graph_def(noise, optimizer)` loaded at `batch_size` (cached per process)."""
    from tfplace.ir.loader import load_op_graph
    return load_op_graph(dropout_graph_def(noise, optimizer), sinks=["train_op"], batch_size=batch_size,
                         loss="loss", source=f"dropout_{noise}_{optimizer}")


# ---- clusters ------------------------------------------------------------------------------
def _host(name: str) -> Host:
    return Host(name=name, nic_bandwidth_bytes_per_s=_NIC_BANDWIDTH_BYTES_PER_S,
                intra_bandwidth_bytes_per_s=_INTRA_BANDWIDTH_BYTES_PER_S)


def two_device_cluster() -> Cluster:
    """One host `h0` with a V100 (`v100_0`, 16 GB) and a P100 (`p100_0`, 12 GB) on PCIe."""
    devices = [Device("v100_0", "V100", "h0", V100_MEMORY_BYTES),
               Device("p100_0", "P100", "h0", P100_MEMORY_BYTES)]
    return build_cluster("two_device", [_host("h0")], devices)


def four_device_cluster() -> Cluster:
    """Two hosts on 10 GbE: `h0` with two V100s (task 0), `h1` with two P100s (task 1)."""
    devices = [Device("v100_0", "V100", "h0", V100_MEMORY_BYTES, task=0),
               Device("v100_1", "V100", "h0", V100_MEMORY_BYTES, task=0),
               Device("p100_0", "P100", "h1", P100_MEMORY_BYTES, task=1),
               Device("p100_1", "P100", "h1", P100_MEMORY_BYTES, task=1)]
    return build_cluster("four_device", [_host("h0"), _host("h1")], devices)


# ---- profiles ------------------------------------------------------------------------------
def uniform_profile(graph: OpGraph, kinds: Sequence[str], seconds_per_op: float = 1e-4) -> Profile:
    """Every op of `graph` takes `seconds_per_op` on every device kind at the full batch.

    Ops that are batch-dependent and have a batched output scale linearly with the per-device
    batch (one point at the reference batch size); every other op costs `seconds_per_op`
    whatever the batch (points at 1 and at the reference batch size).
    """
    ref = graph.reference_batch_size
    batched = np.zeros(graph.num_ops, dtype=bool)
    batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    scaling = graph.op_batch_dependent & batched
    linear = ((ref,), (seconds_per_op,))
    constant = ((1, ref), (seconds_per_op, seconds_per_op)) if ref > 1 else linear
    ops = {name: {kind: (linear if scaling[i] else constant) for kind in kinds}
           for i, name in enumerate(graph.names)}
    return Profile(ops=ops, graph=str(graph.meta.get("model", graph.source)),
                   conditions={"kind": "uniform", "seconds_per_op": seconds_per_op})


def random_strategy(rng: np.random.Generator, group_names, device_names, batch: int = 8, *,
                    micro_batch_probability: float = 0.3, ps_probability: float = 0.4,
                    priority_probability: float = 0.3):
    """A valid random Strategy for tests and benchmarks.

    Per group: 1..D distinct devices with uneven shares that sum to `batch` (a share of >= 2
    samples is split into two micro-batches with `micro_batch_probability`), PS on a random
    device with `ps_probability` (else all-reduce), a priority in 0..2 with
    `priority_probability`. A probability of 0 draws no random number for that choice.
    """
    from tfplace.formats.strategy import Strategy, decision
    devices = list(device_names)
    groups = {}
    for name in group_names:
        k = int(rng.integers(1, len(devices) + 1))
        chosen = rng.choice(len(devices), size=k, replace=False)
        cuts = np.sort(rng.choice(np.arange(1, batch), size=k - 1, replace=False)) if k > 1 else np.zeros(0, int)
        sizes = np.diff(np.concatenate([[0], cuts, [batch]])).astype(int)
        shares = {}
        for d, s in zip(chosen.tolist(), sizes.tolist()):
            split = micro_batch_probability > 0 and s >= 2 and rng.random() < micro_batch_probability
            shares[devices[d]] = [s // 2, s - s // 2] if split else s
        ps = rng.random() < ps_probability
        ps_device = devices[int(rng.integers(len(devices)))] if ps else None
        priority = int(rng.integers(0, 3)) if priority_probability > 0 and rng.random() < priority_probability else None
        groups[name] = decision(shares, "ps" if ps else "allreduce", ps_device, priority)
    return Strategy(batch, len(group_names), None, groups)
