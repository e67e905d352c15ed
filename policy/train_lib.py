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
A checkpoint is written every `checkpoint_every_steps`, at the end, and when SIGTERM or Ctrl-C
(SIGINT) arrives: the step under way finishes first (a step cut half-way would leave the pools,
logs and policy out of step with each other), then `TrainingInterrupted` is raised; a second
signal stops at once, keeping the last checkpoint. A restarted run continues from the newest
usable checkpoint with the same step counter, pools and RNG.

Checkpoint N, in order (each file atomic): checkpoints/ckpt-N.{index,data-*} (TensorFlow), then
checkpoints/ckpt-N.state.json, then a copy of it as state.json (the newest; plan.py reads it);
the last two checkpoints are kept with their state files. Resuming tries state.json, then the
state files in checkpoints/, newest first, and logs why it passed over any (truncated, not JSON,
a missing or mistyped field, a missing or damaged TensorFlow checkpoint); none usable is one
InputError. Every state records the run's fingerprint (`run_fingerprint`: a hash per graph,
cluster, profile and overheads file and per option that changes the problem or the learning);
resuming with a different one is an InputError naming the first part that differs.

Seeds: `seed_everything(config.seed)` runs before anything random is built, so two runs with the
same config and seed take the same steps (policy sampling uses stateless seeds drawn from the
numpy generator that the checkpoint carries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfplace.formats.cluster import load_cluster
from tfplace.formats.config import RESUMABLE_FIELDS, GraphEntry, TrainConfig, save_train_config
from tfplace.formats.errors import InputError
from tfplace.ir.loader import load_op_graph
from tfplace.ir.grouping import make_grouping
from tfplace.formats.jsonio import write_json
from tfplace.formats.profile import load_profile
from tfplace.simulator import SimOptions, write_trace
from tfplace.formats.reports import SimReport
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
STATE_VERSION = 2  # 2: the run's fingerprint and a state file per checkpoint (1 had neither)
CHECKPOINT_STATE = re.compile(r"ckpt-(\d+)\.state\.json")
Log = Callable[[str], None]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by signal `signum` (SIGTERM or SIGINT) at step `step`; `saved`: whether
    that step was checkpointed (a second signal stops at once, leaving the last checkpoint).
    A KeyboardInterrupt, so that code which handles Ctrl-C handles SIGTERM the same way."""

    def __init__(self, signum: int, step: int, saved: bool):
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
    log_rows: List[List[float]] = dataclasses.field(default_factory=list)  # step, mean, min, best
    best_report: Optional[SimReport] = None  # simulation of the pool's best, from write_outputs

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
    bundles = bundles or [graph_bundle(entry, resolve_bundle) for entry in config.graphs]
    runs = []
    for i, (entry, bundle) in enumerate(zip(config.graphs, bundles)):
        for j, cluster_path in enumerate(config.clusters):
            label = task_label(config, i, j)
            overheads = config.overheads[j] if j < len(config.overheads) else None
            task = build_task(label, bundle, entry.batch_size, cluster_path, config.profiles[i], config, overheads)
            log(f"{label}: {task.graph.num_ops} ops, {task.num_groups} groups, {task.num_devices} devices")
            runs.append(TaskRun(task, PlacementEnvironment(task), StrategyPool(config.rl.pool_size)))
    return runs


def seed_everything(seed: int) -> None:
    """Seeds Python's, numpy's global and TensorFlow's global generators. Must run before the
    network is built: its initial weights come from TensorFlow's global seed."""
    tf.keras.utils.set_random_seed(seed)


# ---- fingerprint -------------------------------------------------------------------------------
def _file_digest(paths: Sequence[str], prefix: bytes = b"") -> str:
    """sha256 over `prefix` and the bytes of `paths` (contents only: moving the files keeps a run
    resumable, editing them does not)."""
    h = hashlib.sha256(prefix)
    for path in paths:
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as e:
            raise InputError(path, "", f"cannot be read ({e.strerror})", "check the path and its permissions") from None
        h.update(b"\0")  # file boundary, so that two files never hash like their concatenation
    return h.hexdigest()


def _bundle_files(bundle: str) -> List[str]:
    """The bundle file and, for a bundle .json, the GraphDef file it names (graph_file)."""
    files = [bundle]
    try:
        with open(bundle, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return files  # a .pb, or a bad bundle: the loader reports it
    graph_file = meta.get("graph_file") if isinstance(meta, dict) else None
    if isinstance(graph_file, str) and os.path.isfile(os.path.join(os.path.dirname(bundle), graph_file)):
        files.append(os.path.join(os.path.dirname(bundle), graph_file))
    return files


def run_fingerprint(config: TrainConfig, bundles: Sequence[str]) -> Dict[str, str]:
    """What a run's results depend on, part by part, in config order: "graphs[i]" (the entry's
    options, its bundle and GraphDef files), "clusters[j]", "profiles[i]", "overheads[j]" (file
    contents; "derive" / "none" without a file), then every other TrainConfig field outside
    RESUMABLE_FIELDS (max_groups, seed, network, rl, simulator, ...). Values: sha256 hex digests."""
    parts: Dict[str, str] = {}
    for i, (entry, bundle) in enumerate(zip(config.graphs, bundles)):
        options = {k: v for k, v in dataclasses.asdict(entry).items() if k != "graph"}
        parts[f"graphs[{i}]"] = _file_digest(_bundle_files(bundle), json.dumps(options, sort_keys=True).encode())
    for j, path in enumerate(config.clusters):
        parts[f"clusters[{j}]"] = _file_digest([path])
    for i, path in enumerate(config.profiles):
        parts[f"profiles[{i}]"] = "derive" if path is None else _file_digest([path])
    for j in range(len(config.clusters)):
        path = config.overheads[j] if j < len(config.overheads) else None
        parts[f"overheads[{j}]"] = "none" if path is None else _file_digest([path])
    plain = config.to_json()
    skip = set(RESUMABLE_FIELDS) | {"graphs", "clusters", "profiles", "overheads"}
    for f in dataclasses.fields(config):
        if f.name not in skip:
            parts[f.name] = hashlib.sha256(json.dumps(plain[f.name], sort_keys=True).encode()).hexdigest()
    return parts


def first_difference(saved: Dict[str, str], current: Dict[str, str]) -> Optional[str]:
    """The first part (in the current config's order, then the saved run's) that differs."""
    for part in list(current) + [p for p in saved if p not in current]:
        if saved.get(part) != current.get(part):
            return part
    return None


# ---- state files -------------------------------------------------------------------------------
class _Rejected(Exception):
    """A state file or TensorFlow checkpoint that cannot be used (damaged); `field` names where."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field, self.problem = field, problem


@dataclasses.dataclass
class SavedState:
    """One state file, read and checked against the run (nothing applied yet)."""
    path: str
    step: int
    elapsed_s: float
    tf_checkpoint: str
    rng: Dict[str, object]
    reward_baselines: Dict[str, float]
    pools: Dict[str, StrategyPool]
    logs: Dict[str, List[List[float]]]


_KINDS = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}


def _get(obj: Dict, key: str, kind: type, where: str = ""):
    """obj[key] if it is of `kind` (a float field takes any finite JSON number; bool is no number)."""
    field = f"{where}.{key}" if where else key
    if key not in obj:
        raise _Rejected(field, "is missing")
    value = obj[key]
    ok = isinstance(value, (int, float)) and math.isfinite(value) if kind is float else isinstance(value, kind)
    if isinstance(value, bool) or not ok:
        raise _Rejected(field, f"must be {_KINDS[kind]}, got {json.dumps(value)[:40]}")
    return value


def _refuse(out: str) -> str:
    return f"use a new output_dir, or delete {out} to start over"


def _parse_state_text(path: str) -> Dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise _Rejected("", f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise _Rejected("", "the file is empty")
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Rejected(f"line {e.lineno} column {e.colno}", f"not valid JSON ({e.msg}; truncated?)") from None
    if not isinstance(state, dict):
        raise _Rejected("", f"must be a JSON object, got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise _Rejected("format", f"is {json.dumps(state.get('format'))[:40]}, not {STATE_FORMAT!r}")
    return state


def _check_run(state: Dict, path: str, out: str, labels: Sequence[str], fingerprint: Dict[str, str],
               config_source: str) -> None:
    """Raises InputError when the state belongs to another run than this config's (not damage)."""
    if state.get("version") == 1:
        raise InputError(path, "version", f"{out} holds a run from before runs recorded their config's "
                         "fingerprint, so whether this config describes the same problem cannot be checked",
                         _refuse(out))
    if state.get("version") != STATE_VERSION:
        raise _Rejected("version", f"is {json.dumps(state.get('version'))[:40]}, expected {STATE_VERSION}")
    saved = _get(state, "fingerprint", dict)
    if not all(isinstance(v, str) for v in saved.values()):
        raise _Rejected("fingerprint", "must map each part to a digest string")
    part = first_difference(saved, fingerprint)
    if part is not None:
        what = ("changed since" if part in saved and part in fingerprint else
                "is new since" if part in fingerprint else "is gone since")
        raise InputError(config_source, part, f"{what} the run in {out} was checkpointed (at step "
                         f"{state.get('step')}); resuming would mix the results of two problems", _refuse(out))
    saved_labels = _get(state, "labels", list)
    if saved_labels != list(labels):
        if all(isinstance(x, str) for x in saved_labels):  # same contents, renamed files
            raise InputError(path, "labels", f"{out} holds a run of the tasks {saved_labels}, not {list(labels)}",
                             _refuse(out))
        raise _Rejected("labels", "must be a list of task names")


def read_state(path: str, out: str, labels: Sequence[str], fingerprint: Dict[str, str],
               config_source: str) -> SavedState:
    """Reads and checks one state file. Raises _Rejected when it is damaged, InputError when it
    is sound but belongs to another run (config changed, an old run without a fingerprint)."""
    state = _parse_state_text(path)
    _check_run(state, path, out, labels, fingerprint, config_source)
    step = _get(state, "step", int)
    name = _get(state, "tf_checkpoint", str)
    if step < 0 or name != f"ckpt-{step}":
        raise _Rejected("tf_checkpoint", f"{name!r} is not the checkpoint of step {step}")
    own = CHECKPOINT_STATE.fullmatch(os.path.basename(path))
    if own and int(own.group(1)) != step:
        raise _Rejected("step", f"is {step} in the state file of step {own.group(1)}")
    rng = _get(state, "rng", dict)
    try:  # numpy checks the generator state it is given
        np.random.default_rng().bit_generator.state = rng
    except (TypeError, ValueError, KeyError) as e:
        raise _Rejected("rng", f"is not a numpy generator state ({e})") from None
    baselines = _get(state, "reward_baselines", dict)
    for label in baselines:
        _get(baselines, label, float, "reward_baselines")
    tasks = _get(state, "tasks", dict)
    pools, logs = {}, {}
    for label in labels:
        task = _get(tasks, label, dict, "tasks")
        where = f"tasks.{label}"
        try:
            pools[label] = StrategyPool.from_json(_get(task, "pool", dict, where))
            if not pools[label].entries or not pools[label].baselines:
                raise ValueError("no entries or no baselines")
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # InputError is a ValueError
            raise _Rejected(f"{where}.pool", f"is not a strategy pool ({e})") from None
        rows = _get(task, "log", list, where)
        if not all(isinstance(r, list) and len(r) == 4 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in r) for r in rows):
            raise _Rejected(f"{where}.log", "must be rows of 4 numbers (step, mean, min, best)")
        logs[label] = [list(r) for r in rows]
    return SavedState(path, step, float(_get(state, "elapsed_s", float)), name, rng,
                      {k: float(v) for k, v in baselines.items()}, pools, logs)


@contextlib.contextmanager
def _stop_after_step(trainer: "Trainer") -> Iterator[None]:
    """While training: the first SIGTERM or SIGINT sets `trainer.stop_signal`, so that the loop
    stops after the step under way; a second one raises TrainingInterrupted at once. Signal
    handlers exist only in the main thread; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if trainer.stop_signal is not None:
            raise TrainingInterrupted(signum, trainer.last_saved_step or 0, saved=False)
        trainer.stop_signal = signum
        with contextlib.suppress(OSError):  # os.write, not the log: the handler may interrupt a write to it
            os.write(2, f"\n{signal.Signals(signum).name}: stopping when the step under way ends, with a "
                        "checkpoint (send it again to stop at once, keeping the last checkpoint)\n".encode())

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---- trainer -----------------------------------------------------------------------------------
class Trainer:
    def __init__(self, config: TrainConfig, log: Log, progress: bool = True,
                 resolve_bundle: Optional[BundleResolver] = None):
        self.config, self.log, self.show_progress = config, log, progress
        self.out = config.output_dir
        os.makedirs(self.out, exist_ok=True)
        self.ckpt_dir = os.path.join(self.out, "checkpoints")
        seed_everything(config.seed)  # before anything random (the network's weights) is built
        bundles = [graph_bundle(entry, resolve_bundle) for entry in config.graphs]
        self.fingerprint = run_fingerprint(config, bundles)
        # state files are read before the tasks are built: a changed config stops before any work
        saved, rejected = self._read_states(task_labels(config))
        self.runs = build_runs(config, log, bundles=bundles)
        self.network = PlacementNetwork(config.network, A.ActionLayout())
        self.learner = ReinforceLearner(self.network, config.rl)
        self.learner.build(self.runs[0].task.features.as_observation())
        self.checkpoint = tf.train.Checkpoint(network=self.network, optimizer=self.learner.optimizer)
        self.rng = np.random.default_rng(config.seed)
        self.step, self.elapsed_s = 0, 0.0
        self.last_saved_step: Optional[int] = None
        self.stop_signal: Optional[int] = None
        if saved or rejected:
            self._restore(saved, rejected)
        else:
            for run in self.runs:
                run.pool = seed_pool(run.task, config.rl.pool_size)
                bb = run.pool.best_baseline()
                self.log(f"{run.label}: best baseline {bb.source} {bb.time_s * 1e3:.3f} ms"
                         + (" (out of memory)" if bb.oom else ""))
                if all(b.oom for b in run.pool.baselines):
                    self.log(f"warning: {run.label}: every baseline runs out of memory; the run fails unless "
                             "training finds a strategy that fits (or the config sets accept_infeasible)")
        save_train_config(config, os.path.join(self.out, "config.json"))

    def _state_files(self) -> List[str]:
        """state.json, then the state file of every checkpoint, newest first."""
        files = [os.path.join(self.out, STATE_FILE)] if os.path.lexists(os.path.join(self.out, STATE_FILE)) else []
        if os.path.isdir(self.ckpt_dir):
            found = [(int(m.group(1)), f) for f in os.listdir(self.ckpt_dir) if (m := CHECKPOINT_STATE.fullmatch(f))]
            files += [os.path.join(self.ckpt_dir, f) for _, f in sorted(found, reverse=True)]
        return files

    def _read_states(self, labels: List[str]) -> Tuple[List[SavedState], List[Tuple[str, str, str]]]:
        """(usable state files, [(file, field, why) of the damaged ones]), newest first; ([], []) for
        a fresh run. Raises InputError when a state belongs to another config."""
        saved, rejected = [], []
        for path in self._state_files():
            try:
                saved.append(read_state(path, self.out, labels, self.fingerprint, self.config.source or "config"))
            except _Rejected as e:
                rejected.append((path, e.field, e.problem))
        if not saved and not rejected and os.path.isdir(self.ckpt_dir) and \
                any(f.startswith("ckpt-") for f in os.listdir(self.ckpt_dir)):
            raise InputError(self.ckpt_dir, "", "holds checkpoints but no state file to resume them with "
                             f"({STATE_FILE} and checkpoints/ckpt-<step>.state.json are missing)", _refuse(self.out))
        return saved, rejected

    def _read_tf_checkpoint(self, name: str) -> None:
        prefix = os.path.join(self.ckpt_dir, name)
        if not os.path.isfile(prefix + ".index"):
            raise _Rejected("tf_checkpoint", f"its TensorFlow checkpoint {prefix}.index is missing")
        try:  # a failed read may have restored some variables: the next candidate restores all
            self.checkpoint.read(prefix).assert_consumed()
        except (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise _Rejected("tf_checkpoint", f"its TensorFlow checkpoint {name} cannot be read ({reason})") from None

    def _restore(self, saved: List[SavedState], rejected: List[Tuple[str, str, str]]) -> None:
        """Resumes from the newest state whose TensorFlow checkpoint reads back; logs what it
        passed over and why. None usable: InputError naming the newest state file."""
        damaged: Dict[str, str] = {}  # TF checkpoint -> why it failed
        for s in saved:
            if s.tf_checkpoint in damaged:
                continue  # state.json and checkpoints/ckpt-N.state.json name the same checkpoint
            try:
                self._read_tf_checkpoint(s.tf_checkpoint)
            except _Rejected as e:
                damaged[s.tf_checkpoint] = e.problem
                rejected.append((s.path, e.field, e.problem))
                continue
            self._apply(s)
            newest = os.path.join(self.out, STATE_FILE)
            if s.path != newest:  # state.json names the checkpoint in use again (plan.py reads it)
                shutil.copyfile(s.path, newest + ".tmp")
                os.replace(newest + ".tmp", newest)
            for line in self._reasons(rejected):
                self.log(f"passed over {line}")
            self.log(f"resumed from step {s.step} ({os.path.relpath(s.path, self.out)}, {s.tf_checkpoint})")
            return
        path, field = min(rejected, key=self._file_order)[:2]
        raise InputError(path, field, f"no usable checkpoint to resume from ({'; '.join(self._reasons(rejected))})",
                         _refuse(self.out))

    def _file_order(self, rejection: Tuple[str, str, str]) -> int:
        files = self._state_files()
        return files.index(rejection[0]) if rejection[0] in files else len(files)

    def _reasons(self, rejected: List[Tuple[str, str, str]]) -> List[str]:
        """"<file>: <field>: <why>" per rejected state file, newest file first."""
        return [f"{os.path.relpath(p, self.out)}: {f + ': ' if f else ''}{why}"
                for p, f, why in sorted(rejected, key=self._file_order)]

    def _apply(self, s: SavedState) -> None:
        self.step, self.elapsed_s = s.step, s.elapsed_s
        self.rng.bit_generator.state = s.rng
        self.learner.baselines = dict(s.reward_baselines)
        for run in self.runs:
            run.pool, run.log_rows = s.pools[run.label], s.logs[run.label]
            run.task.reference_time_s = run.pool.best_baseline().effective_time_s
        self.last_saved_step = s.step  # kept with the next checkpoint; newer damaged ones are removed

    def save(self) -> None:
        """TF checkpoint, then its state file, then state.json (each atomic); keeps the last two."""
        os.makedirs(self.ckpt_dir, exist_ok=True)
        name = f"ckpt-{self.step}"
        self.checkpoint.write(os.path.join(self.ckpt_dir, name))
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "step": self.step, "elapsed_s": self.elapsed_s,
                 "tf_checkpoint": name, "labels": [r.label for r in self.runs], "fingerprint": self.fingerprint,
                 "rng": self.rng.bit_generator.state, "reward_baselines": self.learner.baselines,
                 "tasks": {r.label: {"pool": r.pool.to_json(), "log": r.log_rows} for r in self.runs}}
        write_json(os.path.join(self.ckpt_dir, f"{name}.state.json"), state)
        write_json(os.path.join(self.out, STATE_FILE), state)
        keep = {name} if self.last_saved_step is None else {name, f"ckpt-{self.last_saved_step}"}
        for f in os.listdir(self.ckpt_dir):
            if f.startswith("ckpt-") and f.split(".")[0] not in keep:
                os.remove(os.path.join(self.ckpt_dir, f))
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
                if self.stop_signal is not None and not self._done():
                    if self.last_saved_step != self.step:
                        self.save()
                    name = signal.Signals(self.stop_signal).name
                    self.log(f"\nstopped by {name} at step {self.step}: checkpoint saved; "
                             "run the same command again to resume")
                    raise TrainingInterrupted(self.stop_signal, self.step, saved=True)
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
        parts = [f"{r.label} {r.pool.best.time_s * 1e3:.3f}ms x{r.speedup():.2f}" + (" OOM" if r.pool.best.oom else "")
                 for r in self.runs]
        line = f"[step {self.step}{total} {self.elapsed_s:6.0f}s] best (x vs best baseline): " + " | ".join(parts)
        if sys.stderr.isatty():  # a terminal: one line that updates in place
            sys.stderr.write("\r" + line[:300])
        elif self.step % max(1, (b.steps or 200) // 20) == 0:  # a log file: about 20 lines in all
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def summary(self) -> Dict[str, object]:
        """Per task: the best strategy, the best baseline, the speed-up, and `feasible` (False: the
        best found runs out of memory; `oom_devices` then gives each such device's peak and
        capacity in bytes). Also written to output_dir/summary.json."""
        out = {"steps": self.step, "elapsed_s": self.elapsed_s, "tasks": {}}
        for r in self.runs:
            bb, best = r.pool.best_baseline(), r.pool.best
            report = r.best_report or r.task.simulate(best.strategy)
            out["tasks"][r.label] = {"best_time_s": best.time_s, "best_source": best.source,
                                     "feasible": not best.oom,
                                     "oom_devices": {d: {"peak_memory_bytes": int(p), "memory_bytes": int(c)}
                                                     for d, p, c in zip(report.device_names, report.peak_memory_bytes,
                                                                        report.memory_capacity_bytes) if p > c},
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
    run.best_report = dataclasses.replace(report, trace=None)  # the summary's memory figures
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
