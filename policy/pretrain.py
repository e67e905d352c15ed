"""Pre-training the placement policy by expert iteration over the training distribution (the
library behind `python -m tfplace.pretrain`, which writes the policy shipped with the package).

    result = pretrain(PretrainConfig(out="policy/pretrained/policy.json", seed=0), log=print)

The tasks: `num_tasks` (+ `num_validation_tasks`) (model, cluster) pairs drawn with `seed` from the split's train models x
its generated training clusters (tfplace.policy.distribution; the held-out models and cluster
shapes are never drawn). Costs come from the device model (derived profiles).

Each round r = 0 .. rounds-1:
  1. expert: for every task, the policy-guided search (tfplace.policy.planner.plan_task, mode
     "both": policy samples, mutations drawn from the policy's marginals, the strategy-level hill
     climber, every baseline in the pool) runs `search_seconds`; its best strategy is encoded into
     the action space (actions.encode) and the better of that and the best action the search
     itself evaluated becomes the task's target (kept across rounds: a target only improves);
  2. apprentice: `epochs` passes of supervised imitation (ReinforceLearner.imitate) over the
     targets, in shuffled mini-batches of `tasks_per_update` tasks, keeping the weights whose
     greedy strategies came closest to the targets of `num_validation_tasks` further tasks of
     the training distribution that are never imitated (early stopping);
then `rl_steps` REINFORCE steps (the simulator's reward; each on `tasks_per_update` tasks with
`rl_samples` samples, plus one imitation step on the same tasks so that the policy does not
drift from what the search found); their weights are kept only if the validation tasks' greedy
strategies end closer to their targets than before them (the provenance says which). Round r+1's search starts
from round r's policy.

Resume: targets and per-round weights and optimizer state go to `work_dir` as they are made
(JSON, atomically); running the same config again skips what is there. Every random draw comes from the seed and the
round / task index (not from a generator that an interruption would leave elsewhere), so a
resumed run takes the same steps as an uninterrupted one; the run is deterministic for a seed up
to the search's wall-clock budget (a faster machine evaluates more candidates).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from tfplace.formats.config import GraphEntry, NetworkConfig, RLConfig
from tfplace.formats.jsonio import FieldReader, write_json
from tfplace.ir.grouping import make_grouping
from tfplace.ir.loader import load_op_graph

from tfplace.policy import actions as A
from tfplace.policy import distribution, pretrained
from tfplace.policy.environment import PlacementTask
from tfplace.policy.stop_signals import STOP_SIGNALS, held_stop_signals
from tfplace.profiling.device_model import default_profile

Log = Callable[[str], None]
StopHere = Callable[[], None]


def _no_stop() -> None:
    """A safe point where nothing waits (the library called without stop_at_safe_points)."""


@contextlib.contextmanager
def stop_at_safe_points() -> Iterator[StopHere]:
    """While pre-training: SIGINT and SIGTERM wait for the next safe point, the yielded
    `stop_here()` (called between searches, imitation batches and REINFORCE steps), which hands
    the signal to the handler that was there before (Ctrl-C: KeyboardInterrupt; the command lines'
    SIGTERM: their Terminated), as training does after its step (tfplace.policy.stop_signals). A
    signal that lands inside a TensorFlow call leaves its tracing state half-updated, and the next
    call fails with "AssertionError: Concurrent access?" instead of stopping. A second signal is
    handed over at once. What was written (targets, round weights) is kept, so the same command
    resumes."""
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def deliver(signum: int, frame=None) -> None:
        handler = previous[signum]
        if callable(handler):
            # Called with the holding handlers still in place: a handler that returns (one that
            # only logs) lets pre-training go on, and the next signal is held again.
            handler(signum, frame)
            return
        for s, h in previous.items():  # the default ends the process: put it back, then raise
            if h is not None:  # None: set outside Python, cannot be put back
                signal.signal(s, h)
        signal.raise_signal(signum)

    with held_stop_signals("stopping when the search or step under way ends; run the same command again to "
                           "resume (send it again to stop at once)", deliver) as held:
        def stop_here() -> None:
            if held:
                deliver(held.pop())
        yield stop_here


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    out: str
    seed: int = 0
    num_tasks: int = 64
    num_validation_tasks: int = 12
    rounds: int = 2
    search_seconds: float = 5.0
    epochs: int = 40
    rl_steps: int = 20
    rl_samples: int = 4
    tasks_per_update: int = 4
    max_groups: int = 64
    learning_rate: float = 1e-3
    network: NetworkConfig = NetworkConfig()
    split_path: Optional[str] = None
    work_dir: Optional[str] = None  # default: <out>.work

    @property
    def work(self) -> str:
        return self.work_dir or self.out + ".work"


@dataclasses.dataclass
class TaskSpec:
    label: str
    model: str
    batch_size: int
    cluster_name: str
    cluster_body: dict


def draw_tasks(split: distribution.Split, num_tasks: int, seed: int) -> List[TaskSpec]:
    """`num_tasks` distinct (train model, training cluster) pairs, drawn with `seed`; every model
    entry appears about equally often (round robin over a shuffled model order)."""
    clusters = distribution.training_clusters(split)
    rng = np.random.default_rng(seed)
    pairs = [(m, c) for m in range(len(split.train_models)) for c in range(len(clusters))]
    by_model: Dict[int, List[int]] = {}
    for m, c in pairs:
        by_model.setdefault(m, []).append(c)
    for cs in by_model.values():
        rng.shuffle(cs)
    order = list(rng.permutation(len(split.train_models)))
    out: List[TaskSpec] = []
    while len(out) < min(num_tasks, len(pairs)):
        for m in order:
            if by_model[m] and len(out) < num_tasks:
                c = by_model[m].pop()
                entry = split.train_models[m]
                name, body = clusters[c]
                out.append(TaskSpec(f"{entry['model']}_b{entry['batch_size']}__{name}", entry["model"],
                                    int(entry["batch_size"]), name, body))
    return out


def build_task(spec: TaskSpec, max_groups: int, resolve_bundle) -> PlacementTask:
    """The PlacementTask of one spec (device-model profile); `resolve_bundle`: a GraphEntry's
    bundle path (the binaries pass tfplace.graph_defs.export.bundle_for_entry)."""
    graph = load_op_graph(resolve_bundle(GraphEntry(spec.batch_size, model=spec.model)))
    cluster = distribution.as_cluster(spec.cluster_body)
    return PlacementTask(spec.label, graph, make_grouping(graph, max_groups), cluster,
                         default_profile(graph, cluster.kinds), spec.batch_size, max_groups)


def expert_target(learner, task: PlacementTask, search_seconds: float, seed: int,
                  canonical: bool = False) -> Tuple[Dict, float, str]:
    """(target action, its effective time s, where it came from) of one policy-guided search;
    `canonical`: each class of identical devices relabelled (PlacementTask.canonical), for a
    network that reads the device rank."""
    from tfplace.policy.planner import plan_task
    result = plan_task(learner, task, search_seconds, samples=4, seed=seed, mode="both")
    cands = [(A.encode(result.best.strategy, task.grouping.group_names, task.cluster.device_names, task.speeds),
              f"encoded {result.best.source}")]
    if result.best_action is not None:
        cands.append((result.best_action.action, result.best_action.source))
    scored = [(task.evaluate(a).effective_time_s, i, a, src) for i, (a, src) in enumerate(cands)]
    t, _, act, src = min(scored, key=lambda x: (x[0], x[1]))
    if canonical:  # the same strategy up to identical devices; the simulator's tie-breaks may move its time a little
        act = task.canonical(act)
        t = task.evaluate(act).effective_time_s
    return act, t, src


def _read(path: str, default):
    return FieldReader.from_file(path).data if os.path.exists(path) else default


OPTIMIZER_FORMAT = "tfplace.pretrain_optimizer"


def _optimizer_path(round_path: str) -> str:
    return os.path.splitext(round_path)[0] + ".optimizer.json"


def save_optimizer(learner, path: str) -> None:
    """The optimizer's state (Adam's step count and moments) as JSON, beside a round's weights: a
    resumed run continues with it, as the uninterrupted run does (float32 values with 9 digits
    round-trip exactly)."""
    write_json(path, {"format": OPTIMIZER_FORMAT, "version": 1,
                      "variables": pretrained.variables_to_json(learner.optimizer.variables)})


def restore_optimizer(learner, path: str) -> bool:
    """Sets the optimizer's state from `path` (save_optimizer); False when there is none, or it is
    not this optimizer's (a folder from before it was kept: the run then goes on with a fresh one)."""
    if not os.path.exists(path):
        return False
    saved = FieldReader.from_file(path, expected_format=OPTIMIZER_FORMAT).data["variables"]
    own = learner.optimizer.variables
    if [(v.name, list(v.shape)) for v in own] != [(x["name"], list(x["shape"])) for x in saved]:
        return False
    for v, x in zip(own, saved):
        v.assign(np.asarray(x["values"], v.dtype.as_numpy_dtype).reshape(v.shape))
    return True


