"""tfplace.overheads.cpu_demand: the CPU a step asks of each device (kernels under a quota, message bytes,
CPU all-reduces) and the simulator's CPU bound on the step. Hand-built graphs (simulator.fakes),
hand-computed demands."""

import dataclasses

import numpy as np
import pytest

from tfplace.lowering.costs import cpu_fractions
from tfplace.overheads.cpu_demand import curve_seconds
from tfplace.overheads.model import check_curve
from tfplace.overheads.model import overheads_from_json
from tfplace.simulator.core import cpu_bound_seconds
from tfplace.formats.errors import InputError
from tfplace.lowering.placed_graph import DEVICE_KINDS, TASK_COLLECTIVE
from tfplace.formats.profile import Profile
from tfplace.simulator import simulate
from tfplace.simulator import fakes as fk
from tfplace.formats.strategy import Strategy, decision

W = 1_200_000  # fakes.dp_graph's weight / gradient bytes


@pytest.mark.parametrize("nbytes, expected_s", [
    (0, 1e-3),                        # below the first point: its value
    (100, 1e-3),                      # on it
    (550, 2e-3),                      # halfway between 100 B -> 1 ms and 1000 B -> 3 ms
    (1000, 3e-3),
    (2800, 3e-3 + 2e-3 * 1800 / 900),  # beyond: the last slope (2 ms per 900 B) goes on
])
def test_curve_is_piecewise_linear_with_the_last_slope_beyond(nbytes, expected_s):
    got = curve_seconds(np.array([nbytes]), np.array([100.0, 1000.0]), np.array([1e-3, 3e-3]))
    assert got[0] == pytest.approx(expected_s, rel=1e-12)


def test_a_one_point_curve_is_a_constant():
    assert curve_seconds(np.array([0, 16, 1e9]), np.array([16.0]), np.array([2e-4])).tolist() == [2e-4] * 3


@pytest.mark.parametrize("curve, words", [
    ({"bytes": [16, 16], "seconds": [1e-4, 2e-4]}, "strictly increasing"),
    ({"bytes": [16, 32], "seconds": [1e-4]}, "as many seconds"),
    ({"bytes": [16], "seconds": [-1e-4]}, "seconds >= 0"),
    ([1, 2], "must be"),
])
def test_bad_curve_is_one_error_naming_the_field(curve, words):
    with pytest.raises(InputError) as err:
        check_curve(curve, "overheads.json", "collective_cpu_s.3")
    assert "overheads.json: collective_cpu_s.3" in str(err.value) and words in str(err.value)


def test_cpu_fractions_come_from_the_profile_kinds_emulation():
    prof = Profile(ops={}, conditions={"by_kind": {"CPU": {"emulation": {"cpus": [0]}},
                                                   "CPU_half": {"emulation": {"cpus": [1], "cpu_fraction": 0.5}}}})
    assert cpu_fractions(prof, ["CPU", "CPU_half", "CPU_half", "V100"]).tolist() == [1.0, 0.5, 0.5, 1.0]
    assert cpu_fractions(Profile(ops={}), ["CPU"]).tolist() == [1.0]
    bad = Profile(ops={}, conditions={"by_kind": {"CPU": {"emulation": {"cpu_fraction": 0}}}})
    with pytest.raises(InputError) as err:
        cpu_fractions(bad, ["CPU"])
    assert "by_kind.CPU.emulation.cpu_fraction" in str(err.value)


@pytest.mark.parametrize("emulation, fraction", [
    ({"cpu_fraction": 0.5}, 0.5),                                       # quota only: as set
    ({"cpu_fraction": 0.5, "effective_cpu_fraction": 0.44}, 0.44),     # measured slowdown wins
    ({"effective_cpu_fraction": 0.25}, 0.25),
])
def test_cpu_fractions_prefer_the_measured_effective_fraction(emulation, fraction):
    prof = Profile(ops={}, conditions={"by_kind": {"CPU_half": {"emulation": emulation}}})
    assert cpu_fractions(prof, ["CPU_half"]).tolist() == [fraction]


@pytest.mark.parametrize("value", [0, -0.5, "half", True])
def test_bad_effective_fraction_is_one_error_naming_it(value):
    prof = Profile(ops={}, conditions={"by_kind": {"CPU_half": {"emulation": {"cpu_fraction": 0.5,
                                                                              "effective_cpu_fraction": value}}}})
    with pytest.raises(InputError) as err:
        cpu_fractions(prof, ["CPU_half"])
    assert "by_kind.CPU_half.emulation.effective_cpu_fraction" in str(err.value) and "--cpu-fraction" in str(err.value)


