"""Single-process checks of the rewrite's structure (no cluster needed)."""
import os

import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.rewrite.graph_rewrite import rewrite_step
from tfplace.formats.strategy import Strategy, decision, even_strategy
from tfplace.testing import tiny_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _step(strategy=None, optimizer="momentum"):
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = tiny_graph("mlp", 12, optimizer)
    return graph, cluster, rewrite_step(graph, strategy or even_strategy(cluster.device_names, 12, 4), cluster)


def test_replicas_on_real_devices_and_updates_pinned():
    graph, cluster, step = _step()
    nodes = {n.name: n for n in step.graph_def.node}
    devices = {d.tf_device for d in cluster.devices}
    for n in nodes.values():
        assert n.device in devices, n.name
        if n.op.startswith("ResourceApply"):
            assert nodes[n.input[0].split(":")[0]].device == n.device  # pinned with its variable
    # all-reduces among CPU devices are exchanges: a shard summed on every participant
    sums = [n for n in nodes.values() if n.name.endswith("/shard_sum")]
    assert sums and {n.device for n in sums} == devices
    assert not any(n.op == "CollectiveReduceV2" for n in nodes.values())
    assert step.train_op in nodes and step.init_op in nodes and step.loss


def test_the_collective_implementation_emits_collective_reduce():
    graph, cluster, _ = _step()
    step = rewrite_step(graph, even_strategy(cluster.device_names, 12, 4), cluster, cpu_all_reduce="collective")
    ops = [n.op for n in step.graph_def.node]
    assert ops.count("CollectiveReduceV2") > 0 and not any(n.name.endswith("/shard_sum") for n in step.graph_def.node)
    with pytest.raises(InputError, match="cpu_all_reduce"):
        rewrite_step(graph, even_strategy(cluster.device_names, 12, 4), cluster, cpu_all_reduce="ring")


def test_ps_has_no_collectives_and_sends_back():
    s = Strategy(12, 4, decision({"cpu0": 6, "cpu1": [3, 3]}, "ps", "cpu2"), {})
    _, _, step = _step(s)
    ops = [n.op for n in step.graph_def.node]
    assert "CollectiveReduceV2" not in ops
    assert any(n.name.startswith("tfplace/sendback_") for n in step.graph_def.node)


def _kept_control_edges(graph):
    """(src, dst) names of the graph's control edges the lowering keeps (GraphIndex)."""
    from tfplace.ir.grouping import make_grouping
    from tfplace.lowering.graph_index import GraphIndex
    ix = GraphIndex(graph, make_grouping(graph, 4))
    return {(graph.names[s], graph.names[d]) for s, d in zip(ix.control_src.tolist(), ix.control_dst.tolist())}


def test_control_edges_kept_per_replica():
    graph, _, step = _step()
    nodes = {n.name: n for n in step.graph_def.node}
    kept = _kept_control_edges(graph)
    dsts = sorted({d for s, d in kept if d + "/replica_1" in nodes and s + "/replica_1" in nodes})
    assert dsts, "expected control edges between replicated ops"
    for name in dsts:
        for c in (s for s, d in kept if d == name):
            assert any(x.startswith("^" + c + "/replica_") for x in nodes[name + "/replica_1"].input), (c, name)


def test_a_gradient_tuple_does_not_wait_for_the_aggregated_side():
    # tf.tuple's NoOp waits for each gradient of one op; the bias gradient's Reshape runs on the
    # all-reduced value, so keeping that edge made the backward pass wait for the all-reduce.
    # The lowering drops it (it orders pure ops only) and keeps the replica-side ones.
    graph, _, step = _step()
    kept = _kept_control_edges(graph)
    orig = {n.name: n for n in graph.graph_def.node}
    noop = "gradients/add_1_grad/tuple/group_deps"
    sources = [i[1:] for i in orig[noop].input if i.startswith("^")]
    assert "gradients/add_1_grad/Reshape" in sources and len(sources) == 2
    assert ("gradients/add_1_grad/Reshape", noop) not in kept
    others = [s for s in sources if s != "gradients/add_1_grad/Reshape"]
    assert all((s, noop) in kept for s in others)
    nodes = {n.name: n for n in step.graph_def.node}
    assert not any("add_1_grad/Reshape" in i for i in nodes[noop + "/replica_1"].input)


