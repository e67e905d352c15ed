"""Simulator tests: hand-computed step times, physical invariants, fast == reference, memory,
OOM, stragglers and the trace. Graphs and clusters come from sim_fakes (hand-built, no TF)."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfplace import testing
from tfplace.profiling.device_model import device_spec
from tfplace.baselines.problem import make_problem
from tfplace.formats.cluster import Device, Host, build_cluster
from tfplace.formats.errors import InputError
from tfplace.lowering.lower import Lowerer, lower
from tfplace.formats.profile import CommModel, LinearCost, Profile
from tfplace.simulator import SimOptions, schedule, simulate, write_trace
from tfplace.formats.strategy import Strategy, decision

from tfplace.simulator import fakes as fk

INTRA_BW, LAT = 1.2e10, 5e-6          # pair_cluster links (bytes/s, s)
W = 1_200_000                         # dp_graph weight / gradient bytes
P100_BW = (device_spec("P100").memory_bandwidth_bytes_per_s   # a copy on the P100 (datasheet
           * device_spec("P100").memory_efficiency)           # peak x streaming efficiency)
V100_BW = device_spec("V100").memory_bandwidth_bytes_per_s * device_spec("V100").memory_efficiency


def _dp_setup(sync="allreduce", ps=None, shares=None):
    g = fk.dp_graph(W)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    st = Strategy(8, 2, decision(shares or {"v100_0": 6, "p100_0": 2}, sync, ps), {})
    return g, gr, st


def _fork_join():
    # x -> a -> (b, c) -> d; c alone on the P100, everything else on the V100. 8000-byte tensors.
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("b", "Op", 8000, True, True),
           ("c", "Op", 8000, True, True), ("d", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    secs = {"x": 0.0, "a": 1e-3, "b": 2e-3, "c": 3e-3, "d": 1e-3}
    pr = fk.profile_table(g, {n: {"V100": s, "P100": s} for n, s in secs.items()})
    gr = fk.grouping(g, [["x", "a", "b", "d"], ["c"]])
    st = Strategy(8, 2, None, {"x": decision({"v100_0": 8}), "c": decision({"p100_0": 8})})
    return g, gr, pr, st


def _hand_cases():
    cases = []
    # 1. chain on one device: the sum of its 12 ops at 1 ms each.
    g = testing.chain_graph(3, 4096, 8)
    cases.append(("chain_one_device", g, fk.grouping(g), testing.uniform_profile(g, ["V100", "P100"], 1e-3),
                  Strategy(8, 1, decision({"v100_0": 8}), {}), 12e-3))
    # 2. fork-join: a (1 ms), then b (2 ms) on the V100 while a's 8000 bytes go to the P100
    #    (5 µs + 8000 / 12e9 s), c runs 3 ms there and its output comes back the same way; d 1 ms.
    g, gr, pr, st = _fork_join()
    hop = LAT + 8000 / INTRA_BW
    cases.append(("fork_join_two_devices", g, gr, pr, st, 1e-3 + hop + 3e-3 + hop + 1e-3))
    # 3. DP on unequal devices, all-reduce: V100 runs f+g on 6 samples at 0.1 ms/sample (1.2 ms),
    #    P100 on 2 samples at 0.2 ms/sample (0.8 ms); the 2-ring all-reduce of W bytes takes
    #    2(n-1)/n * W / 12e9 + 2(n-1) * 5 µs = 0.11 ms; then apply (0.1 ms) on each holder. The
    #    P100's 2 samples of x (2000 bytes) come from the feed device, the V100, first (5.2 µs:
    #    hidden, the P100 is the faster to finish anyway); the step ends when the P100's "done"
    #    reaches the V100 (5 µs). Before the all-reduce each device multiplies its partial by its
    #    aggregation weight (6/8, 2/8; tfplace.rewrite.graph_rewrite "weights"): 5 µs launch + W read and W
    #    written at its memory bandwidth, on the V100 after its 1.2 ms.
    g, gr, st = _dp_setup()
    cases.append(("dp_unequal_allreduce", g, gr, fk.dp_profile(g), st,
                  1.2e-3 + 5e-6 + 2 * W / V100_BW + W / INTRA_BW + 2 * LAT + 1e-4 + LAT))
    # 4. Same with a PS on the P100: the V100's partial goes over (5 µs + W / 12e9), the P100
    #    sums two partials (5 µs launch + 3 * W / P100 bandwidth), applies (0.1 ms) and sends w
    #    back to the V100 (5 µs + W / 12e9); the control edge apply -> train_op's V100 mirror and
    #    the P100's "done" are empty messages on the same link, queued behind it (5 µs each).
    #    Before the sum the P100 weights the V100's partial (5 µs + W read and written at its
    #    bandwidth; its own partial's weighting runs right after its g, long before).
    g, gr, st = _dp_setup("ps", "p100_0")
    xfer = LAT + W / INTRA_BW
    cases.append(("dp_unequal_ps", g, gr, fk.dp_profile(g), st,
                  1.2e-3 + xfer + 5e-6 + 2 * W / P100_BW + 5e-6 + 3 * W / P100_BW + 1e-4 + xfer + LAT + LAT))
    return cases


@pytest.mark.parametrize("name,graph,grouping,profile,strategy,expected_s", _hand_cases(),
                         ids=[c[0] for c in _hand_cases()])
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_hand_computed_step_times(name, graph, grouping, profile, strategy, expected_s, engine):
    cluster = fk.pair_cluster()
    report = simulate(lower(graph, grouping, cluster, strategy, profile), cluster, SimOptions(engine=engine))
    assert report.iteration_time_s == pytest.approx(expected_s, rel=1e-9)


def test_ps_slower_than_allreduce_here():
    # With the numbers above, the PS pays an extra hop back: PS - AR = sum + send-back - latency.
    cluster, times = fk.pair_cluster(), {}
    for sync, ps in (("allreduce", None), ("ps", "p100_0")):
        g, gr, st = _dp_setup(sync, ps)
        times[sync] = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster).iteration_time_s
    assert times["ps"] > times["allreduce"]


# ---- invariants ------------------------------------------------------------------------------
@pytest.mark.parametrize("num_ops", [1, 3, 10])
@pytest.mark.parametrize("device", ["v100_0", "p100_0"])
def test_one_device_equals_sum_of_compute(num_ops, device):
    g = testing.chain_graph(num_ops, 4096, 8)
    cluster = fk.pair_cluster()
    placed = lower(g, fk.grouping(g), cluster, Strategy(8, 1, decision({device: 8}), {}),
                   testing.uniform_profile(g, ["V100", "P100"], 2e-4))
    report = simulate(placed, cluster)
    assert placed.num_tasks == placed.num_compute  # nothing to move or combine
    assert report.iteration_time_s == pytest.approx(placed.task_seconds.sum(), rel=1e-12)
    assert max(report.busy_s) == pytest.approx(report.iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("shares", [{"v100_0": 8}, {"v100_0": 4, "p100_0": 4}, {"v100_0": 6, "p100_0": 2},
                                    {"v100_0": [3, 3], "p100_0": 2}, {"p100_0": 8}])
@pytest.mark.parametrize("sync", ["allreduce", "ps"])
def test_never_faster_than_compute_over_total_speed(shares, sync):
    # Alone, a device processes r = 1 / (seconds of f + g per sample) samples/s: V100 5000/s,
    # P100 2500/s; no split of 8 samples can beat 8 / 7500 s.
    g, gr, st = _dp_setup(sync, "p100_0" if sync == "ps" else None, shares)
    cluster = fk.pair_cluster()
    t = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster).iteration_time_s
    assert t >= 8 / (1 / 2e-4 + 1 / 4e-4) - 1e-15


@pytest.mark.parametrize("num_devices", [2, 3, 4])
def test_never_below_allreduce_bound(num_devices):
    # Ring all-reduce of S bytes over n ranks whose slowest link has B bytes/s takes at least
    # 2(n-1)/n * S / B (nccl-tests PERFORMANCE.md); here B is the 1.25 GB/s NIC between hosts.
    g = fk.dp_graph(40_000_000)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    cluster = fk.quad_cluster()
    names = cluster.device_names[:num_devices]
    st = Strategy(8, 2, decision({n: 8 // num_devices + (i < 8 % num_devices) for i, n in enumerate(names)}), {})
    prof = fk.profile_table(g, {n: {"V100": 1e-4} for n in g.names})
    t = simulate(lower(g, gr, cluster, st, prof), cluster).iteration_time_s
    b_min = 1.25e9 if num_devices > 2 else 1.2e10
    assert t >= 2 * (num_devices - 1) / num_devices * 40_000_000 / b_min


def _strategies_for_bandwidth():
    return [("dp_allreduce", None), ("dp_ps", "p100_0"), ("model_parallel", "mp")]


@pytest.mark.parametrize("label,ps", _strategies_for_bandwidth())
@pytest.mark.parametrize("scale", [1.5, 2.0, 10.0])
def test_more_bandwidth_never_slower(label, ps, scale):
    if label == "model_parallel":
        g, gr, prof, st = _fork_join()
    else:
        g, gr, st = _dp_setup("ps" if ps else "allreduce", ps)
        prof = fk.dp_profile(g)
    slow, fast = fk.pair_cluster(bandwidth=1e9), fk.pair_cluster(bandwidth=1e9 * scale)
    t_slow = simulate(lower(g, gr, slow, st, prof), slow).iteration_time_s
    t_fast = simulate(lower(g, gr, fast, st, prof), fast).iteration_time_s
    assert t_fast <= t_slow


@pytest.mark.parametrize("shares_of", [lambda b: {"v100_0": b}, lambda b: {"v100_0": b // 2, "p100_0": b // 2},
                                       lambda b: {"v100_0": [b // 4, b - b // 4]}])
def test_peak_memory_monotone_in_batch(shares_of):
    g = testing.chain_graph(4, 512, 8)  # small weight (1 KiB), so activations decide the peak
    cluster = fk.pair_cluster()
    prof = testing.uniform_profile(g, ["V100", "P100"], 1e-4)
    low = Lowerer(g, fk.grouping(g), cluster, prof)
    peaks = [np.array(simulate(low.lower(Strategy(b, 1, decision(shares_of(b)), {})), cluster).peak_memory_bytes)
             for b in (8, 16, 32, 64)]
    for a, b in zip(peaks, peaks[1:]):
        assert (b >= a).all()
    assert peaks[-1].sum() > peaks[0].sum()


def test_oom_is_a_result_on_a_cluster_too_small():
    g = testing.chain_graph(4, 4096, 8)  # a 64 KiB weight alone does not fit in 50 kB
    cluster = fk.pair_cluster(memory=(50_000, 10**9))
    st = Strategy(8, 1, decision({"v100_0": 4, "p100_0": 4}), {})
    report = simulate(lower(g, fk.grouping(g), cluster, st, testing.uniform_profile(g, ["V100", "P100"])), cluster)
    assert report.oom and report.oom_devices == ("v100_0",)
    assert report.peak_memory_bytes[0] > 50_000 and report.iteration_time_s > 0
    fits = fk.pair_cluster(memory=(10**9, 10**9))
    assert not simulate(lower(g, fk.grouping(g), fits, st, testing.uniform_profile(g, ["V100", "P100"])), fits).oom


def test_peak_memory_hand_computed():
    # One device, chain of 1: static 64 KiB weight; live at most input (4096) + op_1 output
    # (4096) + loss_grad (4096) + ... computed by hand below from the schedule order:
    # input, w, w/read, lr, op_1, loss, loss_grad, w_grad, apply, train_op (1 ms each).
    g = testing.chain_graph(1, 4096, 8)
    cluster = fk.pair_cluster()
    placed = lower(g, fk.grouping(g), cluster, Strategy(8, 1, decision({"v100_0": 8}), {}),
                   testing.uniform_profile(g, ["V100", "P100"], 1e-3))
    report = simulate(placed, cluster)
    # While w_grad runs: input (read by w_grad), loss_grad (read by w_grad), w_grad's output
    # (65536, read by apply), lr (4) and the w handle (alias, 0) are live; op_1 and loss are
    # freed when loss_grad finished. Peak = 65536 static + 4096 + 4096 + 65536 + 4.
    assert report.peak_memory_bytes == (65536 + 4096 + 4096 + 65536 + 4, 0)


@pytest.mark.parametrize("held_by, freed_by, extra", [
    ("w_grad", "w_grad", 1000),   # held while w_grad runs, at the peak
    ("w_grad", "apply", 1000),    # held on until apply ends: still at the peak
    ("input", "input", 0),        # held and freed before the peak
])
def test_scratch_is_counted_from_its_task_to_its_free_task(held_by, freed_by, extra):
    """PlacedGraph.scratch_*: memory a task holds beyond its buffers (a bucket's packed concat,
    received shards) is live from its task's allocation to the end of its free task."""
    g = testing.chain_graph(1, 4096, 8)
    cluster = fk.pair_cluster()
    placed = lower(g, fk.grouping(g), cluster, Strategy(8, 1, decision({"v100_0": 8}), {}),
                   testing.uniform_profile(g, ["V100", "P100"], 1e-3))
    task = lambda name: int(placed.op_task_ptr[g.index(name)])  # noqa: E731
    held = dataclasses.replace(placed, scratch_task=np.array([task(held_by)], np.int32),
                               scratch_device=np.zeros(1, np.int32), scratch_bytes=np.array([1000.0]),
                               scratch_free_task=np.array([task(freed_by)], np.int32))
    assert simulate(held, cluster).peak_memory_bytes[0] == simulate(placed, cluster).peak_memory_bytes[0] + extra