@pytest.mark.parametrize("demand_ms, fraction, host_of, cores, bound_ms", [
    ([4, 1, 1], [1, 0.5, 0.5], None, None, 4),          # the busiest device at full speed
    ([1, 3, 1], [1, 0.5, 0.5], None, None, 6),          # a half-speed device needs twice its CPU
    ([3, 3, 3], [1, 1, 1], [0, 0, 0], [2], 4.5),        # 3 devices on 2 cores
    ([3, 3, 3], [1, 1, 1], [0, 0, -1], [2], 3),         # a GPU (-1) does not share the cores
    ([], [], None, None, 0),
])
def test_cpu_bound_is_the_busiest_device_or_host(demand_ms, fraction, host_of, cores, bound_ms):
    got = cpu_bound_seconds(np.array(demand_ms, float) * 1e-3, np.array(fraction, float),
                            None if host_of is None else np.array(host_of), cores)
    assert got == pytest.approx(bound_ms * 1e-3, rel=1e-12)


def _dp(overheads):
    """fakes.dp_graph data-parallel over the V100 (6 samples) and the P100 (2), all-reduced: one
    2-device collective of W bytes."""
    g = fk.dp_graph(W)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    st = Strategy(8, 2, decision({"v100_0": 6, "p100_0": 2}, "allreduce"), {})
    prof = fk.dp_profile(g)
    cluster = fk.pair_cluster()
    return fk.lower_with_overheads(g, gr, cluster, st, prof, overheads), cluster


CURVE = {"bytes": [0, 2 * W], "seconds": [1e-3, 3e-3]}  # W bytes: 2 ms per participant


@pytest.mark.parametrize("per_collective_ms", [0.5, 2.0, 50.0])
def test_collective_cpu_adds_to_each_participant_and_bounds_the_step(per_collective_ms):
    s = per_collective_ms * 1e-3
    placed, cluster = _dp({"collective_cpu_s": {"2": {"bytes": [0], "seconds": [s]}}})
    lane = np.isin(placed.task_kind, DEVICE_KINDS)
    lanes = np.bincount(placed.task_device[lane], weights=placed.task_seconds[lane], minlength=2)
    n_coll = int((placed.task_kind == TASK_COLLECTIVE).sum())
    assert n_coll == 1
    assert placed.device_cpu_seconds == pytest.approx(lanes + s, rel=1e-12)
    assert placed.device_cpu_fraction.tolist() == [1.0, 1.0]
    report = simulate(placed, cluster)
    assert report.cpu_bound_s == pytest.approx(max(lanes) + s, rel=1e-12)
    assert report.iteration_time_s == pytest.approx(max(report.makespan_s, report.cpu_bound_s), rel=1e-12)
    if per_collective_ms == 50.0:  # far beyond the events' makespan: the bound sets the step
        assert report.iteration_time_s == report.cpu_bound_s > report.makespan_s


def test_collective_cpu_follows_the_curve_at_the_collectives_bytes():
    placed, _ = _dp({"collective_cpu_s": {"2": CURVE}})
    base, _ = _dp({"message_cpu_s_per_byte": 0.0, "collective_cpu_s": {"2": {"bytes": [0], "seconds": [0.0]}}})
    assert placed.device_cpu_seconds - base.device_cpu_seconds == pytest.approx([2e-3, 2e-3], rel=1e-12)


@pytest.mark.parametrize("by_kind, expected_ms", [
    # each participant pays its own kind's curve (V100 on device 0, P100 on device 1)
    ({"V100": [1.0, 1.0], "P100": [2.0, 4.0]}, [1.0, 3.0]),
    ({"V100": [0.5, 0.5], "P100": [0.5, 0.5]}, [0.5, 0.5]),
    # a kind the measuring group did not hold pays the participants' mean ("seconds": 2 ms at W)
    ({"P100": [2.0, 4.0]}, [2.0, 3.0]),
    ({}, [2.0, 2.0]),
])
def test_each_participant_pays_the_curve_of_its_device_kind(by_kind, expected_ms):
    curve = {**CURVE, "seconds_by_kind": {k: [v * 1e-3 for v in vs] for k, vs in by_kind.items()}}
    placed, _ = _dp({"collective_cpu_s": {"2": curve}})
    base, _ = _dp({"message_cpu_s_per_byte": 0.0, "collective_cpu_s": {"2": {"bytes": [0], "seconds": [0.0]}}})
    assert placed.device_cpu_seconds - base.device_cpu_seconds == pytest.approx(
        [ms * 1e-3 for ms in expected_ms], rel=1e-12)


