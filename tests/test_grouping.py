"""Tests of tfplace.ir.grouping (base groups, coarsening, group graph) and of the shared fakes in
tfplace.testing. Hand-computed references use `chain_graph` (pure numpy, no TensorFlow)."""

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tfplace.formats.errors import InputError
from tfplace.ir.grouping import Grouping, base_groups, coarsen, group_graph, make_grouping
from tfplace.testing import (chain_graph, four_device_cluster, tiny_graph, two_device_cluster,
                             uniform_profile)

GRAPHS = {
    "chain": lambda: chain_graph(6, 4096, 8),
    "mlp_adam": lambda: tiny_graph("mlp", 8, "adam"),
    "cnn_momentum": lambda: tiny_graph("cnn", 4, "momentum"),
    "attention_sgd": lambda: tiny_graph("attention", 4, "sgd"),
}


def _partition_ok(graph, grouping):
    seen = np.concatenate([grouping.group_ops(g) for g in range(grouping.num_groups)])
    return len(grouping.op_group) == graph.num_ops and np.array_equal(np.sort(seen), np.arange(graph.num_ops))


# ---- base groups -------------------------------------------------------------------------
def test_chain_base_groups_by_hand():
    g = chain_graph(3, 4096, 8)
    b = base_groups(g)
    groups = sorted(tuple(g.names[i] for i in b.group_ops(k)) for k in range(b.num_groups))
    # Variable with its read and update (and the learning-rate constant that only the update
    # uses); every other op alone, because every edge between them is batched or a float value
    # computed from the batch (loss, weight gradient: where partial sums are aggregated).
    assert groups == sorted([("input",), ("w", "w/read", "lr", "apply"), ("op_1",), ("op_2",), ("op_3",),
                             ("loss",), ("loss_grad",), ("w_grad",), ("train_op",)])
    assert b.group_names[b.op_group[g.index("apply")]] == "w"
    split = {b.group_names[k]: bool(b.group_batch_splittable[k]) for k in range(b.num_groups)}
    assert split == {"input": True, "w": False, "op_1": True, "op_2": True, "op_3": True, "loss": False,
                     "loss_grad": True, "w_grad": False, "train_op": False}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_base_groups_partition_and_keep_variables_whole(name):
    g = GRAPHS[name]()
    b = base_groups(g)
    assert _partition_ok(g, b)
    assert len(set(b.group_names)) == b.num_groups
    for k in range(b.num_groups):
        assert g.index(b.group_names[k]) in b.group_ops(k)  # the anchor is a member
    for v in g.variables:
        members = {b.op_group[i] for i in (v.op,) + v.readers + v.updaters}
        assert members == {b.op_group[v.op]}, v.name
        if v.trainable:  # a weight names its group, not one of its slots
            assert not g.variables[[w.name for w in g.variables].index(
                b.group_names[b.op_group[v.op]])].is_slot


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_base_groups_never_join_a_batched_edge_without_colocation(name):
    g = dataclasses.replace(GRAPHS[name](), graph_def=None)  # drop the colocation attrs
    b = base_groups(g)
    batched = g.tensor_batch_axis[g.edge_tensor] >= 0
    src = g.tensor_op[g.edge_tensor]
    # A variable's own reads/updates may take batched values (e.g. scatter); nothing else may.
    in_var = np.zeros(g.num_ops, bool)
    for v in g.variables:
        in_var[list((v.op,) + v.readers + v.updaters)] = True
    joined = batched & (b.op_group[src] == b.op_group[g.edge_dst]) & ~in_var[g.edge_dst]
    assert not joined.any(), [(g.names[s], g.names[d]) for s, d in zip(src[joined], g.edge_dst[joined])]


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_slots_share_the_group_of_their_weight(optimizer):
    g = tiny_graph("mlp", 8, optimizer)
    b = base_groups(g)
    weight_group = {v.updaters[0]: b.op_group[v.op] for v in g.variables if v.trainable}
    for v in g.variables:
        if v.is_slot and v.shape:
            assert b.op_group[v.op] == weight_group[v.updaters[0]], v.name


