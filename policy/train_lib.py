"""The training loop behind `python -m tfplace.train` (the binary only parses flags).

    summary = train(config, log=print_to_stderr)     # resumes from config.output_dir if it holds a run

The policy starts from `init_policy` (e.g. the pre-trained policy shipped with tfplace,
tfplace.policy.pretrained) or from random weights. Per step, for every task (graph x cluster): sample `rl.samples_per_step` strategies from the
policy, simulate them (reward: tfplace.policy.environment), evaluate the policy's own plans (its
greedy strategy and that strategy restricted to the fastest devices and to the devices the policy
ranks first, as `plan` makes them zero-shot: actions.greedy_plans) and local-search mutations of the
pool's best action (these only feed the pool), then one REINFORCE
update over all tasks (tfplace.policy.agent) and, unless rl.imitate_best is off, one imitation
step towards each task's best action so far (expert iteration: REINFORCE alone drove the shipped
policy to the single-device strategy within 5 steps on the bundled default, its samples being
worse than its greedy strategy).

Outputs, under output_dir:
  config.json                the resolved config (plan.py reads the network sizes from it)
  state.json                 step, elapsed seconds, numpy RNG state, reward baselines, pools and
                             logs of every task, name of the TF checkpoint (JSON, never pickle)
  checkpoints/ckpt-<step>*   tf.train.Checkpoint of the policy network and its optimizer
  train.log                  messages
  <label>/time.log           one line per step: step, mean and min sampled time, best time, the
                             time of the policy's best own plan (greedy or restricted; s)
  <label>/best_time.log      JSON: best time, its strategy, every baseline's time, speed-ups
  <label>/best_strategy.json the best strategy (tfplace.formats.strategy format)
  <label>/best_trace.json    simulated Chrome trace of the best strategy
  <label>/training.png       sampled and best time over the steps
  <label>/best_graph.pb      the step rewritten for the best strategy (tfplace.rewrite.graph_rewrite);
                             best_time.log's rewritten_graph says why when the rewrite refused it
A checkpoint is written every `checkpoint_every_steps`, at the end, and when SIGTERM or Ctrl-C
(SIGINT) arrives: the step under way finishes first (a step cut half-way would leave the pools,
logs and policy out of step with each other), then `TrainingInterrupted` is raised; a second
signal stops at once, keeping the last checkpoint. A restarted run continues from the newest
usable checkpoint with the same step counter, pools and RNG.

The state files, the order they are written in, how a resume picks its checkpoint and what the
run's fingerprint covers: tfplace.policy.train_state.

Seeds: `seed_everything(config.seed)` runs before anything random is built, so two runs with the
same config and seed take the same steps (policy sampling uses stateless seeds drawn from the
numpy generator that the checkpoint carries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfplace.formats.cluster import load_cluster
from tfplace.formats.config import GraphEntry, TrainConfig, save_train_config
from tfplace.formats.errors import InputError
from tfplace.formats.files import STEP_SUFFIXES
from tfplace.ir.loader import load_op_graph
from tfplace.ir.grouping import make_grouping
from tfplace.formats.jsonio import atomic_write, write_json
from tfplace.formats.profile import load_profile
from tfplace.profiling.profiler import profile_graph_note
from tfplace.profiling.device_model import cluster_profile
from tfplace.simulator import SimOptions, write_trace
from tfplace.formats.reports import SimReport, same_time
from tfplace.formats.strategy import save_strategy

from tfplace.policy import actions as A
from tfplace.policy.agent import ReinforceLearner
from tfplace.policy.environment import PlacementEnvironment, PlacementTask, evaluate_many
from tfplace.policy.stop_signals import held_stop_signals
from tfplace.baselines.registry import baseline_factories
from tfplace.policy.network import PlacementNetwork
from tfplace.policy.pool import PoolEntry, StrategyPool
from tfplace.policy import train_state
from tfplace.policy.train_state import SavedState

LOCAL_SEARCH_PER_STEP = 4  # mutations of the pool's best action evaluated per task and step
Log = Callable[[str], None]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by signal `signum` (SIGTERM or SIGINT) at step `step`; `saved`: whether
    that step was checkpointed (a second signal stops at once, leaving the last checkpoint: then
    `step` is that checkpoint's, None when there is none yet).
    A KeyboardInterrupt, so that code which handles Ctrl-C handles SIGTERM the same way."""

    def __init__(self, signum: int, step: Optional[int], saved: bool):
        self.signum, self.step, self.saved = signum, step, saved
        super().__init__(f"{signal.Signals(signum).name} at step {step}")

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as a shell reports a process ended by it (143 for SIGTERM)."""
        return 128 + self.signum


@dataclasses.dataclass
class TaskRun:
    """A task plus what training has learned about it (all JSON-serialisable but the task)."""
    task: PlacementTask
    env: PlacementEnvironment
    pool: StrategyPool
    log_rows: List[List[float]] = dataclasses.field(default_factory=list)  # step, mean, min, best, greedy
    best_report: Optional[SimReport] = None  # simulation of `best`, from write_outputs

    @property
    def label(self) -> str:
        return self.task.label

    @property
    def best(self) -> PoolEntry:
        """The strategy the run reports and writes: the fastest that fits in device memory, or,
        when none fits, the pool's best by penalised time (the summary then says INFEASIBLE)."""
        return self.pool.best_fitting or self.pool.best

    @property
    def passed_over(self) -> Optional[PoolEntry]:
        """The pool's best by penalised time when it runs out of memory and a strategy that fits
        is reported instead; else None."""
        first = self.pool.best
        return first if first.oom and self.best is not first else None

    def speedup(self) -> float:
        return self.pool.best_baseline().effective_time_s / self.best.effective_time_s


