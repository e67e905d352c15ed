"""The placement policy network: a graph network over the op-group graph plus a device encoder,
scored per (group, device), so no weight shape depends on the number of groups or devices.

    net = PlacementNetwork(NetworkConfig(), ActionLayout(...))
    dists, _ = net(observation_batch)          # dict of tfd.Independent(Categorical), batch [B]

Inputs: the observation dict of `tfplace.policy.features` with a leading batch dimension B (all
observations of one batch come from the same (graph, cluster), so sizes agree).
Architecture (sizes from `TrainConfig.network`):
  1. encoders: MLPs for nodes, edges, globals, devices, to `hidden_size` (the devices' rank
     column only with `device_rank_feature`);
  2. `num_message_passing_steps` rounds, each (one set of weights for all rounds, residual):
     a. a graph_nets `GraphNetwork` over the group graph (edge, node, global blocks; MLPs with
        `mlp_layers` layers);
     b. a group <-> device exchange: the devices are the other side of a complete bipartite
        graph whose edges carry the pair features. Each (group, device) edge computes a message
        from [group ‖ device ‖ pair features]; a device adds an MLP of [itself ‖ mean of its
        messages ‖ graph global], a group an MLP of [itself ‖ mean of its messages]. So a group
        sees which devices are fast, large or well linked, and a device sees which groups are
        heavy on it, before the next round;
  3. per (group, device) MLP on [group ‖ device ‖ pair features] -> share-level logits and a
     PS-device score; per group MLP on [group ‖ global ‖ mean device] -> sync, micro-batch and
     priority logits.
Output: {"shares": Independent(Categorical [B, G, D, L]) with 2 reinterpreted dims,
         "ps_device": Independent(Categorical [B, G, D]), "sync"/"micro"/"priority":
         Independent(Categorical [B, G, k])}. No state; no dropout (so greedy = deterministic).
"""

from __future__ import annotations

import graph_nets as gn
import sonnet as snt
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.networks import network

from tfplace.formats.config import NetworkConfig
from tfplace.policy import features as F
from tfplace.policy.actions import ActionLayout

tfd = tfp.distributions


def observation_tensor_spec():
    """Shape-agnostic TensorSpecs (None for G, M, D) — the network accepts any graph/cluster."""
    return {
        "nodes": tf.TensorSpec([None, F.NODE_FEATURES], tf.float32),
        "edges": tf.TensorSpec([None, F.EDGE_FEATURES], tf.float32),
        "senders": tf.TensorSpec([None], tf.int32),
        "receivers": tf.TensorSpec([None], tf.int32),
        "devices": tf.TensorSpec([None, F.DEVICE_FEATURES], tf.float32),
        "pairs": tf.TensorSpec([None, None, F.PAIR_FEATURES], tf.float32),
        "globals": tf.TensorSpec([F.GLOBAL_FEATURES], tf.float32),
    }


def _mlp_factory(size: int, layers: int, name: str):
    return lambda: snt.Sequential([snt.nets.MLP([size] * layers, activate_final=True, name=name),
                                   snt.LayerNorm(axis=-1, create_scale=True, create_offset=True)])


def _cat(logits, dims: int, name: str):
    return tfd.Independent(tfd.Categorical(logits=logits, dtype=tf.int32), reinterpreted_batch_ndims=dims,
                           name=name)


