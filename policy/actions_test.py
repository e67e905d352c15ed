import dataclasses

import numpy as np
import pytest

from tfplace.formats.cluster import build_cluster
from tfplace.policy import actions as A
from tfplace.policy.environment import PlacementTask
from tfplace.policy.testing_fixtures import tiny_task
from tfplace.formats.strategy import validate_strategy


@pytest.mark.parametrize("seed,batch", [(0, 8), (1, 3), (2, 64), (3, 1)])
def test_random_actions_always_decode_to_valid_strategies(seed, batch):
    rng = np.random.default_rng(seed)
    names = [f"g{i}" for i in range(7)]
    devices = ["a", "b", "c", "d"]
    for _ in range(200):
        act = A.random_action(rng, len(names), len(devices))
        s = A.decode(act, names, devices, [15.7, 15.7, 9.3, 4.4], batch, 16)
        validate_strategy(s, names, devices, batch)
        for name in names:
            assert s.groups[name].total_samples == batch


def test_all_zero_levels_fall_back_to_fastest_device():
    act = A.proportional_action(2, 3)
    act["shares"][:] = 0
    s = A.decode(act, ["x", "y"], ["a", "b", "c"], [1.0, 3.0, 2.0], 10, 4)
    assert s.groups["x"].shares == (("b", (10,)),)


def test_proportional_action_matches_speed_split():
    act = A.proportional_action(1, 2)
    s = A.decode(act, ["x"], ["fast", "slow"], [1.8, 1.0], 64, 4)
    assert dict(s.groups["x"].shares) == {"fast": (41,), "slow": (23,)}  # proportional_shares example
    assert s.groups["x"].sync == "allreduce"


def test_micro_batches_ps_and_priority():
    act = A.proportional_action(1, 2)
    act["micro"][0], act["sync"][0], act["ps_device"][0], act["priority"][0] = 1, 1, 1, 2
    d = A.decode(act, ["x"], ["a", "b"], [1.0, 1.0], 8, 4).groups["x"]
    assert dict(d.shares) == {"a": (2, 2), "b": (2, 2)}
    assert (d.sync, d.ps_device, d.priority) == ("ps", "b", 2)


def test_random_actions_lower_and_simulate():
    # P100s with 8 kB each: the tiny MLP's random strategies peak at 3-13 kB per device, so some
    # fit and some run out of memory; the OOM penalty is checked by hand on both.
    base = tiny_task(cluster="four")
    devices = [d if d.kind != "P100" else dataclasses.replace(d, memory_bytes=8000) for d in base.cluster.devices]
    cluster = build_cluster("four_small_p100", list(base.cluster.hosts), devices)
    task = PlacementTask("small_p100", base.graph, base.grouping, cluster, base.profile, base.batch_size,
                         base.max_groups)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(20):
        ev = task.evaluate(A.random_action(rng, task.num_groups, task.num_devices))
        assert ev.time_s > 0 and ev.oom == (ev.memory_excess > 0)
        penalty = task.oom_penalty * (1 + ev.memory_excess) if ev.oom else 1.0  # environment docstring
        assert ev.effective_time_s == pytest.approx(ev.time_s * penalty)
        seen.add(ev.oom)
    assert seen == {True, False}


def test_mutate_changes_at_most_k_groups_and_stays_in_spec():
    rng = np.random.default_rng(0)
    a = A.random_action(rng, 5, 3)
    spec = A.action_array_spec(5, 3)
    for _ in range(50):
        b = A.mutate(rng, a, 2)
        for k, s in spec.items():
            s.check_array(b[k])
        assert A.action_key(A.action_from_json(A.action_to_json(b))) == A.action_key(b)


def test_encode_inverts_decode_on_the_action_space():
    """decode(encode(decode(a))) == decode(a) for random actions: every strategy the action space
    expresses comes back exactly (shares, micro-batches, sync, PS device, priority)."""
    rng = np.random.default_rng(7)
    groups, devices, speeds = ["g0", "g1", "g2", "g3"], ["a", "b", "c"], [1.0, 0.55, 0.3]
    for _ in range(200):
        act = A.random_action(rng, len(groups), len(devices))
        s = A.decode(act, groups, devices, speeds, 48, 4)
        back = A.decode(A.encode(s, groups, devices, speeds), groups, devices, speeds, 48, 4)
        assert back.to_json() == s.to_json()


