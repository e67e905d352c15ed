"""XLNet-Large pre-training step (Yang et al. 2019), simplified but faithful in structure.

24 layers, hidden 1024, 16 heads x 64, FFN 4096 (GELU), vocabulary 32000, post-layer-norm.
What is kept from XLNet: time-major layout ([L, N, d]: the batch is axis 1 of most tensors),
relative positional attention (sinusoidal relative encodings projected by W_r, content and
position biases r_w/r_r, relative shift), relative segment encodings (r_s bias, seg_embed),
and two-stream attention: the content stream h attends with the "can see itself" mask, the
query stream g (started from a learned mask embedding) attends to h with the permutation mask.
Both streams share the attention, layer-norm and FFN weights. Einsum ops as in the original.
Simplified: the LM loss is taken on the query stream at ALL L positions (XLNet predicts the
last ~1/6 of a permutation through target_mapping), no memory/recurrence, no dropout.

Inputs (L = seq_len):
  input_ids  int32   [N, L]     token ids in [0, 32000)
  seg_ids    int32   [N, L]     segment ids in [0, 2)
  perm_mask  float32 [N, L, L]  1 where position i may NOT attend to position j (0/1 values;
                                any floats are accepted, values > 0 count as masked)
  labels     int32   [N, L]     targets in [0, 32000)
Loss per example [N]: token cross entropy averaged over the L positions.
"""

import math

import tensorflow as tf

from ._train import Built
from .layers import feed_forward, gelu, layer_norm, sinusoid, weight, zeros

v1 = tf.compat.v1

CONFIG = dict(hidden=1024, num_heads=16, head_size=64, d_ffn=4096)
VOCAB = 32000


def rel_shift(x, klen):
    """x [Lq, R, N, H] scored against R=Lk+Lq relative positions -> [Lq, Lk, N, H] aligned to
    absolute key positions (the reshape trick of Transformer-XL)."""
    qlen, rlen, heads = x.shape[0], x.shape[1], x.shape[3]
    x = tf.reshape(x, [rlen, qlen, -1, heads])[1:]
    return tf.reshape(x, [qlen, rlen - 1, -1, heads])[:, :klen]


def rel_attention_core(q, k, v, k_r, seg_mat, p, mask):
    """q/k/v [L, N, H, D], k_r [2L, N, H, D], seg_mat [L, L, N, 2], mask [L, L, N, 1]
    (1 = blocked) -> attention output [L, N, H, D]."""
    ac = tf.einsum("ibnd,jbnd->ijbn", q + p["r_w_bias"], k)                 # content term
    bd = rel_shift(tf.einsum("ibnd,jbnd->ijbn", q + p["r_r_bias"], k_r), k.shape[0])
    ef = tf.einsum("ibnd,snd->ibns", q + p["r_s_bias"], p["seg_embed"])    # segment term
    ef = tf.einsum("ijbs,ibns->ijbn", seg_mat, ef)
    score = (ac + bd + ef) * (1.0 / math.sqrt(q.shape[-1])) - 1e30 * mask
    # Softmax over the keys j (axis 1). tf.nn.softmax(axis=1) would compute its transpose
    # permutation at run time (Range/Pack ops); constant permutations keep the graph static.
    prob = tf.transpose(tf.nn.softmax(tf.transpose(score, [0, 2, 3, 1])), [0, 3, 1, 2])
    return tf.einsum("ijbn,jbnd->ibnd", prob, v)


def _post_and_ffn(x, attn, p, c):
    """Output projection + residual + LN, then FFN + residual + LN; x [L, N, d]."""
    L, d = x.shape[0], c["hidden"]
    x = layer_norm(tf.einsum("ibnd,hnd->ibh", attn, p["o"]) + x, "attention_norm")
    flat = tf.reshape(x, [-1, d])                      # FFN as dense on [L*N, d], like tf.layers
    flat = layer_norm(flat + feed_forward(flat, c["d_ffn"], "ffn", gelu), "ffn_norm")
    return tf.reshape(flat, [L, -1, d])


