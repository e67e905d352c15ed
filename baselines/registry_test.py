"""The registry covers the configured baseline names and every generator gives a valid strategy."""

import pytest

from tfplace.formats import config

from tfplace import testing
from tfplace.formats.strategy import validate_strategy

from tfplace.baselines import registry
from tfplace.baselines.testing import small_problem


def test_covers_the_config_baselines():
    assert set(config.BASELINES) <= set(registry.names())
    assert set(registry.SIMULATED_AS) == set(registry.RUNTIME_BASELINES)
    assert all(registry.is_runtime(n) for n in registry.RUNTIME_BASELINES)
    assert not registry.is_runtime("single")


def test_unknown_name_is_an_input_error():
    with pytest.raises(ValueError, match="unknown baseline"):
        registry.generate("magic", small_problem())


@pytest.mark.parametrize("name", list(registry.GENERATORS) + list(registry.RUNTIME_BASELINES))
def test_every_generator_gives_a_valid_strategy(name, capsys):
    problem = small_problem(model="cnn", devices=4, batch=16, max_groups=10)
    strategy = registry.generate(name, problem)
    validate_strategy(strategy, problem.group_names, problem.device_names, problem.global_batch_size)
    assert problem.evaluate(strategy).iteration_time_s > 0
    if name == "pipeline":
        assert "estimated speed-up" in capsys.readouterr().out


def test_runtime_baselines_simulate_as_their_strategy():
    problem = small_problem(devices=4, batch=16)
    assert registry.generate("horovod_proportional", problem).to_json() == \
        registry.generate("dp_proportional_allreduce", problem).to_json()


def test_horovod_batch_sizes():
    assert registry.horovod_batch_sizes("horovod_even", 16, 3) == (6, 5, 5)
    # Weights 2 : 1 : 1 over 16 -> 8, 4, 4.
    assert registry.horovod_batch_sizes("horovod_proportional", 16, 3, [2, 1, 1]) == (8, 4, 4)
    with pytest.raises(ValueError):
        registry.run_runtime_baseline("single", "x.json", 16, 2)


def test_baseline_factories_for_the_policy():
    graph = testing.tiny_graph("mlp", 8)
    cluster = testing.four_device_cluster()
    factories = registry.baseline_factories(graph, cluster, 8, 10, profile=testing.uniform_profile(graph, cluster.kinds))
    assert set(factories) == set(registry.GENERATORS)
    s = factories["pipeline"]()
    assert s.global_batch_size == 8 and s.max_groups == 10
    few = registry.baseline_factories(graph, cluster, 2, 10, profile=testing.uniform_profile(graph, cluster.kinds))
    assert "dp_even_allreduce" not in few and "single" in few


def test_both_pipeline_entries_share_one_plan(monkeypatch):
    # The pipeline search is the costliest baseline: "pipeline" and "pipeline_ratio_lp" plan once.
    calls = []
    real = registry.pipeline.plan_pipeline
    monkeypatch.setattr(registry.pipeline, "plan_pipeline", lambda p, **kw: calls.append(p) or real(p, **kw))
    graph = testing.tiny_graph("mlp", 8)
    cluster = testing.four_device_cluster()
    factories = registry.baseline_factories(graph, cluster, 8, 10, profile=testing.uniform_profile(graph, cluster.kinds))
    plain, rebalanced = factories["pipeline"](), factories["pipeline_ratio_lp"]()
    assert len(calls) == 1 and plain.global_batch_size == rebalanced.global_batch_size == 8


def test_importing_the_baselines_does_not_load_tensorflow():
    import subprocess
    import sys
    code = "import sys, tfplace.baselines, tfplace.baselines.registry; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_default_profile_is_the_device_models():
    from tfplace.baselines import data_parallel
    from tfplace.profiling import device_model
    graph = testing.tiny_graph("cnn", 16)
    cluster = testing.four_device_cluster()  # v100_0, v100_1, p100_0, p100_1
    profile = device_model.cluster_profile(graph, cluster)
    assert profile.to_json() == device_model.default_profile(graph, cluster.kinds).to_json()
    # a problem made without a profile gets that one
    assert registry.baseline_factories(graph, cluster, 16, 10)["dp_proportional_allreduce"]().to_json() == \
        registry.baseline_factories(graph, cluster, 16, 10, profile=profile)["dp_proportional_allreduce"]().to_json()
    # not every kind equally fast (what a uniform stand-in would give): the V100 is faster
    weights = data_parallel.device_weights(registry.make_problem(graph, cluster, profile, max_groups=10))
    assert weights[0] == weights[1] > weights[2] == weights[3]