# ---- fast loop == reference loop ---------------------------------------------------------------
def _random_placed(rng, seed):
    """A random graph, grouping and strategy lowered onto the pair (even seed) or quad cluster."""
    g = fk.random_graph(rng, num_ops=int(rng.integers(4, 20)), num_vars=int(rng.integers(1, 4)))
    k = int(rng.integers(1, g.num_ops))
    gr = fk.grouping(g, [list(x) for x in np.array_split(np.array(g.names), k) if len(x)])
    cluster = fk.quad_cluster() if seed % 2 else fk.pair_cluster()
    prof = testing.uniform_profile(g, cluster.kinds, float(rng.uniform(1e-5, 1e-3)))
    return lower(g, gr, cluster, fk.random_strategy(rng, gr.group_names, cluster.device_names), prof), cluster


def _assert_same_schedule(ref, fast):
    assert np.array_equal(ref.start, fast.start) and np.array_equal(ref.finish, fast.finish)
    assert np.array_equal(ref.peak, fast.peak) and ref.makespan == fast.makespan


@pytest.mark.parametrize("seed", range(12))
def test_fast_loop_matches_reference_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    placed, cluster = _random_placed(rng, seed)
    factor = rng.uniform(1.0, 2.0, cluster.num_devices)
    _assert_same_schedule(schedule(placed, factor, "reference"), schedule(placed, factor, "fast"))


