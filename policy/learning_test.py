"""The policy learns: REINFORCE (policy/agent.py) makes the greedy strategy of a tiny task faster.

The task is the tiny MLP on the four-device fake cluster (8 groups, batch 8). With seed 0 the
untrained greedy strategy takes 1.129 ms and the fastest strategy training reached (other seeds)
takes 0.165 ms, so there is room to improve. Training climbs the reward for real (sign +1) and,
as the control that shows the check can fail, with the advantages negated (sign -1: a learner
that climbs the wrong way).
"""

from typing import Dict, List, Tuple

import numpy as np
import pytest
import tensorflow as tf

from tfplace.formats.config import NetworkConfig, RLConfig
from tfplace.policy.actions import ActionLayout
from tfplace.policy.agent import ReinforceLearner
from tfplace.policy.environment import PlacementTask
from tfplace.policy.network import PlacementNetwork
from tfplace.policy.testing_fixtures import tiny_task

NETWORK = NetworkConfig(hidden_size=16, num_message_passing_steps=1, mlp_layers=1)
RL = RLConfig(learning_rate=3e-3)
SAMPLES_PER_UPDATE = 8
UPDATES = 40
# Greedy time after / before, measured at UPDATES=40 over seeds 0-9 (2-core CPU, TF 2.15):
# sign +1 gave 0.08-0.78 (seed 0: 0.375), sign -1 gave 1.03-5.5 (seed 0: 1.88). "Faster by
# 20%" holds for every seed measured and fails for every negated run.
MIN_SPEEDUP = 0.2


def _task() -> PlacementTask:
    return tiny_task("mlp", "four", batch_size=8, max_groups=8)


def _learner(seed: int, obs: Dict[str, np.ndarray]) -> ReinforceLearner:
    """A built learner whose initial weights come from `seed` (set before the network exists)."""
    tf.keras.utils.set_random_seed(seed)
    learner = ReinforceLearner(PlacementNetwork(NETWORK, ActionLayout()), RL)
    learner.build(obs)
    return learner


def _train(seed: int, updates: int, sign: float = 1.0) -> Tuple[float, float, ReinforceLearner]:
    """Runs `updates` REINFORCE steps on a fresh task and learner, the advantages multiplied by
    `sign`; returns the greedy strategy's simulated time (s) before and after, and the learner."""
    task = _task()
    obs = task.features.as_observation()
    learner = _learner(seed, obs)
    before = task.evaluate(learner.greedy(obs)).effective_time_s
    for step in range(updates):
        actions = learner.sample(obs, SAMPLES_PER_UPDATE, [seed, step])
        advantages = learner.advantages(task.label, [task.reward(task.evaluate(a)) for a in actions])
        learner.update([(obs, actions, sign * advantages)])
    return before, task.evaluate(learner.greedy(obs)).effective_time_s, learner


def _weights(learner: ReinforceLearner) -> List[np.ndarray]:
    return [v.numpy() for v in learner.network.trainable_variables]


@pytest.mark.parametrize("sign,expect_faster", [(+1.0, True), (-1.0, False)], ids=["reinforce", "negated"])
def test_reinforce_improves_the_greedy_strategy(sign, expect_faster):
    before, after, _ = _train(seed=0, updates=UPDATES, sign=sign)
    assert (after <= (1 - MIN_SPEEDUP) * before) == expect_faster, (before, after)
    assert (after < before) == expect_faster, (before, after)  # negated: slower, not merely less fast


def test_training_is_reproducible_with_a_seed():
    obs = _task().features.as_observation()
    first, again = _train(seed=1, updates=3)[2], _train(seed=1, updates=3)[2]
    for key, value in first.greedy(obs).items():
        np.testing.assert_array_equal(value, again.greedy(obs)[key], err_msg=key)
    for a, b in zip(_weights(first), _weights(again)):
        np.testing.assert_array_equal(a, b)
    one, two = _weights(_learner(1, obs)), _weights(_learner(2, obs))
    assert any(not np.array_equal(a, b) for a, b in zip(one, two))


def _share_accuracy_after_imitation(rank_feature: int, steps: int) -> float:
    """Imitates a target that puts alternate groups of the tiny MLP on v100_0 and v100_1, two
    identical devices (op-level model parallelism), for `steps` steps; returns the fraction of
    the target's share levels the greedy strategy then matches."""
    task = _task()
    obs = task.features.as_observation()
    tf.keras.utils.set_random_seed(0)
    network = NetworkConfig(hidden_size=16, num_message_passing_steps=2, mlp_layers=1,
                            device_rank_feature=rank_feature)
    learner = ReinforceLearner(PlacementNetwork(network, ActionLayout()), RLConfig(learning_rate=1e-2))
    learner.build(obs)
    g, d = task.num_groups, task.num_devices
    target = {"shares": np.zeros((g, d), np.int32), "micro": np.zeros(g, np.int32), "sync": np.zeros(g, np.int32),
              "ps_device": np.zeros(g, np.int32), "priority": np.zeros(g, np.int32)}
    target["shares"][np.arange(g), np.arange(g) % 2] = 2  # group i whole on v100_(i mod 2)
    for _ in range(steps):
        learner.imitate([(obs, target)])
    return float((learner.greedy(obs)["shares"] == target["shares"]).mean())


def test_only_a_network_that_reads_the_device_rank_can_imitate_model_parallelism_over_identical_devices():
    # Without the rank, v100_0 and v100_1 get the same logits for every group, so each group is
    # wrong on one of the two columns: at most 1 - 1/4 of the share levels can match. With it,
    # the target is learned exactly (measured with seed 0: 0.75 for both after 40 steps, 0.75 and
    # 1.0 after 80).
    assert _share_accuracy_after_imitation(0, 100) <= 0.75
    assert _share_accuracy_after_imitation(1, 100) == 1.0