def test_train_op_waits_for_one_done_per_other_device():
    # One control message per device reaches the train op (the lowering's "done"), not one per
    # last task of that device: every other device's last tasks gather under a NoOp there.
    for strategy in (None, Strategy(12, 4, decision({"cpu0": 6, "cpu1": [3, 3]}, "ps", "cpu2"), {})):
        _, cluster, step = _step(strategy)
        nodes = {n.name: n for n in step.graph_def.node}
        train = nodes[step.train_op]
        ctrl = [i[1:] for i in train.input if i.startswith("^")]
        remote = [c for c in ctrl if nodes[c].device != train.device]
        # even DP: cpu1 and cpu2 each end with their replica of the train op; PS on cpu2: cpu2's
        # updates lead on to the send-backs, so only cpu1 ends with tasks nothing waits for
        assert len(remote) == (2 if strategy is None else 1)
        assert all(c.startswith("tfplace/step_done_") and nodes[c].op == "NoOp" for c in remote)
        assert len({nodes[c].device for c in remote}) == len(remote)
        for c in remote:   # a done waits only for nodes on its own device
            waits = [i[1:] for i in nodes[c].input]
            assert waits and all(nodes[w].device == nodes[c].device for w in waits)


@pytest.mark.parametrize("overheads", [
    {"message_cpu_s": 1e-4},  # one inter-op thread: each message's sender and receiver handlers
    # the CPU that all-reduces and message bytes cost, on the CPU devices' lanes
    {"collective_cpu_s": {"3": {"bytes": [16], "seconds": [3e-4]}}, "message_cpu_s_per_byte": 1e-9},
])
def test_the_rewrite_refuses_a_graph_with_runtime_overheads(overheads):
    # The runtime-overhead pass adds HANDLER tasks and a CPU demand for the simulator only (the
    # runtime's own work); the rewrite emits the lowering's own PlacedGraph and refuses the other.
    from tfplace.formats.errors import InputError
    from tfplace.ir.grouping import make_grouping
    from tfplace.lowering.lower import lower
    from tfplace.lowering.placed_graph import TASK_HANDLER
    from tfplace.overheads.apply import apply
    from tfplace.overheads.model import overheads_from_json
    from tfplace.testing import uniform_profile
    for strategy in (None, Strategy(12, 4, decision({"cpu0": 6, "cpu1": [3, 3]}, "ps", "cpu2"), {})):
        graph, cluster, plain = _step(strategy)
        strategy = strategy or even_strategy(cluster.device_names, 12, 4)
        grouping = make_grouping(graph, strategy.max_groups)
        placed = lower(graph, grouping, cluster, strategy, uniform_profile(graph, cluster.kinds))
        assert not (placed.task_kind == TASK_HANDLER).any() and not placed.has_runtime_overheads
        applied = apply(placed, cluster, overheads_from_json(overheads))
        assert applied.has_runtime_overheads
        with pytest.raises(InputError, match="runtime-overhead pass"):
            rewrite_step(graph, strategy, cluster, grouping=grouping, placed=applied)
        again = rewrite_step(graph, strategy, cluster, grouping=grouping, placed=placed)

        def nodes(step):
            return {n.name: (n.op, n.device, tuple(sorted(n.input))) for n in step.graph_def.node}
        assert nodes(again) == nodes(plain)


def _chain_edges(graph, step):
    """(pred op, op) of the control edges the rewrite added between ops of the graph (its
    per-device priority chains), by op index."""
    orig = {n.name: {i[1:] for i in n.input if i.startswith("^")} for n in graph.graph_def.node}
    out = []
    for n in step.graph_def.node:
        op = n.name.split("/replica_")[0]
        for i in n.input:
            pred = i[1:].split("/replica_")[0]
            if i.startswith("^") and pred != op and graph.has_op(op) and graph.has_op(pred) \
                    and pred not in orig.get(op, ()):
                out.append((graph.index(pred), graph.index(op)))
    return out


