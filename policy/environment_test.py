import numpy as np
from tf_agents.environments import utils

from tfplace.policy import actions as A
from tfplace.policy.environment import PlacementEnvironment, evaluate_many
from tfplace.policy.testing_fixtures import tiny_task


def test_random_policy_against_specs():
    env = PlacementEnvironment(tiny_task("mlp", "four"))
    utils.validate_py_environment(env, episodes=5)


def test_reward_ranks_oom_below_feasible_and_by_excess():
    task = tiny_task("mlp", "two")
    task.reference_time_s = 1e-3
    fit = task.evaluate(A.proportional_action(task.num_groups, task.num_devices))
    assert not fit.oom and task.reward(fit) == -fit.time_s / 1e-3
    from tfplace.policy.environment import Evaluation
    small = Evaluation(fit.time_s, fit.time_s * task.oom_penalty * 1.1, True, 0.1)
    big = Evaluation(fit.time_s, fit.time_s * task.oom_penalty * 2.0, True, 1.0)
    assert task.reward(fit) > task.reward(small) > task.reward(big)


def test_evaluate_many_and_cache():
    task = tiny_task("cnn", "four")
    env = PlacementEnvironment(task)
    rng = np.random.default_rng(0)
    a = A.random_action(rng, task.num_groups, task.num_devices)
    rewards, evals = evaluate_many(env, [a, a])
    assert rewards[0] == rewards[1] and task.num_simulations == 1
