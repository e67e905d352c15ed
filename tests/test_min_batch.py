"""Batch norm's minimum per-replica batch (Strategy.min_batch_per_replica).

A training-mode batch norm normalises each replica's micro-batch with that micro-batch's own
statistics: over one sample every normalised activation is 0. The lowering refuses a strategy
that gives a replica of a batch-statistics group fewer samples than the minimum, naming the group
and the device; the planners (registry.generate), the policy (PlacementTask.decode) and the
search (HillClimber) keep to it through `Lowerer.legalize` / `formats.strategy.with_min_batch`.
Model: the zoo's tiny CNN (conv, batch norm, dense), whose grouping puts the FusedBatchNormV3 in
one group.
"""

import itertools
import json
import os

import numpy as np
import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.strategy import (DEFAULT_MIN_BATCH_PER_REPLICA, Strategy, decision, load_strategy,
                                      micro_batch_shortfall, save_strategy, with_min_batch)
from tfplace.ir.grouping import make_grouping
from tfplace.ir.loader import load_op_graph
from tfplace.lowering.lower import Lowerer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CNN = os.path.join(ROOT, "graph_defs", "zoo", "tiny_cnn_b16_s16_sgd.json")
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")
MAX_GROUPS = 8


# ---- the pure rule -------------------------------------------------------------------------
# (shares, least, expected shares)
CASES = [
    ({"a": 8, "b": 8}, 2, {"a": 8, "b": 8}),                      # nothing short: unchanged
    ({"a": 7, "b": 1}, 2, {"a": 6, "b": 2}),                      # raised from the device with the most
    ({"a": 2, "b": 1}, 2, {"a": 3}),                              # the most cannot spare: b's sample joins a
    ({"a": 1, "b": 1, "c": 1}, 2, {"a": 3}),                      # all short: the first takes the batch
    ({"a": [3, 1, 1]}, 2, {"a": [3, 2]}),                         # short micro-batches are joined
    ({"a": [1, 1, 3]}, 2, {"a": [2, 3]}),
    ({"a": [2, 2], "b": [1, 1, 1, 1]}, 2, {"a": [2, 2], "b": [2, 2]}),
    ({"a": [1, 3], "b": 1, "c": 4}, 2, {"a": 3, "b": 2, "c": 4}),  # a gives b one sample, then joins its own
    ({"a": [4, 4], "b": 8}, 8, {"a": 8, "b": 8}),
    ({"a": 9, "b": 3, "c": 4}, 4, {"a": 8, "b": 4, "c": 4}),
]


@pytest.mark.parametrize("shares, least, expected", CASES)
def test_with_min_batch(shares, least, expected):
    d = decision(shares, "ps", "a", 1)
    got = with_min_batch(d, least)
    assert got.to_json()["shares"] == expected
    assert (got.sync, got.ps_device, got.priority) == ("ps", "a", 1)
    assert got.total_samples == d.total_samples
    assert micro_batch_shortfall(got, least) is None
    assert with_min_batch(got, least) is got  # idempotent: a legal decision is returned as it is


def test_with_min_batch_keeps_every_random_decision_whole():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 5))
        shares = {f"d{i}": [int(x) for x in rng.integers(1, 4, size=int(rng.integers(1, 4)))] for i in range(n)}
        d = decision(shares)
        least = int(rng.integers(1, d.total_samples + 1))
        got = with_min_batch(d, least)
        assert got.total_samples == d.total_samples and micro_batch_shortfall(got, least) is None, (shares, least)
        assert set(got.devices) <= set(d.devices)


# ---- the strategy field ----------------------------------------------------------------------
def test_the_field_round_trips_and_defaults(tmp_path):
    s = Strategy(16, MAX_GROUPS, decision({"cpu0": 16}), {}, min_batch_per_replica=4)
    save_strategy(s, tmp_path / "s.json")
    assert load_strategy(tmp_path / "s.json").min_batch_per_replica == 4
    assert Strategy(16, MAX_GROUPS, decision({"cpu0": 16}), {}).effective_min_batch_per_replica == \
        DEFAULT_MIN_BATCH_PER_REPLICA
    assert Strategy(3, MAX_GROUPS, decision({"cpu0": 3}), {}, min_batch_per_replica=8).effective_min_batch_per_replica == 3


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_bad_minimum_is_one_error_naming_the_field(tmp_path, value):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "tfplace.strategy", "version": 1, "global_batch_size": 16, "max_groups": 8,
                                "min_batch_per_replica": value, "default": {"shares": {"cpu0": 16}}}))
    with pytest.raises(InputError) as err:
        load_strategy(path)
    assert err.value.field == "min_batch_per_replica" and err.value.fix


