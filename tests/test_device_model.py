"""Device model: FLOP and byte counts against hand counts, the device table, derived and roofline
profiles, and bad inputs. Pure numpy (no TensorFlow)."""

import dataclasses

import pytest

from tfplace.profiling import device_model as dm
from tfplace.profiling import fits as profile_fit
from tfplace.formats.errors import InputError
from tfplace.formats.profile import Profile, interpolate_seconds
from tfplace.testing import chain_graph

F32 = "float32"

# (op type, input shapes, output shapes, attrs, hand-computed FLOPs)
FLOP_CASES = [
    # 2 * N(out) * KH*KW*Cin = 2 * (8*32*32*32) * (3*3*16) = 2 * 262144 * 144
    ("Conv2D", [(8, 32, 32, 16), (3, 3, 16, 32)], [(8, 32, 32, 32)], {}, 75_497_472),
    # stride 2 VALID, 15x15 -> 6x6: 2 * (2*6*6*10) * (5*5*3) = 2 * 720 * 75
    ("Conv2D", [(2, 15, 15, 3), (5, 5, 3, 10)], [(2, 6, 6, 10)], {}, 108_000),
    # backprops: same multiply-adds as the forward, counted on dy = [8,32,32,32]
    ("Conv2DBackpropInput", [(4,), (3, 3, 16, 32), (8, 32, 32, 32)], [(8, 32, 32, 16)], {}, 75_497_472),
    ("Conv2DBackpropFilter", [(8, 32, 32, 16), (4,), (8, 32, 32, 32)], [(3, 3, 16, 32)], {}, 75_497_472),
    # 2 * M * N * K = 2 * 64 * 256 * 128, whatever the transposes
    ("MatMul", [(64, 128), (128, 256)], [(64, 256)], {}, 4_194_304),
    ("MatMul", [(128, 64), (128, 256)], [(64, 256)], {}, 4_194_304),   # transpose_a
    ("MatMul", [(64, 128), (256, 128)], [(64, 256)], {}, 4_194_304),   # transpose_b
    # batched: 2 * (4*8*16*24) * K=32
    ("BatchMatMulV2", [(4, 8, 16, 32), (4, 8, 32, 24)], [(4, 8, 16, 24)], {}, 786_432),
    ("BatchMatMulV3", [(4, 8, 16, 32), (32, 24)], [(4, 8, 16, 24)], {}, 786_432),   # broadcast b
    ("BatchMatMulV2", [(4, 8, 32, 16), (4, 8, 32, 24)], [(4, 8, 16, 24)], {}, 786_432),  # adj_x
    # depthwise: 2 * N(out) * KH*KW = 2 * (2*8*8*8) * 9
    ("DepthwiseConv2dNative", [(2, 8, 8, 4), (3, 3, 4, 2)], [(2, 8, 8, 8)], {}, 18_432),
    # einsum: 2 * b*i*j*k = 2 * 2*3*4*5
    ("Einsum", [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)], {"equation": "bij,bjk->bik"}, 240),
    ("Einsum", [(7, 2, 3, 4), (7, 2, 4, 5)], [(7, 2, 3, 5)], {"equation": "...ij,...jk->...ik"}, 1680),
    # optimizers: per parameter SGD 2, Momentum 4, Adam 10 (1000 parameters)
    ("ResourceApplyGradientDescent", [(), (), (100, 10)], [], {}, 2_000),
    ("ResourceApplyMomentum", [(), (), (), (100, 10), ()], [], {}, 4_000),
    ("ResourceApplyAdam", [(), (), (), (), (), (), (), (), (), (100, 10)], [], {}, 10_000),
    # element-wise: 1 per output element
    ("Relu", [(10, 10)], [(10, 10)], {}, 100),
    ("AddV2", [(10, 10), (10,)], [(10, 10)], {}, 100),
    ("ReluGrad", [(10, 10), (10, 10)], [(10, 10)], {}, 100),
    # batch norm training 7 N, gradient 10 N (N = 2*4*4*3 = 96)
    ("FusedBatchNormV3", [(2, 4, 4, 3), (3,), (3,), (0,), (0,)], [(2, 4, 4, 3), (3,), (3,)], {}, 672),
    ("FusedBatchNormGradV3", [(2, 4, 4, 3), (2, 4, 4, 3), (3,), (3,), (3,), (3,)], [(2, 4, 4, 3), (3,), (3,)], {}, 960),
    # pooling 2x2 window: N(out) * 4 = 2*4*4*3 * 4
    ("MaxPool", [(2, 8, 8, 3)], [(2, 4, 4, 3)], {"ksize": [1, 2, 2, 1]}, 384),
    ("MaxPoolGrad", [(2, 8, 8, 3), (2, 4, 4, 3), (2, 4, 4, 3)], [(2, 8, 8, 3)], {"ksize": [1, 2, 2, 1]}, 384),
    # softmax 8 per element; cross-entropy 10 per logit (logits [16, 10])
    ("Softmax", [(16, 10)], [(16, 10)], {}, 1_280),
    ("SparseSoftmaxCrossEntropyWithLogits", [(16, 10), (16,)], [(16,), (16, 10)], {}, 1_600),
    # reductions: one per input element
    ("Sum", [(8, 100), (1,)], [(8,)], {}, 800),
    ("BiasAddGrad", [(8, 100)], [(100,)], {}, 800),
]