@pytest.mark.parametrize("by_kind, field, words", [
    ([1e-3, 2e-3], "collective_cpu_s.2.seconds_by_kind", "must map device kinds"),
    ({"P100": [1e-3]}, "collective_cpu_s.2.seconds_by_kind.P100", "as many seconds"),
    ({"P100": [1e-3, -1.0]}, "collective_cpu_s.2.seconds_by_kind.P100", "finite seconds >= 0"),
])
def test_a_bad_kind_curve_is_one_error_naming_its_field(by_kind, field, words):
    with pytest.raises(InputError) as err:
        _dp({"collective_cpu_s": {"2": {**CURVE, "seconds_by_kind": by_kind}}})
    assert field in str(err.value) and words in str(err.value)


def test_a_group_size_without_a_curve_is_one_error():
    with pytest.raises(InputError) as err:
        _dp({"collective_cpu_s": {"3": CURVE}})
    assert "overheads.json: collective_cpu_s" in str(err.value) and "2 devices" in str(err.value)


def test_message_bytes_cost_cpu_at_both_ends():
    # x on the V100 feeds c on the P100: one 8000-byte message each way of the edge, plus the
    # P100's "done" (0 bytes); every byte costs its sender and its receiver half of the rate
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("c", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("a", "c")])
    pr = fk.profile_table(g, {n: {"V100": s, "P100": s} for n, s in {"x": 0.0, "a": 1e-3, "c": 1e-3}.items()})
    rate = 1e-8
    gr = fk.grouping(g, [["x", "a"], ["c"]])
    st = Strategy(8, 2, None, {"x": decision({"v100_0": 8}), "c": decision({"p100_0": 8})})
    placed = fk.lower_with_overheads(g, gr, fk.pair_cluster(), st, pr, {"message_cpu_s_per_byte": rate})
    lane = np.isin(placed.task_kind, DEVICE_KINDS)
    lanes = np.bincount(placed.task_device[lane], weights=placed.task_seconds[lane], minlength=2)
    assert placed.device_cpu_seconds == pytest.approx(lanes + 0.5 * rate * 8000, rel=1e-12)


@pytest.mark.parametrize("share", [None, {"V100": 0.3, "P100": 0.7}])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_message_cpu_counts_once_in_the_demand_on_the_lanes_or_beside_them(threads, share):
    # one thread: the lanes carry each message's CPU (message_charge_d); two or more: it runs
    # beside them and the demand adds it to each end; either way a device's demand holds its
    # kernels, the bytes' CPU and its end's part of the message CPU once (half, or the end's kind's
    # message_cpu_share)
    from tfplace.lowering.placed_graph import TASK_TRANSFER
    ops = [("x", "Placeholder", 8000, True, True), ("a", "Op", 8000, True, True), ("c", "Op", 8000, True, True)]
    g = fk.op_graph(ops, [("x", "a"), ("a", "c")])
    pr = fk.profile_table(g, {n: {"V100": s, "P100": s} for n, s in {"x": 0.0, "a": 1e-3, "c": 1e-3}.items()})
    rate, message_s = 1e-8, 3e-4
    over = {"message_cpu_s_per_byte": rate, "message_cpu_s": message_s, "inter_op_threads": threads}
    if share is not None:
        over["message_cpu_share"] = {"P100|V100": share}
    pays = np.array([0.5, 0.5]) if share is None else np.array([share["V100"], share["P100"]])  # V100, P100
    gr = fk.grouping(g, [["x", "a"], ["c"]])
    st = Strategy(8, 2, None, {"x": decision({"v100_0": 8}), "c": decision({"p100_0": 8})})
    placed = fk.lower_with_overheads(g, gr, fk.pair_cluster(), st, pr, over)
    x = placed.task_kind == TASK_TRANSFER
    kernels = {"x": 0.0, "a": 1e-3, "c": 1e-3}
    lane_kernels = [kernels["x"] + kernels["a"], kernels["c"]]  # V100, P100
    ends = np.bincount(placed.task_device[x], minlength=2) + np.bincount(placed.task_src_device[x], minlength=2)
    # the lanes' message charge: the sending end's part of each message sent (its HANDLER task)
    # and at most the receiving end's part of each one received (a receiving end with no lane
    # task after it takes none, _charge_received_cpu); beside the lanes: exactly its part per end
    got = placed.device_cpu_seconds - np.array(lane_kernels) - 0.5 * rate * 8000
    if threads == 1:
        sends = np.bincount(placed.task_src_device[x], minlength=2)
        assert np.all(got >= pays * message_s * sends - 1e-12) and np.all(got <= pays * message_s * ends + 1e-12)
    else:
        assert got == pytest.approx(pays * message_s * ends, rel=1e-12)
        lane = np.isin(placed.task_kind, DEVICE_KINDS)
        lanes = np.bincount(placed.task_device[lane], weights=placed.task_seconds[lane], minlength=2)
        assert lanes == pytest.approx(lane_kernels, rel=1e-12)  # nothing on the lanes