# ---- building tasks ----------------------------------------------------------------------------
BundleResolver = Callable[[GraphEntry], str]


def graph_bundle(entry: GraphEntry, resolve_bundle: Optional[BundleResolver] = None) -> str:
    """Path of the bundle .json of one config graph entry.

    A zoo `model` entry, and a bare step (its roles as the entry names them), need `resolve_bundle`
    (the binaries pass `tfplace.graph_defs.export.bundle_for_entry`, which exports on demand):
    the policy itself does not depend on the model zoo. Without it a bare step is read with
    every role inferred.
    """
    if entry.graph is not None and (resolve_bundle is None or not entry.graph.endswith(STEP_SUFFIXES)):
        return entry.graph
    if resolve_bundle is None:
        raise InputError("config", "graphs", f"zoo model {entry.model!r} given without a way to export it",
                         "pass resolve_bundle=tfplace.graph_defs.export.bundle_for_entry or give a bundle path")
    return resolve_bundle(entry)


def config_bundles(config: TrainConfig, resolve_bundle: Optional[BundleResolver] = None) -> List[str]:
    """graph_bundle of each of the config's graph entries; an export's error about an entry's
    option is named as the config's field (graphs[i].batch_size)."""
    out = []
    for i, entry in enumerate(config.graphs):
        try:
            out.append(graph_bundle(entry, resolve_bundle))
        except InputError as err:
            raise entry.in_config(err, config.source or "train config", f"graphs[{i}]") from None
    return out


def build_task(label: str, bundle: str, batch_size: int, cluster_path: str, profile_path: Optional[str],
               config: TrainConfig, overheads_path: Optional[str] = None) -> PlacementTask:
    """The task of one graph on one cluster; `overheads_path`: the cluster's runtime-overheads file
    (tfplace.overheads, read only when given: GPU clusters have none)."""
    graph = load_op_graph(bundle)
    cluster = load_cluster(cluster_path)
    profile = load_profile(profile_path) if profile_path else cluster_profile(graph, cluster)
    overheads = None
    if overheads_path:
        from tfplace.overheads.model import load_overheads
        overheads = load_overheads(overheads_path)
    grouping = make_grouping(graph, config.max_groups)
    seed = config.seed if config.simulator.straggler_seed is None else config.simulator.straggler_seed
    return PlacementTask(label, graph, grouping, cluster, profile, batch_size, config.max_groups,
                         config.rl.oom_penalty, SimOptions(seed=seed), overheads=overheads)