def two_stream_layer(h, g, pos_emb, seg_mat, content_mask, query_mask, c):
    """One XLNet layer on both streams; h, g [L, N, d], pos_emb [2L, N, d]."""
    d, n, hd = c["hidden"], c["num_heads"], c["head_size"]
    p = {name: weight(name, [d, n, hd]) for name in ("q", "k", "v", "o", "r")}
    p.update({name: weight(name, [n, hd]) for name in ("r_w_bias", "r_r_bias", "r_s_bias")})
    p["seg_embed"] = weight("seg_embed", [2, n, hd])
    k = tf.einsum("ibh,hnd->ibnd", h, p["k"])         # keys and values come from h only
    v = tf.einsum("ibh,hnd->ibnd", h, p["v"])
    k_r = tf.einsum("ibh,hnd->ibnd", pos_emb, p["r"])
    attn_h = rel_attention_core(tf.einsum("ibh,hnd->ibnd", h, p["q"]), k, v, k_r, seg_mat, p,
                                content_mask)
    attn_g = rel_attention_core(tf.einsum("ibh,hnd->ibnd", g, p["q"]), k, v, k_r, seg_mat, p,
                                query_mask)
    new_h = _post_and_ffn(h, attn_h, p, c)
    with v1.variable_scope(v1.get_variable_scope(), reuse=True):   # the streams share weights
        new_g = _post_and_ffn(g, attn_g, p, c)
    return new_h, new_g


def build(cfg, inputs):
    c, L = CONFIG, cfg.seq_len
    ids = inputs.add("input_ids", tf.int32, [None, L], max_value=VOCAB)
    seg = inputs.add("seg_ids", tf.int32, [None, L], max_value=2)
    perm = inputs.add("perm_mask", tf.float32, [None, L, L])
    labels = inputs.add("labels", tf.int32, [None, L], max_value=VOCAB)
    # XLNet works time-major: everything below is [L, N, ...] (batch on axis 1 or 2).
    ids_t, seg_t, labels_t = tf.transpose(ids), tf.transpose(seg), tf.transpose(labels)
    batch = tf.shape(ids)[0]
    query_mask = tf.cast(tf.transpose(perm, [1, 2, 0])[:, :, :, None] > 0, tf.float32)
    eye = tf.eye(L)[:, :, None, None]
    content_mask = tf.cast(query_mask - eye > 0, tf.float32)    # h may always see itself
    same = tf.equal(seg_t[:, None], seg_t[None, :])             # [L, L, N]
    seg_mat = tf.one_hot(tf.cast(tf.logical_not(same), tf.int32), 2)
    # Relative positions L, L-1, ..., -L+1 (keys minus queries), sinusoids tiled over the batch.
    pos = sinusoid(tf.range(L, -L, -1, dtype=tf.float32), c["hidden"])
    pos_emb = tf.tile(pos[:, None, :], [1, batch, 1])
    with v1.variable_scope("model/transformer"):
        word_emb = weight("word_embedding", [VOCAB, c["hidden"]])
        h = tf.gather(word_emb, ids_t)                                  # [L, N, d]
        mask_emb = weight("mask_emb", [1, 1, c["hidden"]])
        g = tf.tile(mask_emb, [L, batch, 1])
        for i in range(cfg.num_layers):
            with v1.variable_scope(f"layer_{i}"):
                h, g = two_stream_layer(h, g, pos_emb, seg_mat, content_mask, query_mask, c)
    with v1.variable_scope("model/lm_loss"):
        bias = zeros("bias", [VOCAB])
        logits = tf.einsum("ibd,nd->ibn", g, word_emb) + bias           # [L, N, V]
        # Flatten to [L*N, V]: on rank-3 logits the loss op adds a run-time shape Assert.
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(labels_t, [-1]), logits=tf.reshape(logits, [-1, VOCAB]))
    return Built(tf.reduce_mean(tf.reshape(loss, [L, -1]), axis=0))