# ---- noise, comm model, trace, import hygiene ----------------------------------------------------
def test_stragglers_are_deterministic_for_a_seed():
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster(straggle=(0.5, 3.0))
    placed = lower(g, gr, cluster, st, fk.dp_profile(g))
    draw = lambda s: simulate(placed, cluster, SimOptions(seed=s, stragglers="draw")).iteration_time_s
    times = {s: draw(s) for s in range(8)}
    assert times == {s: draw(s) for s in range(8)}
    assert len(set(times.values())) == 2  # the V100 straggles (3x) in some seeds, not in others
    calm = simulate(placed, cluster, SimOptions(stragglers="off")).iteration_time_s
    assert min(times.values()) == calm


def _straggler_cluster(n: int, probability: float, factor: float):
    """n V100s on one host, every one straggling with `probability` by `factor`."""
    host = Host("h0", intra_bandwidth_bytes_per_s=INTRA_BW, intra_latency_s=LAT)
    return build_cluster("stragglers", [host], [
        Device(f"v100_{i}", "V100", "h0", 16 * 10**9, straggle_probability=probability, straggle_factor=factor)
        for i in range(n)])


def test_expected_step_weights_every_straggler_case_by_its_probability():
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster(straggle=(0.25, 3.0))
    placed = lower(g, gr, cluster, st, fk.dp_profile(g))
    calm = simulate(placed, cluster, SimOptions(stragglers="off")).iteration_time_s
    slow = schedule(placed, np.array([3.0, 1.0])).makespan
    report = simulate(placed, cluster)  # the default: expected
    assert slow > calm * 1.5
    assert report.straggler_cases == 2
    assert report.iteration_time_s == pytest.approx(0.75 * calm + 0.25 * slow, rel=1e-12)
    assert "expected over 2 straggler cases" in report.summary()


def test_a_straggler_without_work_costs_nothing():
    g, gr, st = _dp_setup(shares={"p100_0": 8})  # everything on the P100; the V100 straggles
    cluster = fk.pair_cluster(straggle=(0.5, 3.0))
    placed = lower(g, gr, cluster, st, fk.dp_profile(g))
    report = simulate(placed, cluster)
    assert report.straggler_cases == 1
    assert report.iteration_time_s == simulate(placed, cluster, SimOptions(stragglers="off")).iteration_time_s


def test_expected_step_is_exact_up_to_the_case_limit_then_sampled_by_seed():
    n = 5
    g = fk.dp_graph(W, batch=10)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    st = Strategy(10, 2, decision({f"v100_{i}": 2 for i in range(n)}), {})
    cluster = _straggler_cluster(n, 0.3, 2.0)
    placed = lower(g, gr, cluster, st, fk.dp_profile(g))
    # brute force over the 32 combinations
    expected = 0.0
    for mask in range(2 ** n):
        slow = np.array([(mask >> i) & 1 for i in range(n)], dtype=bool)
        weight = float(np.prod(np.where(slow, 0.3, 0.7)))
        expected += weight * schedule(placed, np.where(slow, 2.0, 1.0)).makespan
    exact = simulate(placed, cluster, SimOptions(max_straggler_cases=32))
    assert exact.straggler_cases == 32 and exact.iteration_time_s == pytest.approx(expected, rel=1e-9)
    sampled = [simulate(placed, cluster, SimOptions(seed=s, max_straggler_cases=16)) for s in (0, 0, 1)]
    assert sampled[0].iteration_time_s == sampled[1].iteration_time_s  # a seed fixes the draws
    assert all(1 <= r.straggler_cases <= 16 for r in sampled)
    calm = simulate(placed, cluster, SimOptions(stragglers="off")).iteration_time_s
    all_slow = schedule(placed, np.full(n, 2.0)).makespan
    assert all(calm < r.iteration_time_s < all_slow for r in sampled)


