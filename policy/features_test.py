import numpy as np
import pytest

from tfplace.policy import features as F
from tfplace.policy.testing_fixtures import tiny_task


@pytest.mark.parametrize("op_type,category", [
    ("Conv2D", "conv"), ("Conv2DBackpropFilter", "conv_grad"), ("MatMul", "matmul"),
    ("ResourceApplyGradientDescent", "optimizer"), ("ReluGrad", "activation_grad"), ("Relu", "activation"),
    ("AddV2", "elementwise"), ("FusedBatchNormV3", "norm"), ("Reshape", "shape"), ("Placeholder", "input"),
    ("SomethingNew", "other")])
def test_op_category(op_type, category):
    assert F.CATEGORY_NAMES[F.op_category(op_type)] == category


@pytest.mark.parametrize("cluster", ["two", "four"])
def test_shapes_do_not_depend_on_device_count(cluster):
    task = tiny_task(cluster=cluster)
    f = task.features
    d = task.num_devices
    assert f.nodes.shape == (task.num_groups, F.NODE_FEATURES)
    assert f.devices.shape == (d, F.DEVICE_FEATURES)
    assert f.pairs.shape == (task.num_groups, d, F.PAIR_FEATURES)
    assert f.globals.shape == (F.GLOBAL_FEATURES,)
    hist = f.nodes[:, :len(F.OP_CATEGORIES)]
    # reference: the fraction of each group's ops in each category, counted op by op
    want = np.zeros_like(hist)
    for op, group in enumerate(task.grouping.op_group):
        want[group, F.op_category(task.graph.op_types[op])] += 1
    want /= want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(hist, want, rtol=1e-5)
    assert (np.count_nonzero(hist, axis=1) > 1).any()  # some group mixes categories
    assert f.senders.max() < task.num_groups and f.receivers.max() < task.num_groups
    # every group has a self edge, forward edges have reverse twins
    assert (f.edges[:, 3] == 1).sum() == task.num_groups
    assert (f.edges[:, 1] == 1).sum() == (f.edges[:, 2] == 1).sum()


def test_faster_device_has_lower_cost_pair_feature():
    task = tiny_task(cluster="four")  # v100 x2, p100 x2
    names = task.cluster.device_names
    v, p = names.index("v100_0"), names.index("p100_0")
    heavy = np.argmax(task.features.nodes[:, len(F.OP_CATEGORIES) + 1])
    assert task.features.pairs[heavy, v, 0] <= task.features.pairs[heavy, p, 0]
    assert task.features.devices[v, 0] >= task.features.devices[p, 0]


@pytest.mark.parametrize("devices,classes,ranks", [
    # (name, kind, host, memory GB) -> classes of identical devices and the rank column
    ([("a", "V100", "h0", 16), ("b", "V100", "h0", 16), ("c", "V100", "h1", 16), ("d", "P100", "h0", 16)],
     ((0, 1), (2,), (3,)), [0.0, 0.5, 0.0, 0.0]),
    ([("a", "V100", "h0", 16), ("b", "P100", "h0", 16), ("c", "V100", "h0", 16), ("d", "V100", "h0", 16)],
     ((0, 2, 3), (1,)), [0.0, 0.0, 1 / 3, 2 / 3]),
    ([("a", "V100", "h0", 16), ("b", "V100", "h0", 8)], ((0,), (1,)), [0.0, 0.0]),  # a capped one differs
])
def test_identical_devices_are_ranked_inside_their_class(devices, classes, ranks):
    from tfplace.formats.cluster import Device, Host, build_cluster
    cluster = build_cluster("c", [Host("h0"), Host("h1")],
                            [Device(n, k, h, int(gb * 1e9)) for n, k, h, gb in devices])
    assert F.identical_device_classes(cluster) == classes
    np.testing.assert_allclose(F.device_features(cluster)[:, F.DEVICE_RANK_COLUMN], ranks)
    # the other columns cannot tell the devices of one class apart: the rank is what can
    cols = F.device_features(cluster)[:, :F.DEVICE_RANK_COLUMN]
    for members in classes:
        assert all(np.array_equal(cols[members[0]], cols[i]) for i in members)
