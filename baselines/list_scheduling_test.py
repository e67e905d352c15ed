"""HEFT / m-ETF / m-SCT on hand-made instances whose schedules are worked out in the comments."""

import numpy as np
import pytest

from tfplace.formats.strategy import validate_strategy

from tfplace.baselines import list_scheduling as ls
from tfplace.baselines.testing import small_problem

INF = np.inf


def instance(cost, edges=(), memory=None, capacity=None, bandwidth=1.0, latency=0.0, **extra):
    cost = np.array(cost, dtype=float)
    g, d = cost.shape
    if "task_group" in extra:
        g = int(np.max(extra["task_group"])) + 1
    bw = np.full((d, d), float(bandwidth))
    np.fill_diagonal(bw, INF)
    lat = np.full((d, d), float(latency))
    np.fill_diagonal(lat, 0.0)
    e = np.array(edges, dtype=float).reshape(-1, 3)
    return ls.SchedulingInstance(cost, np.zeros(g) if memory is None else np.array(memory, float),
                                 np.full(d, 1e18) if capacity is None else np.array(capacity, float),
                                 e[:, 0].astype(int), e[:, 1].astype(int), e[:, 2], bw, lat, **extra)


def test_heft_fork_join():
    # 0 -> {1, 2} -> 3, every group 1 s on two equal devices, every edge 0.1 s on the wire.
    # Ranks: 3: 1; 1 and 2: 1 + 0.1 + 1 = 2.1; 0: 3.2 -> order 0, 1, 2, 3 (ties by index).
    # 0 on d0 [0, 1]; 1 on d0 [1, 2] (d1 would finish at 2.1); 2 on d1 [1.1, 2.1] (d0: 3);
    # 3: on d0 its inputs arrive at max(2, 2.1 + 0.1) = 2.2 -> 3.2; on d1 at max(2 + 0.1, 2.1)
    # = 2.1 -> 3.1: d1. Makespan 3.1 (serial would be 4).
    inst = instance([[1, 1]] * 4, [(0, 1, 0.1), (0, 2, 0.1), (1, 3, 0.1), (2, 3, 0.1)])
    s = ls.heft_schedule(inst)
    assert s.device.tolist() == [0, 0, 1, 1]
    assert s.makespan_s == pytest.approx(3.1)


def test_heft_keeps_a_chain_on_the_fast_device():
    # Chain of 3; d0 takes 1 s per group, d1 3 s, transfers 10 s: everything on d0, makespan 3.
    inst = instance([[1, 3]] * 3, [(0, 1, 10.0), (1, 2, 10.0)])
    s = ls.heft_schedule(inst)
    assert s.device.tolist() == [0, 0, 0] and s.makespan_s == pytest.approx(3.0)


def test_heft_respects_memory():
    # Same chain, but d0 holds only two groups (1 GB each, 2 GB capacity): group 2 goes to d1,
    # finishing at 2 (d0) + 10 (transfer) + 3 (d1) = 15 s; nothing overflows.
    inst = instance([[1, 3]] * 3, [(0, 1, 10.0), (1, 2, 10.0)], memory=[1e9] * 3, capacity=[2e9, 8e9])
    s = ls.heft_schedule(inst)
    assert s.device.tolist() == [0, 0, 1]
    assert s.makespan_s == pytest.approx(15.0) and s.overflow == ()


def test_memory_overflow_is_reported():
    # Two groups of 5 GB, devices of 4 GB: each goes to the device with most free memory.
    inst = instance([[1, 1]] * 2, memory=[5e9, 5e9], capacity=[4e9, 4e9])
    s = ls.heft_schedule(inst)
    assert sorted(s.overflow) == [0, 1] and sorted(s.device.tolist()) == [0, 1]


def test_m_etf_independent_groups_fill_both_devices():
    # Four independent 1 s groups on two equal devices: two each, makespan 2 (optimal).
    s = ls.m_etf_schedule(instance([[1, 1]] * 4))
    assert np.bincount(s.device, minlength=2).tolist() == [2, 2] and s.makespan_s == pytest.approx(2.0)


