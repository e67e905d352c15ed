"""Random ops get distinct per-replica seeds in the rewrite (tfplace.rewrite.nodes).

Single process: the rewritten step runs in one local session whose three CPU devices stand for
the cluster's three tasks (`_local_graph`), so no server process is started. Tables: the noises
of tfplace.testing.dropout_graph_def (stateful, stateless V1 / V2, drop-connect on a weight) x
strategies with 1-3 replicas per op (even, uneven, two micro-batches on one device, PS).
"""
import os
import re

import numpy as np
import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.strategy import Strategy, decision, even_strategy
from tfplace.rewrite import nodes as rn
from tfplace.rewrite.graph_rewrite import rewrite_step
from tfplace.testing import DROPOUT_NOISES, dropout_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, GROUPS = 12, 4
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")
# name -> (strategy, replicas of a batch-split op)
STRATEGIES = {
    "single": (Strategy(BATCH, GROUPS, decision({"cpu0": BATCH}), {}), 1),
    "dp_even": (even_strategy(["cpu0", "cpu1", "cpu2"], BATCH, GROUPS), 3),
    "dp_uneven_2": (Strategy(BATCH, GROUPS, decision({"cpu0": 8, "cpu2": 4}), {}), 2),
    "micro_batches": (Strategy(BATCH, GROUPS, decision({"cpu0": [3, 3], "cpu1": 6}), {}), 3),
    "ps": (even_strategy(["cpu0", "cpu1", "cpu2"], BATCH, GROUPS, "ps", "cpu1"), 3),
}
CASES = [(n, s) for n in DROPOUT_NOISES for s in STRATEGIES]


def _step(noise, strategy):
    graph = dropout_graph(noise, BATCH, "sgd")
    return graph, rewrite_step(graph, STRATEGIES[strategy][0], load_cluster(CLUSTER))


def _replicas(graph_def, op_type):
    """{original op name: [NodeDef of replica 0, 1, ...]} of the random ops of `op_type`."""
    out = {}
    for n in graph_def.node:
        if n.op == op_type and "/replica_" in n.name:
            base, _, k = n.name.rpartition("/replica_")
            out.setdefault(base, {})[int(k)] = n
    return {b: [r[k] for k in sorted(r)] for b, r in out.items()}


def _seed_of(replica, nodes):
    """What seeds a replica, read from the GraphDef: (seed, seed2) attrs of a stateful op, or
    (the seed/key input's op in the original graph, offset added to it) of a stateless one."""
    if replica.op in rn.STATEFUL_RANDOM_OPS:
        return replica.attr["seed"].i, replica.attr["seed2"].i
    index = {**rn.STATELESS_SEED_INPUT, **rn.STATELESS_KEY_INPUT}[replica.op]
    src = replica.input[index].split(":")[0]
    offset = ()
    if src.endswith("/tfplace_seed"):
        add = nodes[src]
        import tensorflow as tf
        offset = tuple(tf.make_ndarray(nodes[add.input[1]].attr["value"].tensor).tolist())
        src = add.input[0].split(":")[0]
    return src.rpartition("/replica_")[0], offset or (0,)


@pytest.mark.parametrize("noise,strategy", CASES)
def test_replica_seeds_are_distinct_and_deterministic(noise, strategy):
    graph, step = _step(noise, strategy)
    op_type = DROPOUT_NOISES[noise]
    nodes = {n.name: n for n in step.graph_def.node}
    orig = {n.name: n for n in graph.graph_def.node}
    reps = _replicas(step.graph_def, op_type)
    assert len(reps) == 1, reps.keys()
    (name, replicas), = reps.items()
    if noise == "drop_connect":  # a weight's mask: one mirror per device
        assert len(replicas) == len({r.device for r in replicas}) == (1 if strategy == "single" else
                                                                      len(replicas)) >= 1
    else:
        assert len(replicas) == STRATEGIES[strategy][1]
    seeds = [_seed_of(r, nodes) for r in replicas]
    assert len(set(seeds)) == len(seeds), seeds
    # replica 0 is the original op, unchanged (a one-replica strategy rewrites no seed)
    r0, o = replicas[0], orig[name]
    assert dict(r0.attr) == {k: v for k, v in o.attr.items() if k not in ("_class", "_output_shapes")}
    if op_type in rn.STATEFUL_RANDOM_OPS:
        assert seeds == [(o.attr["seed"].i, rn.replica_seed2(o.attr["seed2"].i, k)) for k in range(len(seeds))]
    # a deterministic function of the original graph: rewriting a fresh export is byte-identical
    again = rewrite_step(dropout_graph.__wrapped__(noise, BATCH, "sgd"), STRATEGIES[strategy][0],
                         load_cluster(CLUSTER))
    assert again.graph_def.SerializeToString(deterministic=True) == \
        step.graph_def.SerializeToString(deterministic=True)