class PlacementNetwork(network.Network):
    """tf_agents Network whose `call` returns a dict of distributions (see module docstring)."""

    def __init__(self, config: NetworkConfig, layout: ActionLayout, name: str = "PlacementNetwork"):
        super().__init__(input_tensor_spec=observation_tensor_spec(), state_spec=(), name=name)
        h, k = config.hidden_size, config.mlp_layers
        self._layout = layout
        self._steps = config.num_message_passing_steps
        self._device_rank = bool(config.device_rank_feature)
        self._encoder = gn.modules.GraphIndependent(
            edge_model_fn=_mlp_factory(h, k, "enc_edge"), node_model_fn=_mlp_factory(h, k, "enc_node"),
            global_model_fn=_mlp_factory(h, k, "enc_global"))
        self._core = gn.modules.GraphNetwork(
            edge_model_fn=_mlp_factory(h, k, "core_edge"), node_model_fn=_mlp_factory(h, k, "core_node"),
            global_model_fn=_mlp_factory(h, k, "core_global"))
        self._device_enc = _mlp_factory(h, k, "device_enc")()
        self._pair_msg = _mlp_factory(h, k, "pair_msg")()
        self._device_upd = _mlp_factory(h, k, "device_upd")()
        self._group_upd = _mlp_factory(h, k, "group_upd")()
        self._pair_head = snt.Sequential([snt.nets.MLP([h] * k, activate_final=True, name="pair_mlp"),
                                          snt.Linear(layout.share_levels + 1, name="pair_out")])
        self._group_head = snt.Sequential([snt.nets.MLP([h] * k, activate_final=True, name="group_mlp"),
                                           snt.Linear(2 + 2 + layout.priority_levels, name="group_out")])

    def _graphs(self, obs, b, g, m):
        off = tf.repeat(tf.range(b) * g, m)
        return gn.graphs.GraphsTuple(
            nodes=tf.reshape(obs["nodes"], [-1, F.NODE_FEATURES]),
            edges=tf.reshape(obs["edges"], [-1, F.EDGE_FEATURES]),
            senders=tf.reshape(obs["senders"], [-1]) + off, receivers=tf.reshape(obs["receivers"], [-1]) + off,
            globals=obs["globals"], n_node=tf.fill([b], g), n_edge=tf.fill([b], m))

    def _exchange(self, nodes, dev, pairs, glob):
        """One group <-> device round. nodes [B, G, H], dev [B, D, H], pairs [B, G, D, P],
        glob [B, H] -> (nodes, dev), both residual."""
        b, g, d = tf.shape(pairs)[0], tf.shape(pairs)[1], tf.shape(pairs)[2]
        h = nodes.shape[-1]
        msg = self._pair_msg(tf.concat([tf.broadcast_to(nodes[:, :, None, :], [b, g, d, h]),
                                        tf.broadcast_to(dev[:, None, :, :], [b, g, d, h]), pairs], axis=-1))
        dev = dev + self._device_upd(tf.concat([dev, tf.reduce_mean(msg, axis=1),
                                                tf.broadcast_to(glob[:, None, :], tf.shape(dev))], axis=-1))
        nodes = nodes + self._group_upd(tf.concat([nodes, tf.reduce_mean(msg, axis=2)], axis=-1))
        return nodes, dev

    def call(self, observation, step_type=None, network_state=(), training=False):
        shape = tf.shape(observation["pairs"])
        b, g, d = shape[0], shape[1], shape[2]
        m = tf.shape(observation["senders"])[1]
        graph = self._encoder(self._graphs(observation, b, g, m))
        h = graph.nodes.shape[-1]
        devices = observation["devices"]
        if not self._device_rank:  # a policy made before the rank column: the same inputs as then
            devices = devices[..., :F.DEVICE_RANK_COLUMN]
        dev = self._device_enc(devices)  # [B, D, H]
        for _ in range(self._steps):
            out = self._core(graph)
            nodes = tf.reshape(graph.nodes + out.nodes, [b, g, h])
            glob = graph.globals + out.globals
            nodes, dev = self._exchange(nodes, dev, observation["pairs"], glob)
            graph = graph.replace(nodes=tf.reshape(nodes, [-1, h]), edges=graph.edges + out.edges, globals=glob)
        nodes = tf.reshape(graph.nodes, [b, g, h])
        glob = graph.globals  # [B, H]
        pair_in = tf.concat([tf.broadcast_to(nodes[:, :, None, :], [b, g, d, h]),
                             tf.broadcast_to(dev[:, None, :, :], [b, g, d, h]), observation["pairs"]], axis=-1)
        pair_out = self._pair_head(pair_in)  # [B, G, D, L+1]
        mean_dev = tf.reduce_mean(dev, axis=1)
        group_in = tf.concat([nodes, tf.broadcast_to(glob[:, None, :], [b, g, h]),
                              tf.broadcast_to(mean_dev[:, None, :], [b, g, h])], axis=-1)
        group_out = self._group_head(group_in)  # [B, G, 4 + P]
        lv = self._layout.share_levels
        dists = {"shares": _cat(pair_out[..., :lv], 2, "shares"),
                 "ps_device": _cat(pair_out[..., lv], 1, "ps_device"),
                 "sync": _cat(group_out[..., 0:2], 1, "sync"),
                 "micro": _cat(group_out[..., 2:4], 1, "micro"),
                 "priority": _cat(group_out[..., 4:], 1, "priority")}
        return dists, network_state


def log_prob(dists, actions):
    """Sum of the log-probabilities of a (possibly sample-batched) action dict."""
    return tf.add_n([dists[k].log_prob(actions[k]) for k in sorted(dists)])


def entropy(dists):
    return tf.add_n([dists[k].entropy() for k in sorted(dists)])