# ---- coarsening --------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("k", [1, 3, 10, 10_000])
def test_coarsen_reaches_k_and_refines_base_groups(name, k):
    g = GRAPHS[name]()
    b = base_groups(g)
    c = coarsen(g, b, k)
    assert c.num_groups == min(k, b.num_groups)
    assert _partition_ok(g, c) and len(set(c.group_names)) == c.num_groups
    # Every base group lies inside one coarse group.
    pairs = np.unique(np.stack([b.op_group, c.op_group]), axis=1)
    assert len(np.unique(pairs[0])) == pairs.shape[1]
    # Canonical numbering: groups are numbered by their first op.
    firsts = [int(c.group_ops(x)[0]) for x in range(c.num_groups)]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_coarsen_is_deterministic(name):
    g = GRAPHS[name]()
    first = make_grouping(g, 5)
    fresh = GRAPHS[name]() if name == "chain" else tiny_graph.__wrapped__(*{
        "mlp_adam": ("mlp", 8, "adam"), "cnn_momentum": ("cnn", 4, "momentum"),
        "attention_sgd": ("attention", 4, "sgd")}[name])  # reloaded from scratch
    for other in (make_grouping(g, 5), make_grouping(fresh, 5)):
        assert np.array_equal(first.op_group, other.op_group)
        assert first.group_names == other.group_names
        assert np.array_equal(first.group_batch_splittable, other.group_batch_splittable)


def test_coarsen_merges_the_heaviest_edge_first():
    g = chain_graph(4, 4096, 8)
    b = base_groups(g)
    # Make op_2 -> op_3 the only heavy edge: every other op costs a lot, so every merge but that
    # one has a low bytes/cost score.
    cost = np.full(g.num_ops, 1000.0)
    cost[[g.index("op_2"), g.index("op_3")]] = 1.0
    c = coarsen(g, b, b.num_groups - 1, op_cost=cost)
    assert c.op_group[g.index("op_2")] == c.op_group[g.index("op_3")]
    assert c.num_groups == b.num_groups - 1


def test_coarsen_keeps_big_cost_groups_apart():
    g = chain_graph(8, 4096, 8)
    cost = np.ones(g.num_ops)
    big = [g.index("op_3"), g.index("op_4")]  # adjacent, heavy edge between them
    cost[big] = 1000.0
    c = coarsen(g, base_groups(g), 4, op_cost=cost)
    assert c.op_group[big[0]] != c.op_group[big[1]]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_coarsen_rejects_bad_max_groups(bad):
    g = chain_graph()
    with pytest.raises(InputError, match="max_groups"):
        coarsen(g, base_groups(g), bad)


def test_coarsen_rejects_bad_op_cost():
    g = chain_graph()
    with pytest.raises(InputError, match="op_cost"):
        coarsen(g, base_groups(g), 2, op_cost=np.ones(3))


def test_coarsen_rejects_a_grouping_of_another_graph():
    with pytest.raises(InputError, match="op_group"):
        coarsen(chain_graph(5), base_groups(chain_graph(3)), 2)


def test_coarsen_scales_to_a_long_chain():
    g = chain_graph(20_000, 64, 8)  # ~20k ops; must not be quadratic
    c = make_grouping(g, 200)
    assert c.num_groups == 200 and _partition_ok(g, c)


# ---- group graph -------------------------------------------------------------------------
def test_group_graph_by_hand():
    g = chain_graph(2, 4096, 8)
    b = base_groups(g)
    gg = group_graph(g, b)
    name = lambda k: b.group_names[k]
    edges = {(name(s), name(d)): int(n) for s, d, n in zip(gg.edge_src_group, gg.edge_dst_group, gg.edge_bytes)}
    weight = 4 * 128 * 128  # W = 4096 / (4 * 8) = 128
    assert edges == {("input", "op_1"): 4096, ("w", "op_1"): weight, ("op_1", "op_2"): 4096,
                     ("op_2", "loss"): 4096, ("op_2", "loss_grad"): 4096, ("loss", "loss_grad"): 4,
                     ("input", "w_grad"): 4096, ("loss_grad", "w_grad"): 4096, ("w_grad", "w"): weight,
                     ("w", "train_op"): 0}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_group_graph_is_deduplicated_without_self_loops(name):
    g = GRAPHS[name]()
    c = make_grouping(g, 6)
    gg = group_graph(g, c)
    pairs = list(zip(gg.edge_src_group.tolist(), gg.edge_dst_group.tolist()))
    assert len(pairs) == len(set(pairs)) and all(s != d for s, d in pairs)
    assert pairs == sorted(pairs) and (gg.edge_bytes >= 0).all()