def seed_pool(task: PlacementTask, size: int) -> StrategyPool:
    """A pool with every baseline, the best one encoded as an action, and the proportional and
    single-device actions (starts for local search and imitation targets)."""
    pool = StrategyPool(size)
    for name, factory in baseline_factories(task.graph, task.cluster, task.batch_size, task.max_groups,
                                            profile=task.profile, grouping=task.grouping,
                                            overheads=task.overheads).items():
        strategy = task.lowerer.legalize(factory())  # batch norm keeps its least batch per replica
        ev = task.evaluate_strategy(strategy)
        pool.add_baseline(PoolEntry(name, strategy, ev.time_s, ev.effective_time_s, ev.oom, 0))
    task.reference_time_s = pool.best_baseline().effective_time_s
    # The best baseline in the action space too (actions.encode: the nearest share levels), timed
    # as decoded: a start for the local search and, while best, what the policy imitates. Where it
    # times the same, the baseline's own entry carries the action (a copy would crowd the
    # runner-ups the strategy search climbs from); else it joins as an entry of its own.
    b = pool.best_baseline()
    act = A.encode(b.strategy, task.grouping.group_names, task.cluster.device_names, task.speeds)
    ev = task.evaluate(act)
    if same_time(ev.effective_time_s, b.effective_time_s):  # the pool's tie: times apart only by rounding
        pool.give_action(b, act)
    else:
        pool.add(PoolEntry(f"{b.source} as an action", task.decode(act), ev.time_s, ev.effective_time_s, ev.oom, 0,
                           act))
    # Plain starts in the action space.
    prop = A.proportional_action(task.num_groups, task.num_devices)
    single = {k: np.zeros_like(v) for k, v in prop.items()}  # all levels 0 -> fastest device alone
    for name, act in (("proportional action", prop), ("single-device action", single)):
        ev = task.evaluate(act)
        pool.add(PoolEntry(name, task.decode(act), ev.time_s, ev.effective_time_s, ev.oom, 0, act))
    return pool


def task_label(config: TrainConfig, graph: int, cluster: int) -> str:
    """Output-folder name of one task: the graph entry's label, plus the cluster's file stem when
    the config names several clusters."""
    label = config.graphs[graph].label
    if len(config.clusters) == 1:
        return label
    return f"{label}__{os.path.splitext(os.path.basename(config.clusters[cluster]))[0]}"


def task_labels(config: TrainConfig) -> List[str]:
    """Labels of every task, in the order build_runs makes them (graphs outer, clusters inner)."""
    return [task_label(config, i, j) for i in range(len(config.graphs)) for j in range(len(config.clusters))]


def build_runs(config: TrainConfig, log: Log, resolve_bundle: Optional[BundleResolver] = None,
               bundles: Optional[Sequence[str]] = None) -> List[TaskRun]:
    """One TaskRun per (graph, cluster); `bundles`: the graphs' bundle paths when already resolved."""
    bundles = bundles or config_bundles(config, resolve_bundle)
    runs = []
    for i, (entry, bundle) in enumerate(zip(config.graphs, bundles)):
        for j, cluster_path in enumerate(config.clusters):
            label = task_label(config, i, j)
            overheads = config.overheads[j] if j < len(config.overheads) else None
            task = build_task(label, bundle, entry.batch_size, cluster_path, config.profiles[i], config, overheads)
            log(f"{label}: {task.graph.num_ops} ops, {task.num_groups} groups, {task.num_devices} devices")
            note = config.profiles[i] and profile_graph_note(task.profile, bundle, config.profiles[i])
            if note:
                log(note)
            runs.append(TaskRun(task, PlacementEnvironment(task), StrategyPool(config.rl.pool_size)))
    return runs


def seed_everything(seed: int) -> None:
    """Seeds Python's, numpy's global and TensorFlow's global generators. Must run before the
    network is built: its initial weights come from TensorFlow's global seed."""
    tf.keras.utils.set_random_seed(seed)


@contextlib.contextmanager
def _stop_after_step(trainer: "Trainer") -> Iterator[None]:
    """While training: the first SIGTERM or SIGINT is held in `trainer.held_signals`, so that the
    loop stops after the step under way; a second one raises TrainingInterrupted at once
    (tfplace.policy.stop_signals)."""
    def at_once(signum: int, frame) -> None:
        raise TrainingInterrupted(signum, trainer.last_saved_step, saved=False)
    with held_stop_signals("stopping when the step under way ends, with a checkpoint (send it again to stop at "
                           "once, keeping the last checkpoint)", at_once) as held:
        trainer.held_signals = held
        yield


