"""The hybrid planner: a layer's groups, DP with VGG-19's heavy layers on single devices, the devices it
tries; a Problem's kept reports."""

import os

import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.strategy import decision
from tfplace.ir.grouping import make_grouping
from tfplace.ir.loader import load_op_graph
from tfplace.profiling.device_model import cluster_profile
from tfplace.simulator import fakes as fk

from tfplace.baselines import data_parallel, hybrid
from tfplace.baselines.problem import make_problem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_layer_is_its_weight_its_reads_and_their_consumers_its_update_and_its_gradient():
    # dp_graph: x -> f = MatMul(x, read(w)) -> g = MatMul(x, f) -> apply(w, lr, g) -> train_op
    g = fk.dp_graph()
    names = ["x", "w", "r", "lr", "f", "g", "apply", "train_op"]
    problem = make_problem(g, fk.pair_cluster(), fk.dp_profile(g), grouping=fk.grouping(g, [[n] for n in names]))
    (w,) = [v for v in g.variables if v.name == "w"]
    layer = {problem.group_names[i] for i in hybrid.layer_groups(problem, w)}
    assert layer == {"w", "r", "f", "g", "apply"}  # not the input, the learning rate or the train op


@pytest.mark.parametrize("cluster, at_least", [
    ("heterog_testbed.json", 1.15),   # 191.8 ms (DP over the best subset) -> 152.7 ms
    ("two_kind_4gpu.json", 1.2),      # 274.2 ms -> 210.7 ms
])
def test_vgg19_runs_its_fully_connected_layers_whole_on_single_devices(cluster, at_least):
    """VGG-19's FC layers hold 120 M of its 143 M parameters: DP all-reduces their gradients every
    step. The hybrid keeps DP for the convolutions and runs each FC layer on one device, and beats
    every data-parallel baseline, the best subset included, within memory."""
    graph = load_op_graph(os.path.join(REPO, "graph_defs", "zoo", "vgg19_b64_s224_sgd.json"))
    cl = load_cluster(os.path.join(REPO, "clusters", cluster))
    problem = make_problem(graph, cl, cluster_profile(graph, cl), grouping=make_grouping(graph, 64))
    plan = hybrid.dp_mp_hybrid(problem)
    report = problem.evaluate(plan)
    dp_best = min(problem.evaluate(s).iteration_time_s for s in (
        data_parallel.dp_proportional(problem), data_parallel.dp_best_subset(problem, proportional=True),
        data_parallel.dp_best_subset(problem, proportional=False)))
    assert not report.oom and dp_best / report.iteration_time_s >= at_least, (dp_best, report.iteration_time_s)
    heavy = hybrid.heavy_layers(problem)
    assert 3 <= len(heavy) <= hybrid.MAX_LAYERS
    single = [g for g, d in plan.groups.items() if len(d.shares) == 1]
    assert single and len(single) < problem.num_groups / 2  # a hybrid, not model parallelism


def _problem(model_file, cluster):
    graph = load_op_graph(os.path.join(REPO, "graph_defs", "zoo", model_file))
    cl = load_cluster(os.path.join(REPO, "clusters", cluster))
    return make_problem(graph, cl, cluster_profile(graph, cl), grouping=make_grouping(graph, 64))


def test_a_layer_is_tried_on_one_device_of_each_set_the_cluster_and_the_strategy_treat_alike():
    problem = _problem("vgg19_b64_s224_sgd.json", "heterog_testbed.json")  # pairs: 2 V100, 2+2 1080 Ti, 2 P100
    start = data_parallel.dp_proportional(problem)
    assert hybrid.candidate_devices(problem, start) == ["v100_0", "gtx1080ti_0", "gtx1080ti_2", "p100_0"]
    (layer, *_) = hybrid.heavy_layers(problem)
    moved = hybrid._with_layer_on(problem, start, layer, "v100_0")  # v100_0 now differs from v100_1
    assert hybrid.candidate_devices(problem, moved) == ["v100_0", "v100_1", "gtx1080ti_0", "gtx1080ti_2", "p100_0"]


@pytest.mark.parametrize("model_file, cluster", [
    ("vgg19_b64_s224_sgd.json", "heterog_testbed.json"),
    ("vgg19_b64_s224_sgd.json", "two_kind_4gpu.json"),
])
def test_trying_one_device_per_class_plans_what_trying_every_device_plans(model_file, cluster, monkeypatch):
    problem = _problem(model_file, cluster)
    tries = []
    candidates = hybrid.candidate_devices
    monkeypatch.setattr(hybrid, "candidate_devices",
                        lambda p, s: tries.append(len(candidates(p, s))) or candidates(p, s))
    fewer = hybrid.dp_mp_hybrid(problem)
    assert sum(tries) < len(tries) * problem.cluster.num_devices  # fewer simulations
    monkeypatch.setattr(hybrid, "candidate_devices", lambda p, s: list(p.device_names))
    assert hybrid.dp_mp_hybrid(problem) == fewer


def test_a_problem_simulates_a_strategy_once_and_keeps_a_bounded_number_of_reports(monkeypatch):
    from tfplace.baselines import problem as problem_module
    g = fk.dp_graph()
    problem = make_problem(g, fk.pair_cluster(), fk.dp_profile(g))
    simulated = []
    simulate = problem_module.simulate
    monkeypatch.setattr(problem_module, "simulate", lambda *a: simulated.append(1) or simulate(*a))
    monkeypatch.setattr(problem_module, "EVALUATIONS_KEPT", 2)
    a, b, c = (problem.strategy(default=decision(d)) for d in (
        {"v100_0": 8}, {"p100_0": 8}, {"v100_0": 4, "p100_0": 4}))
    first = problem.evaluate(a)
    equal = problem.strategy(default=decision({"v100_0": 8}))
    assert problem.evaluate(equal) is first and len(simulated) == 1
    assert problem.evaluate(b).iteration_time_s > first.iteration_time_s  # the P100 is slower: not a's report
    problem.evaluate(c)  # a third: the oldest (a) is dropped
    problem.evaluate(a)
    assert len(simulated) == 4
