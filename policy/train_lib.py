"""The training loop behind `python -m tfplace.train` (the binary only parses flags).

    summary = train(config, log=print_to_stderr)     # resumes from config.output_dir if it holds a run

Per step, for every task (graph x cluster): sample `rl.samples_per_step` strategies from the
policy, simulate them (reward: tfplace.policy.environment), evaluate the greedy strategy and one
local-search mutation of the pool's best action (both only feed the pool), then one REINFORCE
update over all tasks (tfplace.policy.agent).

Outputs, under output_dir:
  config.json                the resolved config (plan.py reads the network sizes from it)
  state.json                 step, elapsed seconds, numpy RNG state, reward baselines, pools and
                             logs of every task, name of the TF checkpoint (JSON, never pickle)
  checkpoints/ckpt-<step>*   tf.train.Checkpoint of the policy network and its optimizer
  train.log                  messages
  <label>/time.log           one line per step: step, mean and min sampled time, best time (s)
  <label>/best_time.log      JSON: best time, its strategy, every baseline's time, speed-ups
  <label>/best_strategy.json the best strategy (tfplace.formats.strategy format)
  <label>/best_trace.json    simulated Chrome trace of the best strategy
  <label>/training.png       sampled and best time over the steps
  <label>/best_graph.pb      only once the rewrite pass (tfplace.rewrite.graph_rewrite) exists
A checkpoint (state.json last, atomically) is written every `checkpoint_every_steps`, at the end
and on Ctrl-C; a restarted run continues from it with the same step counter, pools and RNG.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tfplace.formats.cluster import load_cluster
from tfplace.formats.config import GraphEntry, TrainConfig, save_train_config
from tfplace.formats.errors import InputError
from tfplace.ir.loader import load_op_graph
from tfplace.ir.grouping import make_grouping
from tfplace.formats.jsonio import write_json
from tfplace.formats.profile import load_profile
from tfplace.simulator import SimOptions, write_trace
from tfplace.formats.strategy import save_strategy

from tfplace.policy import actions as A
from tfplace.policy.agent import ReinforceLearner
from tfplace.policy.environment import PlacementEnvironment, PlacementTask, evaluate_many
from tfplace.policy.fallbacks import baseline_strategies, default_profile
from tfplace.policy.network import PlacementNetwork
from tfplace.policy.pool import PoolEntry, StrategyPool

STATE_FILE = "state.json"
LOCAL_SEARCH_PER_STEP = 4  # mutations of the pool's best action evaluated per task and step
STATE_FORMAT = "tfplace.train_state"
Log = Callable[[str], None]


@dataclasses.dataclass
class TaskRun:
    """A task plus what training has learned about it (all JSON-serialisable but the task)."""
    task: PlacementTask
    env: PlacementEnvironment
    pool: StrategyPool
    log_rows: List[List[float]] = dataclasses.field(default_factory=list)  # step, mean, min, best

    @property
    def label(self) -> str:
        return self.task.label

    def speedup(self) -> float:
        return self.pool.best_baseline().effective_time_s / self.pool.best.effective_time_s


# ---- building tasks ----------------------------------------------------------------------------
BundleResolver = Callable[[GraphEntry], str]


def graph_bundle(entry: GraphEntry, resolve_bundle: Optional[BundleResolver] = None) -> str:
    """Path of the bundle .json of one config graph entry.

    A zoo `model` entry needs `resolve_bundle` (the binaries pass
    `tfplace.graph_defs.export.bundle_for_entry`, which exports on demand): the policy itself
    does not depend on the model zoo.
    """
    if entry.graph is not None:
        return entry.graph
    if resolve_bundle is None:
        raise InputError("config", "graphs", f"zoo model {entry.model!r} given without a way to export it",
                         "pass resolve_bundle=tfplace.graph_defs.export.bundle_for_entry or give a bundle path")
    return resolve_bundle(entry)


def build_task(label: str, bundle: str, batch_size: int, cluster_path: str, profile_path: Optional[str],
               config: TrainConfig, overheads_path: Optional[str] = None) -> PlacementTask:
    """The task of one graph on one cluster; `overheads_path`: the cluster's runtime-overheads file
    (tfplace.overheads, read only when given: GPU clusters have none)."""
    graph = load_op_graph(bundle)
    cluster = load_cluster(cluster_path)
    profile = load_profile(profile_path) if profile_path else default_profile(graph, cluster.kinds)
    overheads = None
    if overheads_path:
        from tfplace.overheads.model import load_overheads
        overheads = load_overheads(overheads_path)
    grouping = make_grouping(graph, config.max_groups)
    seed = config.seed if config.simulator.straggler_seed is None else config.simulator.straggler_seed
    return PlacementTask(label, graph, grouping, cluster, profile, batch_size, config.max_groups,
                         config.rl.oom_penalty, SimOptions(seed=seed), overheads=overheads)


def seed_pool(task: PlacementTask, size: int) -> StrategyPool:
    """A pool with every baseline plus the proportional action (a start for local search)."""
    pool = StrategyPool(size)
    for name, factory in baseline_strategies(task.graph, task.cluster, task.batch_size, task.max_groups,
                                             task.label, task.profile, task.grouping, task.overheads).items():
        strategy = factory()
        ev = task.evaluate_strategy(strategy)
        pool.add_baseline(PoolEntry(name, strategy, ev.time_s, ev.effective_time_s, ev.oom, 0))
    task.reference_time_s = pool.best_baseline().effective_time_s
    # Baselines expressed in the action space, as starts for the local search.
    prop = A.proportional_action(task.num_groups, task.num_devices)
    single = {k: np.zeros_like(v) for k, v in prop.items()}  # all levels 0 -> fastest device alone
    for name, act in (("proportional action", prop), ("single-device action", single)):
        ev = task.evaluate(act)
        pool.add(PoolEntry(name, task.decode(act), ev.time_s, ev.effective_time_s, ev.oom, 0, act))
    return pool


def build_runs(config: TrainConfig, log: Log, resolve_bundle: Optional[BundleResolver] = None) -> List[TaskRun]:
    runs = []
    for i, entry in enumerate(config.graphs):
        bundle = graph_bundle(entry, resolve_bundle)
        for j, cluster_path in enumerate(config.clusters):
            cname = os.path.splitext(os.path.basename(cluster_path))[0]
            label = entry.label if len(config.clusters) == 1 else f"{entry.label}__{cname}"
            overheads = config.overheads[j] if j < len(config.overheads) else None
            task = build_task(label, bundle, entry.batch_size, cluster_path, config.profiles[i], config, overheads)
            log(f"{label}: {task.graph.num_ops} ops, {task.num_groups} groups, {task.num_devices} devices")
            runs.append(TaskRun(task, PlacementEnvironment(task), StrategyPool(config.rl.pool_size)))
    return runs


# ---- state -------------------------------------------------------------------------------------
class Trainer:
    def __init__(self, config: TrainConfig, log: Log, progress: bool = True,
                 resolve_bundle: Optional[BundleResolver] = None):
        self.config, self.log, self.show_progress = config, log, progress
        self.out = config.output_dir
        os.makedirs(self.out, exist_ok=True)
        self.ckpt_dir = os.path.join(self.out, "checkpoints")
        self.runs = build_runs(config, log, resolve_bundle)
        self.network = PlacementNetwork(config.network, A.ActionLayout())
        self.learner = ReinforceLearner(self.network, config.rl)
        self.learner.build(self.runs[0].task.features.as_observation())
        self.checkpoint = tf.train.Checkpoint(network=self.network, optimizer=self.learner.optimizer)
        self.rng = np.random.default_rng(config.seed)
        self.step, self.elapsed_s = 0, 0.0
        if not self._restore():
            tf.random.set_seed(config.seed)
            for run in self.runs:
                run.pool = seed_pool(run.task, config.rl.pool_size)
                self.log(f"{run.label}: best baseline {run.pool.best_baseline().source} "
                         f"{run.pool.best_baseline().time_s * 1e3:.3f} ms")
        else:
            for run in self.runs:
                run.task.reference_time_s = run.pool.best_baseline().effective_time_s
        save_train_config(config, os.path.join(self.out, "config.json"))

    def _restore(self) -> bool:
        path = os.path.join(self.out, STATE_FILE)
        if not os.path.exists(path):
            return False
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        labels = [r.label for r in self.runs]
        if state.get("format") != STATE_FORMAT or state["labels"] != labels:
            raise InputError(path, "labels", f"this output_dir holds a run of other graphs ({state.get('labels')})",
                             "use another --output_dir, or delete the folder to start over")
        self.checkpoint.read(os.path.join(self.ckpt_dir, state["tf_checkpoint"])).assert_consumed()
        self.step, self.elapsed_s = int(state["step"]), float(state["elapsed_s"])
        self.rng.bit_generator.state = state["rng"]
        self.learner.baselines = {k: float(v) for k, v in state["reward_baselines"].items()}
        for run in self.runs:
            s = state["tasks"][run.label]
            run.pool = StrategyPool.from_json(s["pool"])
            run.log_rows = [list(r) for r in s["log"]]
        self.log(f"resumed from step {self.step} ({state['tf_checkpoint']})")
        return True

    def save(self) -> None:
        """TF checkpoint first, then state.json (atomic) naming it; keeps the last two."""
        os.makedirs(self.ckpt_dir, exist_ok=True)
        name = f"ckpt-{self.step}"
        self.checkpoint.write(os.path.join(self.ckpt_dir, name))
        state = {"format": STATE_FORMAT, "version": 1, "step": self.step, "elapsed_s": self.elapsed_s,
                 "tf_checkpoint": name, "labels": [r.label for r in self.runs],
                 "rng": self.rng.bit_generator.state, "reward_baselines": self.learner.baselines,
                 "tasks": {r.label: {"pool": r.pool.to_json(), "log": r.log_rows} for r in self.runs}}
        write_json(os.path.join(self.out, STATE_FILE), state)
        keep = {name, f"ckpt-{self._previous_saved}"} if hasattr(self, "_previous_saved") else {name}
        for f in os.listdir(self.ckpt_dir):
            if f.startswith("ckpt-") and f.split(".")[0] not in keep:
                os.remove(os.path.join(self.ckpt_dir, f))
        self._previous_saved = self.step
        for run in self.runs:
            write_outputs(run, os.path.join(self.out, run.label))

    # ---- loop ----------------------------------------------------------------------------------
    def _done(self) -> bool:
        b = self.config.budget
        return (b.steps is not None and self.step >= b.steps) or \
               (b.minutes is not None and self.elapsed_s >= b.minutes * 60)

    def train_step(self) -> Dict[str, float]:
        k = self.config.rl.samples_per_step
        batch = []
        for run in self.runs:
            obs = run.task.features.as_observation()
            acts = self.learner.sample(obs, k, self.rng.integers(0, 2**31 - 1, size=2))
            rewards, evals = evaluate_many(run.env, acts)
            extra = [("greedy", self.learner.greedy(obs))]
            best = run.pool.best_with_action()
            if best is not None:  # cheap: the incremental lowering re-resolves only touched groups
                extra += [("local search", A.mutate(self.rng, best.action, int(self.rng.integers(1, 4))))
                          for _ in range(LOCAL_SEARCH_PER_STEP)]
            items = [("sample", a, e) for a, e in zip(acts, evals)] + \
                    [(src, a, run.task.evaluate(a)) for src, a in extra]
            for src, a, ev in items:
                run.pool.add(PoolEntry(f"{src} step {self.step + 1}", run.task.decode(a), ev.time_s,
                                       ev.effective_time_s, ev.oom, self.step + 1, a))
            times = [e.effective_time_s for e in evals]
            run.log_rows.append([self.step + 1, float(np.mean(times)), float(min(times)),
                                 run.pool.best.effective_time_s])
            batch.append((obs, acts, self.learner.advantages(run.label, rewards)))
        stats = self.learner.update(batch)
        self.step += 1
        return stats

    def run(self) -> Dict[str, object]:
        every = self.config.checkpoint_every_steps
        last = time.time()
        try:
            while not self._done():
                self.train_step()
                now = time.time()
                self.elapsed_s += now - last
                last = now
                self._progress()
                if self.step % every == 0:
                    self.save()
        except KeyboardInterrupt:
            self.log(f"\ninterrupted at step {self.step}: saving a checkpoint")
            self.save()
            raise
        if self.step % every != 0 or not os.path.exists(os.path.join(self.out, STATE_FILE)):
            self.save()
        if self.show_progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        return self.summary()

    def _progress(self) -> None:
        if not self.show_progress:
            return
        b = self.config.budget
        total = f"/{b.steps}" if b.steps is not None else ""
        parts = [f"{r.label} {r.pool.best.time_s * 1e3:.3f}ms x{r.speedup():.2f}" for r in self.runs]
        line = f"[step {self.step}{total} {self.elapsed_s:6.0f}s] best (x vs best baseline): " + " | ".join(parts)
        if sys.stderr.isatty():  # a terminal: one line that updates in place
            sys.stderr.write("\r" + line[:300])
        elif self.step % max(1, (b.steps or 200) // 20) == 0:  # a log file: about 20 lines in all
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def summary(self) -> Dict[str, object]:
        out = {"steps": self.step, "elapsed_s": self.elapsed_s, "tasks": {}}
        for r in self.runs:
            bb = r.pool.best_baseline()
            out["tasks"][r.label] = {"best_time_s": r.pool.best.time_s, "best_source": r.pool.best.source,
                                     "best_baseline": bb.source, "best_baseline_time_s": bb.time_s,
                                     "speedup_over_best_baseline": r.speedup(),
                                     "simulations": r.task.num_simulations}
        write_json(os.path.join(self.out, "summary.json"), out)
        return out


# ---- per-task outputs --------------------------------------------------------------------------
def rewrite_available() -> bool:
    return importlib.util.find_spec("tfplace.rewrite.graph_rewrite") is not None


def write_outputs(run: TaskRun, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    best, bb = run.pool.best, run.pool.best_baseline()
    with open(os.path.join(folder, "time.log"), "w", encoding="utf-8") as f:
        f.write("# step, mean sampled time s, min sampled time s, best time so far s (OOM penalty folded in)\n")
        for row in run.log_rows:
            f.write(f"{int(row[0])}, {row[1]:.6e}, {row[2]:.6e}, {row[3]:.6e}\n")
    save_strategy(best.strategy, os.path.join(folder, "best_strategy.json"))
    report = run.task.simulate(best.strategy, trace=True)
    write_trace(report.trace, os.path.join(folder, "best_trace.json"))
    graph_note = write_rewritten_graph(run, best, os.path.join(folder, "best_graph.pb"))
    write_json(os.path.join(folder, "best_time.log"), {
        "time_s": best.time_s, "time_ms": best.time_s * 1e3, "oom": best.oom, "source": best.source,
        "peak_memory_bytes": dict(zip(report.device_names, report.peak_memory_bytes)),
        "baselines": run.pool.baseline_times(), "best_baseline": bb.source,
        "speedup_over_best_baseline": run.speedup(),
        "speedups": {e.source: e.effective_time_s / best.effective_time_s for e in run.pool.baselines},
        "rewritten_graph": graph_note, "strategy": best.strategy.to_json()})
    plot(run, os.path.join(folder, "training.png"))


def write_rewritten_graph(run: TaskRun, best: PoolEntry, path: str) -> str:
    """Writes the rewritten GraphDef of the best strategy (only when the best changed); returns
    what best_time.log says about it."""
    if not rewrite_available():
        return "not written: the rewrite pass (tfplace.rewrite.graph_rewrite) does not exist yet"
    key = json.dumps(best.strategy.to_json(), sort_keys=True)
    if getattr(run, "_rewritten_key", None) == key and os.path.exists(path):
        return "best_graph.pb"
    from tfplace.rewrite import graph_rewrite as rewrite  # optional: the rewrite pass is another issue's module
    try:
        graph_def = rewrite.rewrite(run.task.graph, best.strategy, run.task.cluster,
                                    grouping=run.task.grouping, profile=run.task.profile)
    except InputError as e:  # a rewrite limitation must not stop training; it is reported
        return f"not written: the rewrite pass refused the strategy: {e}"
    with open(path + ".tmp", "wb") as f:
        f.write(graph_def.SerializeToString())
    os.replace(path + ".tmp", path)
    run._rewritten_key = key
    return "best_graph.pb"


def plot(run: TaskRun, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    if run.log_rows:
        rows = np.asarray(run.log_rows)
        ax.plot(rows[:, 0], rows[:, 1] * 1e3, lw=0.8, alpha=0.6, label="mean sampled")
        ax.plot(rows[:, 0], rows[:, 2] * 1e3, lw=0.8, label="best sampled in step")
        ax.plot(rows[:, 0], rows[:, 3] * 1e3, lw=2, label="best so far (pool)")
    ax.axhline(run.pool.best_baseline().effective_time_s * 1e3, color="k", ls="--",
               label=f"best baseline ({run.pool.best_baseline().source})")
    ax.set_xlabel("step")
    ax.set_ylabel("simulated iteration time, ms (OOM x penalty)")
    ax.set_yscale("log")
    ax.set_title(run.label)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def train(config: TrainConfig, log: Log, progress: bool = True,
          resolve_bundle: Optional[BundleResolver] = None) -> Dict[str, object]:
    """Trains (or resumes) per `config`; returns the summary (also in output_dir/summary.json)."""
    return Trainer(config, log, progress, resolve_bundle).run()


def file_logger(output_dir: str) -> Log:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "train.log")

    def log(message: str) -> None:
        sys.stderr.write(("\n" if message.startswith("\n") else "") + message.strip("\n") + "\n")
        with open(path, "a", encoding="utf-8") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message.strip("\n") + "\n")
    return log


def geomean(values) -> float:
    v = [x for x in values if x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