# ---- trainer -----------------------------------------------------------------------------------
class Trainer:
    def __init__(self, config: TrainConfig, log: Log, progress: bool = True,
                 resolve_bundle: Optional[BundleResolver] = None, bundles: Optional[Sequence[str]] = None):
        self.config, self.log, self.show_progress = config, log, progress
        self.out = config.output_dir
        os.makedirs(self.out, exist_ok=True)
        seed_everything(config.seed)  # before anything random (the network's weights) is built
        bundles = list(bundles) if bundles is not None else config_bundles(config, resolve_bundle)
        self.fingerprint = train_state.run_fingerprint(config, bundles)
        # state files are read before the tasks are built: a changed config stops before any work
        saved, rejected = train_state.read_states(self.out, task_labels(config), self.fingerprint,
                                                  config.source or "config")
        self.runs = build_runs(config, log, bundles=bundles)
        self.network = PlacementNetwork(config.network, A.ActionLayout())
        self.learner = ReinforceLearner(self.network, config.rl)
        self.learner.build(self.runs[0].task.features.as_observation())
        self.checkpoint = tf.train.Checkpoint(network=self.network, optimizer=self.learner.optimizer)
        self.rng = np.random.default_rng(config.seed)
        self.step, self.elapsed_s = 0, 0.0
        self.last_saved_step: Optional[int] = None
        self.held_signals: List[int] = []  # a stop signal held until the step under way ends
        if saved or rejected:
            self._apply(train_state.resume(self.out, saved, rejected, self._read_checkpoint, log))
        else:
            if config.init_policy:  # the starting weights (a resumed run has its own in the checkpoint)
                from tfplace.policy import pretrained
                weights, variables = pretrained.read_weights(config.init_policy)
                pretrained.assign_weights(self.learner, weights, variables)
                log(f"policy starts from {config.init_policy}")
            for run in self.runs:
                run.pool = seed_pool(run.task, config.rl.pool_size)
                bb = run.pool.best_baseline()
                self.log(f"{run.label}: best baseline {bb.source} {bb.time_s * 1e3:.3f} ms"
                         + (" (out of memory)" if bb.oom else ""))
                if all(b.oom for b in run.pool.baselines):
                    self.log(f"warning: {run.label}: every baseline runs out of memory; the run fails unless "
                             "training finds a strategy that fits (or the config sets accept_infeasible)")
        save_train_config(config, os.path.join(self.out, "config.json"))

    def _apply(self, s: SavedState) -> None:
        self.step, self.elapsed_s = s.step, s.elapsed_s
        self.rng.bit_generator.state = s.rng
        self.learner.baselines = dict(s.reward_baselines)
        for run in self.runs:
            run.pool, run.log_rows = s.pools[run.label], s.logs[run.label]
            run.task.num_simulations += s.simulations.get(run.label, 0)  # the sessions before this one
            run.task.reference_time_s = run.pool.best_baseline().effective_time_s
        self.last_saved_step = s.step  # kept with the next checkpoint; newer damaged ones are removed

    def _read_checkpoint(self, prefix: str) -> None:
        """Restores the network and optimizer from the TF checkpoint `prefix`, every variable."""
        self.checkpoint.read(prefix).assert_consumed()

    def save(self) -> None:
        """Checkpoints this step (tfplace.policy.train_state.write_checkpoint: the last two are
        kept), then writes every task's outputs."""
        state = SavedState(self.step, self.elapsed_s, f"ckpt-{self.step}", self.rng.bit_generator.state,
                           self.learner.baselines, {r.label: r.pool for r in self.runs},
                           {r.label: r.log_rows for r in self.runs},
                           simulations={r.label: r.task.num_simulations for r in self.runs})
        train_state.write_checkpoint(self.out, self.checkpoint, state, self.fingerprint, self.last_saved_step)
        self.last_saved_step = self.step
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
            # the policy's own plans, as planning from this checkpoint makes them (its greedy
            # strategy and its device restrictions): the pool keeps the best, the log its time
            extra = A.greedy_plans(self.learner.probabilities(obs), run.task.speeds)
            num_plans = len(extra)
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
            plan_s = min(ev.effective_time_s for _, _, ev in items[len(evals):len(evals) + num_plans])
            run.log_rows.append([self.step + 1, float(np.mean(times)), float(min(times)),
                                 run.pool.best.effective_time_s, plan_s])
            batch.append((obs, acts, self.learner.advantages(run.label, rewards)))
        stats = self.learner.update(batch)
        if self.config.rl.imitate_best:  # expert iteration: the policy follows the best action found so far
            # a network that reads the device rank follows it with identical devices in one order
            # (as pre-training does): a new best that only swaps them is the same demonstration
            canonical = bool(self.config.network.device_rank_feature)
            demos = [(run.task.features.as_observation(), run.task.canonical(best.action) if canonical else best.action)
                     for run in self.runs if (best := run.pool.best_with_action()) is not None]
            if demos:
                stats["imitation_loss"] = self.learner.imitate(demos)
        self.step += 1
        return stats

    def run(self) -> Dict[str, object]:
        """Trains until the budget is spent; returns the summary. Raises TrainingInterrupted
        (after checkpointing the last whole step) when SIGTERM or SIGINT arrives."""
        every = self.config.checkpoint_every_steps
        last = time.time()
        with _stop_after_step(self):
            while not self._done():
                self.train_step()
                now = time.time()
                self.elapsed_s += now - last
                last = now
                self._progress()
                if self.step % every == 0:
                    self.save()
                if self.held_signals and not self._done():
                    if self.last_saved_step != self.step:
                        self.save()
                    signum = self.held_signals[0]
                    self.log(f"\nstopped by {signal.Signals(signum).name} at step {self.step}: checkpoint saved; "
                             "run the same command again to resume")
                    raise TrainingInterrupted(signum, self.step, saved=True)
            if self.step % every != 0 or not os.path.exists(os.path.join(self.out, train_state.STATE_FILE)):
                self.save()
        if self.show_progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        return self.summary()

    def _progress(self) -> None:
        if not self.show_progress:
            return
        b = self.config.budget
        total = f"/{b.steps}" if b.steps is not None else ""
        parts = [f"{r.label} {r.best.time_s * 1e3:.3f}ms x{r.speedup():.2f}" + (" OOM" if r.best.oom else "")
                 for r in self.runs]
        line = f"[step {self.step}{total} {self.elapsed_s:6.0f}s] best (x vs best baseline): " + " | ".join(parts)
        if sys.stderr.isatty():  # a terminal: one line that updates in place
            sys.stderr.write("\r" + line[:300])
        elif self.step % max(1, (b.steps or 200) // 20) == 0:  # a log file: about 20 lines in all
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def summary(self) -> Dict[str, object]:
        """Per task: the best strategy (TaskRun.best: the fastest that fits), the best baseline,
        the speed-up, `feasible` (False: no strategy found fits in memory; `oom_devices` then gives
        each device over its memory with its peak and capacity in bytes) and `passed_over` (the
        source and time of a strategy that ranks above the best by penalised time but runs out of
        memory, else None). Also written to output_dir/summary.json."""
        out = {"steps": self.step, "elapsed_s": self.elapsed_s, "tasks": {}}
        for r in self.runs:
            bb, best = r.pool.best_baseline(), r.best
            report = r.best_report or r.task.simulate(best.strategy)
            out["tasks"][r.label] = {"best_time_s": best.time_s, "best_source": best.source,
                                     "feasible": not best.oom,
                                     "passed_over": r.passed_over and {"source": r.passed_over.source,
                                                                       "time_s": r.passed_over.time_s},
                                     "oom_devices": {d: {"peak_memory_bytes": p, "memory_bytes": c}
                                                     for d, (p, c) in report.over_memory.items()},
                                     "best_baseline": bb.source, "best_baseline_time_s": bb.time_s,
                                     "best_baseline_feasible": not bb.oom,
                                     "speedup_over_best_baseline": r.speedup(),
                                     "simulations": r.task.num_simulations}
        write_json(os.path.join(self.out, "summary.json"), out)
        return out


def infeasible_tasks(summary: Dict[str, object]) -> List[str]:
    """Labels of the tasks whose best strategy runs out of memory (a failed run unless the config
    sets accept_infeasible)."""
    return [label for label, t in summary["tasks"].items() if not t["feasible"]]


# ---- per-task outputs --------------------------------------------------------------------------
def write_outputs(run: TaskRun, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    best, bb = run.best, run.pool.best_baseline()
    def time_log(f) -> None:
        f.write("# step, mean sampled time s, min sampled time s, best time so far s, the policy's own plan's "
                "time s (OOM penalty folded in)\n")
        for row in run.log_rows:
            f.write(", ".join([str(int(row[0]))] + [f"{x:.6e}" for x in row[1:]]) + "\n")
    atomic_write(os.path.join(folder, "time.log"), time_log)
    save_strategy(best.strategy, os.path.join(folder, "best_strategy.json"))
    report = run.task.simulate(best.strategy, trace=True)
    run.best_report = dataclasses.replace(report, trace=None)  # the summary's memory figures
    write_trace(report.trace, os.path.join(folder, "best_trace.json"))
    graph_note = write_rewritten_graph(run, best, os.path.join(folder, "best_graph.pb"))
    write_json(os.path.join(folder, "best_time.log"), {
        "time_s": best.time_s, "time_ms": best.time_s * 1e3, "oom": best.oom, "source": best.source,
        "peak_memory_bytes": dict(zip(report.device_names, report.peak_memory_bytes)),
        "baselines": run.pool.baseline_times(), "best_baseline": bb.source,
        "speedup_over_best_baseline": run.speedup(),
        "speedups": {e.source: e.effective_time_s / best.effective_time_s for e in run.pool.baselines},
        "rewritten_graph": graph_note, "strategy": best.strategy.to_json(),
        # the graph the strategy is for, with its options and batch (simulate/activate --graph)
        "graph_file": os.path.abspath(run.task.graph.source) if run.task.graph.source else None,
        # the straggler draws every time here was simulated with (python -m tfplace.simulate --seed)
        "simulator_seed": run.task.sim_options.seed})
    plot(run, os.path.join(folder, "training.png"))


def write_rewritten_graph(run: TaskRun, best: PoolEntry, path: str) -> str:
    """Writes the rewritten GraphDef of the best strategy (only when the best changed); returns
    what best_time.log says about it."""
    key = json.dumps(best.strategy.to_json(), sort_keys=True)
    if getattr(run, "_rewritten_key", None) == key and os.path.exists(path):
        return "best_graph.pb"
    from tfplace.rewrite import graph_rewrite as rewrite  # loaded only when a best graph is written
    try:
        graph_def = rewrite.rewrite(run.task.graph, best.strategy, run.task.cluster,
                                    grouping=run.task.grouping, profile=run.task.profile)
    except InputError as e:  # a rewrite limitation must not stop training; it is reported
        return f"not written: the rewrite pass refused the strategy: {e}"
    atomic_write(path, lambda f: f.write(graph_def.SerializeToString()), binary=True)
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
        ax.plot(rows[:, 0], rows[:, 3] * 1e3, lw=2, label="best so far (pool: search and policy)")
        if rows.shape[1] > 4:
            ax.plot(rows[:, 0], rows[:, 4] * 1e3, lw=1.2,
                    label="policy's plan (greedy, or restricted to its top devices)")
    ax.axhline(run.pool.best_baseline().effective_time_s * 1e3, color="k", ls="--",
               label=f"best baseline ({run.pool.best_baseline().source})")
    ax.set_xlabel("step")
    ax.set_ylabel("simulated iteration time, ms (OOM x penalty)")
    ax.set_yscale("log")
    ax.set_title(run.label)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=90, format="png"), binary=True)
    plt.close(fig)


def train(config: TrainConfig, log: Log, progress: bool = True, resolve_bundle: Optional[BundleResolver] = None,
          bundles: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Trains (or resumes) per `config`; returns the summary (also in output_dir/summary.json).
    `bundles`: the graphs' bundle paths when already resolved (config_bundles), else resolved
    here with `resolve_bundle`."""
    return Trainer(config, log, progress, resolve_bundle, bundles).run()


def file_logger(output_dir: str, results: bool = False) -> Log:
    """A Log that appends each message, time-stamped, to output_dir/train.log and writes it to
    stderr (progress and notes) or, with `results`, to stdout (the run's results)."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "train.log")

    def log(message: str) -> None:
        stream = sys.stdout if results else sys.stderr  # looked up per message: a redirect in force then
        stream.write(("\n" if message.startswith("\n") else "") + message.strip("\n") + "\n")
        stream.flush()
        with open(path, "a", encoding="utf-8") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message.strip("\n") + "\n")
    return log


def geomean(values) -> float:
    v = [x for x in values if x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