def test_m_etf_and_m_sct_favourite_child():
    # 0 -> 1 (heavy edge, 0.5 s), 0 -> 2 (0.01 s), 2 -> 3 (0.01 s); all groups 1 s, two devices.
    # Upward ranks: 3: 1; 2: 1 + 0.01 + 1 = 2.01; 1: 1; 0: 1 + max(0.5 + 1, 0.01 + 2.01) = 3.02.
    # m-ETF: 0 on d0 [0, 1]. Ready {1, 2}: earliest start 1 on d0 for both -> higher rank wins:
    #   2 on d0 [1, 2]. Then 1: d0 at 2, d1 at 1 + 0.5 = 1.5 -> d1 [1.5, 2.5]. Then 3 on d0
    #   [2, 3]. Makespan 3.0 (= the critical path 0-2-3, optimal).
    # m-SCT: 1 is 0's favourite child; on d0 it gets a 0.5 s credit, start 1 - 0.5 = 0.5 < 1, so
    #   1 on d0 [1, 2]; 2 on d1 [1.01, 2.01]; 3 (2's favourite) on d1 [2.01, 3.01] (d0 would
    #   start at 2.02). Makespan 3.01; the heavy edge never crosses devices.
    inst = instance([[1, 1]] * 4, [(0, 1, 0.5), (0, 2, 0.01), (2, 3, 0.01)])
    etf = ls.m_etf_schedule(inst)
    assert etf.device.tolist() == [0, 1, 0, 0] and etf.makespan_s == pytest.approx(3.0)
    sct = ls.m_sct_schedule(inst)
    assert sct.device.tolist() == [0, 0, 1, 1] and sct.makespan_s == pytest.approx(3.01)


def test_tasks_of_a_group_share_a_device():
    # Tasks 0 and 1 form one group: 1 + 10 = 11 s of work on d0, 5 + 1 = 6 s on d1. Task 0 alone
    # is cheaper on d0 (finish 1 vs 5), but committing the group there costs 11 - 6 = 5 s more:
    # score 1 + 5 = 6 on d0 vs 5 + 0 on d1 -> d1; both tasks run there, makespan 6 (not 11).
    inst = instance([[1, 5], [10, 1]], task_group=np.array([0, 0]))
    for schedule in (ls.heft_schedule, ls.m_etf_schedule):
        s = schedule(inst)
        assert s.device.tolist() == [1, 1] and s.group_device.tolist() == [1] and s.makespan_s == pytest.approx(6.0)


def test_a_device_receives_one_transfer_at_a_time():
    # Tasks 0 and 1 end at 1 s on d1 and d2; task 2 on d0 needs both (1 s on the wire each).
    # The transfers share d0's incoming port: they arrive at 2 and 3, task 2 runs [3, 4].
    inst = instance([[100, 1, 100], [100, 100, 1], [1, 100, 100]], [(0, 2, 1.0), (1, 2, 1.0)])
    s = ls.heft_schedule(inst)
    assert s.device.tolist() == [1, 2, 0]
    assert s.start_s[2] == pytest.approx(3.0) and s.makespan_s == pytest.approx(4.0)


def test_weights_follow_their_first_consumer():
    # Group 1 has no task (a weight); task 0 (group 0, cheap on d1) reads it, so it goes to d1.
    # Task 1 (group 2, cheap on d0) also reads it: the 5 s weight transfer from d1 starts at the
    # step's start, so task 1 runs [5, 6] on d0.
    inst = instance([[100, 1], [1, 100]], memory=[0.0, 0.0, 0.0], task_group=np.array([0, 2]),
                    mirror_group=np.array([1, 1]), mirror_task=np.array([0, 1]), mirror_bytes=np.array([5.0, 5.0]))
    s = ls.heft_schedule(inst)
    assert s.group_device.tolist() == [1, 1, 0]
    assert s.start_s[1] == pytest.approx(5.0) and s.finish_s[1] == pytest.approx(6.0)