def test_encode_rounds_an_inexpressible_split_to_the_nearest_levels():
    """A 40/8 split of 48 samples on equal devices is not expressible (levels 0.5/1/2 give at most
    4:1 ... 2:0.5); encode picks the nearest, 2 vs 0.5 (38/10), not proportional."""
    from tfplace.formats.strategy import GroupDecision, Strategy
    s = Strategy(48, 1, None, {"g0": GroupDecision((("a", (40,)), ("b", (8,))))}, "")
    act = A.encode(s, ["g0"], ["a", "b"], [1.0, 1.0])
    back = A.decode(act, ["g0"], ["a", "b"], [1.0, 1.0], 48, 1)
    assert [sum(mb) for _, mb in back.decision_for("g0").shares] == [38, 10]


def test_guided_mutate_draws_from_the_policy_marginals():
    """With marginals that put all mass on one value per field, every changed entry takes that
    value; uniform mutate would not (checked over 300 draws)."""
    rng = np.random.default_rng(3)
    g, d = 5, 3
    act = A.proportional_action(g, d)
    probs = {"shares": np.eye(4)[np.full((g, d), 3)], "ps_device": np.eye(d)[np.full(g, 2)],
             "sync": np.eye(2)[np.ones(g, int)], "micro": np.eye(2)[np.ones(g, int)],
             "priority": np.eye(3)[np.full(g, 2)]}
    wanted = {"shares": 3, "ps_device": 2, "sync": 1, "micro": 1, "priority": 2}
    changed = 0
    for _ in range(300):
        new = A.guided_mutate(rng, act, probs, 2)
        for k, v in new.items():
            diff = v != act[k]
            assert np.all(v[diff] == wanted[k])
            changed += int(diff.sum())
    assert changed > 300


@pytest.mark.parametrize("speeds, expected", [
    # the fastest device, then each speed class but the slowest (its mask is the whole cluster)
    ([1.0, 3.0, 2.0], [[0, 1, 0], [0, 1, 1]]),
    ([3.0, 3.0, 1.0, 1.0], [[1, 0, 0, 0], [1, 1, 0, 0]]),
    ([2.0, 1.0], [[1, 0]]),                 # two classes: the fastest class is the fastest device
    ([1.0, 1.0, 1.0], [[1, 0, 0]]),         # one class: only the fastest device alone
    ([5.0], []),                            # one device: nothing to leave out
])
def test_fastest_subsets_are_the_fastest_device_then_the_fastest_classes(speeds, expected):
    assert [m.astype(int).tolist() for m in A.fastest_subsets(speeds)] == expected


def test_ranked_subsets_follow_the_policys_expected_use():
    # P(level 0) per (group, device) for 2 groups, 4 devices: mean P(used) = [0.5, 0.95, 0.1, 0.5];
    # devices 0 and 3 tie (the earlier first). k = 1, 2, 3; the whole cluster is the greedy itself.
    p0 = np.array([[0.5, 0.0, 0.9, 0.2], [0.5, 0.1, 0.9, 0.8]])
    probs = np.stack([p0, 1 - p0, np.zeros_like(p0), np.zeros_like(p0)], axis=-1)  # [G, D, L]
    masks = [m.astype(int).tolist() for m in A.ranked_subsets(probs)]
    assert masks == [[0, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 1]]
    assert A.ranked_subsets(probs[:, :1]) == ()  # one device: nothing to leave out


