"""A training run's state on disk: writing it, reading it back, and checking it (tfplace.train
writes it; tfplace.plan reads it).

On disk, under the run's output_dir:
  state.json                      the newest state (plan.py reads it)
  checkpoints/ckpt-N.{index,data-*}  tf.train.Checkpoint of the policy network and its optimizer
  checkpoints/ckpt-N.state.json   the state of step N
A state file is JSON (never pickle): format, version, step, elapsed seconds, the TF checkpoint it
goes with (`ckpt-<step>`), the task labels, the run's fingerprint, the numpy RNG state, the reward
baselines, and per task its strategy pool, log rows (step, mean and min sampled time, best time so
far, the policy's own plan's time; times in s) and the
number of simulations the run has made for it.

Checkpoint N is written in this order, each file atomic: the TensorFlow files, then
checkpoints/ckpt-N.state.json, then a copy of it as state.json; then every checkpoint but N and
the one before it is removed. A run cut at any point leaves a state file whose checkpoint is whole.

Resuming tries state.json, then the state files in checkpoints/, newest first, and takes the first
that is sound (JSON, every field present and of its type) and whose TensorFlow checkpoint reads
back; it logs why it passed over any. None usable is one InputError naming the newest state file,
why each failed, and the fix. A sound state of another run (a different fingerprint, other task
labels, or a version-1 run without a fingerprint) is an InputError at once: it is no damage.

The fingerprint (`run_fingerprint`) holds a sha256 digest per part, in config order: per graph
entry its options and the contents of its bundle and GraphDef files, per cluster file the cluster it
describes (comments and layout aside), per profile ("derive" without one), per overheads file
("none" without one), then per TrainConfig field outside RESUMABLE_FIELDS (max_groups, seed,
network, rl, simulator, ...). Contents only: moving the files keeps a run resumable, editing them
does not (a cluster file's comments excepted). Resuming with another fingerprint names the
first part that differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfplace.formats.config import RESUMABLE_FIELDS, TrainConfig
from tfplace.formats.errors import InputError
from tfplace.formats.files import STEP_SUFFIXES
from tfplace.formats.jsonio import write_json

from tfplace.policy.pool import StrategyPool

STATE_FILE = "state.json"
CHECKPOINT_DIR = "checkpoints"
STATE_FORMAT = "tfplace.train_state"
STATE_VERSION = 2  # 2: the run's fingerprint and a state file per checkpoint (1 had neither)
CHECKPOINT_STATE = re.compile(r"ckpt-(\d+)\.state\.json")
Log = Callable[[str], None]
Rejection = Tuple[str, str, str]  # (state file, field, why it cannot be used)
# what reading a damaged TF checkpoint raises (a failed assert_consumed: AssertionError)
TF_READ_ERRORS = (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError)


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


def _cluster_digest(path: str) -> str:
    """sha256 of the cluster the file describes (its canonical JSON, Cluster.to_json): comments,
    key order, spacing and defaults written out or left out do not change it; any value does."""
    from tfplace.formats.cluster import load_cluster
    canonical = json.dumps(load_cluster(path).to_json(), sort_keys=True).encode()
    return hashlib.sha256(b"cluster\0" + canonical).hexdigest()


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
    options, its bundle and GraphDef files), "clusters[j]" (the cluster, not the file's layout or
    comments), "profiles[i]", "overheads[j]" (file contents; "derive" / "none" without a file),
    then every other TrainConfig field outside RESUMABLE_FIELDS (max_groups, seed, network, rl,
    simulator, ...). Values: sha256 hex digests."""
    parts: Dict[str, str] = {}
    for i, (entry, bundle) in enumerate(zip(config.graphs, bundles)):
        options = {k: v for k, v in dataclasses.asdict(entry).items() if k != "graph"}
        # a bare step: its own file (with the roles among the options), not the cached bundle it is
        # imported into, whose metadata (the import's duration) differs each time the cache is made
        files = [entry.graph] if entry.graph and entry.graph.endswith(STEP_SUFFIXES) else _bundle_files(bundle)
        parts[f"graphs[{i}]"] = _file_digest(files, json.dumps(options, sort_keys=True).encode())
    for j, path in enumerate(config.clusters):
        parts[f"clusters[{j}]"] = _cluster_digest(path)
    for i, path in enumerate(config.profiles):
        parts[f"profiles[{i}]"] = "derive" if path is None else _file_digest([path])
    for j in range(len(config.clusters)):
        path = config.overheads[j] if j < len(config.overheads) else None
        parts[f"overheads[{j}]"] = "none" if path is None else _file_digest([path])
    plain = config.to_json()
    if plain.get("simulator", {}).get("straggler_seed") == config.seed:  # the default spelled out
        plain["simulator"] = dict(plain["simulator"], straggler_seed=None)
    skip = set(RESUMABLE_FIELDS) | {"graphs", "clusters", "profiles", "overheads", "init_policy"}
    parts["init_policy"] = "random" if config.init_policy is None else _file_digest([config.init_policy])
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