def test_planning_ranks_strategies_by_their_expected_step():
    """A V100 that straggles 3x in 90% of the steps: the plan that loads the P100 wins; without
    stragglers the V100-heavy plan does. The planners' problem must see the difference."""
    g, gr, _ = _dp_setup()
    heavy_v100 = Strategy(8, 2, decision({"v100_0": 6, "p100_0": 2}, "allreduce"), {})
    heavy_p100 = Strategy(8, 2, decision({"v100_0": 2, "p100_0": 6}, "allreduce"), {})
    for straggle, faster in (((0.0, 1.0), heavy_v100), ((0.9, 3.0), heavy_p100)):
        problem = make_problem(g, fk.pair_cluster(straggle=straggle), fk.dp_profile(g), grouping=gr)
        times = {id(s): problem.evaluate(s).iteration_time_s for s in (heavy_v100, heavy_p100)}
        assert min(times, key=times.get) == id(faster), straggle


def test_bad_straggler_options_are_refused():
    for kwargs, field in ((dict(stragglers="sometimes"), "stragglers"), (dict(max_straggler_cases=0),
                                                                          "max_straggler_cases")):
        with pytest.raises(InputError, match=field):
            SimOptions(**kwargs)


def test_fitted_allreduce_model_is_used_when_present():
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster()
    prof = fk.dp_profile(g)
    fitted = Profile(ops=prof.ops, comm=CommModel(allreduce={2: LinearCost(1e-3, 1e9)}))
    placed = lower(g, gr, cluster, st, fitted)
    coll = placed.task_seconds[placed.task_kind == 4]
    assert coll.tolist() == [pytest.approx(1e-3 + W / 1e9)]


def test_trace_is_valid_closed_json(tmp_path):
    g, gr, st = _dp_setup("ps", "p100_0")
    cluster = fk.pair_cluster()
    report = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster, SimOptions(trace=True))
    path = tmp_path / "trace.json"
    write_trace(report.trace, path)
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"]
    assert all({"ph", "ts", "dur", "pid", "tid"} <= set(e) for e in events)
    xs = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1}  # device lanes and link lanes (no collective under PS)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(report.iteration_time_s * 1e6, rel=1e-6)


def test_utilisation_summary():
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster()
    report = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster)
    # V100: f + g + the weighting of its partial + apply (hand case 3); P100: 0.9 ms + its weighting
    weighting = 5e-6 + 2 * W / np.array([V100_BW, P100_BW])
    assert report.busy_s == pytest.approx(np.array([1.3e-3, 0.9e-3]) + weighting)
    assert report.compute_s == pytest.approx(report.busy_s)
    step_s = 1.2e-3 + weighting[0] + W / INTRA_BW + 2 * LAT + 1e-4 + LAT
    assert report.utilisation[0] == pytest.approx((1.3e-3 + weighting[0]) / step_s)
    # each of 2 ranks sends 2(n-1)/n * W, and the P100's 2 samples of x (2000 bytes) are fed to it
    assert report.comm_bytes == pytest.approx(2 * W + 2000)
    assert "v100_0" in report.summary()


@pytest.mark.parametrize("memory, unit, v100_cap", [
    ((16 * 10**9, 12 * 10**9), "GB", "16.000"),
    ((200 * 10**6, 150 * 10**6), "MB", "200.000"),   # in GB every column read 0.000 or 0.200
])
def test_summary_memory_columns_use_a_unit_that_shows_the_numbers(memory, unit, v100_cap):
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster(memory=memory)
    lines = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster).summary().splitlines()
    assert f"peak {unit}" in lines[1] and f"cap {unit}" in lines[1]
    v100 = lines[2].split()
    assert v100[0] == "v100_0" and v100[2] == v100_cap and float(v100[1]) > 0


@pytest.mark.parametrize("fill, near, oom", [(0.95, True, False), (0.5, False, False), (1.05, False, True)])
def test_a_peak_within_a_tenth_of_the_memory_is_flagged_near(fill, near, oom):
    """The simulated peak counts live tensors, not the allocator's rounding and pools: a device it
    fills beyond NEAR_MEMORY_FRACTION (but within its memory) is marked "near" in the summary, and
    near_memory_note names it with the fix; a roomy device or an OOM one is not near."""
    from tfplace.formats.reports import NEAR_MEMORY_FRACTION
    g, gr, st = _dp_setup()
    roomy = fk.pair_cluster(memory=(16 * 10**9, 12 * 10**9))
    peak = simulate(lower(g, gr, roomy, st, fk.dp_profile(g)), roomy).peak_memory_bytes[0]
    cluster = fk.pair_cluster(memory=(int(peak / fill), 12 * 10**9))
    report = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster)
    assert report.oom == oom and report.peak_memory_bytes[0] == peak
    assert ("v100_0" in report.near_memory) == near and "p100_0" not in report.near_memory
    assert report.summary().splitlines()[2].endswith("  near") == near
    note = report.near_memory_note()
    assert (note is not None) == near
    if near:
        assert f"more than {NEAR_MEMORY_FRACTION:.0%} of the memory of v100_0 (95%)" in note and "memory_bytes" in note


def test_importing_the_simulator_does_not_import_tensorflow():
    code = "import sys, tfplace.simulator, tfplace.lowering.lower; assert 'tensorflow' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---- command line ------------------------------------------------------------------------------
