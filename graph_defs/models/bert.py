"""BERT encoder pre-training step (Devlin et al. 2018), written with raw TF ops.

bert_large: 24 layers, hidden 1024, 16 heads, FFN 4096 (GELU); bert_base: 12 / 768 / 12 / 3072.
Vocabulary 30522, 512 learned positions, 2 token types, post-layer-norm blocks, no dropout.

Inputs (L = seq_len tokens, <= 512):
  input_ids              int32 [N, L]  token ids in [0, 30522)
  token_type_ids         int32 [N, L]  segment ids in [0, 2)
  mlm_labels             int32 [N, L]  masked-LM targets in [0, 30522)
  next_sentence_labels   int32 [N]     in [0, 2)
Loss per example [N]: masked-LM cross entropy averaged over ALL L positions (a simplification:
real BERT scores only the ~15% masked positions, so this head does ~6x the softmax work of the
original) plus the next-sentence cross entropy. The LM output layer is tied to the word
embeddings, as in BERT.
"""

import tensorflow as tf

from ._train import Built
from .layers import (attention, dense, embed, feed_forward, gelu, layer_norm,
                     token_cross_entropy, weight)

v1 = tf.compat.v1

CONFIGS = {
    "bert_large": dict(hidden=1024, num_heads=16, d_ffn=4096),
    "bert_base": dict(hidden=768, num_heads=12, d_ffn=3072),
}
VOCAB, MAX_POSITIONS, TYPE_VOCAB = 30522, 512, 2


def embeddings(ids, types, seq_len, hidden):
    """Word + position + token-type embeddings, layer-normed: -> [N*L, hidden]."""
    with v1.variable_scope("embeddings"):
        words = weight("word_embeddings", [VOCAB, hidden])
        positions = weight("position_embeddings", [MAX_POSITIONS, hidden])
        type_table = weight("token_type_embeddings", [TYPE_VOCAB, hidden])
        x = tf.reshape(embed(ids, words), [-1, seq_len, hidden])
        x += positions[:seq_len][None]          # first L learned positions, broadcast over N
        # BERT looks token types up by one-hot matmul (the table is tiny); so do we.
        one_hot = tf.one_hot(tf.reshape(types, [-1]), TYPE_VOCAB)
        x = tf.reshape(x, [-1, hidden]) + tf.matmul(one_hot, type_table)
        return layer_norm(x, "layer_norm"), words


def encoder(x, seq_len, num_layers, c):
    """x [N*L, hidden] -> [N*L, hidden] through `num_layers` post-LN transformer layers."""
    for i in range(num_layers):
        with v1.variable_scope(f"layer_{i}"):
            x = layer_norm(x + attention(x, x, seq_len, seq_len, c["num_heads"], "attention"),
                           "attention_norm")
            x = layer_norm(x + feed_forward(x, c["d_ffn"], "ffn", gelu), "ffn_norm")
    return x


def build(cfg, inputs):
    c, L = CONFIGS[cfg.name], cfg.seq_len
    if L > MAX_POSITIONS:
        raise ValueError(f"{cfg.name}: seq_len must be <= {MAX_POSITIONS}, got {L}")
    ids = inputs.add("input_ids", tf.int32, [None, L], max_value=VOCAB)
    types = inputs.add("token_type_ids", tf.int32, [None, L], max_value=TYPE_VOCAB)
    mlm_labels = inputs.add("mlm_labels", tf.int32, [None, L], max_value=VOCAB)
    nsp_labels = inputs.add("next_sentence_labels", tf.int32, [None], max_value=2)
    with v1.variable_scope("bert"):
        x, words = embeddings(ids, types, L, c["hidden"])
        with v1.variable_scope("encoder"):
            x = encoder(x, L, cfg.num_layers, c)
        with v1.variable_scope("pooler"):
            first = tf.reshape(x, [-1, L, c["hidden"]])[:, 0]            # [CLS] token, [N, d]
            pooled = dense(first, c["hidden"], "dense", tf.tanh)
    with v1.variable_scope("cls/predictions"):
        h = layer_norm(dense(x, c["hidden"], "transform", gelu), "transform_norm")
        mlm = token_cross_entropy(h, words, mlm_labels, L, "output")
    with v1.variable_scope("cls/seq_relationship"):
        nsp_logits = dense(pooled, 2, "output")
        nsp = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits)
    return Built(mlm + nsp)