def test_priority_chains_follow_the_profiles_run_order():
    """One device: the rewrite chains its ops in the run rank, which follows the profile's
    run order (here the legal order that takes the highest op index first) where it has one."""
    import dataclasses
    import numpy as np
    from tfplace.lowering.graph_index import run_order_rank
    from tfplace.testing import uniform_profile
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = tiny_graph("mlp", 12, "sgd")
    late_first = [graph.names[i] for i in np.argsort(run_order_rank(graph, graph.names[::-1]))]
    single = Strategy(12, 4, decision({"cpu0": 12}), {})
    orders = {}
    for run_order in ((), tuple(late_first)):
        prof = dataclasses.replace(uniform_profile(graph, cluster.kinds), run_order=run_order)
        step = rewrite_step(graph, single, cluster, profile=prof)
        rank = run_order_rank(graph, run_order)
        # the sink (train op) waits for every other task of the step, whatever its rank
        edges = [e for e in _chain_edges(graph, step) if e[1] != graph.sink]
        assert len(edges) > 10
        assert all(rank[a] < rank[b] for a, b in edges)
        orders[run_order] = sorted(edges, key=lambda e: rank[e[1]])
    assert orders[()] != orders[tuple(late_first)]


def _ancestors(nodes, name):
    seen, stack = set(), [name]
    while stack:
        for x in nodes[stack.pop()].input:
            src = x.lstrip("^").split(":")[0]
            if src not in seen:
                seen.add(src)
                stack.append(src)
    return seen


@pytest.mark.parametrize("how, marks", [("collective", lambda n: n.op == "CollectiveReduceV2"),
                                         ("exchange", lambda n: n.name.endswith("/shard_sum"))])
def test_every_collective_participant_runs_in_the_step(how, marks):
    # The loss-side group all-reduces a bias gradient between cpu0 and cpu1, but only its
    # consumer on cpu1 reads the result: cpu0's participant had no reader and nothing later on
    # cpu0 was chained after it, so TF pruned it from the train op's subgraph and cpu1's
    # all-reduce waited for it forever (this step hung on the 3-task cluster).
    from tfplace.ir.grouping import make_grouping
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = tiny_graph("attention", 12, "sgd")
    grouping = make_grouping(graph, 4)
    groups = {"query/kernel": decision({"cpu1": [6, 6]}), "key/bias": decision({"cpu2": [6, 6]}),
              "value/kernel": decision({"cpu1": [1, 1], "cpu2": 10}),
              "gradients/Mean_grad/BroadcastTo": decision({"cpu1": [2, 3], "cpu0": 7})}
    step = rewrite_step(graph, Strategy(12, 4, None, groups), cluster, grouping=grouping, cpu_all_reduce=how)
    nodes = {n.name: n for n in step.graph_def.node}
    collectives = [n for n in nodes if marks(nodes[n])]
    assert collectives
    assert set(collectives) <= _ancestors(nodes, step.train_op)


@pytest.mark.parametrize("fetch, says", [
    ("v/Read/ReadVariableOp:0", None),                     # a resource variable's read: aliased to mirror 0
    ("w/read:0", "is the value of a reference variable"),  # a VariableV2's read
    ("w:0", "is the value of a reference variable"),
    ("dense/MatMul:0", "is not in the rewritten step"),
])
def test_the_plugin_aliases_resource_variable_reads_and_names_what_it_cannot_fetch(fetch, says):
    """grappler_entry.add_fetch_aliases on a hand-made original graph and rewritten step."""
    import types

    from tensorflow.core.framework import graph_pb2

    from tfplace.formats.errors import InputError
    from tfplace.rewrite.grappler_entry import add_fetch_aliases
    original = graph_pb2.GraphDef()
    original.node.add(name="v", op="VarHandleOp")
    read = original.node.add(name="v/Read/ReadVariableOp", op="ReadVariableOp", input=["v"])
    read.attr["dtype"].type = 1
    original.node.add(name="w", op="VariableV2")
    original.node.add(name="w/read", op="Identity", input=["w"])
    original.node.add(name="dense/MatMul", op="MatMul", input=["x", "w/read"])
    out = graph_pb2.GraphDef()
    out.node.add(name="tfplace/read/v/replica_0", op="ReadVariableOp", device="/job:worker/task:1/device:CPU:0")
    step = types.SimpleNamespace(variables={"v": ("tfplace/read/v/replica_0:0",)})
    if says is None:
        add_fetch_aliases(out, original, step, [fetch])
        alias = next(n for n in out.node if n.name == "v/Read/ReadVariableOp")
        assert alias.op == "Identity" and list(alias.input) == ["tfplace/read/v/replica_0:0"]
        assert alias.device == "/job:worker/task:1/device:CPU:0"
    else:
        with pytest.raises(InputError, match=says):
            add_fetch_aliases(out, original, step, [fetch])