@pytest.mark.parametrize("threads, bound", [(1, False), (2, True)])
def test_message_cpu_beside_the_lanes_alone_makes_a_bound(threads, bound):
    # with only the fixed message CPU measured, one thread keeps it on the lanes (no bound: it
    # could not pass them); two put it beside them, where only the bound can count it
    placed, cluster = _dp({"message_cpu_s": 1e-4, "inter_op_threads": threads})
    assert (len(placed.device_cpu_seconds) > 0) == bound
    report = simulate(placed, cluster)
    assert (report.cpu_bound_s > 0) == bound


def test_no_cpu_overheads_no_bound():
    placed, cluster = _dp({"message_cpu_s": 1e-4})
    assert len(placed.device_cpu_seconds) == 0
    report = simulate(placed, cluster)
    assert report.cpu_bound_s == 0.0 and report.iteration_time_s == report.makespan_s


def test_kernels_timed_under_a_quota_count_its_share_and_the_bound_divides_by_it():
    # the P100 kind profiled under a 0.5 quota: its lane seconds are wall seconds, half of them CPU;
    # its collective CPU (2 ms) is CPU already, and the bound gives it twice the time
    g = fk.dp_graph(W)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    st = Strategy(8, 2, decision({"v100_0": 6, "p100_0": 2}, "allreduce"), {})
    prof = fk.dp_profile(g)
    conditions = {**prof.conditions, "by_kind": {"P100": {"emulation": {"cpu_fraction": 0.5}}}}
    cluster = fk.pair_cluster()
    placed = fk.lower_with_overheads(g, gr, cluster, st, dataclasses.replace(prof, conditions=conditions),
                                     {"collective_cpu_s": {"2": CURVE}})
    lane = np.isin(placed.task_kind, DEVICE_KINDS)
    lanes = np.bincount(placed.task_device[lane], weights=placed.task_seconds[lane], minlength=2)
    assert placed.device_cpu_fraction.tolist() == [1.0, 0.5]
    assert placed.device_cpu_seconds == pytest.approx([lanes[0] + 2e-3, 0.5 * lanes[1] + 2e-3], rel=1e-12)
    bound = max(lanes[0] + 2e-3, lanes[1] + 4e-3)
    assert simulate(placed, cluster).cpu_bound_s == pytest.approx(bound, rel=1e-12)


# ---- the same CPU on the lanes of CPU devices (HANDLER tasks; tfplace.overheads.apply._append_side_cpu) ----

def _cpu_pair(overheads, strategy=None, fraction=0.5):
    """fakes.dp_graph on two CPU devices, "cpu0" (kind CPU) and "cpu1" (kind CPU_half, profiled
    under a `fraction` quota), 6 + 2 samples all-reduced (or `strategy`), f and g at 1e-4 s per
    sample on both kinds."""
    from tfplace.formats.cluster import Device, Host, build_cluster
    g = fk.dp_graph(W)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    cluster = build_cluster("cpu_pair", [Host("h0", intra_bandwidth_bytes_per_s=1.2e10, intra_latency_s=5e-6)],
                            [Device("cpu0", "CPU", "h0", 16 * 10**9), Device("cpu1", "CPU_half", "h0", 16 * 10**9)])
    table = {n: {"CPU": 0.0, "CPU_half": 0.0} for n in g.names}
    for n in ("f", "g"):
        table[n] = {"CPU": 1e-4 * g.reference_batch_size, "CPU_half": 1e-4 * g.reference_batch_size}
    table["apply"] = {"CPU": 1e-4, "CPU_half": 1e-4}
    prof = fk.profile_table(g, table, linear=("f", "g"))
    conditions = {**prof.conditions, "by_kind": {"CPU_half": {"emulation": {"cpu_fraction": fraction}}}}
    st = strategy or Strategy(8, 2, decision({"cpu0": 6, "cpu1": 2}, "allreduce"), {})
    return fk.lower_with_overheads(g, gr, cluster, st, dataclasses.replace(prof, conditions=conditions),
                                   overheads), cluster


