"""Encoder-decoder Transformer (Vaswani et al. 2017, "base"), written with raw TF ops.

Sizes: d_model 512, 8 heads, FFN 2048 (ReLU), post-layer-norm residual blocks, `num_layers`
layers in BOTH the encoder and decoder stacks (6 by default), one 32000-token vocabulary
shared by source embedding, target embedding and the output softmax (scaled by sqrt(d)),
sinusoidal positions. No dropout (it adds little compute and would make the loss noisy).
tiny_transformer: d 32, 2 heads, FFN 64, vocabulary 50 (seq 8, 2 layers by default).

Inputs (L = seq_len tokens, same length for source and target):
  src_ids     int32 [N, L]  source tokens in [0, V)
  tgt_ids     int32 [N, L]  decoder input tokens (target shifted right) in [0, V)
  tgt_labels  int32 [N, L]  next-token targets in [0, V)
Loss: token cross entropy averaged over the L positions, per example [N].
"""

import math

import tensorflow as tf

from ._train import Built
from .layers import (attention, causal_bias, embed, feed_forward, layer_norm, sinusoid,
                     token_cross_entropy, weight)

v1 = tf.compat.v1

CONFIGS = {
    "transformer": dict(d_model=512, num_heads=8, d_ffn=2048, vocab=32000),
    "tiny_transformer": dict(d_model=32, num_heads=2, d_ffn=64, vocab=50),
}


def _embed_tokens(ids, table, seq_len, positions):
    d = table.shape[-1]
    x = embed(ids, table) * math.sqrt(d)                      # [N*L, d]
    x = tf.reshape(x, [-1, seq_len, d]) + positions[None]      # broadcast [L, d] over N
    return tf.reshape(x, [-1, d])


def encoder(x, seq_len, num_layers, c):
    """x [N*L, d] -> [N*L, d]: self-attention + FFN blocks, post layer norm."""
    for i in range(num_layers):
        with v1.variable_scope(f"layer_{i}"):
            x = layer_norm(x + attention(x, x, seq_len, seq_len, c["num_heads"], "self_attention"),
                           "attention_norm")
            x = layer_norm(x + feed_forward(x, c["d_ffn"], "ffn", tf.nn.relu), "ffn_norm")
    return x


def decoder(y, memory, seq_len, num_layers, c):
    """y [N*L, d] (targets), memory [N*L, d] (encoder output) -> [N*L, d]."""
    mask = causal_bias(seq_len)
    for i in range(num_layers):
        with v1.variable_scope(f"layer_{i}"):
            y = layer_norm(y + attention(y, y, seq_len, seq_len, c["num_heads"], "self_attention",
                                         bias=mask), "self_attention_norm")
            y = layer_norm(y + attention(y, memory, seq_len, seq_len, c["num_heads"],
                                         "cross_attention"), "cross_attention_norm")
            y = layer_norm(y + feed_forward(y, c["d_ffn"], "ffn", tf.nn.relu), "ffn_norm")
    return y


def build(cfg, inputs):
    c = CONFIGS[cfg.name]
    L, vocab = cfg.seq_len, c["vocab"]
    src = inputs.add("src_ids", tf.int32, [None, L], max_value=vocab)
    tgt = inputs.add("tgt_ids", tf.int32, [None, L], max_value=vocab)
    labels = inputs.add("tgt_labels", tf.int32, [None, L], max_value=vocab)
    # Embedding stddev d^-0.5: with the sqrt(d) scale, inputs start at unit variance.
    table = weight("shared_embedding", [vocab, c["d_model"]], stddev=c["d_model"] ** -0.5)
    positions = sinusoid(tf.range(L, dtype=tf.float32), c["d_model"])
    with v1.variable_scope("encoder"):
        memory = encoder(_embed_tokens(src, table, L, positions), L, cfg.num_layers, c)
    with v1.variable_scope("decoder"):
        out = decoder(_embed_tokens(tgt, table, L, positions), memory, L, cfg.num_layers, c)
    return Built(token_cross_entropy(out, table, labels, L, "softmax"))

