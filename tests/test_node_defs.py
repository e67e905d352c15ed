"""The all-reduce nodes the rewrite emits (tfplace.ir.node_defs), checked in one process on three
logical CPU devices: the exchange sums what every participant holds, for sizes on and off the
alignment boundary, one tensor or a packed bucket, with and without padding; and a PS bucket packed
on one device and split on another with static shapes."""

import numpy as np
import pytest

from tfplace.ir import node_defs as nd

DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)]


def _run(build):
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        fetch = build(tf)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 3})
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        return sess.run(fetch)


@pytest.mark.parametrize("elements", [1, 15, 16, 17, 1000, 4097])
def test_an_exchange_of_one_tensor_is_the_sum_on_every_participant(elements):
    """(CollectiveReduceV2 needs a cluster's collective executor: tests/test_equivalence.py runs both.)"""
    rng = np.random.default_rng(elements)
    xs = [rng.standard_normal((elements,)).astype(np.float32) for _ in DEVICES]

    def build(tf):
        vals = []
        for x, d in zip(xs, DEVICES):
            with tf.device(d):
                vals.append(tf.constant(x) * 1.0)
        return nd.import_all_reduce(vals, DEVICES, "float32", "exchange", 1, 1, "ar")
    for got in _run(build):
        np.testing.assert_allclose(got, sum(xs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shapes", [[(3, 5), (16,), (7,)], [(1000,), (4, 4), (33, 2), (1,)], [(2, 8)],
                                    [(40,), (2, 3), (57,), (), (0,)]])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("static", [False, True])
def test_an_exchange_of_a_bucket_unpacks_every_sum_in_its_shape(shapes, padded, static):
    """Sources of every shape come back summed, in their own shapes, whatever the padding; with
    padding every piece of the packed tensor is a multiple of SHARD_ALIGN_ELEMENTS long. With the
    element counts given (static) the sums are sliced out of the shards, no gather of the n sums
    is emitted, and pieces that straddle two shards (the 40- and 57-element sources) and an empty
    source still come back whole."""
    from tensorflow.core.framework import graph_pb2
    rng = np.random.default_rng(len(shapes))
    xs = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in DEVICES]
    pads = [nd.padding_elements(int(np.prod(s))) for s in shapes] if padded else None
    if padded:
        assert all((int(np.prod(s)) + p) % nd.SHARD_ALIGN_ELEMENTS == 0 for s, p in zip(shapes, pads))
    names = [f"ex/d{i}" for i in range(3)]
    out_names = [f"t{k}" for k in range(len(shapes))]

    def build(tf):
        gd = graph_pb2.GraphDef()
        ins = [[f"in{i}_{k}" for k in range(len(shapes))] for i in range(3)]
        for i, d in enumerate(DEVICES):
            for k in range(len(shapes)):
                gd.node.extend([nd.const(ins[i][k], d, xs[i][k], "float32")])
        elements = [int(np.prod(s)) for s in shapes] if static else None
        nodes = nd.exchange_all_reduce(names, DEVICES, ins, out_names, "float32", pads, elements)
        gathers = [n for n in nodes if n.op == "ConcatV2" and sum(x.endswith("/shard_sum") for x in n.input) == 3]
        assert len(gathers) == (0 if static else 3)
        gd.node.extend(nodes)
        tf.compat.v1.import_graph_def(gd, name="")
        return [[f"{n}/{o}:0" for o in out_names] for n in names] + [[f"{n}/packed:0" for n in names]]
    *per_participant, packed = _run(build)
    for got in per_participant:
        for k, s in enumerate(shapes):
            assert got[k].shape == s
            np.testing.assert_allclose(got[k], sum(x[k] for x in xs), rtol=1e-6, atol=1e-6)
    expected_len = sum(int(np.prod(s)) for s in shapes) + (sum(pads) if padded else 0)
    assert all(p.shape == (expected_len,) for p in packed)


@pytest.mark.parametrize("elements, pad", [(0, 0), (1, 15), (15, 1), (16, 0), (17, 15), (1000, 8), (-1, 0)])
def test_padding_ends_each_piece_on_the_boundary(elements, pad):
    assert nd.padding_elements(elements) == pad


@pytest.mark.parametrize("shapes", [[(3, 5), (), (16,)], [(1000,), (4, 4), (33, 2), (1,)], [(2, 8)]])
@pytest.mark.parametrize("padded", [False, True])
def test_a_bucket_packed_on_one_device_unpacks_on_another_with_static_shapes(shapes, padded):
    """A PS bucket: packed on the sender, split on the receiver with constant sizes and shapes;
    every value comes back unchanged in its shape, and no node on the receiver reads a source
    (it would pull every unpacked tensor across on its own)."""
    from tensorflow.core.framework import graph_pb2
    rng = np.random.default_rng(len(shapes))
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pads = [nd.padding_elements(int(np.prod(s))) for s in shapes] if padded else None
    srcs = [f"in_{k}" for k in range(len(shapes))]
    outs = [f"t{k}" for k in range(len(shapes))]
    unpacked = nd.unpack("b", DEVICES[1], "b/packed", srcs, outs, "float32", pads, shapes=shapes)
    assert not any(x.split(":")[0] in srcs for n in unpacked for x in n.input)

    def build(tf):
        gd = graph_pb2.GraphDef()
        gd.node.extend(nd.const(s, DEVICES[0], x, "float32") for s, x in zip(srcs, xs))
        gd.node.extend(nd.pack("b", DEVICES[0], srcs, "float32", pads) + unpacked)
        tf.compat.v1.import_graph_def(gd, name="")
        return [f"b/{o}:0" for o in outs]
    for got, x in zip(_run(build), xs):
        assert got.shape == x.shape
        np.testing.assert_array_equal(got, x)