@pytest.mark.parametrize("cpu_ms", [0.2, 1.0])
def test_collective_cpu_runs_on_each_participants_lane_gating_nothing(cpu_ms):
    from tfplace.lowering.placed_graph import TASK_HANDLER
    s = cpu_ms * 1e-3
    placed, _ = _cpu_pair({"collective_cpu_s": {"2": {"bytes": [0], "seconds": [s]}}})
    plain, _ = _cpu_pair({"collective_cpu_s": {"2": {"bytes": [0], "seconds": [0.0]}}})
    coll = np.nonzero(placed.task_kind == TASK_COLLECTIVE)[0]
    handlers = np.nonzero(placed.task_kind == TASK_HANDLER)[0]
    assert len(coll) == 1 and (plain.task_kind == TASK_HANDLER).sum() == 0  # 0 s of CPU: no handler
    # one per participant, its CPU stretched by the device's quota like its kernels
    assert sorted(zip(placed.task_device[handlers].tolist(), placed.task_seconds[handlers].tolist())) == \
        [(0, pytest.approx(s, rel=1e-12)), (1, pytest.approx(s / 0.5, rel=1e-12))]
    assert placed.task_priority[handlers].tolist() == [placed.task_priority[coll[0]]] * 2
    # ready with the collective, gating nothing; the collective keeps its time
    assert not np.isin(placed.dep_src, handlers).any()
    waits = {int(h): sorted(placed.dep_src[placed.dep_dst == h].tolist()) for h in handlers}
    assert all(w == sorted(placed.dep_src[placed.dep_dst == coll[0]].tolist()) for w in waits.values())
    assert placed.task_seconds[coll] == pytest.approx(plain.task_seconds[plain.task_kind == TASK_COLLECTIVE])
    # the bound counts that CPU once (collective_d), not again for the handlers
    lane = np.isin(placed.task_kind, DEVICE_KINDS) & (placed.task_kind != TASK_HANDLER)
    lanes = np.bincount(placed.task_device[lane], weights=placed.task_seconds[lane], minlength=2)
    assert placed.device_cpu_seconds == pytest.approx([lanes[0] + s, 0.5 * lanes[1] + s], rel=1e-12)


@pytest.mark.parametrize("cpu_ms", [0.05, 0.2, 5.0])
def test_collective_cpu_delays_the_lane_only_beyond_the_collective(cpu_ms):
    # dp_graph's lanes wait idle during the all-reduce: its CPU costs the step nothing while it
    # fits in the collective's time, and beyond that the update waits for the lane
    s = cpu_ms * 1e-3
    placed, cluster = _cpu_pair({"collective_cpu_s": {"2": {"bytes": [0], "seconds": [s]}}})
    plain, _ = _cpu_pair({"collective_cpu_s": {"2": {"bytes": [0], "seconds": [0.0]}}})
    coll_s = float(plain.task_seconds[plain.task_kind == TASK_COLLECTIVE][0])
    got, base = simulate(placed, cluster).makespan_s, simulate(plain, cluster).makespan_s
    # the half-speed device's handler lasts s / 0.5 from the collective's start, like the collective
    assert got == pytest.approx(base + max(0.0, s / 0.5 - coll_s), rel=1e-9, abs=1e-12)


def test_message_bytes_cpu_runs_on_both_ends_lanes():
    from tfplace.lowering.placed_graph import TASK_HANDLER, TASK_TRANSFER
    rate = 1e-8
    st = Strategy(8, 2, None, {"x": decision({"cpu0": 8}), "w": decision({"cpu1": 8})})  # weights on cpu1
    placed, _ = _cpu_pair({"message_cpu_s_per_byte": rate}, strategy=st)
    handlers = np.nonzero(placed.task_kind == TASK_HANDLER)[0]
    x = np.nonzero((placed.task_kind == TASK_TRANSFER) & (placed.task_bytes > 0))[0]
    assert len(x) > 0 and len(handlers) == 2 * len(x)
    fraction = np.array([1.0, 0.5])
    want = sorted((int(d), 0.5 * rate * placed.task_bytes[t] / fraction[d])
                  for t in x for d in (placed.task_src_device[t], placed.task_device[t]))
    got = sorted(zip(placed.task_device[handlers].tolist(), placed.task_seconds[handlers].tolist()))
    assert [d for d, _ in got] == [d for d, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-12)


