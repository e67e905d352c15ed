"""DAPPLE-style pipeline planner: the DP, the search space, and hand-derived optima."""

import numpy as np
import pytest

from tfplace.formats.cluster import Device, Host, build_cluster
from tfplace.formats.strategy import validate_strategy

from tfplace.baselines import pipeline
from tfplace.baselines.testing import small_problem

INF = np.inf


def test_compositions():
    assert list(pipeline.compositions(3, 2)) == [(3,), (1, 2), (2, 1)]
    assert len(list(pipeline.compositions(8, 8))) == 2 ** 7


def test_best_cuts_minimises_the_bottleneck():
    # Groups cost 3, 1, 2 on one device per stage. Cut after group 0: stages 3 | 3 -> 3;
    # after group 1: 4 | 2 -> 4. Best: cuts [0, 1, 3], bottleneck 3.
    pre = np.array([0.0, 3.0, 4.0, 6.0])
    i, j = np.indices((4, 4))
    mat = np.where(i < j, pre[None, :] - pre[:, None], INF)
    assert pipeline._best_cuts([mat, mat]) == (3.0, [0, 1, 3])


def test_best_cuts_reports_infeasible():
    mat = np.full((3, 3), INF)
    assert pipeline._best_cuts([mat, mat]) == (INF, [])


def test_hierarchical_order_keeps_hosts_together():
    problem = small_problem(devices=4)
    assert pipeline.hierarchical_order(problem) == [0, 1, 2, 3]


def test_data_parallel_is_optimal_with_free_memory(capsys):
    # Two equal devices, costs linear in the samples, batch-independent ops free: one stage over
    # both devices takes W/2 (W = the step on one device), while S stages with M micro-batches
    # take at least W/M + (M-1)·W/(S·M) >= W/2 with equality only for S = 1. So the plan is DP.
    problem = small_problem(devices=2, factors={"V100": 1.0, "P100": 1.0}, fixed_seconds=0.0)
    plan = pipeline.plan_pipeline(problem, verify=False)
    assert len(plan.stages) == 1 and sorted(plan.stages[0][1]) == [0, 1]
    assert plan.estimate_s == pytest.approx(plan.dp_estimate_s) and plan.estimated_speedup == pytest.approx(1.0)
    # By hand: T = W/2 + the ring all-reduce of S gradient bytes in k tensors over 2 devices on
    # one PCIe link (12 GB/s, 5 µs): 2·(1/2)·S/12e9 + 2·1·5e-6·k.
    c = problem.costs
    w = c.replica_seconds("V100", problem.global_batch_size).sum()
    ring = c.grad_bytes.sum() / 1.2e10 + 2 * 5e-6 * c.grad_tensors.sum()
    assert plan.estimate_s == pytest.approx(w / 2 + ring, rel=1e-9)
    assert "estimated speed-up 1.00x" in capsys.readouterr().out


