"""The structural profile (tfplace.profiling.structural) and the rewrite's default profile: the
rewritten graph depends on the strategy and the graph, not on the profile's costs."""
import dataclasses
import os

import numpy as np
import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.strategy import Strategy, decision, even_strategy
from tfplace.profiling.structural import structural_profile
from tfplace.rewrite.graph_rewrite import rewrite_step
from tfplace.testing import random_strategy, tiny_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cluster(name="local_cpu.json"):
    return load_cluster(os.path.join(ROOT, "clusters", name))


def _nodes(step):
    return {n.name: (n.op, n.device, tuple(n.input)) for n in step.graph_def.node}


def _random_costs(profile, rng):
    """`profile` with every op's seconds drawn at random per kind (1 us .. 10 ms, log-uniform)."""
    ops = {name: {kind: (pts[0], tuple(float(x) for x in 10 ** rng.uniform(-6, -2, len(pts[1]))))
                  for kind, pts in per.items()}
           for name, per in profile.ops.items()}
    return dataclasses.replace(profile, ops=ops)


def test_every_op_on_every_kind_even_kinds_the_device_model_does_not_know():
    graph = tiny_graph("cnn", 8)
    p = structural_profile(graph, ["CPU", "CPU_half"], seconds_per_op=2e-4)
    assert set(p.ops) == set(graph.names) and p.kinds == ("CPU", "CPU_half")
    assert not p.run_order and not p.missing_ops
    batched = np.zeros(graph.num_ops, dtype=bool)
    batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    scales = graph.op_batch_dependent & batched
    assert 0 < scales.sum() < graph.num_ops
    for i, name in enumerate(graph.names):
        # by hand: batched ops are linear (4 of 8 samples: half the time), the others constant
        assert p.seconds(name, "CPU_half", 8) == pytest.approx(2e-4)
        assert p.seconds(name, "CPU", 4) == pytest.approx(1e-4 if scales[i] else 2e-4)


@pytest.mark.parametrize("kinds, seconds", [([], 1e-4), (["CPU"], 0.0), (["CPU"], float("nan"))])
def test_bad_arguments_name_the_field(kinds, seconds):
    with pytest.raises(InputError, match="kinds|seconds_per_op"):
        structural_profile(tiny_graph("mlp", 8), kinds, seconds)


def _strategies(cluster, graph):
    devices = list(cluster.device_names)
    out = [even_strategy(devices, 12, 4),
           Strategy(12, 4, decision({"cpu0": 6, "cpu1": [3, 3]}, "ps", "cpu2"), {})]
    from tfplace.ir.grouping import make_grouping
    groups = make_grouping(graph, 4).group_names
    rng = np.random.default_rng(7)
    out += [random_strategy(rng, groups, devices, 12) for _ in range(3)]
    return out


def test_the_rewritten_graph_does_not_depend_on_costs():
    """No profile (the structural default), the structural profile at another unit, and random
    costs per op and kind: the same GraphDef for every strategy."""
    cluster = _cluster()
    graph = tiny_graph("mlp", 12, "momentum")
    rng = np.random.default_rng(0)
    for strategy in _strategies(cluster, graph):
        default = _nodes(rewrite_step(graph, strategy, cluster))
        assert len(default) > graph.num_ops
        for profile in (structural_profile(graph, cluster.kinds, 3e-3),
                        _random_costs(structural_profile(graph, cluster.kinds), rng)):
            assert _nodes(rewrite_step(graph, strategy, cluster, profile=profile)) == default


def test_a_run_order_is_what_changes_it():
    """The comparison above can see a difference: the profile's run order (priority ties)
    changes the per-device control chains."""
    cluster = _cluster()
    graph = tiny_graph("mlp", 12, "momentum")
    single = Strategy(12, 4, decision({"cpu0": 12}), {})
    ordered = dataclasses.replace(structural_profile(graph, cluster.kinds), run_order=tuple(graph.names[::-1]))
    assert _nodes(rewrite_step(graph, single, cluster, profile=ordered)) != _nodes(rewrite_step(graph, single, cluster))


def test_default_serves_kinds_the_device_model_does_not_know():
    cluster = _cluster("local_cpu_hetero.json")
    assert "CPU_half" in cluster.kinds
    from tfplace.profiling.device_model import default_profile
    graph = tiny_graph("mlp", 12, "sgd")
    with pytest.raises(InputError):
        default_profile(graph, cluster.kinds)
    step = rewrite_step(graph, even_strategy(list(cluster.device_names), 12, 4), cluster)
    assert {n.device for n in step.graph_def.node} == {d.tf_device for d in cluster.devices}
