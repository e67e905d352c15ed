"""Profiler: per-op measurement of real training steps on this machine's CPU (single process),
the step-stats rules (GPU stream records included, on a hand-written StepStats), fused-kernel
attribution, the command line, and derived profiles of measured graphs."""

import json
import os

import numpy as np
import pytest

from tfplace.profiling import device_model, profiler

from tfplace.cli import common
from tfplace.cli import profile as profiler_cli
from tfplace.formats.errors import InputError
from tfplace.formats.profile import load_profile

tf = pytest.importorskip("tensorflow")


def _bundle(model):
    from tfplace.graph_defs.export import ZOO_DIR, ensure_bundle
    committed = {"tiny_mlp": "tiny_mlp_b16_sgd.json", "tiny_cnn": "tiny_cnn_b16_s16_sgd.json"}
    path = os.path.join(ZOO_DIR, committed[model])
    return path if os.path.exists(path) else ensure_bundle(model)


@pytest.fixture(scope="module")
def tiny_cnn_profile():
    opts = profiler.ProfileOptions(device="CPU", batch_sizes=(2, 4), repeats=2, warmup=1)
    return profiler.profile_bundle(_bundle("tiny_cnn"), opts)


# Op types that run no kernel of their own: nothing else may be missing from a profile.
NO_KERNEL = {"Placeholder"}


@pytest.mark.parametrize("model", ["tiny_mlp", "tiny_cnn"])
def test_profile_has_every_op_of_the_step(model, tiny_cnn_profile):
    from tfplace.ir.loader import load_op_graph
    path = _bundle(model)
    result = tiny_cnn_profile if model == "tiny_cnn" else profiler.profile_bundle(
        path, profiler.ProfileOptions(batch_sizes=(2, 4), repeats=2, warmup=1))
    prof = result.profile
    graph = load_op_graph(path)
    for name, op_type in zip(graph.names, graph.op_types):
        if name in prof.ops:
            batches, secs = prof.ops[name]["CPU"]
            assert batches == (2, 4) and all(s >= 0 for s in secs)
        else:
            assert name in prof.missing_ops, f"{name} ({op_type}) neither measured nor listed missing"
            assert result.missing_reasons[name]
            assert op_type in NO_KERNEL, f"compute op {name} ({op_type}) missing: {result.missing_reasons[name]}"
    assert set(prof.ops) | set(prof.missing_ops) == set(graph.names)
    c = prof.conditions
    for key in ("tf_version", "repeats", "statistic", "cpu_model", "date", "intra_op_threads", "step_wall_s"):
        assert key in c
    assert c["statistic"] == "min" and prof.graph == os.path.basename(path).split(".json")[0].replace("_b16", "")


@pytest.mark.parametrize("times_us,untraced_us,expected_us", [
    ([10, 10, 10], 30, 0.0),              # the records already add up to the untraced step
    ([10, 10, 10], 40, 0.0),              # never raised: the rest is not the ops'
    ([10, 10, 10], 24, 2.0),              # 3 x (10 - 2) = 24
    ([1, 5, 20], 20, 2.55),               # 1 stops at its floor 0.1: 0.1 + (5 - 2.55) + (20 - 2.55) = 20
    ([2, 2, 2], 1, 2 - 1 / 3),            # 3 x (2 - 5/3) = 1
    ([2, 2, 2], 0.3, 2.0),                # below every floor (0.2 each): the largest useful cost
    ([10, 10, 10], 0, 0.0),               # no information (untraced no slower than the empty step)
])
def test_trace_cost_per_op(times_us, untraced_us, expected_us):
    times = [t * 1e-6 for t in times_us]
    tau = profiler.trace_cost_per_op(times, untraced_us * 1e-6)
    corrected = sum(max(t - tau, profiler.TRACE_FLOOR_FRACTION * t) for t in times)
    reachable = profiler.TRACE_FLOOR_FRACTION * sum(times_us) < untraced_us < sum(times_us)
    assert tau == pytest.approx(expected_us * 1e-6, abs=1e-9)
    if reachable:
        assert corrected == pytest.approx(untraced_us * 1e-6, abs=1e-9)   # the sums agree