# Settings a run may change when it resumes a work folder: more rounds continue it, and the
# REINFORCE steps run after the rounds from what they left (neither is stored in the folder).
RESUMABLE_CHANGES = ("out", "work_dir", "rounds", "rl_steps")
SETTINGS_FILE = "settings.json"


def work_settings(config: PretrainConfig) -> Dict[str, object]:
    """What the work folder's targets and round weights depend on: every setting but RESUMABLE_CHANGES."""
    out = {k: v for k, v in dataclasses.asdict(config).items() if k not in RESUMABLE_CHANGES}
    out["split_path"] = os.path.abspath(config.split_path or distribution.DEFAULT_SPLIT_PATH)
    return out


def check_work_settings(config: PretrainConfig) -> None:
    """Records the settings in a new work folder (SETTINGS_FILE); in one that has them, raises
    InputError naming the first setting that differs, before any work: targets and weights made
    with other settings would be resumed as if they were this run's."""
    from tfplace.formats.errors import InputError
    path = os.path.join(config.work, SETTINGS_FILE)
    now = work_settings(config)
    if not os.path.exists(path):
        write_json(path, {"format": "tfplace.pretrain_work", "version": 1, "settings": now})
        return
    was = FieldReader.from_file(path, expected_format="tfplace.pretrain_work").data.get("settings", {})
    for key in sorted(set(now) | set(was)):
        if now.get(key) != was.get(key):
            raise InputError(path, f"settings.{key}", f"the work folder was made with {was.get(key)!r}, this run "
                             f"asks for {now.get(key)!r}", f"run with the settings it was made with, or give "
                             f"another --work_dir (or remove {config.work})")