def _embedding_step_graph(optimizer):
    """ids int32 [None, 10] -> a 4-row table (tf.gather: an IndexedSlices gradient) -> mean -> loss."""
    import tensorflow as tf
    from tfplace.ir.loader import load_op_graph
    from tfplace.testing import _train_step
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        ids = v1.placeholder(tf.int32, [None, 10], name="ids")
        table = v1.get_variable("table", [4, 8], use_resource=True)
        _train_step(tf.reduce_mean(tf.square(tf.gather(table, ids)), name="loss"), optimizer)
    return load_op_graph(graph.as_graph_def(), sinks=["train_op"], batch_size=12, loss="loss", source="embedding")


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_sparse_gradient_deduplicated_per_replica_is_refused_across_replicas(optimizer):
    """Momentum and Adam apply an IndexedSlices gradient after Unique: each replica's rows are the
    distinct ids of its own samples. Summed element by element over replicas they crashed (AddN of
    [41] and [44]) or, where every replica saw all 4 rows, updated wrong rows silently (Momentum
    slot off by 186% under DP-even). Refused now, naming the variable and the fixes; one replica runs."""
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = _embedding_step_graph(optimizer)
    with pytest.raises(InputError) as info:
        rewrite_step(graph, even_strategy(list(cluster.device_names), 12, 4), cluster)
    message = str(info.value)
    assert info.value.field == "default.shares" and "'table'" in message and "Unique" in message, message
    assert "on one device" in message and "SGD" in message, message
    rewrite_step(graph, even_strategy(["cpu1"], 12, 4), cluster)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_every_planner_keeps_a_deduplicated_sparse_gradient_on_one_replica(optimizer):
    """What compare, plan and train recommend runs: the lowering's legalize puts each group that
    makes a deduplicated sparse gradient whole on the device with most of its samples, so every
    baseline and planner strategy of such a graph rewrites (they used to be refused for real after
    the simulator had ranked them), and the rest of the strategy stays split."""
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.profiling.device_model import cluster_profile
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = _embedding_step_graph(optimizer)
    problem = make_problem(graph, cluster, cluster_profile(graph, cluster), max_groups=4)
    whole = {problem.lowerer.index.group_names[g] for g in problem.lowerer.whole_groups}
    assert whole, "the deduplicating ops were not found"
    for name in registry.names():
        strategy = registry.generate(name, problem)
        for group in whole:
            d = strategy.groups.get(group, strategy.default)
            assert len(d.shares) == 1 and len(d.shares[0][1]) == 1, (name, group, d)
        rewrite_step(graph, strategy, cluster)
    dp = problem.lowerer.legalize(even_strategy(list(cluster.device_names), 12, 4))
    assert len(dp.default.shares) == 3  # the groups without a sparse gradient stay data parallel
    from tfplace.cli.common import whole_groups_note  # what compare and plan tell the user
    note = whole_groups_note(problem.lowerer)
    assert all(repr(group) in note for group in whole) and "of 'table'" in note, note
    sgd = make_problem(_embedding_step_graph("sgd"), cluster, cluster_profile(graph, cluster), max_groups=4)
    assert whole_groups_note(sgd.lowerer) is None


def test_a_sparse_gradient_sgd_applies_without_unique_is_not_refused():
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    rewrite_step(_embedding_step_graph("sgd"), even_strategy(list(cluster.device_names), 12, 4), cluster)


