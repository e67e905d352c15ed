"""Lowering tests: what a strategy means, task by task, on hand-built graphs."""

import dataclasses

import numpy as np
import pytest

from tfplace import testing
from tfplace.formats.errors import InputError
from tfplace.lowering.lower import Lowerer, LoweringOptions, lower
from tfplace.lowering.costs import ComputeCosts
from tfplace.lowering.graph_index import ROLE_MIRROR, ROLE_REPLICA, ROLE_UPDATE, GraphIndex
from tfplace.lowering.placed_graph import TASK_COLLECTIVE, TASK_RESPLIT, TASK_SUM, TASK_TRANSFER
from tfplace.formats.profile import Profile
from tfplace.formats.strategy import Strategy, decision

from tfplace.simulator import fakes as fk
from tfplace.simulator import simulate

W = 1_200_000


def _dp(shares, sync="allreduce", ps=None, reduction="mean", cluster=None):
    g = fk.dp_graph(W, reduction=reduction)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    cluster = cluster or fk.pair_cluster()
    return g, lower(g, gr, cluster, Strategy(8, 2, decision(shares, sync, ps), {}), fk.dp_profile(g))


def _tasks(placed, kind):
    """Tasks of `kind` that stand for the graph (the step's own messages, feed slices and
    "done"s, are left out; test_step_messages checks them)."""
    return np.array([t for t in np.nonzero(placed.task_kind == kind)[0] if not placed.is_step_message(t)], dtype=np.int64)


def _devices_of(placed, graph, op):
    return placed.task_device[placed.tasks_of_op(graph.index(op))].tolist()


def test_roles_of_the_dp_graph():
    g = fk.dp_graph(W)
    ix = GraphIndex(g, fk.grouping(g))
    role = dict(zip(g.names, ix.role.tolist()))
    assert {n for n, r in role.items() if r == ROLE_REPLICA} == {"x", "f", "g"}
    assert {n for n, r in role.items() if r == ROLE_MIRROR} == {"w", "r", "lr", "train_op"}
    assert {n for n, r in role.items() if r == ROLE_UPDATE} == {"apply"}


@pytest.mark.parametrize("shares,replicas", [({"v100_0": 8}, 1), ({"v100_0": 6, "p100_0": 2}, 2),
                                             ({"v100_0": [3, 3], "p100_0": 2}, 3)])
def test_batch_ops_run_per_micro_batch_and_mirrors_per_device(shares, replicas):
    g, placed = _dp(shares)
    f = placed.tasks_of_op(g.index("f"))
    assert len(f) == replicas
    assert placed.task_samples[f].sum() == 8 and placed.task_weight[f].sum() == pytest.approx(1.0)
    # the V100's f on 6 samples costs 6 × 0.1 ms; a micro-batch of 3 costs half of that
    assert placed.task_seconds[f[0]] == pytest.approx(1e-4 * placed.task_samples[f[0]])
    assert _devices_of(placed, g, "r") == sorted(set(placed.task_device[f].tolist()))
    assert placed.static_bytes.tolist() == [W if d in shares else 0 for d in ("v100_0", "p100_0")]


@pytest.mark.parametrize("reduction,mean", [("mean", True), ("sum", False)])
def test_aggregation_weights_follow_the_loss_reduction(reduction, mean):
    g, placed = _dp({"v100_0": 6, "p100_0": 2}, reduction=reduction)
    grad = g.tensor_op.tolist().index(g.index("g"))
    assert bool(placed.tensor_weight_mean[grad]) is mean
    f = placed.tasks_of_op(g.index("f"))
    assert placed.task_weight[f].tolist() == [0.75, 0.25]  # samples / B, used when mean