def _work(op, ins, outs, attrs):
    dtypes_in = ["int32" if op.startswith("Conv2DBackprop") and len(s) == 1 else F32 for s in ins]
    return dm.op_work(op, ins, dtypes_in, outs, [F32] * len(outs), attrs)


@pytest.mark.parametrize("op,ins,outs,attrs,flops", FLOP_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FLOP_CASES)])
def test_flops_match_hand_counts(op, ins, outs, attrs, flops):
    assert _work(op, ins, outs, attrs).flops == pytest.approx(flops, rel=1e-12)


def test_bytes_count_inputs_and_outputs():
    # conv: (x + filter + y) float32 = (131072 + 4608 + 262144) * 4
    w = _work("Conv2D", [(8, 32, 32, 16), (3, 3, 16, 32)], [(8, 32, 32, 32)], {})
    assert w.bytes == 1_591_296 and w.klass == dm.MATMUL
    # SGD on 1000 float32 parameters: read var and grad, write var = 3 * 4000
    sgd = _work("ResourceApplyGradientDescent", [(), (), (100, 10)], [], {})
    assert sgd.bytes == 12_000
    # handles move no data; reshapes and reads are host ops with no work
    read = dm.op_work("ReadVariableOp", [()], ["resource"], [(100, 10)], [F32])
    assert (read.flops, read.bytes, read.klass) == (0.0, 0.0, dm.HOST)


def test_unknown_op_type_gets_generic_cost_and_is_flagged():
    w = dm.op_work("MyCustomOp", [(4, 4)], [F32], [(4, 4)], [F32])
    assert w.flops == 16 and w.bytes == 128 and not w.known


def test_chain_graph_costs_scale_with_batch():
    g = chain_graph(4, 4096, 8)  # W = 128, reference batch 8
    i_mm, i_wgrad = g.index("op_1"), g.index("w_grad")
    for b in (8, 32):
        c = dm.op_costs(g, b)
        assert c.flops[i_mm] == 2 * b * 128 * 128       # forward MatMul [b,128] x [128,128]
        assert c.flops[i_wgrad] == 2 * 128 * 128 * b    # weight gradient, K = batch
        assert c.klass[g.index("w/read")] == dm.HOST
        assert c.flops[g.index("apply")] == 2 * 128 * 128


def test_device_table_has_the_datasheet_kinds():
    for kind, flops, bw in (("V100", 15.7e12, 900e9), ("P100", 9.3e12, 549e9), ("GTX1080Ti", 11.3e12, 484e9),
                            ("T4", 8.1e12, 320e9), ("A100", 19.5e12, 1555e9), ("H100", 67e12, 3.35e12)):
        spec = dm.device_spec(kind)
        assert (spec.peak_flops_per_s, spec.memory_bandwidth_bytes_per_s) == (flops, bw)
        assert spec.memory_bytes > 8e9 and spec.source
    assert dm.device_spec("1080Ti").kind == "GTX1080Ti"
    speeds = [dm.relative_speed(k) for k in ("CPU", "T4", "P100", "GTX1080Ti", "V100", "A100", "H100")]
    assert speeds == sorted(speeds) and dm.relative_speed("V100") == 1.0


def test_roofline_is_max_of_compute_and_memory_plus_launch():
    spec = dm.DeviceSpec("X", 1e12, 1e11, 1, compute_efficiency=0.5, memory_efficiency=0.5,
                         launch_overhead_s=1e-6, host_op_overhead_s=2e-7)
    compute_bound = dm.OpWork(1e9, 1e6, dm.MATMUL)     # 1e9 / 5e11 = 2 ms vs 1e6 / 5e10 = 20 us
    memory_bound = dm.OpWork(1e3, 1e9, dm.MEMORY)      # 20 ms of traffic
    assert dm.roofline_op_seconds(spec, compute_bound) == pytest.approx(2e-3 + 1e-6)
    assert dm.roofline_op_seconds(spec, memory_bound) == pytest.approx(2e-2 + 1e-6)
    assert dm.roofline_op_seconds(spec, dm.OpWork(0, 0, dm.HOST)) == 2e-7