def test_profile_removes_the_tracing_cost_on_a_serial_cpu(tiny_cnn_profile):
    c = tiny_cnn_profile.profile.conditions
    for b in ("2", "4"):
        assert c["untraced_step_wall_s"][b] > 0 and c["empty_step_wall_s"][b] > 0
        assert c["sum_of_ops_s"][b] <= c["traced_sum_of_ops_s"][b]
    assert c["trace_cost_per_op_s"] >= 0 and "removed" in c["trace_calibration"]
    assert set(tiny_cnn_profile.untraced_step_wall_s) == {2, 4}
    raw = profiler.profile_bundle(_bundle("tiny_mlp"), profiler.ProfileOptions(
        batch_sizes=(2,), repeats=2, warmup=1, trace_calibration=False)).profile.conditions
    assert raw["trace_calibration"] == "off" and raw["sum_of_ops_s"] == raw["traced_sum_of_ops_s"]
    par = profiler.profile_bundle(_bundle("tiny_mlp"), profiler.ProfileOptions(
        batch_sizes=(2,), repeats=2, warmup=1, inter_threads=2)).profile.conditions
    assert par["trace_calibration"].startswith("none") and par["sum_of_ops_s"] == par["traced_sum_of_ops_s"]


def test_fused_kernels_are_split_among_their_ops():
    """oneDNN fuses Conv2D + BiasAdd into one kernel named after the BiasAdd; the Conv2D must
    still get a time (its roofline share), never silently 0."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 16, 16, 8], name="x")
        w = v1.get_variable("w", [3, 3, 8, 16], use_resource=True)
        b = v1.get_variable("b", [16], use_resource=True, initializer=v1.zeros_initializer())
        y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME", name="conv"), b, name="bias"))
        loss = tf.identity(tf.reduce_mean(y), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        init = v1.variables_initializer(v1.global_variables(), name="init")
    meta = {"sink": "train_op", "init_op": init.name, "loss": "loss",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 16, 16, 8], "batch_axis": 0}]}
    res = profiler.profile_graph(g.as_graph_def(), meta, profiler.ProfileOptions(batch_sizes=(4,), repeats=2, warmup=1))
    ops = res.profile.ops
    assert "conv" in ops and "bias" in ops and res.profile.missing_ops == ("x",)
    fused = res.profile.conditions["fused"]
    if fused:  # oneDNN on: the conv's share is most of the fused kernel's time
        assert fused == {"conv": "bias"}
        assert ops["conv"]["CPU"][1][0] > ops["bias"]["CPU"][1][0] > 0


def _node(step_stats_dev, name, micros):
    ns = step_stats_dev.node_stats.add()
    ns.node_name, ns.all_end_rel_micros = name, micros


def test_step_stats_rules_for_gpu_streams():
    from tensorflow.core.framework import step_stats_pb2
    ss = step_stats_pb2.StepStats()
    gpu = ss.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0")
    _node(gpu, "conv", 12)        # launch record: replaced by the kernels below
    _node(gpu, "shape", 3)        # host-only op on the GPU device: kept
    streams = ss.dev_stats.add(device="/device:GPU:0/stream:all")
    _node(streams, "conv:Conv2D", 100)
    _node(streams, "conv:Conv2D", 50)   # two kernels of one op in one step: summed
    one_stream = ss.dev_stats.add(device="/device:GPU:0/stream:7")
    _node(one_stream, "conv:Conv2D", 100)  # per-stream duplicate: ignored
    memcpy = ss.dev_stats.add(device="/device:GPU:0/memcpy")
    _node(memcpy, "x", 40)
    cpu = ss.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    _node(cpu, "_SOURCE", 1)
    _node(cpu, "loss:0", 7)
    out = profiler.op_seconds_from_step_stats(ss, known={"conv", "shape", "loss", "x"})
    assert out == pytest.approx({"conv": 150e-6, "shape": 3e-6, "loss": 7e-6})


def _started(step_stats_dev, name, start_us):
    ns = step_stats_dev.node_stats.add()
    ns.node_name, ns.all_start_micros = name, start_us


@pytest.mark.parametrize("records,known,expected", [
    ([("a", 5), ("b", 3), ("c", 9)], None, ["b", "a", "c"]),               # by start time
    ([("a", 5), ("b", 5), ("c", 1)], None, ["c", "a", "b"]),               # ties: record order
    ([("_SOURCE", 0), ("a:0", 4), ("b", 2)], {"a", "b"}, ["b", "a"]),      # normalised, filtered
    ([("a", 2), ("a", 9), ("b", 4)], None, ["a", "b"]),                    # an op's first record
])
def test_op_start_order(records, known, expected):
    from tensorflow.core.framework import step_stats_pb2
    ss = step_stats_pb2.StepStats()
    dev = ss.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    for name, start in records:
        _started(dev, name, start)
    assert profiler.op_start_order(ss, known=known) == expected


@pytest.mark.parametrize("order,fused,expected", [
    (["a", "b"], {}, ["a", "b"]),
    (["a", "bias", "c"], {"conv": "bias"}, ["a", "conv", "bias", "c"]),       # just before its kernel
    (["relu", "c"], {"conv": "relu", "bias": "relu"}, ["conv", "bias", "relu", "c"]),
    (["a"], {"conv": "gone"}, ["a"]),                                        # its kernel never ran
])
def test_run_order_puts_a_fused_op_before_its_kernel(order, fused, expected):
    assert profiler.run_order_with_fused(order, fused) == expected


@pytest.mark.parametrize("base,extra,expected", [
    (("a", "b"), ("b", "a"), ("a", "b")),   # the base profile's order is kept
    ((), ("b", "a"), ("b", "a")),           # else the added kinds'
    ((), (), ()),
])
def test_merged_profiles_keep_one_run_order(base, extra, expected):
    from tfplace.formats.profile import Profile
    merged = profiler.merge_profiles(Profile(ops={}, run_order=base), Profile(ops={}, run_order=extra))
    assert merged.run_order == expected


def test_run_order_is_every_op_of_the_step_after_its_inputs(tiny_cnn_profile):
    from tfplace.ir.loader import load_op_graph
    prof = tiny_cnn_profile.profile
    graph = load_op_graph(_bundle("tiny_cnn"))
    order = prof.run_order
    assert len(set(order)) == len(order) and set(order) == set(prof.ops)
    at = {op: i for i, op in enumerate(order)}
    checked = 0
    for s, d in zip(graph.tensor_op[graph.edge_tensor], graph.edge_dst):
        a, b = graph.names[s], graph.names[d]
        if a in at and b in at:
            assert at[a] < at[b], f"{b} started before its input {a}"
            checked += 1
    assert checked > 50


def test_reduce_samples_and_statistics():
    samples = [{"a": 3.0, "b": 1.0}, {"a": 1.0}, {"a": 2.0, "b": 5.0}]
    assert profiler.reduce_samples(samples, "min") == {"a": 1.0, "b": 1.0}
    assert profiler.reduce_samples(samples, "median") == {"a": 2.0, "b": 3.0}
    # mean: the expected cost, stalls included (a CPU quota's stall lands in one op of one step)
    assert profiler.reduce_samples([{"a": 1.0}, {"a": 1.0}, {"a": 7.0}], "mean") == {"a": 3.0}


@pytest.mark.parametrize("batch_sizes,repeats,phase_start,phase_len", [
    ((1, 2, 4, 8), 5, 15, 5),    # the last size's five repeats, were they timed size after size
    ((1, 2, 4, 8), 9, 0, 16),    # four passes of nine from the start
    ((2, 4), 9, 7, 8),           # four passes in the middle
    ((8,), 5, 3, 2),             # one size: two of five
])
def test_measurement_order_lets_the_median_drop_a_slow_phase(batch_sizes, repeats, phase_start, phase_len):
    """A phase of the machine slows a contiguous stretch of the timed steps 3.4x (ResNet-50's
    conv5 kernels in one run). Round-robin, it covers fewer than half of each size's repeats
    and every median stays the undisturbed time; size after size, the same stretch takes all
    repeats of the sizes it falls on."""
    order = profiler.measurement_order(batch_sizes, repeats)
    assert sorted(order) == sorted((r, b) for r in range(repeats) for b in batch_sizes)  # each once

    def medians(sequence):
        times = {b: [] for b in batch_sizes}
        for i, (_, b) in enumerate(sequence):
            times[b].append(3.4 * b if phase_start <= i < phase_start + phase_len else float(b))
        return {b: float(np.median(t)) for b, t in times.items()}

    assert medians(order) == {b: float(b) for b in batch_sizes}
    size_after_size = [(r, b) for b in batch_sizes for r in range(repeats)]
    if len(batch_sizes) > 1:
        assert medians(size_after_size) != {b: float(b) for b in batch_sizes}


def test_synthetic_feed_respects_dtype_shape_and_range():
    rng = np.random.default_rng(0)
    feed = profiler.synthetic_feed([
        {"name": "img", "dtype": "float32", "shape": [-1, 4, 4, 3], "batch_axis": 0},
        {"name": "tok", "dtype": "int32", "shape": [7, -1], "batch_axis": 1, "max_value": 5},
    ], 6, rng)
    assert feed["img:0"].shape == (6, 4, 4, 3) and feed["img:0"].dtype == np.float32
    assert feed["tok:0"].shape == (7, 6) and feed["tok:0"].dtype == np.int32
    assert feed["tok:0"].min() >= 0 and feed["tok:0"].max() < 5


def test_measured_profile_derives_faster_gpu_profiles(tiny_cnn_profile):
    from tfplace.ir.loader import load_op_graph
    graph = load_op_graph(_bundle("tiny_cnn"))
    measured = tiny_cnn_profile.profile
    derived = device_model.derive_profile(measured, graph, "CPU", ["V100", "P100"])
    conv = "conv_0/Conv2D"
    assert derived.seconds(conv, "V100", 4) < derived.seconds(conv, "P100", 4) < measured.seconds(conv, "CPU", 4)
    merged = profiler.merge_profiles(measured, derived)
    assert set(merged.kinds) == {"CPU", "V100", "P100"} and merged.derived == {"V100": "CPU", "P100": "CPU"}
    small = profiler.rounded(merged, 3)
    s = small.ops[conv]["V100"][1][0]
    assert s == float(f"{s:.3g}")


def test_cli_writes_a_profile_with_derived_kinds(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = common.call(profiler_cli, ["--graph", _bundle("tiny_mlp"), "--batch-sizes", "2,4", "--repeats", "1",
                                    "--warmup", "0", "--derive", "V100,1080Ti", "--quiet", "--out", str(out)])
    assert rc == 0
    prof = load_profile(out)
    # an alias is written as the device model's kind, the name cluster files use
    assert set(prof.kinds) == {"CPU", "V100", "GTX1080Ti"}
    assert prof.derived == {"V100": "CPU", "GTX1080Ti": "CPU"}
    assert "measured" in capsys.readouterr().out
    raw = json.loads(out.read_text())
    assert raw["conditions"]["by_kind"]["CPU"]["repeats"] == 1
    # measured with malloc set as the servers run (tfplace.emulation.allocator), and the profile says so
    # (every setting where the C library is glibc; no entry where it sets none)
    from tfplace.emulation.allocator import steady_allocator
    assert raw["conditions"].get("allocator", {}) == steady_allocator()


def test_scaled_kind_multiplies_one_kind_only():
    from tfplace.formats.profile import Profile
    prof = Profile(ops={"a": {"CPU": ((1, 2), (1.0, 2.0)), "CPU_half": ((1, 2), (1.0, 3.0))}})
    got = profiler.scaled_kind(prof, "CPU_half", 2.5)
    assert got.ops["a"]["CPU_half"] == ((1, 2), (2.5, 7.5)) and got.ops["a"]["CPU"] == ((1, 2), (1.0, 2.0))
    with pytest.raises(InputError, match="factor"):
        profiler.scaled_kind(prof, "CPU_half", 0.0)


def test_cli_cpu_fraction_scales_unlimited_op_times_by_the_measured_throttle(tmp_path, monkeypatch):
    # The ops are timed without the quota (this process is never limited) and multiplied by the
    # slowdown measured under it; the conditions say so. The probe itself is tested in
    # test_cpu_quota; here it reports a fixed 2.5 so that the scaling can be checked exactly.
    from tfplace.emulation import cpu_quota
    calls, raw = [], {}
    monkeypatch.setattr(cpu_quota, "measure_throttle", lambda fraction, cpus=None: calls.append((fraction, cpus)) or 2.5)
    measure = profiler.profile_bundle

    def keep(*a, **k):
        raw["result"] = measure(*a, **k)
        return raw["result"]
    monkeypatch.setattr(profiler, "profile_bundle", keep)
    out = tmp_path / "p.json"
    rc = common.call(profiler_cli, ["--graph", _bundle("tiny_mlp"), "--batch-sizes", "2", "--repeats", "1",
                                    "--warmup", "0", "--kind", "CPU_half", "--cpu-fraction", "0.5", "--quiet",
                                    "--out", str(out)])
    monkeypatch.undo()
    assert rc == 0 and calls == [(0.5, None)]
    emulation = json.loads(out.read_text())["conditions"]["emulation"]
    assert emulation["throttle_wall_per_cpu_s"] == 2.5 and emulation["effective_cpu_fraction"] == 0.4
    assert emulation["cpu_fraction"] == 0.5 and emulation["cpu_period_us"] == 4000
    written, measured = load_profile(out), raw["result"].profile
    for op in measured.ops:
        assert written.seconds(op, "CPU_half", 2) == pytest.approx(2.5 * measured.seconds(op, "CPU_half", 2), rel=1e-3)


@pytest.mark.parametrize("args,field,hint", [
    (["--batch-sizes", "0,4"], "--batch-sizes", "Fix:"),    # checked when the flags are parsed
    (["--batch-sizes", "4,x"], "--batch-sizes", "Fix:"),
    (["--repeats", "0"], "--repeats", "positive"),
    (["--out", "no_such_folder/p.json"], "no_such_folder", "Fix:"),
    (["--device", "TPU:0"], "device", "Fix:"),              # checked by ProfileOptions
    (["--device", "GPU"], "kind", "Fix:"),
])
def test_cli_bad_arguments_name_the_field(tmp_path, capsys, args, field, hint):
    rc = common.call(profiler_cli, ["--graph", _bundle("tiny_mlp"), "--quiet", "--out", str(tmp_path / "p.json")]
                     + args)
    err = capsys.readouterr().err
    assert rc == 2 and field in err and hint in err and len(err.strip().splitlines()) == 1, err


def test_cli_missing_graph_file(tmp_path, capsys):
    rc = common.call(profiler_cli, ["--graph", str(tmp_path / "nope.json"), "--quiet",
                                    "--out", str(tmp_path / "p.json")])
    assert rc == 2 and "nope.json" in capsys.readouterr().err


def test_options_validation():
    with pytest.raises(InputError, match="statistic"):
        profiler.ProfileOptions(statistic="max").validated()
    assert profiler.ProfileOptions(device="gpu:1", kind="V100").validated().device == "/device:GPU:1"
    assert profiler.ProfileOptions(batch_sizes=(8, 2, 8)).validated().batch_sizes == (2, 8)


def test_kernel_replay_op_table_and_profile():
    """The GPU replay's TensorFlow-side halves: the op table carries shapes and small constants;
    a replay result becomes a profile keyed by the GPU kind with host ops missing."""
    from tfplace.profiling import kernel_replay
    from tfplace.ir.loader import load_op_graph
    graph = load_op_graph(_bundle("tiny_cnn"))
    table = kernel_replay.export_op_table(graph)
    by_name = {op["name"]: op for op in table["ops"]}
    assert len(table["ops"]) == graph.num_ops and table["reference_batch_size"] == 16
    conv = by_name["conv_0/Conv2D"]
    assert conv["in"][0][0] == [16, 16, 16, 3] and conv["in"][0][2] == 0 and conv["attrs"]["padding"] == "SAME"
    means = [op for op in table["ops"] if op["type"] == "Mean"]
    assert means and all(op["in"][1][3] is not None for op in means)  # reduction axes are constants
    assert table["graph"] == "tiny_cnn_s16_sgd"  # as the profiler names it: no batch part
    result = {"graph": table["graph"], "device": "NVIDIA H100", "batch_sizes": [4, 8],
              "seconds": {"conv_0/Conv2D": {"4": 2e-6, "8": 3e-6}}, "skipped": {"images": "host op: no device kernel"}}
    prof = kernel_replay.replay_to_profile(result, "H100")
    assert prof.ops["conv_0/Conv2D"]["H100"] == ((4, 8), (2e-6, 3e-6))
    assert prof.missing_ops == ("images",) and prof.conditions["device"] == "NVIDIA H100"


@pytest.mark.parametrize("stem, name", [
    ("tiny_cnn_b16_s16_sgd", "tiny_cnn_s16_sgd"),   # a zoo bundle: the batch is a profile's key, not its name
    ("mystep_0123456789ab", "mystep"),              # a bare step's cached bundle: without the cache's hash
])
def test_every_profile_maker_names_the_graph_alike(stem, name, tmp_path):
    """profile --merge and the lowering's "profile of another graph" compare these names: the
    profiler, the device model and the kernel replay's op table must agree."""
    import dataclasses
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling import device_model, kernel_replay
    graph = dataclasses.replace(load_op_graph(_bundle("tiny_cnn")), source=str(tmp_path / f"{stem}.json"))
    assert profiler.graph_name(graph.source) == name
    assert kernel_replay.export_op_table(graph)["graph"] == name
    assert device_model.roofline_profile(graph, ["V100"]).graph == name