# ---- one state file ----------------------------------------------------------------------------
class _Rejected(Exception):
    """A state file or TensorFlow checkpoint that cannot be used (damaged); `field` names where."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field, self.problem = field, problem


@dataclasses.dataclass
class SavedState:
    """One state: read from `path` and checked, or about to be written (path "")."""
    step: int
    elapsed_s: float
    tf_checkpoint: str
    rng: Dict[str, object]  # numpy bit_generator.state
    reward_baselines: Dict[str, float]
    pools: Dict[str, StrategyPool]  # per task label, in task order
    logs: Dict[str, List[List[float]]]
    path: str = ""
    simulations: Dict[str, int] = dataclasses.field(default_factory=dict)  # per task label, every session

    def to_json(self, fingerprint: Dict[str, str]) -> Dict[str, object]:
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "step": self.step, "elapsed_s": self.elapsed_s,
                "tf_checkpoint": self.tf_checkpoint, "labels": list(self.pools), "fingerprint": fingerprint,
                "rng": self.rng, "reward_baselines": self.reward_baselines,
                "tasks": {label: {"pool": pool.to_json(), "log": self.logs[label],
                                  "simulations": int(self.simulations.get(label, 0))}
                          for label, pool in self.pools.items()}}


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


def _own_labels(state: Dict) -> List[str]:
    """The state's task labels, unchecked against a run (any version that has them)."""
    if state.get("version") not in (1, STATE_VERSION):
        raise _Rejected("version", f"is {json.dumps(state.get('version'))[:40]}, expected {STATE_VERSION}")
    labels = _get(state, "labels", list)
    if not all(isinstance(x, str) for x in labels):
        raise _Rejected("labels", "must be a list of task names")
    return labels


def read_state(path: str, out: str, labels: Optional[Sequence[str]] = None,
               fingerprint: Optional[Dict[str, str]] = None, config_source: str = "config") -> SavedState:
    """Reads and checks one state file. Raises _Rejected when it is damaged, InputError when it
    is sound but belongs to another run (config changed, an old run without a fingerprint).
    Without `fingerprint` (and `labels`) it is not checked against a run: the planner needs only
    the policy's checkpoint."""
    state = _parse_state_text(path)
    if fingerprint is None:
        labels = _own_labels(state)
    else:
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
    pools, logs, simulations = {}, {}, {}
    for label in labels:
        task = _get(tasks, label, dict, "tasks")
        pools[label], logs[label] = _read_task(task, f"tasks.{label}")
        # states written before runs counted their simulations across sessions have none: 0
        simulations[label] = _get(task, "simulations", int, f"tasks.{label}") if "simulations" in task else 0
        if simulations[label] < 0:
            raise _Rejected(f"tasks.{label}.simulations", f"is {simulations[label]}, not a count")
    return SavedState(step, float(_get(state, "elapsed_s", float)), name, rng,
                      {k: float(v) for k, v in baselines.items()}, pools, logs, path, simulations)


def _read_task(task: Dict, where: str) -> Tuple[StrategyPool, List[List[float]]]:
    """(pool, log rows) of one task's entry in a state file."""
    try:
        pool = StrategyPool.from_json(_get(task, "pool", dict, where))
        if not pool.entries or not pool.baselines:
            raise ValueError("no entries or no baselines")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # InputError is a ValueError
        raise _Rejected(f"{where}.pool", f"is not a strategy pool ({e})") from None
    rows = _get(task, "log", list, where)
    if not all(isinstance(r, list) and len(r) in (4, 5) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in r) for r in rows):
        raise _Rejected(f"{where}.log", "must be rows of 5 numbers (step, mean, min, best, greedy)")
    return pool, [list(r) for r in rows]


# ---- a run's state files -----------------------------------------------------------------------
def state_files(out: str) -> List[str]:
    """state.json, then the state file of every checkpoint, newest first (the order resume tries)."""
    newest, ckpt_dir = os.path.join(out, STATE_FILE), os.path.join(out, CHECKPOINT_DIR)
    files = [newest] if os.path.lexists(newest) else []
    if os.path.isdir(ckpt_dir):
        found = [(int(m.group(1)), f) for f in os.listdir(ckpt_dir) if (m := CHECKPOINT_STATE.fullmatch(f))]
        files += [os.path.join(ckpt_dir, f) for _, f in sorted(found, reverse=True)]
    return files