def _measured_cpu(graph, batches=(4, 8, 16)):
    """A 'measured' CPU profile: the CPU roofline times x 1.7 (a fake measurement)."""
    rp = dm.roofline_profile(graph, ["CPU"], batches)
    ops = {op: {"CPU": (b, tuple(1.7 * s for s in secs))} for op, per in rp.ops.items()
           for b, secs in [per["CPU"]] if op != "input"}
    return Profile(ops=ops, graph="chain", missing_ops=("input",))


def test_derived_profile_of_faster_kind_is_faster():
    g = chain_graph(6, 1 << 20, 8)
    measured = _measured_cpu(g)
    derived = dm.derive_profile(measured, g, "CPU", ["V100", "P100"], [4, 8, 16])
    assert derived.derived == {"V100": "CPU", "P100": "CPU"}
    assert derived.missing_ops == ("input",) and "input" not in derived.ops
    work = [n for i, n in enumerate(g.names) if dm.op_costs(g, 8).klass[i] != dm.HOST and n != "input"]
    for b in (4, 8, 16):
        cpu = sum(measured.seconds(n, "CPU", b) for n in measured.ops)
        v100 = sum(derived.seconds(n, "V100", b) for n in derived.ops)
        p100 = sum(derived.seconds(n, "P100", b) for n in derived.ops)
        assert v100 < p100 < cpu
        for n in work:  # every op with work is faster on the faster device
            assert derived.seconds(n, "V100", b) <= derived.seconds(n, "P100", b) < measured.seconds(n, "CPU", b)
    # fixed cost swapped, the rest scaled by the work ratio:
    # t_V100 = launch_V100 + (t_CPU - launch_CPU) * work_V100 / work_CPU
    c = dm.op_costs(g, 8)
    (w_cpu, f_cpu), (w_v, f_v) = dm.roofline_parts(dm.device_spec("CPU"), c), dm.roofline_parts(dm.device_spec("V100"), c)
    i = g.index("op_1")
    expect = f_v[i] + (measured.seconds("op_1", "CPU", 8) - f_cpu[i]) * w_v[i] / w_cpu[i]
    assert derived.seconds("op_1", "V100", 8) == pytest.approx(expect)
    # an op without work (a variable read) scales by the fixed costs: 1.7 x the V100 host cost
    assert derived.seconds("w/read", "V100", 8) == pytest.approx(1.7 * dm.device_spec("V100").host_op_overhead_s)


def test_roofline_profile_covers_every_op_and_is_exact_at_its_points():
    g = chain_graph(3, 4096, 8)
    p = dm.roofline_profile(g, ["V100", "T4"])
    assert set(p.ops) == set(g.names) and set(p.kinds) == {"V100", "T4"}
    batches, secs = p.ops["op_1"]["T4"]
    assert batches == dm.default_batch_sizes(g) == (1, 2, 4, 8)
    for b, s in zip(batches, secs):
        assert p.seconds("op_1", "T4", b) == s


def test_default_profile_without_bundle_is_the_roofline():
    g = chain_graph(3, 4096, 8)
    assert dm.bundled_profile_path(g) is None
    p = dm.default_profile(g, ["V100", "P100"])
    assert set(p.ops) == set(g.names) and set(p.kinds) == {"V100", "P100"}


def test_interpolation_is_exact_at_measured_points():
    batches, secs = (2, 4, 8, 16), (1.0e-3, 1.9e-3, 4.2e-3, 7.9e-3)
    for b, s in zip(batches, secs):
        assert interpolate_seconds(batches, secs, b) == s
        assert profile_fit.robust_seconds(batches, secs, b) == s
    # between points: linear
    assert profile_fit.robust_seconds(batches, secs, 6) == pytest.approx((1.9e-3 + 4.2e-3) / 2)


def test_robust_extrapolation_uses_the_least_squares_slope():
    batches, secs = (4, 8, 16), (25e-3, 102e-3, 120e-3)  # noisy (as measured on a shared machine)
    a, slope = profile_fit.affine_fit(batches, secs)
    assert slope > 0 and a >= 0
    assert profile_fit.robust_seconds(batches, secs, 32) == pytest.approx(120e-3 + slope * 16)
    assert profile_fit.robust_seconds(batches, secs, 1) >= 0
    # a decreasing measurement does not extrapolate below zero or downwards
    assert profile_fit.robust_seconds((4, 8), (2e-3, 1e-3), 64) >= 1e-3
    p = Profile(ops={"x": {"CPU": (batches, secs)}})
    sm = profile_fit.smoothed(p)
    assert sm.ops["x"]["CPU"][1] == pytest.approx(tuple(a + slope * b for b in batches))