@pytest.mark.parametrize("keys", [{"format": "tfplace.profiling.kernel_replay_ops", "version": 1},
                                  {}])  # a table written before the files carried format and version
def test_kernel_replay_op_table_reads_back(tmp_path, keys):
    from tfplace.profiling import kernel_replay
    from tfplace.ir.loader import load_op_graph
    table = kernel_replay.export_op_table(load_op_graph(_bundle("tiny_mlp")))
    assert (table["format"], table["version"]) == (kernel_replay.OPS_FORMAT, kernel_replay.VERSION)
    table = {**{k: v for k, v in table.items() if k not in ("format", "version")}, **keys}
    path = tmp_path / "ops.json"
    path.write_text(json.dumps(table))
    assert kernel_replay.read_op_table(str(path)) == table


@pytest.mark.parametrize("keys", [{"format": "tfplace.profiling.kernel_replay", "version": 1},
                                  {"format": "tfplace.profiling.kernel_replay"},  # written before the version
                                  {}])
def test_kernel_replay_result_reads_back(tmp_path, keys):
    from tfplace.profiling import kernel_replay
    result = {**keys, "graph": "tiny_cnn_s16_sgd", "device": "NVIDIA H100",
              "seconds": {"conv_0/Conv2D": {"4": 2e-6, "8": 3e-6}}, "skipped": {"images": "host op: no device kernel"}}
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(result))
    assert kernel_replay.read_replay_result(str(path)) == result