def test_memory_forces_a_pipeline():
    # Devices just too small for data parallelism (every replica holds every weight): the plan
    # must have several stages, each within its devices' memory by the planner's estimate.
    base = small_problem(devices=2, factors={"V100": 1.0, "P100": 1.0})
    costs = base.costs
    batch = base.global_batch_size
    dp_need = costs.memory_bytes(range(base.num_groups), batch // 2)
    cap = int(dp_need * 0.98)
    host = Host("h0")
    cluster = build_cluster("small", [host], [Device("v100_0", "V100", "h0", cap), Device("v100_1", "V100", "h0", cap)])
    problem = small_problem(cluster=cluster, factors={"V100": 1.0})
    plan = pipeline.plan_pipeline(problem, log=None)
    assert len(plan.stages) >= 2 and np.isfinite(plan.estimate_s)
    c, m = problem.costs, plan.micro_batches
    for (lo, hi), devs in plan.stages:
        share = batch // len(devs)  # equal speeds
        need = c.param_bytes[lo:hi].sum() + c.act_scale * (c.act_bytes_per_sample[lo:hi].sum() * share
                                                          + c.act_full_bytes[lo:hi].sum() * m)
        assert need <= cap


def test_verification_picks_a_plan_the_simulator_finds_faster_than_the_models_optimum():
    # The tiny CNN on 4 devices: the analytic model's best plan (3 stages, 2 micro-batches) runs
    # about 9% slower in the simulator than another plan of the short list, which verify=True
    # returns; the DP time it reports is the simulated time of one stage over every device.
    problem = small_problem(model="cnn", devices=4, batch=16)
    model_best = pipeline.plan_pipeline(problem, verify=False, log=None)
    verified = pipeline.plan_pipeline(problem, log=None)
    assert verified.strategy.to_json() != model_best.strategy.to_json()
    assert verified.simulated_s < 0.95 * problem.evaluate(model_best.strategy).iteration_time_s
    assert verified.simulated_s == pytest.approx(problem.evaluate(verified.strategy).iteration_time_s)
    dp = pipeline.plan_pipeline(problem, max_stages=1, micro_batches=(1,), verify=False, log=None)
    assert len(dp.stages) == 1 and dp.micro_batches == 1
    assert verified.dp_simulated_s == pytest.approx(problem.evaluate(dp.strategy).iteration_time_s)


def test_strategy_expresses_micro_batches():
    problem = small_problem(devices=4, batch=16)
    plan = pipeline.plan_pipeline(problem, micro_batches=(4,), max_stages=2, log=None)
    assert plan.micro_batches == 4
    validate_strategy(plan.strategy, problem.group_names, problem.device_names, 16)
    for (lo, hi), devs in plan.stages:
        d = plan.strategy.decision_for(problem.group_names[lo])
        assert sorted(problem.cluster.device_index(x) for x in d.devices) == sorted(devs)
        assert all(len(mb) <= 4 for _, mb in d.shares) and d.total_samples == 16
    assert not problem.evaluate(plan.strategy).oom


def test_stage_devices_follow_speed():
    # One stage over a V100 and a P100 (twice as slow): samples split 2 : 1 -> 11 and 5 of 16.
    problem = small_problem(devices=2, batch=16, fixed_seconds=0.0)
    plan = pipeline.plan_pipeline(problem, max_stages=1, micro_batches=(1,), log=None)
    shares = {d: sum(mb) for d, mb in plan.strategy.decision_for(problem.group_names[0]).shares}
    assert shares == {"v100_0": 11, "p100_0": 5}


@pytest.mark.parametrize("n, bounds", [(4, [0, 1, 2, 3, 4]), (10, list(range(11))),
                                       (16, [0, 2, 4, 6, 8, 10, 12, 13, 14, 15, 16]),
                                       (23, [0, 3, 6, 9, 11, 13, 15, 17, 19, 21, 23])])
def test_stage_boundaries_fall_on_at_most_ten_runs_of_devices(n, bounds):
    assert pipeline.unit_bounds(n) == bounds


def test_stage_matrices_are_built_once_and_match_a_fresh_build():
    # The search asks for the same stage under many compositions; the memo must hand back the
    # matrix a fresh build gives, and callers must not be able to change it in place.
    problem = small_problem(devices=4)
    model = pipeline._Model(problem)
    first = model.stage_matrix((0, 1), (2, 3), 2)
    assert model.stage_matrix([0, 1], [2, 3], 2) is first
    np.testing.assert_array_equal(first, pipeline._Model(problem)._stage_matrix((0, 1), (2, 3), 2))
    assert model.stage_matrix((0, 1), None, 2) is not first  # the last stage sends nothing on
    with pytest.raises(ValueError):
        first[0, 1] = 0.0
    shares = model.shares((0, 1))
    shares[0] += 5  # a caller's copy
    assert model.shares((0, 1)) != shares