@pytest.mark.parametrize("cluster,n", [(fk.pair_cluster(), 2), (fk.quad_cluster(), 4)])
def test_partial_gradients_are_full_size(cluster, n):
    names = cluster.device_names
    g, placed = _dp({d: 8 // n for d in names}, cluster=cluster)
    coll = _tasks(placed, TASK_COLLECTIVE)
    assert len(coll) == 1 and placed.task_bytes[coll[0]] == W  # never W / n
    assert np.diff(placed.part_ptr)[coll[0]] == n
    # every apply replica waits for the collective
    applies = placed.tasks_of_op(g.index("apply"))
    assert all(coll[0] in placed.dep_src[placed.dep_dst == a] for a in applies)


def test_ps_reduces_updates_and_sends_back():
    g, placed = _dp({"v100_0": [4, 2], "p100_0": 2}, "ps", "p100_0")
    assert _devices_of(placed, g, "apply") == [1]          # updates only on the PS
    assert _devices_of(placed, g, "lr") == [1]             # an update-only input lives there too
    assert sorted(_devices_of(placed, g, "w")) == [0, 1]   # the weight is mirrored
    sums = _tasks(placed, TASK_SUM)
    assert placed.task_device[sums].tolist() == [0, 1]     # micro-batches on the V100, then the PS
    xfers = [t for t in _tasks(placed, TASK_TRANSFER) if not placed.is_control_message(t)]
    got = sorted((int(placed.task_src_device[t]), int(placed.task_device[t]), float(placed.task_bytes[t])) for t in xfers)
    assert got == [(0, 1, W), (1, 0, W)]                    # partial to the PS, updated w back
    assert (placed.task_seconds[sums] > 0).all()           # aux tasks cost memory bandwidth
    # apply (on the PS) -> train_op's mirror on the V100 crosses devices: one empty message
    msgs = [t for t in _tasks(placed, TASK_TRANSFER) if placed.is_control_message(t)]
    assert [(g.names[placed.task_op[t]], int(placed.task_src_device[t]), int(placed.task_device[t]),
             float(placed.task_bytes[t])) for t in msgs] == [("apply", 1, 0, 0.0)]
    assert placed.task_seconds[msgs[0]] > 0                 # the link latency


@pytest.mark.parametrize("shares,sync,messages", [
    ({"v100_0": 4, "p100_0": 4}, "allreduce", 0),      # apply and train_op mirrored alike: per replica
    ({"v100_0": [2, 2], "p100_0": 4}, "allreduce", 0),  # micro-batches do not change the mirrors
    ({"v100_0": 4, "p100_0": 4}, "ps", 1),             # apply on the PS only: one message to the V100
])
def test_control_edges_cross_devices_only_as_messages(shares, sync, messages):
    # Reference: TensorFlow's partitioner sends one empty message per (source node, other
    # partition) for control edges; between replicas of one layout the edge stays per replica.
    g, placed = _dp(shares, sync, "p100_0" if sync == "ps" else None)
    msgs = [t for t in _tasks(placed, TASK_TRANSFER) if placed.is_control_message(t)]
    assert len(msgs) == messages
    succ_ptr, succ_idx, _ = placed.successors()
    for t in msgs:   # every message leads from its source op's instance to another device
        assert placed.task_bytes[t] == 0 and placed.task_src_device[t] != placed.task_device[t]
        assert all(placed.task_device[s] == placed.task_device[t] for s in succ_idx[succ_ptr[t]:succ_ptr[t + 1]])
    apply_tasks = placed.tasks_of_op(g.index("apply")).tolist()
    for k, sink in enumerate(placed.tasks_of_op(g.index("train_op")).tolist()):
        preds = placed.dep_src[placed.dep_dst == sink].tolist()
        if sync == "allreduce":   # replica k of train_op waits on replica k of apply only
            assert [p for p in preds if p in apply_tasks] == [apply_tasks[k]]


@pytest.mark.parametrize("shares,sync,feeds,dones", [
    ({"v100_0": 8}, "allreduce", [], []),                                   # one device: no messages
    ({"v100_0": 6, "p100_0": 2}, "allreduce", [(0, 1, 6, 8, 2000.0)], [1]),
    ({"v100_0": [3, 3], "p100_0": 2}, "ps", [(0, 1, 6, 8, 2000.0)], [1]),
    ({"p100_0": 4, "v100_0": 4}, "allreduce", [(1, 0, 4, 8, 4000.0)], [0]),  # the P100 feeds
])
def test_step_messages(shares, sync, feeds, dones):
    # The runtime feeds the global batch on the feed device (the first input's first instance)
    # and cuts each replica's slice there (tfplace.rewrite.graph_rewrite "inputs"): another device's input
    # instance waits for its slice, a message of its bytes (x: 1000 bytes per sample). Every
    # other device sends one empty "done" to the feed device after its last tasks (the train op).
    g, placed = _dp(shares, sync, "p100_0" if sync == "ps" else None)
    x_tasks = placed.tasks_of_op(g.index("x"))
    first = int(x_tasks[0])
    step = [t for t in range(placed.num_tasks) if placed.is_step_message(t)]
    assert placed.step_message_start == (step[0] if step else -1)
    assert all(placed.task_kind[t] == TASK_TRANSFER for t in step)
    feed = [t for t in step if not placed.is_control_message(t)]
    done = [t for t in step if placed.is_control_message(t)]
    assert [(int(placed.task_src_device[t]), int(placed.task_device[t]), int(placed.task_lo[t]),
             int(placed.task_hi[t]), float(placed.task_bytes[t])) for t in feed] == feeds
    lat = 5e-6  # fk.pair_cluster's link latency
    for t in feed:
        assert placed.dep_src[placed.dep_dst == t].tolist() == [first]       # after the batch arrives
        succ = placed.dep_dst[placed.dep_src == t].tolist()
        assert succ == [u for u in x_tasks.tolist() if placed.task_device[u] == placed.task_device[t]]
        assert placed.task_seconds[t] == pytest.approx(lat + placed.task_bytes[t] / 1.2e10)
        assert placed.out_ptr[t] == placed.out_ptr[t + 1] and placed.in_ptr[t] == placed.in_ptr[t + 1]
    assert [int(placed.task_src_device[t]) for t in done] == dones
    feed_dev = int(placed.task_device[first])
    succ_ptr, _, _ = placed.successors()
    for t in done:
        assert placed.task_device[t] == feed_dev and placed.task_bytes[t] == 0
        assert succ_ptr[t] == succ_ptr[t + 1]                                   # nothing waits for it
        waits = placed.dep_src[placed.dep_dst == t]
        sinks = placed.tasks_of_op(g.index("train_op"))
        assert set(sinks[placed.task_device[sinks] == placed.task_src_device[t]].tolist()) <= set(waits.tolist())
        assert (placed.task_device[waits] == placed.task_src_device[t]).all()
    # every task on another device now leads to the feed device: the step's last tasks are there
    assert (placed.task_device[np.diff(succ_ptr) == 0] == feed_dev).all()


@pytest.mark.parametrize("shares,hops", [
    ({"v100_1": 4, "v100_0": 4}, []),                    # fed on task 0: the feed is there already
    ({"v100_2": 4, "v100_0": 4}, [(0, 2, 0, 8, 8000.0)]),  # fed on task 1: the whole batch hops
    ({"v100_3": 8}, [(0, 3, 0, 8, 8000.0)]),
])
def test_feeds_reach_the_master_task_first(shares, hops):
    # TensorFlow delivers every feed to the session's master, task 0 (the partition graphs show
    # `_recv_<input>_0` on task 0 sent to the feed device's task: tests/test_equivalence.py
    # test_lowering_sends_the_messages_the_real_step_sends). Where the feed device is on another
    # task, each input first travels whole from task 0's first device, before that input's
    # instances there and the slices cut for the other devices.
    cluster = fk.quad_cluster()   # tasks: 0 = v100_0, v100_1; 1 = v100_2, v100_3
    g, placed = _dp(shares, cluster=cluster)
    step = [t for t in range(placed.num_tasks) if placed.is_step_message(t) and not placed.is_control_message(t)]
    hop = [t for t in step if int(placed.task_hi[t] - placed.task_lo[t]) == 8 and placed.task_bytes[t] == 8000.0]
    assert [(int(placed.task_src_device[t]), int(placed.task_device[t]), int(placed.task_lo[t]),
             int(placed.task_hi[t]), float(placed.task_bytes[t])) for t in hop] == hops
    x_tasks = placed.tasks_of_op(g.index("x")).tolist()
    for t in hop:
        assert placed.dep_src[placed.dep_dst == t].tolist() == []       # the feed itself
        assert placed.task_seconds[t] == pytest.approx(cluster.transfer_seconds(0, int(placed.task_device[t]), 8000))
        waits = set(placed.dep_dst[placed.dep_src == t].tolist())
        here = {u for u in x_tasks if placed.task_device[u] == placed.task_device[t]}
        slices = set(step) - set(hop)
        assert waits == here | slices and here


def test_slot_variables_live_only_where_updates_run():
    # A momentum slot `m` updated together with `w`: mirrored w on both devices, m on the PS only.
    g = fk.op_graph(
        [("x", "Placeholder", 8000, True, True), ("w", "VarHandleOp", 8, False, False),
         ("m", "VarHandleOp", 8, False, False), ("r", "ReadVariableOp", W, False, False),
         ("f", "MatMul", 8000, True, True), ("g", "MatMul", W, False, True),
         ("apply", "ResourceApplyMomentum", None, False, True), ("train_op", "NoOp", None, False, False)],
        [("w", "r"), ("x", "f"), ("r", "f"), ("x", "g"), ("f", "g"), ("w", "apply"), ("m", "apply"), ("g", "apply")],
        variables=[("w", ["r"], ["apply"], W, False), ("m", [], ["apply"], W, True)], control=[("apply", "train_op")])
    gr = fk.grouping(g, [["x", "f", "g"]])
    prof = fk.profile_table(g, {n: {"V100": 1e-4, "P100": 1e-4} for n in g.names})
    cluster = fk.pair_cluster()
    for sync, ps, static in (("ps", "p100_0", [W, 2 * W]), ("allreduce", None, [2 * W, 2 * W])):
        st = Strategy(8, 2, decision({"v100_0": 4, "p100_0": 4}, sync, ps), {})
        assert lower(g, gr, cluster, st, prof).static_bytes.tolist() == static


def _resplit_graph():
    # x -> a (group A) -> b (group B) -> c (group B); A and B split the batch differently.
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("b", "Op", 8000, True, True),
           ("c", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("a", "b"), ("b", "c")])
    gr = fk.grouping(g, [["x", "a"], ["b", "c"]])
    prof = fk.profile_table(g, {n: {"V100": 1e-4, "P100": 1e-4} for n in g.names})
    return g, gr, prof


def test_resplit_between_groups_with_different_shares():
    g, gr, prof = _resplit_graph()
    st = Strategy(8, 2, None, {"x": decision({"v100_0": 6, "p100_0": 2}), "b": decision({"v100_0": 4, "p100_0": 4})})
    placed = lower(g, gr, fk.pair_cluster(), st, prof)
    xfers = _tasks(placed, TASK_TRANSFER)
    # b's P100 replica holds samples [4, 8): [4, 6) comes from the V100 (2 of 8 samples of an
    # 8000-byte tensor), [6, 8) is local; the V100 replica's [0, 4) is a slice of its own [0, 6).
    assert [(placed.task_lo[t], placed.task_hi[t], placed.task_bytes[t]) for t in xfers] == [(4, 6, 2000.0)]
    rs = _tasks(placed, TASK_RESPLIT)
    assert sorted((int(placed.task_device[t]), int(placed.task_lo[t]), int(placed.task_hi[t])) for t in rs) == \
        [(0, 0, 4), (1, 4, 8)]
    assert (placed.task_seconds[rs] > LoweringOptions().aux_launch_s).all()
    b_tasks = placed.tasks_of_op(g.index("b"))
    assert set(placed.dep_src[np.isin(placed.dep_dst, b_tasks)].tolist()) == set(rs.tolist())


def test_transfers_are_deduplicated_per_tensor_and_destination():
    # a on the V100 feeds b and c, both on the P100 (two groups with the same decision): one transfer.
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("b", "Op", 8000, True, True),
           ("c", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("a", "b"), ("a", "c")])
    gr = fk.grouping(g, [["x", "a"], ["b"], ["c"]])
    prof = fk.profile_table(g, {n: {"V100": 1e-4, "P100": 1e-4} for n in g.names})
    st = Strategy(8, 3, decision({"p100_0": 8}), {"x": decision({"v100_0": 8})})
    placed = lower(g, gr, fk.pair_cluster(), st, prof)
    assert len(_tasks(placed, TASK_TRANSFER)) == 1


