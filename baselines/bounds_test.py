"""Physics checks: the bounds by hand, and no baseline ever simulated below them."""

import dataclasses

import pytest

from tfplace import testing

from tfplace.baselines import bounds, registry
from tfplace.baselines.testing import small_problem


def test_formulas_by_hand():
    # 64 samples over devices doing 100 and 60 samples/s: 64 / 160 = 0.4 s.
    assert bounds.throughput_bound_s(64, [100.0, 60.0]) == pytest.approx(0.4)
    # 1 GB over a 4-rank ring at 10 GB/s: 2·3/4·0.1 = 0.15 s; one rank needs nothing.
    assert bounds.allreduce_bound_s(1e9, 4, 1e10) == pytest.approx(0.15)
    assert bounds.allreduce_bound_s(1e9, 1, 1e10) == 0.0
    # PS: 1 GB from each of 3 workers; slowest worker path 1 GB/s -> 1 s; the PS link at 2 GB/s
    # takes 3 GB -> 1.5 s: the bound is 1.5 s.
    assert bounds.ps_bound_s(1e9, [1e9, 2e9, 4e9], 2e9) == pytest.approx(1.5)


def test_compute_bound_is_batch_over_total_throughput_for_proportional_speeds():
    # Scaled profile: a P100 is exactly twice as slow as a V100 on every op, so the LP bound
    # equals B / Σ_d throughput_d with the per-sample rates of the batch-split ops.
    problem = small_problem(devices=4, batch=16, fixed_seconds=0.0)
    costs = problem.costs
    per_sample = {k: costs.replica_seconds(k, 16).sum() / 16 for k in costs.kinds}
    throughputs = [1.0 / per_sample[k] for k in costs.device_kind]  # 2 V100 + 2 P100
    expected = bounds.throughput_bound_s(16, throughputs)
    # By hand: V100 rate r, P100 2r -> 16 / (2/r + 2/(2r)) = 16 r / 3.
    assert expected == pytest.approx(16 * per_sample["V100"] / 3)
    assert bounds.ideal_compute_s(problem) == pytest.approx(expected, rel=1e-9)


def test_compute_bound_uses_relative_advantages():
    # Kinds that are not proportional: groups with an even index run 3x faster on a V100, odd
    # ones 3x faster on a P100. The proportional formula (whole-step throughputs, one split for
    # every group) is a feasible point of the LP, so the LP bound is below it, strictly here.
    base = small_problem(devices=4, batch=16, fixed_seconds=0.0)
    og = base.costs.op_group
    profile = dataclasses.replace(base.profile, ops={
        name: {"V100": (pts["V100"][0], tuple(x * (1 if og[i] % 2 == 0 else 3) for x in pts["V100"][1])),
               "P100": (pts["P100"][0], tuple(x / 2 * (3 if og[i] % 2 == 0 else 1) for x in pts["P100"][1]))}
        for i, (name, pts) in enumerate(base.profile.ops.items())})
    problem = registry.make_problem(base.graph, base.cluster, profile, max_groups=base.max_groups,
                                    grouping=base.grouping)
    costs = problem.costs
    throughputs = [16 / costs.replica_seconds(k, 16).sum() for k in costs.device_kind]
    assert bounds.ideal_compute_s(problem) < bounds.throughput_bound_s(16, throughputs) * (1 - 1e-3)


SMALL_CASES = [("mlp", 2, 8), ("mlp", 4, 16), ("cnn", 4, 16), ("attention", 2, 8)]


@pytest.mark.parametrize("model, devices, batch", SMALL_CASES)
def test_no_baseline_beats_physics(model, devices, batch):
    problem = small_problem(model=model, devices=devices, batch=batch, max_groups=10)
    for name in registry.GENERATORS:
        strategy = registry.generate(name, problem) if name != "pipeline" else \
            registry.pipeline.plan_pipeline(problem, log=None).strategy
        time_s = problem.evaluate(strategy).iteration_time_s
        for kind, bound in bounds.strategy_bounds(problem, strategy).items():
            assert time_s >= bound * (1 - 1e-9), f"{name} simulated {time_s} s, below the {kind} bound {bound} s"


def test_data_parallel_respects_the_communication_bounds():
    # DP with all-reduce gets the compute and ring bounds, DP with a PS the compute and PS bounds.
    problem = small_problem(devices=4, batch=16)
    strategy = registry.generate("dp_even_allreduce", problem)
    b = bounds.strategy_bounds(problem, strategy)
    assert set(b) == {"compute", "allreduce"}
    assert problem.evaluate(strategy).iteration_time_s >= max(b.values())
    ps = bounds.strategy_bounds(problem, registry.generate("dp_even_ps", problem))
    assert set(ps) == {"compute", "ps"}


def test_bounds_on_a_bigger_batch_and_a_uniform_profile():
    graph = testing.tiny_graph("cnn", 32)
    cluster = testing.four_device_cluster()
    problem = registry.make_problem(graph, cluster, testing.uniform_profile(graph, cluster.kinds), max_groups=8)
    strategy = registry.generate("dp_proportional_allreduce", problem)
    assert problem.evaluate(strategy).iteration_time_s >= bounds.ideal_compute_s(problem)