# ---- the lowering refuses, the planners, policy and search keep to it -------------------------
@pytest.fixture(scope="module")
def problem():
    from tfplace.baselines.problem import make_problem
    from tfplace.profiling.device_model import default_profile
    graph = load_op_graph(TINY_CNN)
    cluster = load_cluster(CLUSTER)
    return make_problem(graph, cluster, default_profile(graph, ["CPU"]), max_groups=MAX_GROUPS, global_batch_size=5)


def _bn_group(problem):
    lowerer = problem.lowerer
    assert lowerer.batch_stat_groups, "the tiny CNN has a training-mode batch norm"
    return lowerer.index.group_names[next(iter(lowerer.batch_stat_groups))]


def test_the_lowering_refuses_a_batch_norm_replica_below_the_minimum(problem):
    name = _bn_group(problem)
    bad = problem.strategy(groups={name: decision({"cpu0": 4, "cpu1": 1})}, default=decision({"cpu0": 5}))
    with pytest.raises(InputError) as err:
        problem.lowerer.lower(bad)
    assert err.value.field == f"groups.{name}.shares.cpu1"
    assert "batch statistics" in err.value.problem and "FusedBatchNorm" in err.value.problem
    assert "min_batch_per_replica" in err.value.fix
    # one sample per replica is fine where the group holds no batch statistics, and off with 1
    other = next(g for g in problem.group_names if g != name)
    problem.lowerer.lower(problem.strategy(groups={other: decision({"cpu0": 4, "cpu1": 1})},
                                           default=decision({"cpu0": 5})))
    import dataclasses
    problem.lowerer.lower(dataclasses.replace(bad, min_batch_per_replica=1))
    # legalize gives the strategy the planners keep: the lowering takes it
    fixed = problem.lowerer.legalize(bad)
    assert fixed.groups[name].to_json()["shares"] == {"cpu0": 3, "cpu1": 2}
    problem.lowerer.lower(fixed)


def test_an_inference_mode_batch_norm_has_no_minimum():
    from tfplace.lowering.lower import batch_statistics_groups
    graph = load_op_graph(TINY_CNN)
    grouping = make_grouping(graph, MAX_GROUPS)
    assert batch_statistics_groups(graph, grouping.op_group)
    for node in graph.graph_def.node:
        if node.op.startswith("FusedBatchNorm") and "is_training" in node.attr:
            node.attr["is_training"].b = False
    assert batch_statistics_groups(graph, grouping.op_group) == {}


def test_every_baseline_keeps_the_minimum(problem):
    from tfplace.baselines import registry
    bn = _bn_group(problem)
    raised = 0
    for name in registry.GENERATORS:
        try:
            strategy = registry.generate(name, problem)
        except InputError:  # a baseline that does not apply to this problem says so
            continue
        d = strategy.decision_for(bn)
        assert micro_batch_shortfall(d, 2) is None, (name, d.to_json())
        raised += any(s == 1 for _, sizes in registry.GENERATORS[name](problem).decision_for(bn).shares
                      for s in sizes)
        problem.lowerer.lower(strategy)
    assert raised, "no baseline gave batch norm a 1-sample replica at batch 5 on 3 devices: the test proves nothing"


def test_the_policy_and_the_search_keep_the_minimum(problem):
    from tfplace.policy import actions as A
    from tfplace.policy import search as S
    from tfplace.policy.environment import PlacementTask
    from tfplace.policy.pool import PoolEntry, StrategyPool
    task = PlacementTask("tiny_cnn", problem.graph, problem.grouping, problem.cluster, problem.profile, 5, MAX_GROUPS)
    bn = _bn_group(problem)
    rng = np.random.default_rng(1)
    raised = 0
    for _ in range(40):
        action = A.random_action(rng, task.num_groups, task.num_devices, task.layout)
        raw = A.decode(action, task.grouping.group_names, task.cluster.device_names, task.speeds, 5, MAX_GROUPS)
        raised += micro_batch_shortfall(raw.decision_for(bn), 2) is not None
        assert micro_batch_shortfall(task.decode(action).decision_for(bn), 2) is None
    assert raised, "no random action gave batch norm a 1-sample replica: the test proves nothing"
    pool = StrategyPool(8)
    start = problem.strategy(default=decision({"cpu0": 2, "cpu1": 2, "cpu2": 1}))
    start = task.lowerer.legalize(start)
    ev = task.evaluate_strategy(start)
    pool.add(PoolEntry("start", start, ev.time_s, ev.effective_time_s, ev.oom, 0, None))
    climber = S.HillClimber(task, pool, np.random.default_rng(3))
    climber.step(60)
    assert climber.evaluations > 10
    for entry in pool.entries:
        assert micro_batch_shortfall(entry.strategy.decision_for(bn), 2) is None, entry.strategy.to_json()