# Only the order of priorities means anything: any integer a file gives (json has no bound) must
# order the device the same. The task key multiplies a group's priority by micro-batches x ops:
# 2**62 wrapped int64 (it ran first), 2**70 raised OverflowError from numpy.
@pytest.mark.parametrize("priority", [1, 2 ** 40, 2 ** 62, 2 ** 70])
def test_priorities_order_a_device(priority):
    ops = [("x", "Placeholder", 800, True, True), ("a", "Op", 800, True, True), ("b", "Op", 800, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("x", "b")])
    gr = fk.grouping(g)
    prof = fk.profile_table(g, {n: {"V100": 1e-4, "P100": 1e-4} for n in g.names})
    from tfplace.simulator import schedule
    cluster = fk.pair_cluster()
    for first, second in (("a", "b"), ("b", "a")):
        st = Strategy(8, 3, decision({"v100_0": 8}), {second: decision({"v100_0": 8}, priority=priority)})
        placed = lower(g, gr, cluster, st, prof)
        sched = schedule(placed, np.ones(2))
        assert sched.start[g.index(first)] < sched.start[g.index(second)]


def test_control_edges_are_kept_per_replica():
    g, placed = _dp({"v100_0": 4, "p100_0": 4})
    applies, sinks = placed.tasks_of_op(g.index("apply")), placed.tasks_of_op(g.index("train_op"))
    pairs = set(zip(placed.dep_src.tolist(), placed.dep_dst.tolist()))
    assert {(int(a), int(s)) for a, s in zip(applies, sinks)} <= pairs
    assert (int(applies[0]), int(sinks[1])) not in pairs  # same layout: replica to replica only


@pytest.mark.parametrize("strategy,field", [
    (Strategy(8, 2, decision({"v100_0": 8}), {"nope": decision({"v100_0": 8})}), "groups.nope"),
    (Strategy(8, 2, decision({"tpu_0": 8}), {}), "default.shares.tpu_0"),
    (Strategy(8, 2, None, {"x": decision({"v100_0": 8})}), "groups.w"),
])
def test_bad_strategies_name_the_field(strategy, field):
    g = fk.dp_graph(W)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    with pytest.raises(InputError) as err:
        lower(g, gr, fk.pair_cluster(), strategy, fk.dp_profile(g))
    assert err.value.field == field


def test_missing_profile_entry_is_an_error_unless_listed():
    g = testing.chain_graph(2, 4096, 8)
    prof = testing.uniform_profile(g, ["V100"])
    ops = {k: v for k, v in prof.ops.items() if k != "train_op"}
    st = Strategy(8, 1, decision({"v100_0": 8}), {})
    with pytest.raises(InputError, match="train_op"):
        lower(g, fk.grouping(g), fk.pair_cluster(), st, Profile(ops=ops))
    placed = lower(g, fk.grouping(g), fk.pair_cluster(), st, Profile(ops=ops, missing_ops=("train_op",)),
                   LoweringOptions(missing_op_s=1e-6))
    assert placed.task_seconds[g.index("train_op")] == 1e-6


@pytest.mark.parametrize("profile_graph, graph_file, drop, field, says", [
    # another graph's profile: said first, with both names (not "profile the graph on a V100")
    ("tiny_mlp_sgd", "zoo/chain_b8_sgd.json", "all", "graph",
     "the profile was measured on graph 'tiny_mlp_sgd', not 'chain_sgd'"),
    # this graph's profile (at another batch: the same name), one op not measured
    ("chain_sgd", "zoo/chain_b64_sgd.json", "all", "ops.train_op.V100", "not in the profile"),
    # a renamed bundle (or a bare step) holding every op: a gap is a kind not measured, whatever its name
    ("renamed", "zoo/chain_b8_sgd.json", "V100", "ops.train_op.V100", "not in the profile"),
    # a profile that names no graph, or a graph from no file: nothing to compare
    ("", "zoo/chain_b8_sgd.json", "all", "ops.train_op.V100", "not in the profile"),
    ("tiny_mlp_sgd", "", "all", "ops.train_op.V100", "not in the profile"),
])
def test_a_profile_of_another_graph_is_named_as_such(profile_graph, graph_file, drop, field, says):
    g = dataclasses.replace(testing.chain_graph(2, 4096, 8), source=graph_file)
    prof = testing.uniform_profile(g, ["V100", "P100"])
    ops = {op: {k: pts for k, pts in per.items() if op != "train_op" or drop not in ("all", k)}
           for op, per in prof.ops.items()}
    ops = {op: per for op, per in ops.items() if per}
    st = Strategy(8, 1, decision({"v100_0": 8}), {})
    with pytest.raises(InputError) as err:
        lower(g, fk.grouping(g), fk.pair_cluster(), st, Profile(ops=ops, graph=profile_graph, source="p.json"))
    assert err.value.field == field and says in err.value.problem, str(err.value)


def _missing_op_by_seconds(g, prof):
    prof.seconds("train_op", "V100", 8)


def _missing_op_by_lowering(g, prof):
    lower(g, fk.grouping(g), fk.pair_cluster(), Strategy(8, 1, decision({"v100_0": 8}), {}), prof)


@pytest.mark.parametrize("profile_graph", ["chain_sgd", ""])
def test_an_op_missing_from_the_profile_reads_the_same_from_the_lookup_and_the_lowering(profile_graph):
    """Profile.seconds and the lowering's costs say one thing: the profile file, the op and kind,
    the graph the profile was measured on, and the fixes (profile this graph, or the device model)."""
    g = dataclasses.replace(testing.chain_graph(2, 4096, 8), source="zoo/chain_b8_sgd.json")
    ops = {op: per for op, per in testing.uniform_profile(g, ["V100"]).ops.items() if op != "train_op"}
    prof = Profile(ops=ops, graph=profile_graph, source="p.json")
    said = []
    for reach in (_missing_op_by_seconds, _missing_op_by_lowering):
        with pytest.raises(InputError) as err:
            reach(g, prof)
        said.append(str(err.value))
    assert said[0] == said[1], said
    assert said[0].startswith("p.json: ops.train_op.V100: op 'train_op' on V100 is not in the profile"), said[0]
    assert ("(measured on graph 'chain_sgd')" in said[0]) == bool(profile_graph), said[0]
    assert "python -m tfplace.profile --graph" in said[0] and "the device model's times" in said[0], said[0]


@pytest.mark.parametrize("profile_graph", ["chain_renamed", "chain_sgd"])
def test_a_metadata_clone_missing_from_the_profile_reads_as_its_original(profile_graph):
    """A clone costs as its original (tfplace_clone_of): when the original lacks a kind, the
    clone's gap is that gap, named by the original, not "a profile of another graph"."""
    from tfplace.lowering.meta import CLONE_SUFFIX
    g = testing.chain_graph(2, 4096, 8)
    names = list(g.names)
    names[3] = "input" + CLONE_SUFFIX + "1"  # lr stands as input's clone
    g = dataclasses.replace(g, names=tuple(names), source="zoo/chain_b8_sgd.json",
                            meta={**g.meta, "tfplace_clone_of": {names[3]: "input"}})
    ops = {op: per for op, per in testing.uniform_profile(g, ["V100", "P100"]).ops.items() if op != names[3]}
    ops["input"] = {"P100": ops["input"]["P100"]}  # measured, but not on a V100
    costs = ComputeCosts(g, fk.pair_cluster(), Profile(ops=ops, graph=profile_graph, source="p.json"), 0.0)
    said = []
    for op in (0, 3):  # the original, then its clone
        with pytest.raises(InputError) as err:
            costs.check(np.array([np.nan]), np.array([op]), np.array([0]))
        said.append(str(err.value))
    assert said[0] == said[1] and said[0].startswith("p.json: ops.input.V100: op 'input' on V100"), said