def _cli_files(tmp_path):
    from tfplace.ir.loader import load_op_graph
    from tfplace.formats.profile import save_profile
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    meta = os.path.join(repo, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
    graph = load_op_graph(meta)
    save_profile(testing.uniform_profile(graph, ["V100", "P100"]), tmp_path / "profile.json")
    (tmp_path / "strategy.json").write_text(json.dumps({
        "format": "tfplace.strategy", "version": 1, "global_batch_size": 16, "max_groups": 8,
        "default": {"shares": {"v100_0": 6, "v100_1": 6, "p100_0": 2, "p100_1": 2}, "sync": "ps", "ps_device": "v100_0"}}))
    return meta, os.path.join(repo, "clusters", "two_kind_4gpu.json")


def test_cli_prints_the_report_and_writes_the_trace(tmp_path, capsys):
    from tfplace.cli import common, simulate
    meta, cluster = _cli_files(tmp_path)
    code = common.call(simulate, ["--graph", meta, "--cluster", cluster, "--strategy", str(tmp_path / "strategy.json"),
                                  "--profile", str(tmp_path / "profile.json"), "--trace", str(tmp_path / "t.json"),
                                  "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0 and "iteration time" in out and "p100_1" in out and "OOM: no" in out
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert json.loads((tmp_path / "r.json").read_text())["iteration_time_s"] > 0


def test_cli_without_profile_uses_the_device_model(tmp_path, capsys):
    from tfplace.cli import common, simulate
    meta, cluster = _cli_files(tmp_path)
    code = common.call(simulate, ["--graph", meta, "--cluster", cluster, "--strategy", str(tmp_path / "strategy.json")])
    out = capsys.readouterr().out
    assert code == 0 and "device model" in out and "iteration time" in out


def test_cli_bad_strategy_is_one_message(tmp_path, capsys):
    from tfplace.cli import common, simulate
    meta, cluster = _cli_files(tmp_path)
    bad = json.loads((tmp_path / "strategy.json").read_text())
    bad["default"]["shares"] = {"tpu_0": 16}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code = common.call(simulate, ["--graph", meta, "--cluster", cluster, "--strategy", str(tmp_path / "bad.json"),
                                  "--profile", str(tmp_path / "profile.json")])
    err = capsys.readouterr().err
    assert code == 2 and "tpu_0" in err and "Fix:" in err


# ---- reports -----------------------------------------------------------------------------------
def test_sim_and_run_reports_share_field_names():
    from tfplace.formats.reports import SHARED_FIELDS, RunReport, compare_rows, report_row
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster()
    sim = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster)
    run = RunReport(step_times_s=(1.0e-3, 1.2e-3, 1.4e-3), device_names=cluster.device_names)
    assert run.iteration_time_s == run.mean_s == pytest.approx(1.2e-3)
    assert run.std_s == pytest.approx(0.2e-3)
    rows = [report_row(sim, "dp"), report_row(run, "dp")]
    assert all(set(SHARED_FIELDS) <= set(r) for r in rows)
    assert "simulated" in compare_rows(rows) and "measured" in compare_rows(rows)
    with pytest.raises(ValueError):
        RunReport(step_times_s=())


def test_allreduce_trace_has_collective_lanes():
    g, gr, st = _dp_setup()
    cluster = fk.pair_cluster()
    report = simulate(lower(g, gr, cluster, st, fk.dp_profile(g)), cluster, SimOptions(trace=True))
    coll = [e for e in report.trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 2]
    assert sorted(e["tid"] for e in coll) == [0, 1]  # one event per participant


# ---- link hold (LogGP gap) and host cores --------------------------------------------------------
def _hold_and_slots(rng, placed, num_devices):
    link = placed.task_kind >= 3  # TRANSFER, COLLECTIVE
    hold = np.where(link, placed.task_seconds * rng.uniform(0.0, 1.0, placed.num_tasks), placed.task_seconds)
    group = rng.integers(-1, 2, num_devices).astype(np.int64)
    return hold, (group, np.array([1, 2], dtype=np.int64))


@pytest.mark.parametrize("seed", range(8))
def test_fast_loop_matches_reference_with_link_hold_and_core_slots(seed):
    rng = np.random.default_rng(100 + seed)
    placed, cluster = _random_placed(rng, seed)
    hold, slots = _hold_and_slots(rng, placed, cluster.num_devices)
    placed = dataclasses.replace(placed, task_hold_seconds=hold)
    factor = rng.uniform(1.0, 2.0, cluster.num_devices)
    ref = schedule(placed, factor, "reference", slots)
    _assert_same_schedule(ref, schedule(placed, factor, "fast", slots))
    # a device never runs two tasks at once, and a core group never runs more tasks than cores
    lane = placed.task_kind < 3
    for group in (0, 1):
        members = np.flatnonzero(slots[0] == group)
        sel = np.flatnonzero(lane & np.isin(placed.task_device, members) & (ref.finish > ref.start))
        for t in ref.start[sel]:
            running = ((ref.start[sel] <= t) & (ref.finish[sel] > t)).sum()
            assert running <= slots[1][group]


def _cpu_cluster(cores):
    from tfplace.formats.cluster import Device, Host, build_cluster
    host = Host("h0", intra_bandwidth_bytes_per_s=INTRA_BW, intra_latency_s=LAT, cpu_cores=cores)
    return build_cluster("cpus", [host], [Device(f"cpu{i}", "CPU", "h0", 10**9, task=i) for i in range(3)])


def _three_way_fork():
    # x (0 s) -> a on cpu0, b on cpu1, c on cpu2 (1 ms each), 8000-byte tensors.
    ops = [("x", "Placeholder", 8000, True, True)] + [(n, "Op", 8000, True, True) for n in "abc"]
    g = fk.op_graph(ops, [("x", "a"), ("x", "b"), ("x", "c")])
    pr = fk.profile_table(g, {"x": {"CPU": 0.0}, "a": {"CPU": 1e-3}, "b": {"CPU": 1e-3}, "c": {"CPU": 1e-3}})
    gr = fk.grouping(g, [["x", "a"], ["b"], ["c"]])
    st = Strategy(8, 3, None, {"x": decision({"cpu0": 8}), "b": decision({"cpu1": 8}), "c": decision({"cpu2": 8})})
    return g, gr, pr, st


@pytest.mark.parametrize("cores, expected_s", [
    # b and c start when x arrives (the two sends share cpu0's out-port: c's copy of x lands one
    # hop after b's), a at once: all in parallel. The step ends when the "done" of the device
    # that finishes last reaches cpu0, the feed device (one latency).
    (None, 2 * (LAT + 8000 / INTRA_BW) + 1e-3 + LAT),
    (3, 2 * (LAT + 8000 / INTRA_BW) + 1e-3 + LAT),
    (2, 2e-3 + LAT),                       # a and b take the 2 cores; c waits for a's core (1 ms)
    (1, 3e-3 + LAT),                       # one at a time: a, then b, then c
])
def test_host_cores_limit_the_cpu_devices_running_at_once(cores, expected_s):
    g, gr, pr, st = _three_way_fork()
    cluster = _cpu_cluster(cores)
    report = simulate(lower(g, gr, cluster, st, pr), cluster)
    assert report.iteration_time_s == pytest.approx(expected_s, rel=1e-9)


def test_local_cpu_cluster_declares_its_shared_cores():
    from tfplace.formats.cluster import load_cluster
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cluster = load_cluster(os.path.join(root, "clusters", "local_cpu.json"))
    assert cluster.hosts[0].cpu_cores == 2
    assert "cpu_cores" not in load_cluster(os.path.join(root, "clusters", "two_kind_4gpu.json")).to_json()["hosts"][0]


def _two_sends(overheads):
    # a, b on the V100 (1 ms each), both read by c on the P100: two transfers on one link, the
    # second ready 1 ms after the first; the link latency (2 ms) is longer than that gap.
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("b", "Op", 8000, True, True),
           ("c", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("x", "b"), ("a", "c"), ("b", "c")])
    pr = fk.profile_table(g, {n: {"V100": s, "P100": s} for n, s in {"x": 0.0, "a": 1e-3, "b": 1e-3, "c": 1e-3}.items()})
    gr = fk.grouping(g, [["x", "a", "b"], ["c"]])
    st = Strategy(8, 2, None, {"x": decision({"v100_0": 8}), "c": decision({"p100_0": 8})})
    cluster = fk.pair_cluster(latency=2e-3)
    return fk.lower_with_overheads(g, gr, cluster, st, pr, overheads), cluster


def _two_inputs_one_device(overheads):
    # inputs x (8000 bytes at batch 8) and y (400 bytes) read by a on the V100 (1 ms)
    ops = [("x", "Placeholder", 8000, True, True), ("y", "Placeholder", 400, True, True),
           ("a", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("y", "a")])
    pr = fk.profile_table(g, {n: {"V100": s, "P100": s} for n, s in {"x": 0.0, "y": 0.0, "a": 1e-3}.items()})
    st = Strategy(8, 1, None, {"x": decision({"v100_0": 8})})
    cluster = fk.pair_cluster(latency=2e-3)
    placed = fk.lower_with_overheads(g, fk.grouping(g, [["x", "y", "a"]]), cluster, st, pr, overheads)
    return simulate(placed, cluster).iteration_time_s


@pytest.mark.parametrize("overheads,added_s", [
    ({}, 0.0),
    ({"step_s": 2e-4}, 2e-4),
    ({"feed_input_s": 3e-5}, 3e-5),                   # y is the one input beyond the first
    ({"feed_s_per_byte": 1e-8}, 8400 * 1e-8),        # both inputs' bytes at the global batch
    # worker_s adds nothing: no further task runs a partition
    ({"step_s": 2e-4, "feed_input_s": 3e-5, "feed_s_per_byte": 1e-8, "worker_s": 1.0}, 2e-4 + 3e-5 + 8.4e-5),
])
def test_step_and_feed_costs_come_once_per_step(overheads, added_s):
    assert _two_inputs_one_device(overheads) == pytest.approx(1e-3 + added_s, rel=1e-9)


@pytest.mark.parametrize("worker_ms", [0.0, 0.5, 6.0])
def test_a_further_device_starts_when_its_rungraph_arrives(worker_ms):
    """The master sends every RunGraph at once: the feed device's lane carries step_s, and each
    further device's lane starts worker_s (per further task) after the step begins, in
    parallel with it (the fork-join graph: x, a, b, d on the V100, c on the P100)."""
    from tfplace.lowering.placed_graph import TASK_HANDLER
    g, gr, pr, st = _fork_join()
    cluster = fk.pair_cluster()
    placed = fk.lower_with_overheads(g, gr, cluster, st, pr, {"step_s": 2e-4, "worker_s": worker_ms * 1e-3})
    sched = schedule(placed, np.ones(2))
    c = placed.tasks_of_op(g.index("c"))[0]
    x = placed.tasks_of_op(g.index("x"))[0]
    assert sched.start[x] == 0.0 and sched.finish[x] == pytest.approx(2e-4)  # step_s only
    hop = LAT + 8000 / INTRA_BW
    # c waits for a's output (step_s + a + the hop) and for its RunGraph (worker_s)
    assert sched.start[c] == pytest.approx(max(2e-4 + 1e-3 + hop, worker_ms * 1e-3), rel=1e-9)
    waits = np.nonzero((placed.task_kind == TASK_HANDLER) & (placed.task_device == 1))[0]
    assert len(waits) == (1 if worker_ms else 0)


@pytest.mark.parametrize("gap_s", [None, 0.0, 1e-4, 5e-3])
def test_transfer_holds_its_link_for_the_gap_plus_bytes(gap_s):
    placed, cluster = _two_sends({} if gap_s is None else {"transfer_gap_s": gap_s})
    wire = 8000 / INTRA_BW
    first_start = 1e-3
    if gap_s is None:  # the link is held for latency + bytes / bandwidth
        second_start = first_start + 2e-3 + wire
    else:
        second_start = max(2e-3, first_start + min(wire + gap_s, 2e-3 + wire))
    expected = second_start + 2e-3 + wire + 1e-3 + 2e-3  # then the P100's "done" to the V100 (latency)
    assert simulate(placed, cluster).iteration_time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("key,value", [("transfer_s", 3e-4), ("message_cpu_s", 4e-4)])
def test_message_overheads_per_pair_of_device_kinds(key, value):
    # every message here runs between a V100 and a P100: a per-kind-pair entry acts as the scalar
    scalar, _ = _two_sends({"transfer_gap_s": 0.0, key: value})
    paired, _ = _two_sends({"transfer_gap_s": 0.0, key: {"P100|V100": value, "V100|V100": 1.0}})
    assert np.array_equal(paired.task_seconds, scalar.task_seconds)
    assert np.array_equal(paired.task_hold_seconds, scalar.task_hold_seconds)
    with pytest.raises(InputError) as err:
        _two_sends({"transfer_gap_s": 0.0, key: {"V100|V100": value}})
    assert f"overheads.json: {key}" in str(err.value) and "P100|V100" in str(err.value)


def test_one_thread_message_cpu_sender_half_is_a_handler_receiver_half_on_the_next_task():
    # one inter-op thread (the default): the sending half of each message's CPU is a HANDLER task
    # on the source lane, the receiving half goes on the first task the message feeds there, and
    # a 0 s hand-back on the destination lane sits between the message and what waits for it
    from tfplace.lowering.placed_graph import TASK_HANDLER, TASK_TRANSFER
    base, _ = _two_sends({"transfer_gap_s": 0.0})
    placed, _ = _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4})
    m = base.num_tasks
    assert placed.num_tasks == m + 6  # a -> c, b -> c and the P100's "done": two handlers each
    assert np.array_equal(placed.task_kind[:m], base.task_kind[:m])
    assert (placed.task_kind[m:] == TASK_HANDLER).all()
    extra = dict(zip((placed.task_name(t) for t in range(m)), placed.task_seconds[:m] - base.task_seconds))
    # c receives a's and b's messages (their receiving halves); the "done" feeds nothing on the V100
    assert {name.split("/")[0]: v for name, v in extra.items() if v} == pytest.approx({"c": 4e-4})
    x = np.nonzero(placed.task_kind == TASK_TRANSFER)[0]
    deps = set(zip(placed.dep_src.tolist(), placed.dep_dst.tolist()))
    assert set(zip(base.dep_src.tolist(), base.dep_dst.tolist())) <= deps  # the graph's own ones stay
    for k, t in enumerate(x):
        send, back = m + k, m + len(x) + k
        assert placed.task_device[send] == placed.task_src_device[t] and placed.task_seconds[send] == 2e-4
        assert placed.task_device[back] == placed.task_device[t] and placed.task_seconds[back] == 0.0
        assert (send, t) in deps and (t, back) in deps
        assert all((p, send) in deps for p, d in deps if d == t and p != send)
        assert all((back, s) in deps for p, s in deps if p == t and s != back)
    assert placed.task_priority[m:].min() > placed.task_priority[:m].max()  # after any other work
    assert placed.is_step_message(int(x[-1])) and not placed.is_step_message(placed.num_tasks - 1)


