"""The learner: REINFORCE with a moving-average reward baseline per task and entropy
regularisation (chosen over PPO: each step evaluates a few whole strategies of one-step
episodes, and with fresh on-policy samples every step PPO's clipping buys little; the config
loader accepts `rl.algorithm: "reinforce"` only).

Per task (graph, cluster) and step, with K sampled actions a_k and rewards r_k:
    A_k  = (r_k - b) / max(std_k(r), 0.01 |b|)          b: moving average of the task's rewards
    loss = mean over tasks [ -mean_k(A_k log pi(a_k)) / G  -  beta H(pi) / G ]
(G = groups of the task, so tasks of different sizes weigh the same). One Adam update per step
over all tasks; then b <- decay b + (1 - decay) mean_k(r_k). Only fresh on-policy samples enter
the gradient (no off-policy pool replay without importance weights, a flaw of HeteroG's learner).

Imitation (expert iteration, tfplace.policy.pretrain): `imitate` takes one supervised step
towards target actions (strategies the search found, encoded by tfplace.policy.actions.encode):
    loss = mean over tasks [ -log pi(a*) / G ]
and `probabilities` gives the per-group marginals the policy-guided search draws its moves from.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfplace.formats.config import RLConfig
from tfplace.formats.errors import InputError

from tfplace.policy.network import PlacementNetwork, entropy, log_prob

Action = Dict[str, np.ndarray]


def batch_observation(obs: Dict[str, np.ndarray]) -> Dict[str, tf.Tensor]:
    """Adds the batch dimension B = 1 to a single observation."""
    return {k: tf.convert_to_tensor(np.asarray(v)[None]) for k, v in obs.items()}


class ReinforceLearner:
    def __init__(self, network: PlacementNetwork, config: RLConfig):
        if config.algorithm != "reinforce":
            raise InputError("config", "rl.algorithm", f"{config.algorithm!r} is not implemented yet",
                             'use "reinforce"')
        self.network = network
        self.config = config
        self.optimizer = tf.keras.optimizers.Adam(learning_rate=config.learning_rate)
        self.baselines: Dict[str, float] = {}

    def build(self, obs: Dict[str, np.ndarray]) -> None:
        """Creates the network and optimizer variables (before restoring a checkpoint)."""
        self.network(batch_observation(obs))
        self.optimizer.build(self.network.trainable_variables)
        self._built = True

    def _ensure_built(self, obs: Dict[str, np.ndarray]) -> None:
        if not getattr(self, "_built", False):
            self.build(obs)

    # The network passes run as tf.functions (one trace per graph/cluster shape family; relaxed
    # shapes after the first retrace), which removes most of the per-step Python/eager overhead.
    @tf.function(reduce_retracing=True)
    def _sample_fn(self, obs, n, seed):
        dists, _ = self.network(obs)
        return {k: d.sample(n, seed=tf.random.experimental.stateless_fold_in(seed, i))
                for i, (k, d) in enumerate(sorted(dists.items()))}

    @tf.function(reduce_retracing=True)
    def _greedy_fn(self, obs):
        dists, _ = self.network(obs)
        return {k: d.mode() for k, d in dists.items()}

    @tf.function(reduce_retracing=True)
    def _task_grads(self, obs, acts, adv, beta):
        with tf.GradientTape() as tape:
            dists, _ = self.network(obs, training=True)
            g = tf.cast(tf.shape(obs["nodes"])[1], tf.float32)
            lp = log_prob(dists, acts)[:, 0]  # [K]
            ent = entropy(dists)[0]
            loss = -tf.reduce_mean(adv * lp) / g - beta * ent / g
        variables = self.network.trainable_variables
        grads = tape.gradient(loss, variables)
        grads = [tf.zeros_like(v) if gr is None else gr for gr, v in zip(grads, variables)]
        return loss, ent / g, grads

    @tf.function(reduce_retracing=True)
    def _imitation_grads(self, obs, target):
        with tf.GradientTape() as tape:
            dists, _ = self.network(obs, training=True)
            g = tf.cast(tf.shape(obs["nodes"])[1], tf.float32)
            loss = -tf.reduce_mean(log_prob(dists, target)) / g
        variables = self.network.trainable_variables
        grads = tape.gradient(loss, variables)
        return loss, [tf.zeros_like(v) if gr is None else gr for gr, v in zip(grads, variables)]

    def probabilities(self, obs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Per-group marginals of the policy for one observation: shares [G, D, L], ps_device
        [G, D], sync [G, 2], micro [G, 2], priority [G, P] (each row sums to 1). Eager: planning
        calls it once per task, and one eager pass (about 0.05 s for Inception-V3 on 6 devices)
        costs far less than tracing a tf.function for a new shape (about 3 s)."""
        self._ensure_built(obs)
        dists, _ = self.network(batch_observation(obs))
        return {k: d.distribution.probs_parameter().numpy()[0].astype(np.float64) for k, d in dists.items()}

    def imitate(self, batch: Sequence[Tuple[Dict[str, np.ndarray], Action]]) -> float:
        """One supervised step over [(observation, target action)] of several tasks (mean of the
        per-task losses); returns the mean loss, in nats per group, before the step."""
        self._ensure_built(batch[0][0])
        losses, grads = [], []
        for obs, target in batch:
            acts = {k: tf.constant(np.asarray(v, np.int32)[None]) for k, v in target.items()}
            loss, g = self._imitation_grads(batch_observation(obs), acts)
            losses.append(float(loss))
            grads.append(g)
        self._apply_mean(grads)
        return float(np.mean(losses))

    def _apply_mean(self, per_task_grads) -> None:
        """One optimizer step with the mean of the tasks' gradients (clipped; refused if not finite)."""
        grads = [tf.add_n(list(gs)) / len(per_task_grads) for gs in zip(*per_task_grads)]
        if any(not np.all(np.isfinite(gr.numpy())) for gr in grads):
            raise FloatingPointError("policy gradient is not finite; lower rl.learning_rate")
        grads, _ = tf.clip_by_global_norm(grads, 5.0)
        self.optimizer.apply_gradients(zip(grads, self.network.trainable_variables))

    def sample(self, obs: Dict[str, np.ndarray], n: int, seed: Sequence[int]) -> List[Action]:
        self._ensure_built(obs)
        seed_t = tf.constant(np.asarray(seed, dtype=np.int32))
        out = {k: v.numpy()[:, 0] for k, v in self._sample_fn(batch_observation(obs), int(n), seed_t).items()}
        return [{k: v[i].astype(np.int32) for k, v in out.items()} for i in range(n)]

    def greedy(self, obs: Dict[str, np.ndarray]) -> Action:
        self._ensure_built(obs)
        return {k: v.numpy()[0].astype(np.int32) for k, v in self._greedy_fn(batch_observation(obs)).items()}

    def advantages(self, label: str, rewards: Sequence[float]) -> np.ndarray:
        r = np.asarray(rewards, dtype=np.float64)
        b = self.baselines.get(label, float(r.mean()))
        scale = max(float(r.std()), 0.01 * abs(b), 1e-6)
        adv = (r - b) / scale
        d = self.config.baseline_decay
        self.baselines[label] = d * b + (1 - d) * float(r.mean())
        return adv.astype(np.float32)

    def update(self, batch: Sequence[Tuple[Dict[str, np.ndarray], List[Action], np.ndarray]]) -> Dict[str, float]:
        """One gradient step over [(observation, sampled actions, advantages)] of several tasks
        (the loss is the mean over tasks, so the gradient is the mean of the per-task ones)."""
        self._ensure_built(batch[0][0])
        beta = tf.constant(self.config.entropy_coef, tf.float32)
        losses, ents, grads = [], [], []
        for obs, actions, adv in batch:
            acts = {k: tf.constant(np.stack([a[k] for a in actions])[:, None]) for k in actions[0]}
            loss, ent, g = self._task_grads(batch_observation(obs), acts, tf.constant(adv, tf.float32), beta)
            losses.append(float(loss))
            ents.append(float(ent))
            grads.append(g)
        self._apply_mean(grads)
        return {"loss": float(np.mean(losses)), "entropy_per_group": float(np.mean(ents))}
