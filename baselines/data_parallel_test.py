"""Single-device, data-parallel and model-parallel baselines on tiny graphs (hand-computed)."""

import dataclasses

import numpy as np
import pytest

from tfplace import testing
from tfplace.formats.cluster import Device, Host, build_cluster
from tfplace.formats.strategy import validate_strategy

from tfplace.baselines import data_parallel, model_parallel
from tfplace.baselines.testing import small_problem


def _shares(strategy):
    return {d: sum(mb) for d, mb in strategy.default.shares}


def test_single_device_is_the_fastest():
    problem = small_problem(devices=2)  # V100 twice as fast as P100
    assert _shares(data_parallel.single_device(problem)) == {"v100_0": 16}


def test_single_device_skips_a_device_that_does_not_fit():
    # The V100 gets 1 kB of memory: the step cannot fit there, so the (slower) P100 is chosen.
    base = testing.two_device_cluster()
    devices = [dataclasses.replace(base.devices[0], memory_bytes=1000, task=None, tf_device=""),
               dataclasses.replace(base.devices[1], task=None, tf_device="")]
    cluster = build_cluster("small_v100", list(base.hosts), devices)
    problem = small_problem(cluster=cluster)
    assert _shares(data_parallel.single_device(problem)) == {"p100_0": 16}
    assert problem.evaluate(problem.single_device_strategy("v100_0")).oom


def test_dp_even_and_proportional_shares():
    problem = small_problem(devices=4, batch=16)
    assert list(_shares(data_parallel.dp_even(problem)).values()) == [4, 4, 4, 4]
    # Speeds 2:2:1:1 -> targets 5.33, 5.33, 2.67, 2.67 -> floors 5, 5, 2, 2; the two samples
    # left go to the largest shortfalls (0.67, the P100s): 5, 5, 3, 3.
    prop = data_parallel.dp_proportional(problem)
    assert _shares(prop) == {"v100_0": 5, "v100_1": 5, "p100_0": 3, "p100_1": 3}
    for s in (prop, data_parallel.dp_even(problem, "ps")):
        validate_strategy(s, problem.group_names, problem.device_names, 16)
    np.testing.assert_allclose(data_parallel.device_weights(problem), [1 / 3, 1 / 3, 1 / 6, 1 / 6])


def test_proportional_beats_even_on_a_heterogeneous_cluster():
    problem = small_problem(devices=4, batch=16)
    even = problem.evaluate(data_parallel.dp_even(problem)).iteration_time_s
    prop = problem.evaluate(data_parallel.dp_proportional(problem)).iteration_time_s
    assert prop < even


def test_ps_device_has_the_best_links():
    # Hosts a and b on 100 GbE, c on 10 GbE: device a/b see 12.5 + 1.25 GB/s, c only 1.25 + 1.25.
    # a (P100) and b (V100) tie on links; the faster b wins.
    hosts = [Host("a", nic_bandwidth_bytes_per_s=1.25e10), Host("b", nic_bandwidth_bytes_per_s=1.25e10),
             Host("c", nic_bandwidth_bytes_per_s=1.25e9)]
    devices = [Device("p100_a", "P100", "a", 12 * 10**9), Device("v100_b", "V100", "b", 16 * 10**9),
               Device("v100_c", "V100", "c", 16 * 10**9)]
    problem = small_problem(cluster=build_cluster("three_hosts", hosts, devices), batch=16)
    assert data_parallel.ps_device(problem) == "v100_b"
    assert data_parallel.dp_even(problem, "ps").default.ps_device == "v100_b"


def test_bad_sync_is_an_input_error():
    with pytest.raises(ValueError, match="sync"):
        data_parallel.dp_even(small_problem(), "gossip")