@pytest.mark.parametrize("batch", [1, 3, 8, 13, 64, 100])
def test_vectorised_profile_lookup_matches_profile_seconds(batch):
    rng = np.random.default_rng(batch)
    g = testing.chain_graph(3, 4096, 8)
    ops = {}
    for name in g.names:
        pts = sorted(rng.choice(np.arange(1, 80), size=int(rng.integers(1, 5)), replace=False).tolist())
        ops[name] = {"V100": (tuple(pts), tuple(rng.uniform(0, 1e-3, len(pts)).tolist()))}
    prof = Profile(ops=ops)
    cluster = fk.pair_cluster()
    costs = ComputeCosts(g, cluster, prof, 0.0)
    n = g.num_ops
    got = costs.seconds(np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, batch))
    assert got == pytest.approx([prof.seconds(name, "V100", batch) for name in g.names], rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_lowering_equals_fresh_lowering(seed):
    rng = np.random.default_rng(seed)
    g = fk.random_graph(rng, num_ops=14, num_vars=3)
    gr = fk.grouping(g, [list(x) for x in np.array_split(np.array(g.names), 6)])
    cluster = fk.quad_cluster()
    prof = testing.uniform_profile(g, cluster.kinds)
    lowerer = Lowerer(g, gr, cluster, prof)
    st = fk.random_strategy(rng, gr.group_names, cluster.device_names)
    for _ in range(4):
        name = gr.group_names[int(rng.integers(len(gr.group_names)))]
        other = fk.random_strategy(rng, gr.group_names, cluster.device_names)
        st = Strategy(8, st.max_groups, None, {**st.groups, name: other.groups[name]})
        warm, cold = lowerer.lower(st), lower(g, gr, cluster, st, prof)
        for field in ("task_kind", "task_device", "task_seconds", "task_bytes", "dep_src", "dep_dst", "in_buf",
                      "buf_bytes", "link_idx", "static_bytes"):
            assert np.array_equal(getattr(warm, field), getattr(cold, field)), field


def test_real_tf_graph_with_momentum_lowers_and_simulates():
    from tfplace.ir.grouping import make_grouping
    from tfplace.simulator import simulate
    g = testing.tiny_mlp_graph(8, "momentum")
    gr = make_grouping(g, 4)
    cluster = testing.four_device_cluster()
    prof = testing.uniform_profile(g, cluster.kinds)
    for d in (decision({n: 2 for n in cluster.device_names}),
              decision({n: 2 for n in cluster.device_names}, "ps", "p100_1")):
        placed = lower(g, gr, cluster, Strategy(8, 4, d, {}), prof)
        report = simulate(placed, cluster)
        assert report.iteration_time_s > 0 and not report.oom
        for v in g.variables:  # updates run where the strategy says, one per update device
            for u in v.updaters:
                devs = placed.task_device[placed.tasks_of_op(u)].tolist()
                assert devs == ([3] if d.sync == "ps" else [0, 1, 2, 3])


def test_mirrored_instances_are_not_extrapolated_over_batch():
    # apply is measured at per-device batches 1 and 8 (1e-4 s and 2e-4 s). It does not split the
    # batch, so at a global batch of 64 it costs its value at 8, not the line extended to 64.
    g = testing.chain_graph(2, 4096, 8)
    prof = testing.uniform_profile(g, ["V100"], 1e-4)
    ops = dict(prof.ops)
    ops["apply"] = {"V100": ((1, 8), (1e-4, 2e-4))}
    ops["op_1"] = {"V100": ((1, 8), (1e-4, 2e-4))}
    placed = lower(g, fk.grouping(g), fk.pair_cluster(), Strategy(64, 1, decision({"v100_0": 64}), {}), Profile(ops=ops))
    assert placed.task_seconds[placed.tasks_of_op(g.index("apply"))].tolist() == [2e-4]
    # a batch-split op is extrapolated: 1e-4 + (64 - 1) * (1e-4 / 7)
    assert placed.task_seconds[placed.tasks_of_op(g.index("op_1"))].tolist() == [pytest.approx(1e-4 + 63e-4 / 7)]


@pytest.mark.parametrize("seed", range(4))
def test_numpy_keyed_signatures_match_python_keyed(seed):
    # The lowering keys narrow signatures with numpy and wide ones in Python; forcing every
    # signature through the Python path must give the same PlacedGraph.
    rng = np.random.default_rng(100 + seed)
    g = fk.random_graph(rng, num_ops=16, num_vars=3)
    gr = fk.grouping(g, [list(x) for x in np.array_split(np.array(g.names), 7)])
    cluster = fk.quad_cluster()
    prof = testing.uniform_profile(g, cluster.kinds)
    st = fk.random_strategy(rng, gr.group_names, cluster.device_names)
    numpy_keyed, python_keyed = Lowerer(g, gr, cluster, prof), Lowerer(g, gr, cluster, prof)
    python_keyed._NARROW = 0
    a, b = numpy_keyed.lower(st), python_keyed.lower(st)
    for field in ("task_kind", "task_device", "task_bytes", "dep_src", "dep_dst", "in_buf", "link_idx"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_changing_one_group_re_resolves_only_its_signatures():
    rng = np.random.default_rng(7)
    g = fk.random_graph(rng, num_ops=30, num_vars=4)
    gr = fk.grouping(g, [list(x) for x in np.array_split(np.array(g.names), 10)])
    cluster = fk.quad_cluster()
    lowerer = Lowerer(g, gr, cluster, testing.uniform_profile(g, cluster.kinds))
    seen = []
    inner = lowerer._patterns_for
    lowerer._patterns_for = lambda sigs, *a: seen.append(len(sigs)) or inner(sigs, *a)
    st = fk.random_strategy(rng, gr.group_names, cluster.device_names)
    lowerer.lower(st)
    name = gr.group_names[3]
    lowerer.lower(Strategy(8, st.max_groups, None, {**st.groups, name: decision({"v100_3": 8})}))
    lowerer.lower(Strategy(8, st.max_groups, None, {**st.groups, name: decision({"v100_3": 8})}))
    assert seen[0] == lowerer.index.num_sigs
    assert seen[1] == len(lowerer.index.sigs_of_groups([3])) < seen[0]
    assert len(seen) == 2  # an unchanged strategy resolves nothing


# ---- per-replica metadata, sum-reduced losses, mean-scaled slices (TF graphs) -----------------

def _sum_mlp_graph(batch=12, reduction="sum"):
    """Tiny MLP whose loss is tf.reduce_sum (or reduce_mean) of per-example cross entropy, or
    (reduction "tf_losses") tf.compat.v1.losses' mean: the sum divided by a forward count
    (`num_present`), then tiled over the batch in the gradient."""
    import tensorflow as tf
    from tfplace.ir.loader import load_op_graph
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        v1.set_random_seed(0)
        x = v1.placeholder(tf.float32, [None, 16], name="features")
        y = v1.placeholder(tf.int32, [None], name="labels")
        logits = testing._dense(tf.nn.relu(testing._dense(x, 8, "dense_0")), 4, "dense_1")
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        reduce = {"sum": tf.reduce_sum, "mean": tf.reduce_mean,
                  "tf_losses": lambda _: v1.losses.sparse_softmax_cross_entropy(y, logits)}[reduction]
        testing._train_step(tf.identity(reduce(per_example), name="loss"), "sgd")
    return load_op_graph(g.as_graph_def(), sinks=["train_op"], batch_size=batch, loss="loss",
                         loss_reduction="sum" if reduction == "sum" else "mean", source=f"{reduction}_mlp")


def _grad_tensors(graph):
    """Tensors feeding a variable updater that come from the backward pass (weight gradients)."""
    upd = {u for v in graph.variables for u in v.updaters}
    out = set()
    for t, d in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist()):
        if d in upd and graph.names[graph.tensor_op[t]].startswith("gradients/"):
            out.add(t)
    return sorted(out)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_gradient_weights_follow_the_loss_reduction_in_a_tf_graph(reduction):
    # TF seeds gradients with a constant (gradients/Fill): they do not descend from the loss
    # through data edges, yet they must be weighted per the loss reduction (sum: 1, mean: s/B).
    g = _sum_mlp_graph(reduction=reduction)
    ix = GraphIndex(g, _grouping4(g))
    grads = _grad_tensors(g)
    assert grads
    assert ix.tensor_weight_mean[grads].tolist() == [reduction == "mean"] * len(grads)
    loss_t = int(g.loss_tensor)
    assert bool(ix.tensor_weight_mean[loss_t]) == (reduction == "mean")
    # batched backward tensors carry 1/s per sample only under a mean loss
    assert ix.tensor_mean_scaled.any() == (reduction == "mean")
    assert not (ix.tensor_mean_scaled & (g.tensor_batch_axis < 0)).any()


def test_integer_tensors_of_the_backward_pass_are_not_mean_scaled():
    # An embedding gradient's IndexedSlices indices (the ids flattened, int32 [N*6]) are computed
    # in the backward pass from the input alone: rescaled like a gradient slice they named other
    # rows (tests/test_equivalence.py::test_sparse_gradient_indices_move_between_groups_unscaled).
    import tensorflow as tf
    from tfplace.ir.loader import load_op_graph
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        ids = v1.placeholder(tf.int32, [None, 6], name="ids")
        table = v1.get_variable("table", [20, 8], use_resource=True)
        loss = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    g = load_op_graph(graph.as_graph_def(), sinks=["train_op"], batch_size=8, loss="loss")
    ix = GraphIndex(g, _grouping4(g))
    at = {n: i for i, n in enumerate(g.names)}
    indices, values = (int(np.nonzero(g.tensor_op == at[f"gradients/embedding_lookup_grad/{n}"])[0][0])
                       for n in ("Reshape_1", "Reshape"))
    assert g.tensor_dtype[indices] == "int32" and not ix.tensor_mean_scaled[indices]
    assert ix.tensor_mean_scaled[values]

# A mean's gradient tiles the upstream gradient over the batch (gradients/Mean_grad/Tile: 1 per
# sample at any replica size), then divides by the replica's count (Mean_grad/truediv: 1/s). Only
# what follows the division carries 1/s; rescaling the Tile's slices by s_r / s_c when they moved
# to a replica of another size scaled every gradient by that ratio (0.5 with the Tile split 6 / 6
# and the division on one device: tests/test_equivalence.py, the loss-gradient seed case).
# tf.compat.v1.losses divides first, by a forward count (num_present): its Tile carries 1/s.
MEAN_SCALED_CASES = [
    ("mean", "gradients/Mean_grad/Tile", False),
    ("mean", "gradients/Mean_grad/truediv", True),
    ("mean", "gradients/SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits_grad/mul", True),
    ("mean", "gradients/Relu_grad/ReluGrad", True),
    ("mean", "Relu", False),
    ("tf_losses", "gradients/sparse_softmax_cross_entropy_loss/Sum_grad/Tile", True),
    ("tf_losses", "gradients/Relu_grad/ReluGrad", True),
]


@pytest.mark.parametrize("loss,name,scaled", MEAN_SCALED_CASES)
def test_only_tensors_after_a_means_division_carry_one_over_the_replica_size(loss, name, scaled):
    g = _sum_mlp_graph(reduction=loss)
    ix = GraphIndex(g, _grouping4(g))
    tensor = int(np.nonzero(g.tensor_op == g.index(name))[0][0])
    assert g.tensor_batch_axis[tensor] >= 0
    assert bool(ix.tensor_mean_scaled[tensor]) == scaled


def test_readers_of_a_partial_run_in_its_producers_group():
    # Drop-connect's kernel gradient (MatMul grad -> SelectV2 grad -> ... -> update) passes
    # replica-locally through ops without a batch axis: they must split as the MatMul does, or a
    # replica reads a partial summed over other samples (GraphIndex._pin_partial_readers).
    g = testing.dropout_graph("drop_connect", 12, "sgd")
    gr = _grouping4(g)
    ix = GraphIndex(g, gr)
    at = {n: i for i, n in enumerate(g.names)}
    head = ix.op_group[at["gradients/MatMul_1_grad/MatMul_1"]]
    readers = ["gradients/dropout/SelectV2_grad/SelectV2", "gradients/dropout/SelectV2_grad/tuple/control_dependency"]
    assert any(gr.op_group[at[r]] != head for r in readers)  # the grouping splits the chain
    assert [int(ix.op_group[at[r]]) for r in readers] == [int(head)] * len(readers)
    assert (ix.role[[at[r] for r in readers]] == ROLE_REPLICA).all()


def test_a_batch_norm_gradient_runs_in_its_forward_ops_group():
    # FusedBatchNormGradV3 reads its forward op's saved batch mean / variance replica by replica:
    # in a group of another split, replica k would differentiate with another range's statistics
    # (tests/test_equivalence.py, cnn/bn_grad_apart: 0.07 error, silently). The 4-group grouping
    # of the tiny BN cnn puts them apart; the lowering runs the gradient with its forward op
    # (GraphIndex._pin_batch_norm_gradients). Its scale / offset gradients go to the update side,
    # aggregated with the gradient's (now the forward's) replica weights.
    g = testing.tiny_graph("cnn", 12, "sgd")
    gr = _grouping4(g)
    ix = GraphIndex(g, gr)
    at = {n: i for i, n in enumerate(g.names)}
    fwd, grad = at["FusedBatchNormV3"], at["gradients/FusedBatchNormV3_grad/FusedBatchNormGradV3"]
    assert gr.op_group[grad] != gr.op_group[fwd]
    assert ix.op_group[grad] == ix.op_group[fwd] and ix.role[grad] == ROLE_REPLICA
    readers = ["gradients/FusedBatchNormV3_grad/tuple/control_dependency_1",
               "gradients/FusedBatchNormV3_grad/tuple/control_dependency_2"]
    assert (ix.role[[at[r] for r in readers]] == ROLE_UPDATE).all()
    # so a strategy that splits the two groups differently runs both with the forward's replicas
    cluster = testing.four_device_cluster()
    devs = list(cluster.device_names)
    names = gr.group_names
    strategy = Strategy(12, 4, decision({devs[0]: 12}), {names[gr.op_group[fwd]]: decision({devs[1]: 5, devs[2]: 7}),
                                                         names[gr.op_group[grad]]: decision({devs[3]: 12})})
    placed = lower(g, gr, cluster, strategy, testing.uniform_profile(g, cluster.kinds))
    ranges = [sorted(zip(placed.task_lo[placed.tasks_of_op(op)].tolist(), placed.task_hi[placed.tasks_of_op(op)].tolist(),
                         placed.task_device[placed.tasks_of_op(op)].tolist())) for op in (fwd, grad)]
    assert ranges[0] == ranges[1] == [(0, 5, 1), (5, 12, 2)]


def _grouping4(g, groups=4):
    from tfplace.ir.grouping import make_grouping
    return make_grouping(g, groups)


def test_placed_graph_carries_mean_scaled_tensors():
    g = _sum_mlp_graph(reduction="mean")
    gr = _grouping4(g)
    cluster = testing.four_device_cluster()
    devs = list(cluster.device_names)
    placed = lower(g, gr, cluster, Strategy(12, 4, decision({devs[0]: 7, devs[1]: 5}, "allreduce"), {}),
                   testing.uniform_profile(g, cluster.kinds))
    assert placed.tensor_mean_scaled.shape == (placed.tensor_weight_mean.shape[0],)
    assert placed.tensor_mean_scaled.any()


def test_placed_graph_carries_rows_per_sample_of_flattened_batch_axes():
    # The zoo transformer flattens activations to [N*L, d]: samples [lo, hi) of such a tensor
    # are rows [lo*L, hi*L), which the rewrite's slices of resplits and transfers need.
    import os
    from tfplace.ir.loader import load_op_graph
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    g = load_op_graph(os.path.join(root, "graph_defs", "zoo", "tiny_transformer_b16_t8_n2_sgd.json"))
    ix = GraphIndex(g, _grouping4(g))
    rows = ix.tensor_batch_rows
    assert rows.shape == (g.num_tensors,)
    assert (rows[g.tensor_batch_axis < 0] == 1).all()
    batched = np.nonzero(g.tensor_batch_axis >= 0)[0]
    lengths = np.array([g.tensor_shape[t][g.tensor_batch_axis[t]] for t in batched])
    assert set(rows[batched].tolist()) == {1, 8}  # [N, L] ids, [N*L, d] activations
    assert (lengths == rows[batched] * g.reference_batch_size).all()
    cluster = testing.four_device_cluster()
    devs = list(cluster.device_names)
    placed = lower(g, _grouping4(g), cluster, Strategy(16, 4, decision({devs[0]: 11, devs[1]: 5}, "allreduce"), {}),
                   testing.uniform_profile(g, cluster.kinds))
    assert placed.tensor_batch_rows.shape == (placed.tensor_weight_mean.shape[0],)
    assert placed.tensor_batch_rows.max() == 8


def _attention_placed(shares_a, shares_b):
    from tfplace.ir.grouping import make_grouping
    g = testing.tiny_graph("attention", 12, "sgd")
    gr = make_grouping(g, 4)
    cluster = testing.four_device_cluster()
    names = gr.group_names
    groups = {n: decision(shares_a if i % 2 else shares_b, "allreduce") for i, n in enumerate(names)}
    lowerer = Lowerer(g, gr, cluster, testing.uniform_profile(g, cluster.kinds))
    return g, lowerer, lowerer.lower(Strategy(12, 4, None, groups))


def test_metadata_is_computed_per_consumer_replica():
    # Shape-derived values (the shape fed to a mean's BroadcastTo, its 1/B) depend on the
    # replica size: a consumer replica must never read one computed for another size.
    from tfplace.lowering.meta import CLONE_SUFFIX, metadata_ops
    cluster = testing.four_device_cluster()
    d = list(cluster.device_names)
    g, lowerer, placed = _attention_placed({d[0]: 7, d[1]: 5}, {d[0]: 2, d[1]: [4, 6]})
    lg = lowerer.graph
    # original ids are kept; clones are appended and cost as their original
    assert placed.op_names[:g.num_ops] == g.names and len(placed.op_names) > g.num_ops
    assert all(CLONE_SUFFIX in n for n in placed.op_names[g.num_ops:])
    meta = metadata_ops(lg)
    assert {lg.op_types[i] for i in np.nonzero(meta)[0]} >= {"Shape"}
    assert not meta[list(lg.inputs)].any()
    for i in np.nonzero(meta)[0].tolist():
        assert not (lg.tensor_batch_axis[lg.tensor_op == i] >= 0).any()
    checked = 0
    for t in range(placed.num_compute):
        if placed.task_samples[t] == 0:
            continue
        for b, e in zip(placed.in_buf[placed.in_ptr[t]:placed.in_ptr[t + 1]].tolist(),
                        placed.in_edge[placed.in_ptr[t]:placed.in_ptr[t + 1]].tolist()):
            src = int(placed.buf_task[b])
            if meta[lg.tensor_op[lg.edge_tensor[e]]]:
                assert placed.task_kind[src] == 0 and placed.task_samples[src] == placed.task_samples[t]
                assert placed.task_lo[src] == placed.task_lo[t] and placed.task_device[src] == placed.task_device[t]
                checked += 1
    assert checked > 10


def test_graphs_without_cross_group_metadata_are_not_changed():
    g = fk.dp_graph(W)
    lowerer = Lowerer(g, fk.grouping(g), fk.pair_cluster(), fk.dp_profile(g))
    assert lowerer.graph is g


def _pipeline(micro):
    """x -> a1 -> a2 (stage 1 on v100_0) -> b1 -> b2 (stage 2 on p100_0); every compute op 1 ms
    at the global batch 8, linear in samples; 800-byte activations (a transfer costs ~5 µs)."""
    ops = [("x", "Placeholder", 800, True, True), ("a1", "Op", 800, True, True), ("a2", "Op", 800, True, True),
           ("b1", "Op", 800, True, True), ("b2", "Op", 800, True, True)]
    g = fk.op_graph(ops, [("x", "a1"), ("a1", "a2"), ("a2", "b1"), ("b1", "b2")])
    gr = fk.grouping(g, [["x", "a1", "a2"], ["b1", "b2"]])
    prof = fk.profile_table(g, {n: {"V100": 1e-3 if n != "x" else 0.0, "P100": 1e-3 if n != "x" else 0.0}
                                for n in g.names})
    shares = [8 // micro] * micro
    st = Strategy(8, 2, decision({"p100_0": shares}), {"x": decision({"v100_0": shares})})
    return g, lower(g, gr, fk.pair_cluster(), st, prof)


def test_micro_batches_pipeline_two_stages():
    """Hand-computed: with 1 micro-batch, stage 1 runs 2 ms, the transfer ~5 µs, stage 2 2 ms:
    ~4.005 ms. With 2 micro-batches of 4 samples (0.5 ms per op), micro-batch 0 goes through
    a1, a2 first (done at 1 ms), reaches p100_0 at ~1.005 ms; stage 2 runs it while stage 1 runs
    micro-batch 1 (done at 2 ms); stage 2 then runs micro-batch 1 from ~2.005 to ~3.005 ms.
    (Ordering by op first, a1/mb1 would run before a2/mb0 and stage 2 would start at 1.5 ms:
    ~3.5 ms.) So 2 micro-batches simulate ~25% faster than 1."""
    from tfplace.simulator import schedule
    t = {}
    for micro in (1, 2):
        g, placed = _pipeline(micro)
        sched = schedule(placed, np.ones(2))
        t[micro] = float(np.max(sched.finish))
    assert t[1] == pytest.approx(4.0e-3, abs=5e-5)
    assert t[2] == pytest.approx(3.0e-3, abs=5e-5)
    assert t[2] < t[1]


def test_priority_key_is_group_then_micro_batch_then_rank():
    g, placed = _pipeline(2)
    first, second = (placed.tasks_of_op(g.index(n)) for n in ("a1", "a2"))
    # a2 of micro-batch 0 outranks a1 of micro-batch 1 on the same device
    assert placed.task_priority[second[0]] < placed.task_priority[first[1]]
    assert placed.task_priority[first[0]] < placed.task_priority[second[0]]


def _const_transfers(const_bytes=4, consumers=("a", "b"), control=False, cluster_file="local_cpu.json"):
    """Transfers of the constant `lr` when `a` (with x) runs on the first device and `b` on the
    second, `lr` (a Const of const_bytes) beside `a` and read by `consumers`."""
    import os
    from tfplace.formats.cluster import load_cluster
    ops = [("x", "Placeholder", 8000, True, True), ("lr", "Const", const_bytes, False, False),
           ("a", "Op", 8000, True, True), ("b", "Op", 8000, True, True), ("sink", "NoOp", None, False, False)]
    edges = [("x", "a"), ("a", "b")] + [("lr", c) for c in consumers]
    g = fk.op_graph(ops, edges, control=[("lr", "sink")] if control else [])
    cluster = load_cluster(os.path.join(os.path.dirname(__file__), "..", "clusters", cluster_file)) \
        if cluster_file else fk.pair_cluster()
    first, second = cluster.device_names[:2]
    gr = fk.grouping(g, [["x", "lr", "a"], ["b"], ["sink"]])
    prof = fk.profile_table(g, {n: {k: 1e-4 for k in cluster.kinds} for n in g.names})
    st = Strategy(8, 3, decision({first: 8}), {"b": decision({second: 8})})
    placed = lower(g, gr, cluster, st, prof)
    lr = g.index("lr")
    return sum(int(placed.task_op[t]) == lr for t in _tasks(placed, TASK_TRANSFER))


@pytest.mark.parametrize("kwargs, transfers", [
    # TensorFlow's ReplicateConstantsPass (checked on the local cluster's partition graphs: the
    # learning rate of a model-parallel step crossed no task) copies a Const of at most 16
    # elements onto each successor's task when they are on two or more tasks
    ({}, 0),
    ({"const_bytes": 64}, 0),                     # 16 float32: still small
    ({"const_bytes": 68}, 1),                     # 17 elements: sent
    ({"consumers": ("b",)}, 1),                   # one successor, on one other task: sent
    ({"control": True}, 1),                       # a control successor: not replicated
    ({"cluster_file": ""}, 1),                    # GPUs: only constants on a CPU are replicated
])
def test_small_constants_are_replicated_not_sent(kwargs, transfers):
    assert _const_transfers(**kwargs) == transfers


def _weighting_cases():
    """(name, strategy factory) over the tiny MLP on three CPUs: even and uneven DP with
    all-reduce and PS, one device (no weights), and random strategies (uneven shares, PS,
    micro-batches on one device)."""
    devs = ["cpu0", "cpu1", "cpu2"]
    cases = [("single", lambda groups: Strategy(12, 4, decision({"cpu0": 12}), {})),
             ("dp_even_allreduce", lambda groups: Strategy(12, 4, decision({d: 4 for d in devs}), {})),
             ("dp_uneven_ps", lambda groups: Strategy(12, 4, decision({"cpu0": 6, "cpu1": [3, 3]}, "ps", "cpu2"), {})),
             ("micro_batches_one_device", lambda groups: Strategy(12, 4, decision({"cpu1": [4, 4, 4]}), {}))]
    for seed in range(4):
        cases.append((f"random_{seed}", lambda groups, seed=seed: testing.random_strategy(
            np.random.default_rng(seed), groups, devs, 12, micro_batch_probability=0.4)))
    return cases


@pytest.mark.parametrize("name,make", _weighting_cases(), ids=[c[0] for c in _weighting_cases()])
def test_weighting_cost_follows_the_rewrites_multiplies(name, make):
    """The lowering charges one aggregation-weight multiply per (buffer, device) where the
    rewrite emits one (`tfplace/weighted_<buffer>_d<device>`, a Mul by samples / batch): the
    same pairs, the same weights, each on its device. Each costs a launch plus the partial
    read and written at the device's memory bandwidth (ResNet-50 b8 data-parallel on three
    CPU tasks: its 25.6 M gradients' weighting took 7.4 ms per task)."""
    import os

    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.grouping import make_grouping
    from tfplace.lowering.meta import split_metadata
    from tfplace.lowering.placed_graph import TASK_COMPUTE
    from tfplace.rewrite.graph_rewrite import rewrite_step
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cluster = load_cluster(os.path.join(root, "clusters", "local_cpu.json"))
    graph = testing.tiny_graph("mlp", 12, "momentum")
    grouping = make_grouping(graph, 4)
    step = rewrite_step(graph, make(grouping.group_names), cluster, grouping=grouping)
    p = step.placed
    nodes = {n.name: n for n in step.graph_def.node}
    emitted = {}
    for n in nodes.values():
        if n.op == "Mul" and n.name.startswith("tfplace/weighted_"):
            b, d = n.name[len("tfplace/weighted_"):].split("_d")
            weight = nodes[n.name + "/weight"].attr["value"].tensor.float_val[0]
            emitted[(int(b), int(d))] = (weight, n.device)
    lowered = split_metadata(graph, grouping.op_group)[0]  # the graph p was lowered from
    buf, dev, weight, charged = p.weighted_reads(lowered.tensor_batch_axis)
    modelled = {(int(b), int(d)): float(w) for b, d, w in zip(buf, dev, weight)}
    assert set(modelled) == set(emitted)
    for key, (w, device) in emitted.items():
        assert modelled[key] == pytest.approx(w, rel=1e-6)
        assert device == cluster.devices[key[1]].tf_device
    assert (p.task_device[charged] == dev).all()  # charged on the device that multiplies
    if name == "single":
        assert not emitted
    if name == "dp_even_allreduce":  # every device weights its own gradients, after the gradient op
        assert set(dev.tolist()) == {0, 1, 2} and (p.task_kind[charged] == TASK_COMPUTE).all()
    if name == "dp_uneven_ps":  # cpu0's partials are weighted where they are summed, on the PS
        assert set(dev.tolist()) == {1, 2}  # cpu1 first sums its own two micro-batches


@pytest.mark.parametrize("kind,fraction,expected", [
    ("CPU", None, "cpu"),             # the datasheet entry
    ("CPU_half", None, "cpu"),        # a CPU kind without a quota in its profile: a whole core
    ("CPU_half", 0.5, "cpu_half"),    # under a 0.5 quota a copy takes twice the wall
    ("XPU_9000", None, "default"),    # a kind nothing knows: the default
])
def test_memory_bandwidth_of_cpu_kinds_follows_their_quota(kind, fraction, expected):
    from types import SimpleNamespace

    from tfplace.profiling.device_model import device_spec
    from tfplace.lowering.costs import memory_bandwidth
    cpu = device_spec("CPU").memory_bandwidth_bytes_per_s * device_spec("CPU").memory_efficiency
    cluster = SimpleNamespace(devices=[SimpleNamespace(kind=kind)])  # all memory_bandwidth reads
    conditions = {"by_kind": {kind: {"emulation": {"cpu_fraction": fraction}}}} if fraction else {}
    profile = SimpleNamespace(conditions=conditions)
    got = memory_bandwidth(cluster, None, 2e11, profile)[0]
    want = {"cpu": cpu, "cpu_half": 0.5 * cpu, "default": 2e11}[expected]
    assert got == pytest.approx(want)
    assert memory_bandwidth(cluster, {kind: 1e9}, 2e11, profile)[0] == 1e9  # a given table wins


# ---- run order: the last key of a task's priority --------------------------------------------
def _diamond():
    """x -> a, x -> b, (a, b) -> c -> sink, and d -> sink with no input: a and b (and d) are
    independent, so only the run order decides which of them goes first."""
    ops = [("x", "Placeholder", 800, True, True), ("a", "Op", 800, True, True), ("b", "Op", 800, True, True),
           ("c", "Op", 800, True, True), ("d", "Const", 4, False, False), ("sink", "NoOp", None, False, False)]
    edges = [("x", "a"), ("x", "b"), ("a", "c"), ("b", "c"), ("d", "sink")]
    return fk.op_graph(ops, edges, control=[("c", "sink")])


@pytest.mark.parametrize("run_order,expected", [
    ((), ["x", "a", "b", "c", "d", "sink"]),                      # no run order: the graph's own order
    (("x", "b", "a", "c", "d", "sink"), ["x", "b", "a", "c", "d", "sink"]),   # followed where legal
    (("d", "x", "a", "b", "c", "sink"), ["d", "x", "a", "b", "c", "sink"]),
    (("c", "b", "x", "a", "sink", "d"), ["x", "b", "a", "c", "d", "sink"]),   # never before its inputs
    (("x", "b", "a", "c", "sink"), ["d", "x", "b", "a", "c", "sink"]),        # unlisted d: once ready
])
def test_run_order_rank_is_the_topological_order_that_follows_the_run_order(run_order, expected):
    from tfplace.lowering.graph_index import run_order_rank
    g = _diamond()
    rank = run_order_rank(g, run_order)
    assert sorted(rank.tolist()) == list(range(g.num_ops))
    assert [g.names[i] for i in np.argsort(rank)] == expected
    for s, d in list(zip(g.tensor_op[g.edge_tensor], g.edge_dst)) + list(zip(g.control_src, g.control_dst)):
        assert rank[s] < rank[d]


def test_a_metadata_clone_runs_where_its_original_is_listed():
    from tfplace.lowering.graph_index import run_order_rank
    from tfplace.lowering.meta import CLONE_SUFFIX
    g = _diamond()
    names = list(g.names)
    names[2] = "a" + CLONE_SUFFIX + "1"   # b stands as a's clone: it takes a's place in the order
    clone = dataclasses.replace(g, names=tuple(names), meta={"tfplace_clone_of": {names[2]: "a"}})
    rank = run_order_rank(clone, ("x", "a", "c", "d", "sink"))
    assert rank[1] == 1 and rank[2] == 2    # with a (listed at 1), before c; b itself is not listed


@pytest.mark.parametrize("run_order,first", [((), "a"), (("x", "b", "a", "c", "d", "sink"), "b")])
def test_priority_ties_on_a_device_follow_the_profiles_run_order(run_order, first):
    g = _diamond()
    gr = fk.grouping(g, [list(g.names)])
    prof = dataclasses.replace(fk.profile_table(g, {n: {"V100": 1e-4, "P100": 2e-4} for n in g.names}),
                               run_order=run_order)
    placed = lower(g, gr, fk.pair_cluster(), Strategy(8, 1, decision({"v100_0": 8}), {}), prof)
    (a,), (b,) = (placed.tasks_of_op(g.index(n)) for n in ("a", "b"))
    second = "b" if first == "a" else "a"
    by_name = {"a": a, "b": b}
    assert placed.task_priority[by_name[first]] < placed.task_priority[by_name[second]]


def test_joining_a_losss_partials_moves_no_batch_norm_or_weight_gradient():
    """The forward pass's readers of several producers' partials join them to one layout
    (GraphIndex._pin_partial_readers); the backward pass is never moved. With the global norm of
    clipped gradients fetched by the train op, its readers read every weight gradient: joining
    those moved batch-norm gradients away from their forward ops (which
    _pin_batch_norm_gradients keeps together) and pulled weight gradients of many groups into one."""
    import tensorflow as tf
    from tfplace.ir.grouping import make_grouping
    from tfplace.ir.loader import load_op_graph
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        h = v1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        for i in range(3):
            h = v1.layers.conv2d(h, 4, 3, padding="same", use_bias=False, name=f"c{i}")
            h = tf.nn.relu(v1.layers.batch_normalization(h, training=True, fused=True, name=f"bn{i}"))
        loss = tf.reduce_mean(tf.square(h), name="loss")
        opt = v1.train.GradientDescentOptimizer(0.1)
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            grads, variables = zip(*opt.compute_gradients(loss))
        clipped, norm = tf.clip_by_global_norm(grads, 1.0)
        tf.group(opt.apply_gradients(zip(clipped, variables)), tf.identity(norm), name="train_op")
    g = load_op_graph(graph.as_graph_def(), sinks=["train_op"], batch_size=16, loss="loss", source="bn_clip")
    grouping = make_grouping(g, 24)
    pinned = GraphIndex._pin_batch_norm_gradients(g, GraphIndex._pin_variables(g, np.asarray(grouping.op_group).copy()))
    index = GraphIndex(g, grouping)
    heavy = [i for i, t in enumerate(g.op_types) if t in ("FusedBatchNormGradV3", "Conv2DBackpropFilter")]
    assert len(heavy) == 6
    assert [index.op_group[i] for i in heavy] == [pinned[i] for i in heavy]


# ---- memory the rewritten step holds beyond the buffers (PlacedGraph.scratch_*) -----------------
def test_a_send_back_counts_the_received_weights_on_the_worker():
    """The V100 receives the updated w (W bytes) from the PS and assigns it to its mirror: while
    that value is live the worker holds the weight twice (measured on the real step: the received
    weights were never counted before)."""
    g, placed = _dp({"v100_0": 4, "p100_0": 4}, "ps", "p100_0")
    back = [t for t in _tasks(placed, TASK_TRANSFER) if not placed.is_control_message(t)
            and placed.out_ptr[t] == placed.out_ptr[t + 1]]
    assert [(int(placed.task_device[t]), float(placed.task_bytes[t])) for t in back] == [(0, W)]
    held = list(zip(placed.scratch_task.tolist(), placed.scratch_device.tolist(), placed.scratch_bytes.tolist(),
                    placed.scratch_free_task.tolist()))
    assert held == [(back[0], 0, W, back[0])]  # on the V100, while the send-back lands
    # the simulator counts it: the V100's peak with the scratch left out is W lower at most
    report = simulate(placed, fk.pair_cluster())
    bare = dataclasses.replace(placed, scratch_task=placed.scratch_task[:0], scratch_device=placed.scratch_device[:0],
                               scratch_bytes=placed.scratch_bytes[:0], scratch_free_task=placed.scratch_free_task[:0])
    assert report.peak_memory_bytes[0] >= simulate(bare, fk.pair_cluster()).peak_memory_bytes[0]
    assert report.peak_memory_bytes[0] >= placed.static_bytes[0] + W


def _gather_graph(gather: bool):
    """dp_graph whose weight is also read by a ResourceGather (an embedding lookup) or not."""
    ops = [("x", "Placeholder", 8000, True, True), ("w", "VarHandleOp", 8, False, False),
           ("r", "ReadVariableOp", W, False, False), ("lr", "Const", 4, False, False),
           ("f", "MatMul", 8000, True, True)]
    ops += [("gat", "ResourceGather", 8000, True, True)] if gather else []
    ops += [("g", "MatMul", W, False, True), ("apply", "ResourceApplyGradientDescent", None, False, True),
            ("train_op", "NoOp", None, False, False)]
    edges = [("w", "r"), ("x", "f"), ("r", "f"), ("x", "g"), ("f", "g"), ("w", "apply"), ("lr", "apply"),
             ("g", "apply")]
    edges += [("w", "gat"), ("x", "gat")] if gather else []
    readers = ["r", "gat"] if gather else ["r"]
    return fk.op_graph(ops, edges, variables=[("w", readers, ["apply"], W, False)], control=[("apply", "train_op")],
                       loss="f")


@pytest.mark.parametrize("gather, read_bytes", [(False, 0.0), (True, W)])
def test_a_dense_read_of_a_copy_on_read_variable_is_a_copy(gather, read_bytes):
    """TensorFlow puts a variable that a ResourceGather (or a sparse update) touches in copy-on-read
    mode: a dense ReadVariableOp then copies it (a measured out-of-memory was such a copy), else it
    aliases the resident variable."""
    g = _gather_graph(gather)
    placed = lower(g, fk.grouping(g), fk.pair_cluster(), Strategy(8, 1, decision({"v100_0": 8}), {}),
                   testing.uniform_profile(g, ["V100", "P100"], 1e-3))
    r = int(placed.op_task_ptr[g.index("r")])
    assert placed.buf_bytes[placed.out_ptr[r]:placed.out_ptr[r + 1]].sum() == read_bytes
    report = simulate(placed, fk.pair_cluster())
    assert report.peak_memory_bytes[0] >= placed.static_bytes[0] + read_bytes + 8000  # the copy next to f's output