def pretrain(config: PretrainConfig, log: Log, resolve_bundle) -> Dict[str, object]:
    """Runs (or resumes) pre-training; writes config.out; returns its provenance. `resolve_bundle`:
    as for build_task (the policy does not depend on the model zoo). SIGINT and SIGTERM stop
    it at the next safe point (stop_at_safe_points)."""
    with stop_at_safe_points() as stop_here:
        provenance = _pretrain(config, log, resolve_bundle, stop_here)
        stop_here()  # a signal held through the last stretch still ends the run as that signal (130 / 143)
        return provenance


def _pretrain(config: PretrainConfig, log: Log, resolve_bundle, stop_here: StopHere) -> Dict[str, object]:
    from tfplace.policy.train_lib import seed_everything
    split = distribution.load_split(config.split_path)  # a bad split leaves no work folder that records it
    drawn = draw_tasks(split, config.num_tasks + config.num_validation_tasks, config.seed)
    os.makedirs(config.work, exist_ok=True)
    check_work_settings(config)
    seed_everything(config.seed)  # before the network is built: its initial weights
    specs, validation = drawn[:config.num_tasks], drawn[config.num_tasks:]
    learner = pretrained.new_learner(config.network, RLConfig(learning_rate=config.learning_rate))
    t0 = time.time()
    tasks: Dict[str, PlacementTask] = {}
    for i, spec in enumerate(drawn):
        stop_here()
        tasks[spec.label] = build_task(spec, config.max_groups, resolve_bundle)
        log(f"[task {i + 1}/{len(drawn)}] {spec.label}: {tasks[spec.label].num_groups} groups, "
            f"{tasks[spec.label].num_devices} devices")
    targets_path = os.path.join(config.work, "targets.json")
    targets: Dict[str, Dict] = _read(targets_path, {})
    rounds_log: List[Dict[str, object]] = _read(os.path.join(config.work, "rounds.json"), {"rounds": []})["rounds"]
    for r in range(config.rounds):
        round_path = os.path.join(config.work, f"round{r}.json")
        if os.path.exists(round_path):
            weights, variables = pretrained.read_weights(round_path)
            pretrained.assign_weights(learner, weights, variables)
            kept = restore_optimizer(learner, _optimizer_path(round_path))
            log(f"round {r}: resumed from {round_path}" +
                ("" if kept else " (its optimizer state was not kept: the run goes on with a fresh optimizer)"))
            continue
        for i, spec in enumerate(drawn):  # validation tasks get targets too, to be judged against
            key = f"{r}:{spec.label}"
            if key in targets.get("done", []):
                continue
            stop_here()
            task = tasks[spec.label]
            search_seed = int(np.random.SeedSequence([config.seed, r, i]).generate_state(1)[0])
            act, t, src = expert_target(learner, task, config.search_seconds, search_seed,
                                        canonical=bool(config.network.device_rank_feature))
            old = targets.get(spec.label)
            if old is None or t < old["effective_time_s"]:
                targets[spec.label] = {"action": A.action_to_json(act), "effective_time_s": t, "source": src,
                                       "round": r, "baseline_s": task.reference_time_s}
            targets.setdefault("done", []).append(key)
            write_json(targets_path, targets)
            log(f"[round {r} search {i + 1}/{len(drawn)}] {spec.label}: target {t * 1e3:.2f} ms ({src}); "
                f"best baseline {task.reference_time_s * 1e3:.2f} ms")
        stats = _imitate(learner, specs, validation, tasks, targets, config, np.random.default_rng([config.seed, r]),
                         log, r, stop_here)
        rounds_log.append(stats)
        save_optimizer(learner, _optimizer_path(round_path))  # first: a round file means both are there
        pretrained.save_weights(learner, round_path, config.network, config.max_groups, {"round": r})
        write_json(os.path.join(config.work, "rounds.json"), {"rounds": rounds_log})
    rl = {}
    if config.rl_steps:
        kept = _snapshot(learner)
        val_before = _greedy_ratios(learner, validation, tasks, targets)
        rl = _reinforce(learner, specs, tasks, targets, config, np.random.default_rng([config.seed, config.rounds]),
                        log, stop_here)
        rl["validation_before"] = val_before
        rl["validation_after"] = _greedy_ratios(learner, validation, tasks, targets)
        rl["kept"] = rl["validation_after"] <= val_before
        if not rl["kept"]:  # REINFORCE made the validation greedy strategies worse: keep the imitation weights
            _restore(learner, kept)
            log("reinforce did not bring the validation tasks' greedy strategies closer to their targets: "
                "its weights are dropped")
    final = _greedy_ratios(learner, specs, tasks, targets)
    final_val = _greedy_ratios(learner, validation, tasks, targets)
    provenance = {"command": pretrained.PRETRAIN_COMMAND, "seed": config.seed,
                  "config": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("out", "work_dir")},
                  "split": os.path.relpath(config.split_path or distribution.DEFAULT_SPLIT_PATH,
                                           distribution.REPO_ROOT),
                  "tasks": [s.label for s in specs], "validation_tasks": [s.label for s in validation],
                  "rounds": rounds_log, "rl": rl, "greedy_over_target_geomean": final,
                  "validation_greedy_over_target_geomean": final_val, "wall_s": time.time() - t0}
    pretrained.save_weights(learner, config.out, config.network, config.max_groups, provenance)
    log(f"wrote {config.out}: greedy / target time, geomean over the training tasks {final:.3f}, "
        f"over the validation tasks {final_val:.3f}")
    return provenance