def test_round_robin_and_contiguous_count():
    problem = small_problem(devices=4, max_groups=12)
    g = problem.num_groups
    rr = model_parallel.round_robin(problem)
    names = problem.device_names
    assert [rr.decision_for(n).devices[0] for n in problem.group_names] == [names[i % 4] for i in range(g)]
    block = -(-g // 4)  # HeteroG's rule: group i -> device floor(i / ceil(G / n))
    cont = model_parallel.contiguous(problem, balance="count")
    assert [cont.decision_for(n).devices[0] for n in problem.group_names] == [names[i // block] for i in range(g)]
    for s in (rr, cont, model_parallel.contiguous(problem)):
        validate_strategy(s, problem.group_names, problem.device_names, problem.global_batch_size)


@pytest.mark.parametrize("weights, device_weights, expected", [
    # Six equal groups, device 0 twice as fast: cut at 2/3 of the work -> 4 + 2 groups.
    ([1, 1, 1, 1, 1, 1], [2, 1], [0, 0, 0, 0, 1, 1]),
    # One heavy group first: raw blocks [1, 2, 2, 2] would leave block 0 empty; the repair keeps
    # the order and gives every device at least one group.
    ([10, 1, 1, 1], [1, 1, 1], [0, 1, 2, 2]),
    # Fewer groups than devices: some devices stay empty.
    ([1, 1], [1, 1, 1], [0, 2]),
])
def test_contiguous_blocks(weights, device_weights, expected):
    got = model_parallel.contiguous_blocks(np.array(weights, float), np.array(device_weights, float))
    assert got.tolist() == expected


def _fast_pair_slow_pair():
    """Two V100s on one host with NVLink-class links; two P100s on another host behind a 1 Gb/s
    NIC. The MLP's dense layers at batch 64 with a large hidden layer: its gradients are MBs."""
    hosts = [Host("fast", intra_bandwidth_bytes_per_s=5e10, nic_bandwidth_bytes_per_s=1.25e8),
             Host("slow", intra_bandwidth_bytes_per_s=1e10, nic_bandwidth_bytes_per_s=1.25e8)]
    devices = [Device("v100_0", "V100", "fast", 16 * 10**9), Device("v100_1", "V100", "fast", 16 * 10**9),
               Device("p100_0", "P100", "slow", 12 * 10**9), Device("p100_1", "P100", "slow", 12 * 10**9)]
    return build_cluster("fast_pair_slow_pair", hosts, devices)


def test_dp_over_the_best_subset_leaves_the_slow_linked_devices_out():
    problem = small_problem(cluster=_fast_pair_slow_pair(), batch=64)
    every = {name: problem.evaluate(fn(problem)).iteration_time_s for name, fn in (
        ("dp_even_allreduce", lambda p: data_parallel.dp_even(p, "allreduce")),
        ("dp_even_ps", lambda p: data_parallel.dp_even(p, "ps")),
        ("dp_proportional_allreduce", lambda p: data_parallel.dp_proportional(p, "allreduce")),
        ("dp_proportional_ps", lambda p: data_parallel.dp_proportional(p, "ps")))}
    for proportional in (False, True):
        subset = data_parallel.dp_best_subset(problem, "allreduce", proportional=proportional)
        assert set(_shares(subset)) == {"v100_0", "v100_1"}, _shares(subset)
        t = problem.evaluate(subset).iteration_time_s
        assert t * 1.3 < min(every.values()), (t, every)  # the slow NIC makes every all-device DP pay


@pytest.mark.parametrize("batch, devices", [
    (64, 4),   # compute-bound, one host with fast links: every device pays
    (16, 3),   # less work per device: the fourth (slow) device no longer pays for its all-reduce share
])
def test_dp_over_the_best_subset_takes_as_many_devices_as_pay(batch, devices):
    problem = small_problem(devices=4, batch=batch, fixed_seconds=1e-6)
    subset = data_parallel.dp_best_subset(problem, "allreduce", proportional=True)
    assert len(_shares(subset)) == devices
    times = [problem.evaluate(data_parallel.data_parallel(
        problem, [1.0] * k, "allreduce", [problem.device_names[i] for i in data_parallel.speed_order(problem)[:k]]))
        .iteration_time_s for k in range(1, 5)]
    assert problem.evaluate(subset).iteration_time_s <= min(times) * 1.05