@pytest.mark.parametrize("profiled, applied, noted", [
    ("graph_defs/zoo/tiny_cnn_b16_s16_sgd.json", "x/tiny_cnn_b64_s16_sgd.json", False),   # another batch: same graph
    ("graph_defs/zoo/tiny_cnn_b16_s16_sgd.json", "x/tiny_cnn_b16_s64_sgd.json", True),    # another image size
    ("graph_defs/zoo/tiny_cnn_b16_s16_sgd.json", "x/tiny_cnn_b16_s16_adam.json", True),   # another optimizer
    ("cache/step_0123456789ab.json", "work/step.pb", False),  # a bare step, imported for the profile
    ("cache/step_0123456789ab.json", "work/other.pb", True),
])
def test_a_profile_of_another_graph_is_noted(profiled, applied, noted):
    from tfplace.formats.profile import Profile
    profile = Profile(ops={}, graph=profiler.graph_name(profiled))
    note = profiler.profile_graph_note(profile, applied, "p.json")
    assert bool(note) == noted, note
    if noted:
        assert note.startswith(f"note: the profile p.json was measured on graph {profile.graph!r}")


@pytest.mark.parametrize("ops, missing_ops, noted", [
    ({"a": {}, "b": {}}, (), True),     # covers the graph's ops: applied, with the note
    ({"a": {}}, ("b",), True),          # b listed as unmeasured: still this profile's business
    ({"a": {}}, (), False),             # lacks b: the lowering refuses it, a note would contradict that
])
def test_no_note_that_a_profile_is_applied_when_it_lacks_ops_of_the_graph(ops, missing_ops, noted):
    from tfplace.formats.profile import Profile
    profile = Profile(ops=ops, graph="other_model", missing_ops=missing_ops)
    assert bool(profiler.profile_graph_note(profile, "x/step.json", "p.json", ("a", "b"))) == noted