def test_gpus_carry_no_side_cpu_on_their_lanes():
    # the same overheads on the V100 / P100 pair: the bound counts the CPU, the lanes do not
    from tfplace.lowering.placed_graph import TASK_HANDLER
    placed, _ = _dp({"collective_cpu_s": {"2": CURVE}, "message_cpu_s_per_byte": 1e-8})
    assert (placed.task_kind == TASK_HANDLER).sum() == 0 and placed.device_cpu_seconds.sum() > 0


# ---- the step's dispatch: CPU in the demand in place of the wall the lanes carry ----

@pytest.mark.parametrize("over, wall_device, used, want", [
    # older profiles: no dispatch CPU, nothing changes
    ({"step_s": 1e-3, "worker_s": 2e-3}, 0, [0, 1, 2], [0.0, 0.0, 0.0]),
    # the wall (charged at device 0, fraction 1) leaves; the master gets its CPU, 2 further tasks
    ({"step_cpu_s": 1e-4, "master_worker_cpu_s": 5e-5, "worker_cpu_s": 3e-4}, 0, [0, 1, 2],
     [-1e-3 + 1e-4 + 2 * 5e-5, 3e-4, 3e-4]),
    # the first input on device 1 (fraction 0.5: half its wall seconds were in the demand)
    ({"step_cpu_s": 1e-4, "worker_cpu_s": 3e-4}, 1, [1], [1e-4, -0.5e-3 + 3e-4, 0.0]),
    # a further device that is a GPU gets no RunGraph CPU
    ({"worker_cpu_s": 3e-4}, 0, [0, 2, 3], [0.0, 0.0, 3e-4, 0.0]),
    # the first input on the GPU: its wall leaves the GPU's demand, the CPU master is device 0
    ({"step_cpu_s": 1e-4, "master_worker_cpu_s": 5e-5}, 3, [0, 3], [1e-4 + 5e-5, 0.0, 0.0, -1e-3]),
])
def test_dispatch_cpu_replaces_the_wall_with_each_tasks_cpu(over, wall_device, used, want):
    from tfplace.overheads.cpu_demand import dispatch_cpu_seconds
    fraction = np.array([1.0, 0.5, 0.5, 1.0])[:len(want)]
    cpu_device = np.array([True, True, True, False])[:len(want)]
    got = dispatch_cpu_seconds(overheads_from_json(over), 1e-3, wall_device, np.array(used), fraction, cpu_device)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_dispatch_cpu_gives_a_gpu_as_device_0_no_master_work():
    from tfplace.overheads.cpu_demand import dispatch_cpu_seconds
    got = dispatch_cpu_seconds(overheads_from_json({"step_cpu_s": 1e-4, "worker_cpu_s": 3e-4}), 1e-3, 0, np.array([0, 1]),
                               np.ones(2), np.array([False, True]))
    assert got == pytest.approx([-1e-3, 3e-4], rel=1e-12)


def test_dispatch_cpu_reaches_the_demand_through_the_lowering_and_leaves_the_lanes_alone():
    coll = {"collective_cpu_s": {"2": {"bytes": [0], "seconds": [2e-4]}}, "step_s": 4e-4, "worker_s": 3e-4}
    cpu = {"step_cpu_s": 1e-4, "master_worker_cpu_s": 6e-5, "worker_cpu_s": 2.5e-4}
    wall_only, cluster = _cpu_pair(coll)
    placed, _ = _cpu_pair({**coll, **cpu})
    # the first input's first instance is on cpu0 (fraction 1) and carries step_s as wall; the
    # step runs on both devices (worker_s is cpu1's wait for its RunGraph, a lane task outside
    # the demand)
    assert placed.device_cpu_seconds - wall_only.device_cpu_seconds == pytest.approx(
        [-4e-4 + 1e-4 + 6e-5, 2.5e-4], rel=1e-9)
    assert placed.task_seconds == pytest.approx(wall_only.task_seconds, rel=1e-12)
    assert simulate(placed, cluster).makespan_s == pytest.approx(simulate(wall_only, cluster).makespan_s, rel=1e-12)