def test_bad_inputs_name_the_field():
    g = chain_graph(2, 4096, 8)
    with pytest.raises(InputError, match="kind") as e:
        dm.device_spec("TPUv9")
    assert "TPUv9" in str(e.value) and "V100" in str(e.value)
    with pytest.raises(InputError, match=r"kinds\[1\]"):
        dm.roofline_profile(g, ["V100", "K9000"])
    with pytest.raises(InputError, match="batch_size"):
        dm.op_costs(g, 0)
    with pytest.raises(InputError, match=r"batch_sizes\[1\]"):
        dm.roofline_profile(g, ["V100"], [8, 0])
    no_shapes = dataclasses.replace(g, tensor_shape=tuple(tuple(-1 for _ in s) for s in g.tensor_shape))
    with pytest.raises(InputError, match="tensor_shape") as e:
        dm.op_costs(no_shapes, 8)
    assert "op_1" in str(e.value) and "unknown dimensions" in str(e.value)
    with pytest.raises(InputError, match="from_kind"):
        dm.derive_profile(_measured_cpu(g), g, "Z80", ["V100"])
    with pytest.raises(InputError, match="no 'V100' measurements"):
        dm.derive_profile(_measured_cpu(g), g, "V100", ["P100"])


def _cluster_file(tmp_path, kinds_fractions):
    """A loopback cluster file with one device per (kind, cpu_fraction or None)."""
    import json
    from tfplace.formats.cluster import load_cluster
    host = {"name": "h", "address": "127.0.0.1", "nic_bandwidth_bytes_per_s": 2e9, "nic_latency_s": 7e-5,
            "intra_bandwidth_bytes_per_s": 2e9, "intra_latency_s": 7e-5}
    devices = []
    for i, (kind, fraction) in enumerate(kinds_fractions):
        d = {"name": f"d{i}", "kind": kind, "host": "h", "memory_bytes": 4_000_000_000, "task": i}
        if fraction is not None:
            d["emulation"] = {"cpus": [0], "cpu_fraction": fraction}
        devices.append(d)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "tfplace.cluster", "version": 1, "name": "c", "hosts": [host],
                                "devices": devices}))
    return load_cluster(str(path))


@pytest.mark.parametrize("devices, slowdowns", [
    ([("V100", None), ("P100", None)], {}),                          # the device table's kinds as they are
    ([("CPU", None), ("CPU_half", 0.5), ("CPU_half", 0.5)], {"CPU_half": 2.0}),   # clusters/local_cpu_hetero.json
    ([("CPU_quarter", 0.25), ("CPU_half", 0.5)], {"CPU_quarter": 4.0, "CPU_half": 2.0}),  # no plain CPU device
])
def test_cluster_profile_gives_quota_kinds_the_cpu_over_their_quota(tmp_path, devices, slowdowns):
    """Every command's profile without --profile (simulate, compare, plan, train, activate)."""
    graph = chain_graph(6, batch_size=8)
    cluster = _cluster_file(tmp_path, devices)
    profile = dm.cluster_profile(graph, cluster)
    plain = dm.default_profile(graph, [k for k in cluster.kinds if k not in slowdowns] + (["CPU"] if slowdowns else []))
    for op in graph.names:
        for kind in cluster.kinds:
            base = "CPU" if kind in slowdowns else kind
            assert profile.seconds(op, kind, 8) == pytest.approx(slowdowns.get(kind, 1.0) * plain.seconds(op, base, 8))
    assert dm.quota_kinds(cluster) == {k: 1.0 / s for k, s in slowdowns.items()}


@pytest.mark.parametrize("devices, field", [
    ([("V100", None), ("B300", None)], "devices[1].kind"),                  # not in the device table
    ([("CPU_half", 0.5), ("CPU_half", 0.25)], "devices[0].kind"),           # one kind, two quotas
    ([("CPU", None), ("CPU_half", None)], "devices[1].kind"),               # an unknown CPU kind with no quota
])
def test_cluster_profile_of_an_unknown_kind_names_the_cluster_file_and_asks_for_a_profile(tmp_path, devices, field):
    cluster = _cluster_file(tmp_path, devices)
    with pytest.raises(InputError) as err:
        dm.cluster_profile(chain_graph(4), cluster)
    assert err.value.source.endswith("c.json") and err.value.field == field, str(err.value)
    assert "--profile" in err.value.fix and "python -m tfplace.profile" in err.value.fix