@pytest.mark.parametrize("share", [None, {"V100": 0.3, "P100": 0.7}, {"V100": 1.0, "P100": 0.0}])
def test_message_cpu_share_splits_each_message_between_its_ends_by_kind(share):
    # message_cpu_share: the V100 end of a V100-P100 message pays share["V100"] of its CPU (its
    # HANDLER task when it sends), the P100 end the rest (on c, which both messages feed); none
    # given: half each. a -> c and b -> c leave the V100, the P100's "done" leaves the P100.
    from tfplace.lowering.placed_graph import TASK_HANDLER, TASK_TRANSFER
    cpu_s = 4e-4
    over = {"transfer_gap_s": 0.0, "message_cpu_s": cpu_s}
    if share is not None:
        over["message_cpu_share"] = {"P100|V100": share}
    base, _ = _two_sends({"transfer_gap_s": 0.0})
    placed, _ = _two_sends(over)
    pays = share or {"V100": 0.5, "P100": 0.5}
    kind_of = {0: "V100", 1: "P100"}
    x = np.nonzero(placed.task_kind == TASK_TRANSFER)[0]
    m = base.num_tasks
    for k, t in enumerate(x):
        send = m + k
        assert placed.task_kind[send] == TASK_HANDLER
        sender_kind = kind_of[int(placed.task_src_device[t])]
        assert placed.task_seconds[send] == pytest.approx(pays[sender_kind] * cpu_s, abs=1e-15)
    c = next(t for t in range(base.num_compute) if placed.task_name(t).startswith("c/"))
    assert placed.task_seconds[c] - base.task_seconds[c] == pytest.approx(2 * pays["P100"] * cpu_s, abs=1e-15)