def test_a_refused_sparse_update_names_the_table_not_its_slot():
    """v1 Adam scatters the deduplicated rows into its slots (`table/Adam`, `table/Adam_1`) and
    updates the table densely from them: the message names the table the user wrote."""
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    with pytest.raises(InputError) as info:
        rewrite_step(_embedding_step_graph("adam"), even_strategy(list(cluster.device_names), 12, 4), cluster)
    assert "of 'table'" in str(info.value) and "'table/Adam" not in str(info.value), str(info.value)


@pytest.mark.parametrize("step_reads_it_too", [False, True])
def test_an_initial_value_that_reads_a_variable_waits_for_its_initializer(step_reads_it_too):
    """A bare step whose learning-rate variable starts at a value read from another variable (a
    schedule of the step counter, as a new Keras optimizer's): the original init orders neither
    initializer. The rewritten init, with the handles on their devices, read the counter before
    it existed ("Could not find variable"); the read now waits for the counter's initializer.
    Where the step uses the same read, the init reads through a copy of its own that waits (the
    step's read cannot: every step would run the initializer again)."""
    import tensorflow as tf
    from tfplace.ir.loader import load_op_graph
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 4], name="features")
        step = v1.get_variable("counter", initializer=tf.constant(0.0), use_resource=True, trainable=False)
        counter_at_init = tf.raw_ops.ReadVariableOp(resource=step.handle, dtype=tf.float32, name="counter_at_init")
        rate = v1.Variable(0.1 * tf.pow(0.5, counter_at_init), name="rate", use_resource=True, trainable=False)
        loss = tf.reduce_mean(tf.square(v1.layers.dense(x, 1, name="dense")))
        loss = tf.identity(loss + 0.0 * counter_at_init if step_reads_it_too else loss, name="loss")
        train_op = tf.group(v1.train.GradientDescentOptimizer(rate).minimize(loss), step.assign_add(1.0),
                            name="train_op")
        v1.global_variables_initializer()
    graph = load_op_graph(g.as_graph_def(), sinks=[train_op.name], batch_size=12, loss="loss", source="scheduled")
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    out = rewrite_step(graph, even_strategy(list(cluster.device_names), 12, 4), cluster).graph_def
    name = "tfplace/init_read/counter_at_init" if step_reads_it_too else "counter_at_init"
    read = next(n for n in out.node if n.name == name)
    assert "^counter/Assign" in read.input, read
    assign = next(n for n in out.node if n.name == "counter/Assign")
    assert not any(i.lstrip("^").split(":")[0] == name for i in assign.input)  # no cycle
    nodes = {n.name: n for n in out.node}
    reads = [nodes[n] for n in _ancestors(nodes, "rate/Assign") if nodes[n].op == "ReadVariableOp"]
    assert reads and all("^counter/Assign" in n.input for n in reads), reads  # every read the initial value makes



def test_the_steps_function_library_is_its_own_and_colocates_nothing_by_name():
    """nodes.private_function_library: every function renamed with every reference (an If's
    branches, in the graph and inside bodies), no `_class` left in any body, and the result
    imports into the graph it came from (the hook's case: a library of the same names but other
    bodies is refused by TensorFlow)."""
    import tensorflow as tf
    from tfplace.rewrite.nodes import FUNCTION_SUFFIX, private_function_library
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        training = v1.placeholder_with_default(True, [], name="training")
        v1.layers.batch_normalization(x, training=training, name="bn")
        original = g.as_graph_def()
    assert any("_class" in n.attr for f in original.library.function for n in f.node_def)  # what is dropped
    renamed = type(original)()
    renamed.CopyFrom(original)
    private_function_library(renamed)
    functions = {f.signature.name for f in renamed.library.function}
    assert functions == {f.signature.name + FUNCTION_SUFFIX for f in original.library.function}
    branches = [n.attr[key].func.name for n in renamed.node if n.op in ("If", "StatelessIf")
                for key in ("then_branch", "else_branch")]
    assert branches and set(branches) <= functions
    assert not any("_class" in n.attr for f in renamed.library.function for n in f.node_def)
    with g.as_default():
        tf.graph_util.import_graph_def(renamed, name="step")