def _snapshot(learner) -> List[np.ndarray]:
    """The network's weights, to return to with _restore."""
    return [v.numpy() for v in learner.network.trainable_variables]


def _restore(learner, weights: List[np.ndarray]) -> None:
    for v, value in zip(learner.network.trainable_variables, weights):
        v.assign(value)


def _target(targets, label):
    return A.action_from_json(targets[label]["action"])


def _greedy_ratios(learner, specs, tasks, targets) -> float:
    """Geomean over tasks of (greedy strategy's effective time / target's)."""
    ratios = []
    for spec in specs:
        task = tasks[spec.label]
        g = task.evaluate(learner.greedy(task.features.as_observation())).effective_time_s
        ratios.append(g / targets[spec.label]["effective_time_s"])
    return float(np.exp(np.mean(np.log(ratios))))


def _batches(rng, specs, size):
    order = rng.permutation(len(specs))
    return [[specs[i] for i in order[k:k + size]] for k in range(0, len(order), size)]


VALIDATE_EVERY_EPOCHS = 5


def _imitate(learner, specs, validation, tasks, targets, config, rng, log, r,
             stop_here: StopHere = _no_stop) -> Dict[str, object]:
    """`config.epochs` of imitation over `specs`; every VALIDATE_EVERY_EPOCHS epochs the greedy
    strategies of the validation tasks are timed, and the weights that did best on them are kept
    (early stopping: the training tasks alone reward memorising them). `stop_here` runs before
    each mini-batch (stop_at_safe_points)."""
    before = _greedy_ratios(learner, specs, tasks, targets)
    best_val, best_epoch = _greedy_ratios(learner, validation, tasks, targets), 0
    best_weights = _snapshot(learner)
    first = last = None
    for epoch in range(1, config.epochs + 1):
        losses = []
        for batch in _batches(rng, specs, config.tasks_per_update):
            stop_here()
            losses.append(learner.imitate([(tasks[s.label].features.as_observation(), _target(targets, s.label))
                                           for s in batch]))
        last = float(np.mean(losses))
        first = last if first is None else first
        if epoch % VALIDATE_EVERY_EPOCHS == 0 or epoch == config.epochs:
            val = _greedy_ratios(learner, validation, tasks, targets)
            if val < best_val:
                best_val, best_epoch = val, epoch
                best_weights = _snapshot(learner)
            log(f"[round {r} imitation epoch {epoch}/{config.epochs}] loss {last:.4f} nats per group; "
                f"validation greedy / target {val:.3f}")
    _restore(learner, best_weights)
    after = _greedy_ratios(learner, specs, tasks, targets)
    log(f"round {r}: kept epoch {best_epoch}; greedy / target time (geomean) on the training tasks "
        f"{before:.3f} -> {after:.3f}, on the validation tasks {best_val:.3f}")
    return {"round": r, "loss_first_epoch": first, "loss_last_epoch": last, "kept_epoch": best_epoch,
            "greedy_over_target_before": before, "greedy_over_target_after": after,
            "validation_greedy_over_target": best_val}


