"""Raw-TensorFlow building blocks for the sequence models (transformer, BERT).

Every variable is a resource variable made with tf.compat.v1.get_variable under a
variable_scope, so names are explicit and deterministic (e.g. encoder/layer_3/ffn/in/kernel).
Activations are kept 2-D as [N*L, d] (tokens flattened, N = batch, L = sequence length) so
dense layers are plain MatMul ops; reshapes use -1 for the batch so nothing bakes it in.
"""

import math

import tensorflow as tf

v1 = tf.compat.v1
INIT_STDDEV = 0.02  # BERT / GPT style truncated-normal init


def weight(name, shape, stddev=INIT_STDDEV):
    return v1.get_variable(name, shape, tf.float32, v1.truncated_normal_initializer(stddev=stddev),
                           use_resource=True)


def zeros(name, shape):
    return v1.get_variable(name, shape, tf.float32, v1.zeros_initializer(), use_resource=True)


def ones(name, shape):
    return v1.get_variable(name, shape, tf.float32, v1.ones_initializer(), use_resource=True)


def dense(x, units, name, activation=None):
    """x [T, d_in] -> [T, units]: MatMul + BiasAdd (+ activation)."""
    with v1.variable_scope(name):
        kernel = weight("kernel", [x.shape[-1], units])
        bias = zeros("bias", [units])
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
    return activation(y) if activation is not None else y


def layer_norm(x, name, eps=1e-6):
    """Normalizes the last axis of x (any rank) with learned gain and bias of size d."""
    with v1.variable_scope(name):
        d = x.shape[-1]
        gamma, beta = ones("gamma", [d]), zeros("beta", [d])
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + eps) * gamma + beta


def gelu(x):
    return tf.nn.gelu(x, approximate=True)  # tanh form, as in the original BERT code


def embed(ids, table):
    """ids int32 [N, L], table [V, d] -> [N*L, d] (ResourceGather; sparse gradient)."""
    flat = tf.reshape(ids, [-1])
    return tf.gather(table, flat)


def _split_heads(x, seq_len, num_heads):
    """[N*L, d] -> [N, H, L, d/H]."""
    d = x.shape[-1]
    x = tf.reshape(x, [-1, seq_len, num_heads, d // num_heads])
    return tf.transpose(x, [0, 2, 1, 3])


def attention(q_in, kv_in, q_len, kv_len, num_heads, name, bias=None):
    """Multi-head scaled dot-product attention.

    q_in [N*Lq, d], kv_in [N*Lk, d]; bias broadcastable to [N, H, Lq, Lk] (additive, e.g. the
    causal mask) or None. Returns [N*Lq, d] after the output projection.
    """
    d = q_in.shape[-1]
    if d % num_heads:
        raise ValueError(f"{name}: width {d} is not divisible by {num_heads} heads")
    with v1.variable_scope(name):
        q = _split_heads(dense(q_in, d, "query"), q_len, num_heads)
        k = _split_heads(dense(kv_in, d, "key"), kv_len, num_heads)
        v = _split_heads(dense(kv_in, d, "value"), kv_len, num_heads)
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(d // num_heads))
        if bias is not None:
            scores += bias
        context = tf.matmul(tf.nn.softmax(scores), v)          # [N, H, Lq, d/H]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, d])
        return dense(context, d, "output")


def causal_bias(seq_len):
    """[1, 1, L, L] additive mask: 0 where key j <= query i, -1e9 elsewhere (constant)."""
    allowed = tf.linalg.band_part(tf.ones([seq_len, seq_len]), -1, 0)
    return tf.reshape((1.0 - allowed) * -1e9, [1, 1, seq_len, seq_len])


def feed_forward(x, inner, name, activation):
    """Position-wise FFN: [T, d] -> inner (activation) -> [T, d]."""
    with v1.variable_scope(name):
        h = dense(x, inner, "in", activation)
        return dense(h, x.shape[-1], "out")


def token_cross_entropy(hidden, table, labels, seq_len, name="lm_head"):
    """Tied-embedding LM loss. hidden [N*L, d], table [V, d], labels int32 [N, L].

    Returns the per-example loss [N]: mean over the L positions of the token cross entropy.
    """
    with v1.variable_scope(name):
        bias = zeros("bias", [table.shape[0]])
        logits = tf.nn.bias_add(tf.matmul(hidden, table, transpose_b=True), bias)  # [N*L, V]
        flat = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(labels, [-1]), logits=logits)
        return tf.reduce_mean(tf.reshape(flat, [-1, seq_len]), axis=1)


def sinusoid(positions, dim):
    """Sinusoidal encodings (Vaswani et al.): positions float32 [P] -> [P, dim], computed in
    the graph so the GraphDef carries no [P, dim] constant."""
    inv_freq = 1.0 / tf.pow(10000.0, tf.range(0, dim, 2, dtype=tf.float32) / dim)
    angles = positions[:, None] * inv_freq[None, :]
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)
