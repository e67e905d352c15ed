import numpy as np
import tensorflow as tf

from tfplace.formats.config import NetworkConfig, RLConfig
from tfplace.policy import actions as A
from tfplace.policy.actions import ActionLayout, action_array_spec
from tfplace.policy.agent import ReinforceLearner, batch_observation
from tfplace.policy.network import PlacementNetwork
from tfplace.policy.testing_fixtures import tiny_task

CONFIG = NetworkConfig(hidden_size=16, num_message_passing_steps=2, mlp_layers=1)


def test_one_network_serves_any_graph_and_device_count():
    net = PlacementNetwork(CONFIG, ActionLayout())
    for task in (tiny_task("mlp", "two"), tiny_task("cnn", "four")):
        dists, _ = net(batch_observation(task.features.as_observation()))
        g, d = task.num_groups, task.num_devices
        sample = {k: v.sample().numpy()[0] for k, v in dists.items()}
        for key, spec in action_array_spec(g, d).items():
            spec.check_array(sample[key].astype(np.int32))
        assert dists["shares"].batch_shape == [1]
    assert len(net.trainable_variables) > 0


def test_batched_observations_match_single():
    net = PlacementNetwork(CONFIG, ActionLayout())
    obs = tiny_task("mlp", "four").features.as_observation()
    one, _ = net(batch_observation(obs))
    two, _ = net({k: tf.constant(np.stack([v, v])) for k, v in obs.items()})
    np.testing.assert_allclose(two["shares"].distribution.logits.numpy()[1],
                               one["shares"].distribution.logits.numpy()[0], rtol=1e-4, atol=1e-5)


def test_reinforce_update_moves_probability_towards_rewarded_action():
    task = tiny_task("mlp", "four")
    obs = task.features.as_observation()
    learner = ReinforceLearner(PlacementNetwork(CONFIG, ActionLayout()), RLConfig(learning_rate=1e-3, entropy_coef=0.0))
    learner.build(obs)
    before = [v.numpy().copy() for v in learner.network.trainable_variables]
    acts = learner.sample(obs, 4, [1, 2])
    from tfplace.policy.network import log_prob

    def margin():  # log pi(rewarded) - mean log pi(others): what REINFORCE with a baseline moves
        d, _ = learner.network(batch_observation(obs))
        lps = [float(log_prob(d, {k: tf.constant(v[None]) for k, v in a.items()})[0]) for a in acts]
        return lps[0] - np.mean(lps[1:])
    start = margin()
    for _ in range(5):
        learner.update([(obs, acts, np.array([1.0, -1 / 3, -1 / 3, -1 / 3], np.float32))])
    assert margin() > start
    changed = sum(not np.allclose(a, b.numpy()) for a, b in zip(before, learner.network.trainable_variables))
    assert changed > len(before) // 2


def test_devices_take_part_in_message_passing():
    """A device's embedding gathers messages from every group: changing the pair features of one
    group on device 0 moves the share logits of *another* group on device 0 (pair features only
    entered their own (group, device) head before devices took part in message passing)."""
    net = PlacementNetwork(CONFIG, ActionLayout())
    obs = tiny_task("mlp", "four").features.as_observation()
    changed = {k: np.array(v) for k, v in obs.items()}
    changed["pairs"][0, 0, :] += 1.0
    logits = [net(batch_observation(o))[0]["shares"].distribution.logits.numpy()[0] for o in (obs, changed)]
    other_group = np.abs(logits[0][1:, 0] - logits[1][1:, 0]).max()
    assert other_group > 1e-4


def test_planning_draws_from_the_marginals_as_the_network_does():
    # Planning takes one pass of the network and decodes greedy and samples from its marginals
    # (actions.greedy_from / sample_from): the mode must be the network's, and sample frequencies
    # its probabilities.
    obs = tiny_task().features.as_observation()
    tf.keras.utils.set_random_seed(3)
    learner = ReinforceLearner(PlacementNetwork(CONFIG, ActionLayout()), RLConfig())
    probs = learner.probabilities(obs)
    greedy = A.greedy_from(probs)
    for k, v in learner.greedy(obs).items():
        np.testing.assert_array_equal(greedy[k], v, err_msg=k)
    draws = A.sample_from(np.random.default_rng(0), probs, 4000)
    for k in A.ACTION_KEYS:
        levels = probs[k].shape[-1]
        freq = np.mean([np.eye(levels)[a[k]] for a in draws], axis=0)
        assert freq.shape == probs[k].shape
        assert np.abs(freq - probs[k]).max() < 0.035, k  # 4000 draws: sd <= 0.008
    one_hot = {k: np.eye(v.shape[-1])[np.zeros(v.shape[:-1], int) + 1] for k, v in probs.items()}
    assert all((a[k] == 1).all() for a in A.sample_from(np.random.default_rng(1), one_hot, 5) for k in a)


def test_only_the_rank_feature_lets_identical_devices_differ():
    # v100_0 and v100_1 (and the two P100s) are identical: a network without the rank column
    # gives them the same share logits for every group, one with it can tell them apart
    obs = batch_observation(tiny_task("mlp", "four").features.as_observation())
    for rank, differ in ((0, False), (1, True)):
        tf.random.set_seed(3)
        config = NetworkConfig(hidden_size=16, num_message_passing_steps=2, mlp_layers=1, device_rank_feature=rank)
        logits = PlacementNetwork(config, ActionLayout())(obs)[0]["shares"].distribution.logits.numpy()[0]
        gap = max(np.abs(logits[:, 0] - logits[:, 1]).max(), np.abs(logits[:, 2] - logits[:, 3]).max())
        assert (gap > 1e-4) == differ, (rank, gap)
