"""Planning with a trained policy (library behind `python -m tfplace.plan` and the benchmark).

    result = plan(run_dir, graph=..., cluster=..., search_seconds=10, out="strategy.json")
    result = plan_task(learner, task, search_seconds, samples, seed)     # with a loaded policy
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tfplace.formats.config import load_train_config
from tfplace.formats.errors import InputError
from tfplace.formats.strategy import save_strategy

from tfplace.policy import actions as A
from tfplace.policy.agent import ReinforceLearner
from tfplace.policy.environment import PlacementTask
from tfplace.policy.network import PlacementNetwork
from tfplace.policy.pool import PoolEntry
from tfplace.policy.search import HillClimber
from tfplace.policy import train_lib, train_state


@dataclasses.dataclass
class PlanResult:
    label: str
    best: PoolEntry
    zero_shot: Optional[PoolEntry]  # best of greedy + samples, before any search (None: mode "search")
    baselines: Dict[str, Dict]
    best_baseline: str
    best_baseline_time_s: float
    planning_s: float
    zero_shot_s: float
    out: Optional[str] = None
    trace: List[Tuple[float, float, str]] = dataclasses.field(default_factory=list)
    best_action: Optional[PoolEntry] = None  # the best strategy found that is an action (decode-able)
    baseline_entries: List[PoolEntry] = dataclasses.field(default_factory=list)  # every baseline, simulated
    task: Optional[PlacementTask] = None  # set by plan(): what was planned (graph, grouping, profile)
    bundle: Optional[str] = None  # set by plan(): the graph bundle planned
    # the fastest strategy found that fits in memory (None: none does); the pool ranks by effective
    # time, in which an out-of-memory strategy's time is multiplied by the penalty, so a fast one
    # slightly over memory can rank above every one that fits
    best_fitting: Optional[PoolEntry] = None


def _to_stderr(message: str) -> None:
    sys.stderr.write(message + "\n")


def load_policy(run_dir: str, log: Callable[[str], None] = _to_stderr):
    """(learner, train config, prefix of the TF checkpoint to restore its weights from) of a
    training output_dir. The checkpoint is the newest whose state file and TF checkpoint read back,
    tried in resume's order (tfplace.policy.train_state; `log` says which it passed over and why);
    none usable is one InputError naming the newest state file in run_dir and the fix."""
    fix = "give the output_dir of a training run"
    for name in ("config.json", train_state.STATE_FILE):
        if not os.path.exists(os.path.join(run_dir, name)):
            raise InputError(run_dir, name, "missing", fix)
    config = load_train_config(os.path.join(run_dir, "config.json"))
    learner = ReinforceLearner(PlacementNetwork(config.network, A.ActionLayout()), config.rl)
    return learner, config, _newest_checkpoint(run_dir, log)


def _newest_checkpoint(run_dir: str, log: Callable[[str], None] = _to_stderr) -> str:
    """Prefix of the newest TF checkpoint of training run `run_dir` that reads back (load_policy's)."""
    fix = "give the output_dir of a training run"
    saved, rejected = train_state.read_states(run_dir)  # not checked against a run: any graph may be planned
    state = train_state.newest_usable(run_dir, saved, rejected, tf.train.load_checkpoint, log, "plan with",
                                      f"{fix} whose checkpoints are intact, or train again with a new "
                                      "output_dir (python -m tfplace.train) and plan with that")
    return os.path.join(run_dir, train_state.CHECKPOINT_DIR, state.tf_checkpoint)


def _entry(task: PlacementTask, source: str, act) -> PoolEntry:
    ev = task.evaluate(act)
    return PoolEntry(source, task.decode(act), ev.time_s, ev.effective_time_s, ev.oom, 0, act)


MODES = ("both", "search", "policy")
# progress(seconds since the search started, the best entry so far): plan_task calls it after each
# round of the search and once at its end, for a command to show how the search goes
Progress = Callable[[float, PoolEntry], None]
ACTION_ROUND_EVERY = 4  # action-level moves (samples, mutations of the best action) in one round of this many


def plan_task(learner: Optional[ReinforceLearner], task: PlacementTask, search_seconds: float = 0.0,
              samples: int = 8, seed: int = 0, mode: str = "both",
              target_time_s: Optional[float] = None, progress: Optional[Progress] = None) -> PlanResult:
    """Plans one task. Zero-shot (modes "both" and "policy"): the best of the policy's greedy
    strategy, the greedy strategy restricted to each of the cluster's fastest parts (the fastest
    device, then the fastest speed classes) and to the k devices the policy most expects to use
    (k < D) -- the policy's own choices on those devices, the rest left out (actions.greedy_plans)
    -- and `samples` samples; each timed alone. Then every
    baseline joins the pool (so the result is never worse than the best baseline) and, for
    `search_seconds`:
      "both"    policy-guided search: policy samples, mutations of the best action drawn from the
                policy's marginals (actions.guided_mutate), and the strategy-level hill climber
                (its sweep of single-group changes ordered by the policy: search.sweep_order);
      "search"  the same without the policy: uniform action mutations and the hill climber;
      "policy"  policy samples only.
    `target_time_s`: stop as soon as the best effective time is at most this (time-to-match).
    PlanResult.trace holds (seconds since start, best effective time, its source) at the start
    and at every improvement. `progress` (Progress), when given, hears of the search as it goes."""
    if mode not in MODES:
        raise InputError("argument", "mode", f"{mode!r} is not one of {MODES}", f"use one of {MODES}")
    if mode != "search" and learner is None:
        raise InputError("argument", "learner", f"mode {mode!r} needs a policy", 'load one, or use mode "search"')
    start = time.time()
    rng = np.random.default_rng(seed)
    obs = task.features.as_observation()
    shot, probs = [], None
    if mode != "search":
        # one pass of the network: greedy and samples come from its marginals (it factorises)
        probs = learner.probabilities(obs)
        shot = [_entry(task, f"zero-shot {what}", a) for what, a in A.greedy_plans(probs, task.speeds)]
        shot += [_entry(task, "zero-shot sample", a) for a in A.sample_from(rng, probs, samples)]
    zero = min(shot, key=lambda e: e.effective_time_s) if shot else None
    zero_s = time.time() - start
    pool = train_lib.seed_pool(task, 16)
    for e in shot:
        pool.add(e)
    trace = [(time.time() - start, pool.best.effective_time_s, pool.best.source)]

    def note():
        if pool.best.effective_time_s < trace[-1][1]:
            trace.append((time.time() - start, pool.best.effective_time_s, pool.best.source))
        if progress is not None:
            progress(time.time() - start, pool.best)
        return target_time_s is not None and pool.best.effective_time_s <= target_time_s

    guide = probs if mode == "both" else None  # the marginals that guided mutations and the sweep draw from
    climber = HillClimber(task, pool, rng, guide=guide)
    if mode != "policy" and all(b.oom for b in pool.baselines):  # nothing fits: memory-balanced stages
        climber.seed_memory_partitions()

    def best_action(kept):  # kept apart: strategy-search entries may push actions out of the pool
        return min((e for e in [kept, pool.best_with_action()] if e is not None),
                   key=lambda e: e.effective_time_s, default=None)
    best_act = pool.best_with_action()
    it = 0
    while time.time() - start < search_seconds and not note():
        if mode == "policy":
            for a in A.sample_from(rng, probs, 4):
                pool.add(_entry(task, "search sample", a))
            continue
        if it % ACTION_ROUND_EVERY == 0:  # action-level moves: one round in ACTION_ROUND_EVERY
            if mode == "both":
                for a in A.sample_from(rng, probs, 2):
                    pool.add(_entry(task, "search sample", a))
            best_act = best_action(best_act)
            for _ in range(4):
                n = int(rng.integers(1, 4))
                act = A.guided_mutate(rng, best_act.action, guide, n) if guide is not None \
                    else A.mutate(rng, best_act.action, n)
                cand = _entry(task, "policy-guided search" if guide is not None else "local search", act)
                pool.add(cand)
                if cand.effective_time_s < best_act.effective_time_s:
                    best_act = cand
        climber.step(8)  # strategy-level moves around the pool's best (baselines included)
        it += 1
    note()
    bb = pool.best_baseline()
    return PlanResult(task.label, pool.best, zero, pool.baseline_times(), bb.source, bb.time_s,
                      time.time() - start, zero_s, trace=trace,
                      best_action=best_action(best_act), baseline_entries=list(pool.baselines),
                      best_fitting=pool.best_fitting)


def load_any_policy(run_dir: Optional[str] = None, weights: Optional[str] = None):
    """(learner, TrainConfig with the network sizes and max_groups, TF checkpoint prefix or None)
    of a training run's output_dir, of a weights file (python -m tfplace.pretrain), or, with
    neither, of the pre-trained policy shipped with tfplace."""
    if run_dir is not None:
        return load_policy(run_dir)
    from tfplace.formats.config import TrainConfig
    from tfplace.policy import pretrained
    learner, w = pretrained.load_weights(weights) if weights else pretrained.load_pretrained()
    return learner, TrainConfig((), (), (), "", max_groups=w.max_groups, network=w.network), None


_READ_TRIES = 3


def _read_weights(learner, run_dir: str, ckpt: str) -> None:
    """Restores the network's weights from `ckpt`, a checkpoint of the training run `run_dir`. A
    run still training keeps its last two checkpoints, so the one load_policy chose may be gone by
    the time the task is built (seconds later, after two more saves): then the run's newest usable
    one, at most _READ_TRIES times. The network's shapes are the run's config's, whichever
    checkpoint."""
    for attempt in range(_READ_TRIES):
        try:
            tf.train.Checkpoint(network=learner.network).read(ckpt).expect_partial()
            return
        except tf.errors.NotFoundError:
            if attempt == _READ_TRIES - 1:
                raise InputError(run_dir, "checkpoints", f"{ckpt} was removed while it was being read, "
                                 f"{_READ_TRIES} times (the run saves faster than planning reads)",
                                 "plan from a run that has stopped, or from a copy of its output_dir") from None
            ckpt = _newest_checkpoint(run_dir)


def plan(run_dir: Optional[str], *, graph: Optional[str], model: Optional[str], batch_size: Optional[int],
         cluster: str, image_size: Optional[int] = None, seq_len: Optional[int] = None,
         num_layers: Optional[int] = None, optimizer: Optional[str] = None,
         profile: Optional[str] = None, search_seconds: float = 0.0, samples: int = 8, seed: int = 0,
         out: Optional[str] = None, resolve_bundle=None, overheads: Optional[str] = None,
         weights: Optional[str] = None, label: Optional[str] = None,
         progress: Optional[Progress] = None) -> PlanResult:
    """Plans with the policy of `run_dir` (a training run), `weights` (a weights file) or, with
    neither, the shipped pre-trained policy; policy-guided search for `search_seconds` (`progress`:
    as plan_task's). `label` names the graph in the result (default: the bundle's file stem).
    `image_size` (pixels), `seq_len` (tokens), `num_layers` and `optimizer`: the zoo `model`'s
    options, as a config's graph entry gives them (None: the model's default)."""
    learner, config, ckpt = load_any_policy(run_dir, weights)
    if model is not None:
        from tfplace.formats.config import GraphEntry
        entry = GraphEntry(batch_size, model=model, image_size=image_size, seq_len=seq_len, num_layers=num_layers,
                           optimizer=optimizer)
        bundle = train_lib.graph_bundle(entry, resolve_bundle)  # resolve_bundle None: the zoo's
    else:
        bundle = graph
    from tfplace.ir.loader import load_op_graph
    batch = batch_size or load_op_graph(bundle).reference_batch_size
    label = label or os.path.splitext(os.path.basename(bundle))[0]
    task = train_lib.build_task(label, bundle, batch, cluster, profile, config, overheads)
    learner.build(task.features.as_observation())
    if ckpt is not None:
        _read_weights(learner, run_dir, ckpt)
    result = plan_task(learner, task, search_seconds, samples, seed, progress=progress)
    result.task, result.bundle = task, bundle
    if out:
        save_strategy(result.best.strategy, out)
        result.out = out
    return result


def format_result(r: PlanResult) -> str:
    lines = [f"{r.label}: best {r.best.time_s * 1e3:.3f} ms ({r.best.source}{', OOM' if r.best.oom else ''}); "
             f"zero-shot {r.zero_shot.time_s * 1e3:.3f} ms{' (OOM)' if r.zero_shot.oom else ''} in {r.zero_shot_s:.2f} s; "
             f"best baseline {r.best_baseline} {r.best_baseline_time_s * 1e3:.3f} ms; planning {r.planning_s:.1f} s"]
    for name, b in r.baselines.items():
        lines.append(f"  baseline {name:<28} {b['time_s'] * 1e3:9.3f} ms{'  OOM' if b['oom'] else ''}")
    if r.out:
        lines.append(f"strategy written to {r.out}")
    return "\n".join(lines)