def _local_graph(step):
    """The rewritten GraphDef imported with task t's devices mapped to this process's CPU:t."""
    import tensorflow as tf
    gd = type(step.graph_def)()
    gd.CopyFrom(step.graph_def)
    for n in gd.node:
        n.device = re.sub(r"^/job:worker/replica:0/task:(\d+)/device:CPU:0$",
                          r"/job:localhost/replica:0/task:0/device:CPU:\1", n.device)
        assert n.device.startswith("/job:localhost"), (n.name, n.device)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    return graph


def _session(step):
    import tensorflow as tf
    from tfplace.runtime.step_runner import step_session_config
    config = step_session_config(tf.compat.v1.ConfigProto(device_count={"CPU": 3}))
    return tf.compat.v1.Session(graph=_local_graph(step), config=config)


@pytest.mark.parametrize("noise,strategy", [c for c in CASES if c[1] != "single"])
def test_replicas_draw_different_masks(noise, strategy):
    from tfplace.runtime.step_runner import random_feed
    _, step = _step(noise, strategy)
    (name, replicas), = _replicas(step.graph_def, DROPOUT_NOISES[noise]).items()
    feed = random_feed(step.inputs, BATCH, 0)
    with _session(step) as sess:
        sess.run(step.init_op)
        draws = [np.ravel(x) for x in sess.run([r.name + ":0" for r in replicas], feed)]
        # the same seeds give the same stream whatever the shape: compare the common prefix
        for i in range(len(draws)):
            for j in range(i):
                n = min(draws[i].size, draws[j].size)
                assert n > 0 and not np.array_equal(draws[i][:n], draws[j][:n]), (name, i, j)
        loss = sess.run([step.train_op, step.loss], feed)[1]  # the whole step runs
    assert np.isfinite(loss)
    # the seeds are fixed by the rewrite, not by the session: a fresh one draws the same again
    with _session(step) as sess:
        sess.run(step.init_op)
        fresh = [np.ravel(x) for x in sess.run([r.name + ":0" for r in replicas], feed)]
    assert all(np.array_equal(a, b) for a, b in zip(draws, fresh))


@pytest.mark.parametrize("seed2", [0, 1, 2, 87654321, 2 ** 31 - 2, 2 ** 31 - 1])
def test_replica_seed2_is_one_to_one_and_never_zero(seed2):
    values = [rn.replica_seed2(seed2, k) for k in range(256)]
    assert len(set(values)) == len(values)
    assert all(1 <= v <= 2 ** 31 - 1 for v in values)
    if seed2 >= 1:
        assert values[0] == seed2


@pytest.mark.parametrize("seed,seed2,k,want", [
    (0, 0, 1, 0),                                    # TF draws a fresh seed per instance: keep 0
    (0, 0, 2, 0),
    (0, 5, 0, 5),                                    # replica 0 keeps the original
    (0, 5, 1, rn.replica_seed2(5, 1)),
    (3, 0, 1, rn.replica_seed2(0, 1)),               # seed2 0 with a graph seed: still derived
])
def test_stateful_seed_attrs(seed, seed2, k, want):
    node = rn.node("r/replica_%d" % k, "RandomUniform", "/device:CPU:0", ["shape"], seed=seed, seed2=seed2)
    assert rn.reseed_replica(node, k, "/device:CPU:0") == []
    assert (node.attr["seed"].i, node.attr["seed2"].i) == (seed, want)


def test_the_random_op_tables_match_tensorflow():
    """Each listed op exists with the seeds where the table says; every stateless op of this
    TensorFlow with a seed or key input is either re-seeded or deliberately not."""
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    for op in rn.STATEFUL_RANDOM_OPS:
        attrs = {a.name for a in op_def_registry.get(op).attr}
        assert {"seed", "seed2"} <= attrs, op
    for table, arg in ((rn.STATELESS_SEED_INPUT, "seed"), (rn.STATELESS_KEY_INPUT, "key")):
        for op, index in table.items():
            assert op_def_registry.get(op).input_arg[index].name == arg, op
    listed = set(rn.STATELESS_SEED_INPUT) | set(rn.STATELESS_KEY_INPUT) | rn.NOT_RESEEDED
    for op in dir(tf.raw_ops):
        # input pipelines (datasets, queues) are not step ops the rewrite replicates
        if not op.startswith(("Stateless", "Random")) or re.search(r"(Dataset|Queue)(V\d)?$", op):
            continue
        od = op_def_registry.get(op)
        if {"seed", "key"} & {a.name for a in od.input_arg}:
            assert op in listed, f"{op}: a random op with a seed input the rewrite does not know"
        if {"seed", "seed2"} <= {a.name for a in od.attr}:
            assert op in rn.STATEFUL_RANDOM_OPS, f"{op}: a random op with seed attrs the rewrite does not know"
