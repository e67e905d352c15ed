"""One (graph, cluster) placement problem as a TF-Agents PyEnvironment.

    task = PlacementTask.build(graph, grouping, cluster, profile, batch_size, max_groups, ...)
    env = PlacementEnvironment(task)              # one-step episodes
    ts = env.reset()                              # observation: task.features.as_observation()
    ts = env.step(action)                         # reward, then the episode ends

Reward of a strategy with simulated iteration time t (seconds):
    effective_time = t                                           if it fits in memory
                   = t * oom_penalty * (1 + max_d(peak_d / cap_d - 1))   if it runs out of memory
    reward = -effective_time / reference_time_s
reference_time_s is the best baseline's (feasible) time, so reward -1 = as good as the best
baseline and an OOM strategy ranks below every feasible one but above a worse OOM one.
The evaluator keeps a `Lowerer` per task, so consecutive strategies that differ in a few groups
re-lower only those (the incremental evaluation), and caches results by action.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from tfplace.formats.cluster import Cluster
from tfplace.ir.graph_ir import OpGraph
from tfplace.ir.grouping import Grouping
from tfplace.lowering.lower import Lowerer
from tfplace.formats.profile import Profile
from tfplace.formats.reports import SimReport
from tfplace.simulator import SimOptions, simulate
from tfplace.baselines.problem import with_overheads
from tfplace.formats.strategy import Strategy
from tfplace.profiling.device_model import device_speed

from tfplace.policy import actions as A
from tfplace.policy.features import GraphFeatures, build_features, group_seconds, identical_device_classes


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Simulated result of one strategy. effective_time_s folds in the OOM penalty."""
    time_s: float
    effective_time_s: float
    oom: bool
    memory_excess: float


class PlacementTask:
    """Everything about one (graph, cluster): features, decoding and the cached evaluator."""

    def __init__(self, label: str, graph: OpGraph, grouping: Grouping, cluster: Cluster, profile: Profile,
                 batch_size: int, max_groups: int, oom_penalty: float = 10.0,
                 sim_options: SimOptions = SimOptions(), layout: A.ActionLayout = A.ActionLayout(),
                 overheads=None):
        """overheads: the cluster's RuntimeOverheads (CPU-emulated clusters; tfplace.overheads), or None."""
        self.overheads = overheads
        self.label, self.graph, self.grouping, self.cluster, self.profile = label, graph, grouping, cluster, profile
        self.batch_size, self.max_groups, self.oom_penalty = batch_size, max_groups, oom_penalty
        self.sim_options, self.layout = sim_options, layout
        self.features: GraphFeatures = build_features(graph, grouping, cluster, profile, batch_size)
        self.speeds = [float(device_speed(d)) for d in cluster.devices]
        self.lowerer = Lowerer(graph, grouping, cluster, profile)
        self.reference_time_s = 1.0  # set to the best baseline's time by the trainer
        self._cache: Dict[bytes, Evaluation] = {}
        self.num_simulations = 0
        self._canonical_args = None

    @property
    def num_groups(self) -> int:
        return self.grouping.num_groups

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def decode(self, action: Dict[str, np.ndarray]) -> Strategy:
        """The action's strategy, batch-statistics replicas raised to the minimum batch (Lowerer.legalize)."""
        return self.lowerer.legalize(A.decode(action, self.grouping.group_names, self.cluster.device_names,
                                              self.speeds, self.batch_size, self.max_groups, self.graph.name))

    def _canonical_inputs(self):
        """(classes of identical devices, each group's seconds on the fastest kind), made once."""
        if self._canonical_args is None:
            seconds = group_seconds(self.graph, self.grouping, self.profile, self.cluster.kinds, self.batch_size)
            self._canonical_args = (identical_device_classes(self.cluster), seconds.min(axis=1))
        return self._canonical_args

    def canonical_permutation(self, action: Dict[str, np.ndarray]) -> np.ndarray:
        """[D] the new index of each device under `canonical` (A.canonical_device_permutation)."""
        return A.canonical_device_permutation(action, *self._canonical_inputs())

    def canonical(self, action: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """`action` with each class of identical devices relabelled so that its first device does
        the most work (A.canonical_device_order, weighted by each group's seconds on the fastest
        kind): the same strategy up to that relabelling, in the order the device rank feature
        describes."""
        return A.canonical_device_order(action, *self._canonical_inputs())

    def simulate(self, strategy: Strategy, trace: bool = False) -> SimReport:
        """Simulated step of `strategy`; counted in num_simulations (strategies scored) unless it
        is a re-run for the Chrome trace of a strategy scored before (`trace`)."""
        if not trace:
            self.num_simulations += 1
        return simulate(with_overheads(self.lowerer.lower(strategy), self.cluster, self.overheads), self.cluster,
                        dataclasses.replace(self.sim_options, trace=trace))

    def evaluate_strategy(self, strategy: Strategy) -> Evaluation:
        r = self.simulate(strategy)
        excess = max(0.0, max(p / c - 1.0 for p, c in zip(r.peak_memory_bytes, r.memory_capacity_bytes)))
        eff = r.iteration_time_s * (self.oom_penalty * (1.0 + excess) if r.oom else 1.0)
        return Evaluation(r.iteration_time_s, eff, r.oom, excess)

    def evaluate(self, action: Dict[str, np.ndarray]) -> Evaluation:
        key = A.action_key(action)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > 50_000:
                self._cache.clear()
            hit = self._cache[key] = self.evaluate_strategy(self.decode(action))
        return hit

    def reward(self, ev: Evaluation) -> float:
        return -ev.effective_time_s / self.reference_time_s


def observation_array_spec(features: GraphFeatures):
    return {k: array_spec.ArraySpec(v.shape, v.dtype, name=k) for k, v in features.as_observation().items()}


class PlacementEnvironment(py_environment.PyEnvironment):
    """One-step episodes: observe the task, act once (a whole strategy), get its reward."""

    def __init__(self, task: PlacementTask):
        super().__init__()
        self._task = task
        self._obs = task.features.as_observation()
        self._obs_spec = observation_array_spec(task.features)
        self._action_spec = A.action_array_spec(task.num_groups, task.num_devices, task.layout)
        self.last_evaluation: Optional[Evaluation] = None

    def observation_spec(self):
        return self._obs_spec

    def action_spec(self):
        return self._action_spec

    def _reset(self):
        return ts.restart(self._obs)

    def _step(self, action):
        if self._current_time_step is not None and self._current_time_step.is_last():
            return self.reset()
        action = {k: np.asarray(v, dtype=np.int32) for k, v in action.items()}
        self.last_evaluation = self._task.evaluate(action)
        return ts.termination(self._obs, np.float32(self._task.reward(self.last_evaluation)))


def evaluate_many(env: PlacementEnvironment, actions: Sequence[Dict[str, np.ndarray]]):
    """Steps `env` once per action (reset before each); returns (rewards, evaluations)."""
    rewards, evals = [], []
    for a in actions:
        env.reset()
        step = env.step(a)
        rewards.append(float(step.reward))
        evals.append(env.last_evaluation)
    return rewards, evals