@pytest.mark.parametrize("schedule", [ls.heft_schedule, ls.m_etf_schedule, ls.m_sct_schedule])
def test_shape_ops_do_not_decide_a_groups_device(schedule):
    # Group 0: task 0, 100 s on d0 (fast) / 300 s on d1. Group 1: a tiny shape task 1 (no inputs,
    # ready at 0) and its expensive task 2 (10 s / 30 s) that needs task 0 (1 s on the wire).
    # Placing per task, the shape task would start at 0 on the idle d1 (d0 is busy until 100)
    # and drag task 2 there: 101 + 30 = 131. Per group: group 1 is one node ready at 100;
    # d0 gives 100 + 10.001 = 110.001, d1 101 + 30.001 -> d0, makespan 110.001.
    inst = instance([[100, 300], [0.001, 0.001], [10, 30]], [(0, 2, 1.0), (1, 2, 0.0)],
                    task_group=np.array([0, 1, 1]))
    s = schedule(inst)
    assert s.group_device.tolist() == [0, 0] and s.device.tolist() == [0, 0, 0]
    assert s.makespan_s == pytest.approx(110.001)
    assert s.group_start_s.tolist() == pytest.approx([0.0, 100.0])


@pytest.mark.parametrize("schedule", [ls.heft_schedule, ls.m_etf_schedule, ls.m_sct_schedule])
def test_forward_backward_groups_keep_their_order(schedule):
    # Group A = {forward task 0, backward task 3}, group B = {forward 1, backward 2}; chain
    # 0 -> 1 -> 2 -> 3, so the group graph A <-> B has a cycle. A is split into phases {0} and {3}
    # (3 depends on A's task 0 through B), B is one phase {1, 2}: nodes A0 -> B0 -> A1. Every task
    # 1 s on d0 and 2 s on d1, 0.5 s per transfer: all on d0, tasks back to back, makespan 4,
    # and task 3 starts after task 2 (a whole-group view of A would run it before B).
    inst = instance([[1, 2]] * 4, [(0, 1, 0.5), (1, 2, 0.5), (2, 3, 0.5)], task_group=np.array([0, 1, 1, 0]))
    s = schedule(inst)
    assert s.group_device.tolist() == [0, 0]
    assert s.start_s.tolist() == pytest.approx([0, 1, 2, 3]) and s.makespan_s == pytest.approx(4.0)


def test_group_is_charged_for_its_later_phases_and_back_edges():
    # Same chain as above, but A's backward task 3 is 10 s on d0 and 1 s on d1 while B is cheap
    # on d0. A's placement is decided at its first phase (task 0, 1 s on either device), with
    # the rest of its work counted: d0 costs 10 - 1 = 9 s more for task 3 -> A on d1. Then B:
    # on d0 it finishes at 1.5 + 2 = 3.5 but its output must go back to A (0.5 s): 4.0; on d1
    # 1 + 4 = 5 -> B on d0. A's task 3 runs on d1 [4, 5]: makespan 5 (all on d0 would be 13).
    inst = instance([[1, 1], [1, 2], [1, 2], [10, 1]], [(0, 1, 0.5), (1, 2, 0.5), (2, 3, 0.5)],
                    task_group=np.array([0, 1, 1, 0]))
    s = ls.heft_schedule(inst)
    assert s.group_device.tolist() == [1, 0]
    assert s.start_s[3] == pytest.approx(4.0) and s.makespan_s == pytest.approx(5.0)


def test_edges_must_go_forward():
    with pytest.raises(ValueError, match="forward"):
        instance([[1, 1]] * 2, [(1, 0, 1.0)])


@pytest.mark.parametrize("placer", [ls.heft, ls.m_etf, ls.m_sct])
def test_placers_give_valid_strategies(placer):
    problem = small_problem(model="cnn", devices=4, max_groups=12)
    strategy = placer(problem)
    validate_strategy(strategy, problem.group_names, problem.device_names, problem.global_batch_size)
    report = problem.evaluate(strategy)
    assert not report.oom and report.iteration_time_s > 0