@pytest.mark.parametrize("share,field,says", [
    ({"CPU|V100": {"CPU": 0.5, "V100": 0.5}}, "message_cpu_share", "no entry for the device kinds 'P100|V100'"),
    ({"V100|V100": {"V100": 0.5}}, "message_cpu_share.V100|V100", "two different device kinds"),
    ({"P100|V100": {"V100": 0.3}}, "message_cpu_share.P100|V100", "needs the share of each end"),
    ({"P100|V100": {"V100": 0.6, "P100": 0.6}}, "message_cpu_share.P100|V100", "add up to 1"),
    ({"P100|V100": {"V100": -0.1, "P100": 1.1}}, "message_cpu_share.P100|V100.V100", "lie in [0, 1]"),
    ({"P100|V100": {"V100": "0.5", "P100": 0.5}}, "message_cpu_share.P100|V100.V100", "must be a number"),
])
def test_bad_message_cpu_share_is_one_error_naming_the_field(share, field, says):
    with pytest.raises(InputError) as err:
        _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4, "message_cpu_share": share})
    assert f"overheads.json: {field}:" in str(err.value) and says in str(err.value) and "Fix:" in str(err.value)


def test_message_cpu_share_that_is_not_an_object_is_one_error_naming_the_field():
    with pytest.raises(InputError) as err:
        _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4, "message_cpu_share": [0.4, 0.6]})
    assert "message_cpu_share" in str(err.value)