def read_states(out: str, labels: Optional[Sequence[str]] = None, fingerprint: Optional[Dict[str, str]] = None,
                config_source: str = "config") -> Tuple[List[SavedState], List[Rejection]]:
    """(sound state files, the damaged ones), newest first; ([], []) for a fresh run. Raises
    InputError when a state belongs to another run (see read_state), or, checking against a run,
    when checkpoints are left without any state file."""
    saved, rejected = [], []
    for path in state_files(out):
        try:
            saved.append(read_state(path, out, labels, fingerprint, config_source))
        except _Rejected as e:
            rejected.append((path, e.field, e.problem))
    ckpt_dir = os.path.join(out, CHECKPOINT_DIR)
    if fingerprint is not None and not saved and not rejected and os.path.isdir(ckpt_dir) and \
            any(f.startswith("ckpt-") for f in os.listdir(ckpt_dir)):
        raise InputError(ckpt_dir, "", "holds checkpoints but no state file to resume them with "
                         f"({STATE_FILE} and {CHECKPOINT_DIR}/ckpt-<step>.state.json are missing)", _refuse(out))
    return saved, rejected


def _read_tf_checkpoint(out: str, name: str, read: Callable[[str], object]) -> None:
    prefix = os.path.join(out, CHECKPOINT_DIR, name)
    if not os.path.isfile(prefix + ".index"):
        raise _Rejected("tf_checkpoint", f"its TensorFlow checkpoint {prefix}.index is missing")
    try:  # a failed read may have restored some variables: the next candidate restores all
        read(prefix)
    except TF_READ_ERRORS as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise _Rejected("tf_checkpoint", f"its TensorFlow checkpoint {name} cannot be read ({reason})") from None


def newest_usable(out: str, saved: List[SavedState], rejected: List[Rejection], read: Callable[[str], object],
                  log: Log, purpose: str = "resume from", fix: Optional[str] = None) -> SavedState:
    """The newest of `saved` whose TensorFlow checkpoint `read(prefix)` reads back (raising one of
    TF_READ_ERRORS when it does not); logs what it passed over and why (adding to `rejected`). None
    usable: InputError naming the newest state file, every reason, and `fix` (default: start over)."""
    damaged: Dict[str, str] = {}  # TF checkpoint -> why it failed
    for s in saved:
        if s.tf_checkpoint in damaged:
            continue  # state.json and checkpoints/ckpt-N.state.json name the same checkpoint
        try:
            _read_tf_checkpoint(out, s.tf_checkpoint, read)
        except _Rejected as e:
            damaged[s.tf_checkpoint] = e.problem
            rejected.append((s.path, e.field, e.problem))
            continue
        for line in _reasons(out, rejected):
            log(f"passed over {line}")
        return s
    path, field = min(rejected, key=lambda r: _file_order(out, r))[:2]
    raise InputError(path, field, f"no usable checkpoint to {purpose} ({'; '.join(_reasons(out, rejected))})",
                     fix or _refuse(out))


def resume(out: str, saved: List[SavedState], rejected: List[Rejection], read: Callable[[str], object],
           log: Log) -> SavedState:
    """newest_usable, then state.json names the checkpoint in use again (plan.py reads it)."""
    s = newest_usable(out, saved, rejected, read, log)
    newest = os.path.join(out, STATE_FILE)
    if s.path != newest:
        shutil.copyfile(s.path, newest + ".tmp")
        os.replace(newest + ".tmp", newest)
    log(f"resumed from step {s.step} ({os.path.relpath(s.path, out)}, {s.tf_checkpoint})")
    return s


def _file_order(out: str, rejection: Rejection) -> int:
    files = state_files(out)
    return files.index(rejection[0]) if rejection[0] in files else len(files)


def _reasons(out: str, rejected: List[Rejection]) -> List[str]:
    """"<file>: <field>: <why>" per rejected state file, newest file first."""
    return [f"{os.path.relpath(p, out)}: {f + ': ' if f else ''}{why}"
            for p, f, why in sorted(rejected, key=lambda r: _file_order(out, r))]


# ---- writing -----------------------------------------------------------------------------------
def write_checkpoint(out: str, checkpoint: tf.train.Checkpoint, state: SavedState, fingerprint: Dict[str, str],
                     keep_step: Optional[int]) -> None:
    """Checkpoint `state.step`: its TF checkpoint, then its state file, then state.json (each
    atomic); then removes every checkpoint but this one and that of `keep_step`."""
    ckpt_dir = os.path.join(out, CHECKPOINT_DIR)
    os.makedirs(ckpt_dir, exist_ok=True)
    checkpoint.write(os.path.join(ckpt_dir, state.tf_checkpoint))
    data = state.to_json(fingerprint)
    write_json(os.path.join(ckpt_dir, f"{state.tf_checkpoint}.state.json"), data)
    write_json(os.path.join(out, STATE_FILE), data)
    keep = {state.tf_checkpoint} | (set() if keep_step is None else {f"ckpt-{keep_step}"})
    for f in os.listdir(ckpt_dir):
        if f.startswith("ckpt-") and f.split(".")[0] not in keep:
            os.remove(os.path.join(ckpt_dir, f))