def _reinforce(learner, specs, tasks, targets, config, rng, log, stop_here: StopHere = _no_stop) -> Dict[str, object]:
    """`config.rl_steps` REINFORCE steps, each followed by an imitation step on the same tasks;
    `stop_here` runs before each step (stop_at_safe_points)."""
    before = _greedy_ratios(learner, specs, tasks, targets)
    for step in range(config.rl_steps):
        stop_here()
        batch = _batches(rng, specs, config.tasks_per_update)[0]
        rl_batch, demo = [], []
        for s in batch:
            task = tasks[s.label]
            obs = task.features.as_observation()
            acts = learner.sample(obs, config.rl_samples, rng.integers(0, 2**31 - 1, 2))
            rewards = [task.reward(task.evaluate(a)) for a in acts]
            rl_batch.append((obs, acts, learner.advantages(s.label, rewards)))
            demo.append((obs, _target(targets, s.label)))
        learner.update(rl_batch)
        learner.imitate(demo)
        if step % 10 == 9:
            log(f"[reinforce {step + 1}/{config.rl_steps}]")
    after = _greedy_ratios(learner, specs, tasks, targets)
    log(f"reinforce: greedy / target time (geomean over tasks) {before:.3f} -> {after:.3f}")
    return {"steps": config.rl_steps, "greedy_over_target_before": before, "greedy_over_target_after": after}