def test_one_thread_handler_waits_until_its_lane_has_nothing_else_ready():
    # a and b (1 ms each) on the V100 are both ready at 0; a's message is served only after b
    # (the executor runs the ops it has before a handler): a -> c leaves at 2.2 ms, not 1.2 ms
    from tfplace.lowering.placed_graph import TASK_TRANSFER
    from tfplace.simulator.core import schedule
    placed, cluster = _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4})
    sched = schedule(placed, np.ones(placed.num_devices))
    x = np.nonzero(placed.task_kind == TASK_TRANSFER)[0]
    wire = 8000 / INTRA_BW
    assert sched.start[x[:2]] == pytest.approx([2.2e-3, 2.4e-3], rel=1e-9)
    c = next(t for t in range(placed.num_compute) if placed.task_name(t).startswith("c/"))
    assert sched.start[c] == pytest.approx(2.4e-3 + 2e-3 + wire, rel=1e-9)  # after both hand-backs
    # c (1 ms and its two receiving halves), its "done" handler (0.2 ms), the 2 ms hop
    assert simulate(placed, cluster).iteration_time_s == pytest.approx(sched.start[c] + 1.4e-3 + 2e-4 + 2e-3, rel=1e-9)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_with_two_or_more_inter_op_threads_message_cpu_lengthens_the_transfer_not_the_lanes(threads):
    # the servers' RPC handlers run beside the ops then: each message lasts its CPU longer (the
    # hop as measured), the lanes keep their kernels, the links are held as long as before
    from tfplace.lowering.placed_graph import TASK_HANDLER, TASK_TRANSFER
    base, _ = _two_sends({"transfer_gap_s": 0.0})
    one, _ = _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4, "inter_op_threads": 1})
    off, _ = _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4, "inter_op_threads": threads})
    x = off.task_kind == TASK_TRANSFER
    assert x.sum() == 3 and off.num_tasks == base.num_tasks  # a -> c, b -> c, the P100's "done"; no handlers
    assert np.allclose(off.task_seconds[x], base.task_seconds[x] + 4e-4, rtol=1e-12)
    assert np.array_equal(off.task_seconds[~x], base.task_seconds[~x])
    assert np.array_equal(off.task_hold_seconds, np.minimum(base.task_hold_seconds, off.task_seconds))
    # one thread: on the lanes (tests above), the transfers as before
    assert (one.task_kind == TASK_HANDLER).sum() == 6
    assert np.array_equal(one.task_seconds[:base.num_tasks][x], base.task_seconds[x])


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, float("nan"), float("inf")])  # null: the default, 1
def test_bad_inter_op_threads_is_one_error_naming_the_field(value):
    with pytest.raises(InputError) as err:
        _two_sends({"transfer_gap_s": 0.0, "message_cpu_s": 4e-4, "inter_op_threads": value})
    assert "overheads.json: inter_op_threads" in str(err.value) and "tfplace.cli.overheads" in str(err.value)


@pytest.mark.parametrize("transfer_s", [3e-4, -1e-3, -5e-3])
def test_negative_transfer_overhead_shortens_a_message_but_never_below_zero(transfer_s):
    # transfer_s is what a message takes beyond the link fit and the message CPU the lanes carry,
    # so it may be negative (`python -m tfplace.cli.overheads`); the 2 ms latency link here
    from tfplace.lowering.placed_graph import TASK_TRANSFER
    placed, _ = _two_sends({"transfer_gap_s": 0.0, "transfer_s": transfer_s})
    x = placed.task_kind == TASK_TRANSFER
    fit = 2e-3 + placed.task_bytes[x] / INTRA_BW  # 8000-byte tensors and the 0-byte "done"
    assert set(placed.task_bytes[x]) == {0.0, 8000.0}
    assert np.allclose(placed.task_seconds[x], np.maximum(fit + transfer_s, 0.0), rtol=1e-12, atol=1e-15)


def _dp_collectives(shares, overheads):
    """fakes.dp_graph data-parallel over `shares` of the quad cluster's V100s, all-reduced: one
    collective of len(shares) participants; returns its lowered seconds."""
    from tfplace.lowering.placed_graph import TASK_COLLECTIVE
    g, gr, st = _dp_setup(shares=shares)
    pr = fk.dp_profile(g)
    cluster = fk.quad_cluster()
    placed = fk.lower_with_overheads(g, gr, cluster, st, pr, overheads)
    c = placed.task_kind == TASK_COLLECTIVE
    assert c.sum() == 1
    return float(placed.task_seconds[c][0])


TWO, THREE = {"v100_0": 4, "v100_1": 4}, {"v100_0": 4, "v100_1": 2, "v100_2": 2}


@pytest.mark.parametrize("shares, collective_s, added_s", [
    (TWO, 3e-4, 3e-4),                               # one number for every collective
    (THREE, 3e-4, 3e-4),
    (TWO, {"2": -2e-6, "3": 5e-4}, -2e-6),           # per group size: a chained all-reduce takes less
    (THREE, {"2": -2e-6, "3": 5e-4}, 5e-4),
    (TWO, {"2": -1.0}, None),                        # never below 0
])
def test_collective_overhead_per_group_size(shares, collective_s, added_s):
    # RuntimeOverheads.collective_s: what an all-reduce in a step takes beyond the all-reduce fit
    # (`python -m tfplace.cli.overheads` measures it per group size; it may be negative)
    base = _dp_collectives(shares, {})
    got = _dp_collectives(shares, {"collective_s": collective_s})
    assert got == (0.0 if added_s is None else pytest.approx(base + added_s, rel=1e-12))


def test_a_collective_overhead_without_the_group_size_is_one_error_naming_the_field():
    with pytest.raises(InputError) as err:
        _dp_collectives(THREE, {"collective_s": {"2": 1e-4}})
    assert "overheads.json: collective_s" in str(err.value) and "group of 3" in str(err.value)