def test_a_placeholder_the_batch_feed_cannot_fill_is_refused_before_measuring():
    """The profiler feeds the batch only: a required keep_prob is one InputError naming it and
    the fix (was TensorFlow's 'You must feed a value for placeholder tensor' traceback)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        keep = v1.placeholder(tf.float32, [], name="keep_prob")
        w = v1.get_variable("w", [4, 2], use_resource=True)
        loss = tf.reduce_mean(tf.nn.dropout(tf.matmul(x, w), rate=1.0 - keep), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        v1.global_variables_initializer()  # the op "init"
    meta = {"sink": "train", "init_op": "init", "loss": "loss",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4], "batch_axis": 0}]}
    with pytest.raises(InputError, match=r"step.pb: placeholders: 'keep_prob' must be fed.*placeholder_with_default"):
        profiler.profile_graph(g.as_graph_def(), meta, profiler.ProfileOptions(batch_sizes=(2,), repeats=1, warmup=0),
                               source="step.pb")


class _Measuring(Exception):
    """Raised where the command would start measuring."""


@pytest.mark.parametrize("out_holds, refused", [
    ('{"format": "tfplace.profile", "version": 1, "graph": "tiny_cnn_s16_sgd", "ops": {"images": {"CPU": '
     '{"8": 0.001}}}}', "--merge would add graph 'tiny_mlp_sgd' to a profile of graph 'tiny_cnn_s16_sgd'"),
    ('{"format": "tfplace.profile", "ops": {', "not valid JSON"),
    # the same graph's other batch sizes or kinds, or a comm-only file: merged into
    ('{"format": "tfplace.profile", "version": 1, "graph": "tiny_mlp_sgd", "ops": {"x": {"V100": {"8": 0.001}}}}',
     None),
    ('{"format": "tfplace.profile", "version": 1, "graph": "", "ops": {}}', None),
])
def test_merge_reads_and_checks_the_existing_out_before_measuring(tmp_path, monkeypatch, capsys, out_holds, refused):
    def measuring(*args, **kwargs):
        raise _Measuring()
    monkeypatch.setattr(profiler, "profile_bundle", measuring)
    out = tmp_path / "p.json"
    out.write_text(out_holds)
    argv = ["--graph", _bundle("tiny_mlp"), "--batch-sizes", "8", "--merge", "--quiet", "--out", str(out)]
    if refused is None:
        with pytest.raises(_Measuring):
            common.call(profiler_cli, argv)
        return
    assert common.call(profiler_cli, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and refused in err[0], err
    assert out.read_text() == out_holds


@pytest.mark.parametrize("steps, last_line", [
    # work that started before the bar: its own elapsed seconds set the bar's clock (and so the time left)
    ([("to", 4, 2.0)], "search [###########                 ]  40%     2s elapsed, ~3s left  n"),
    ([("to", 4, 60.0), ("add", 2, None)], "search [#################           ]  60%    60s elapsed, ~40s left  n"),
    # clipped to the total
    ([("to", 25, 9.0)], "search [############################] 100%     9s elapsed, ~0s left  n"),
])
def test_a_progress_bar_takes_the_work_done_and_elapsed_seconds_of_work_it_did_not_start(steps, last_line):
    import io
    text = io.StringIO()
    bar = profiler.ProgressBar(10, "search", stream=text, min_interval_s=0.0)
    for how, amount, elapsed_s in steps:
        if how == "to":
            bar.update_to(amount, "n", elapsed_s=elapsed_s)
        else:
            bar.update(amount, "n")
    assert text.getvalue().splitlines()[-1] == last_line