def test_restrict_leaves_the_masked_devices_out_and_moves_their_servers():
    act = A.proportional_action(3, 3)
    act["sync"][:] = [0, 1, 1]
    act["ps_device"][:] = [2, 2, 0]
    act["micro"][:] = [1, 0, 1]
    ps_probs = np.array([[0.1, 0.2, 0.7], [0.1, 0.6, 0.3], [0.2, 0.5, 0.3]])
    out = A.restrict(act, np.array([True, True, False]), ps_probs)
    assert out["shares"][:, 2].tolist() == [0, 0, 0] and (out["shares"][:, :2] == act["shares"][:, :2]).all()
    # group 1's server (device 2) is masked: the most likely server of the mask takes it; group 2's stays
    assert out["ps_device"].tolist() == [2, 1, 0]
    assert out["micro"].tolist() == [1, 0, 1] and act["shares"][:, 2].tolist() != [0, 0, 0]  # input untouched
    s = A.decode(out, ["x", "y", "z"], ["a", "b", "c"], [2.0, 2.0, 1.0], 12, 4)
    assert all(name != "c" for g in s.groups.values() for name, _ in g.shares)


def _canonical_case():
    """3 groups on devices [a, b, c, d] where b, c, d are identical; group weights 1, 2, 4."""
    act = A.proportional_action(3, 4)
    act["shares"][:] = [[0, 2, 0, 0],   # group 0 on b
                        [0, 0, 0, 2],   # group 1 on d
                        [2, 0, 0, 2]]   # group 2 on a and d
    act["sync"][:] = [1, 1, 0]
    act["ps_device"][:] = [2, 2, 1]     # groups 0 and 1 keep their variables on c
    return act, ((0,), (1, 2, 3)), [1.0, 2.0, 4.0]


def test_canonical_device_order_puts_the_busiest_identical_device_first():
    act, classes, weights = _canonical_case()
    out = A.canonical_device_order(act, classes, weights)
    # d carried 6 units of work, b 1 and c none (it only serves two PS): d, b, c become b, c, d
    np.testing.assert_array_equal(out["shares"], [[0, 0, 2, 0], [0, 2, 0, 0], [2, 2, 0, 0]])
    np.testing.assert_array_equal(out["ps_device"], [3, 3, 2])
    np.testing.assert_array_equal(out["sync"], act["sync"])
    np.testing.assert_array_equal(act["shares"][0], [0, 2, 0, 0])  # the input is left as it was


@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (0, 2, 1, 3), (0, 3, 2, 1), (0, 2, 3, 1)])
def test_canonical_device_order_is_one_order_for_every_relabelling(perm):
    # relabel the identical devices b, c, d any way: the canonical action is the same
    act, classes, weights = _canonical_case()
    perm = np.asarray(perm)
    relabelled = {k: np.array(v, copy=True) for k, v in act.items()}
    relabelled["shares"][:, perm] = act["shares"]
    relabelled["ps_device"] = perm[act["ps_device"]].astype(np.int32)
    want = A.canonical_device_order(act, classes, weights)
    got = A.canonical_device_order(relabelled, classes, weights)
    assert A.action_key(got) == A.action_key(want)
    assert A.action_key(A.canonical_device_order(got, classes, weights)) == A.action_key(got)  # idempotent


def test_canonical_device_order_relabels_the_strategy():
    # one device per group (no batch split to break ties by index): the canonical action is the
    # same strategy with identical devices swapped, so each device's compute moves with it and
    # the bytes sent stay the same
    from tfplace.simulator import SimOptions, simulate
    task = tiny_task("mlp", "four")  # v100_0, v100_1 identical; p100_0, p100_1 identical
    rng = np.random.default_rng(5)
    swapped = 0
    for _ in range(10):
        act = A.random_action(rng, task.num_groups, task.num_devices)
        act["shares"][:] = 0
        act["shares"][np.arange(task.num_groups), rng.integers(0, task.num_devices, task.num_groups)] = 2
        canon = task.canonical(act)
        new_of = task.canonical_permutation(act)
        np.testing.assert_array_equal(canon["shares"][:, new_of], act["shares"])
        swapped += int((new_of != np.arange(task.num_devices)).any())
        reports = [simulate(task.lowerer.lower(task.decode(a)), task.cluster, SimOptions()) for a in (act, canon)]
        np.testing.assert_allclose(np.asarray(reports[1].compute_s)[new_of], reports[0].compute_s, rtol=1e-12)
        assert reports[1].comm_bytes == reports[0].comm_bytes
        assert A.action_key(task.canonical(canon)) == A.action_key(canon)  # idempotent
    assert swapped >= 3  # the check saw relabellings, not only actions already in order