def test_grouping_validates():
    with pytest.raises(InputError, match="op_group"):
        Grouping(np.array([0, 2], dtype=np.int32), ("a", "b", "c"), np.zeros(3, bool))
    with pytest.raises(InputError, match="unique"):
        Grouping(np.array([0, 1], dtype=np.int32), ("a", "a"), np.zeros(2, bool))


# ---- shared fakes ------------------------------------------------------------------------
@pytest.mark.parametrize("num_ops,tensor_bytes,batch", [(1, 32, 8), (5, 4096, 8), (3, 4 * 64 * 10, 64)])
def test_chain_graph_is_consistent(num_ops, tensor_bytes, batch):
    g = chain_graph(num_ops, tensor_bytes, batch)
    assert g.num_ops == num_ops + 9 and g.reference_batch_size == batch
    batched = g.tensor_batch_axis >= 0
    assert (g.tensor_bytes[batched] == tensor_bytes).all()
    for t in range(g.num_tensors):
        assert g.tensor_bytes[t] == {"float32": 4, "resource": 8}[g.tensor_dtype[t]] * int(np.prod(g.tensor_shape[t]))
    assert (g.tensor_op[g.edge_tensor] < g.edge_dst).all()
    (v,) = g.variables
    assert g.names[v.op] == "w" and [g.op_types[u] for u in v.updaters] == ["ResourceApplyGradientDescent"]


def test_chain_graph_rejects_uneven_bytes():
    with pytest.raises(ValueError, match="multiple of 4"):
        chain_graph(2, 100, 8)


@pytest.mark.parametrize("make,num_devices,kinds,hosts", [(two_device_cluster, 2, ("V100", "P100"), 1),
                                                          (four_device_cluster, 4, ("V100", "P100"), 2)])
def test_fake_clusters(make, num_devices, kinds, hosts):
    c = make()
    assert c.num_devices == num_devices and c.kinds == kinds and len(c.hosts) == hosts


def test_uniform_profile_covers_every_op_and_scales_batched_ops():
    g = chain_graph(3, 4096, 8)
    p = uniform_profile(g, ("V100", "P100"), seconds_per_op=2e-4)
    assert set(p.ops) == set(g.names) and p.kinds == ("V100", "P100")
    assert p.seconds("op_1", "V100", 4) == pytest.approx(1e-4)   # batched: half the batch, half the time
    assert p.seconds("apply", "P100", 4) == pytest.approx(2e-4)  # weight update: independent of batch


# ---- CLI ---------------------------------------------------------------------------------
def test_groups_cli_prints_and_writes_json(tmp_path, capsys):
    import json

    from tfplace.cli import common, groups
    from tfplace.testing import tiny_graph_def

    pb = tmp_path / "step.pb"
    pb.write_bytes(tiny_graph_def("cnn", "adam").SerializeToString())
    out = tmp_path / "groups.json"
    rc = common.call(groups, ["--graph", str(pb), "--sinks", "train_op", "--batch-size", "4", "--loss", "loss",
                              "--max-groups", "5", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["max_groups"] == 5 and len(doc["groups"]) == 5
    assert sum(g["num_ops"] for g in doc["groups"]) == doc["num_ops"]
    assert sorted(op for g in doc["groups"] for op in g["ops"]) == sorted(
        tiny_graph("cnn", 4, "adam").names)
    printed = capsys.readouterr().out
    assert all(g["name"] in printed for g in doc["groups"]) and "5 groups" in printed


def test_groups_cli_bad_input_exit_code(tmp_path, capsys):
    from tfplace.cli import common, groups

    assert common.call(groups, ["--graph", str(tmp_path / "missing.pb"), "--sinks", "t", "--max-groups", "3"]) == 2
    assert "missing.pb" in capsys.readouterr().err
