"""Run configurations: the train config (`config.json`, read by `python -m tfplace.train`) and
the activate config (`activate_config.txt`, read by `activate.py`; JSON despite the extension,
as in HeteroG). Every key, unit and default is described in examples/formats/README.md.

Defaults live in one place: the dataclass defaults below (`train_config_defaults()` lists them).
Path rules:
  * input paths (graphs, clusters, profiles, strategies) are resolved against the folder of the
    config file, then against the folder of tfplace's bundled clusters/ (the repository root, or
    the installed package: tfplace.formats.files.bundled_root), and must exist;
  * output_dir is resolved against the current working directory (default `runs/<config
    stem>`), so that a run never writes into the folder its inputs come from.
The loaded values hold absolute paths.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.files import STEP_SUFFIXES, bundled_root, saved_model_problem
from tfplace.formats.jsonio import FieldReader, resolve_path, write_json
from tfplace.formats.strategy import load_strategy, validate_strategy

# The checkout's root (tfplace/formats/ -> repo), for tools that write into a checkout (policy.distribution's
# held-out clusters). Inputs resolve against bundled_root(), which is also right in an installed copy.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_FORMAT = "tfplace.train_config"
ACTIVATE_FORMAT = "tfplace.activate_config"
RL_ALGORITHMS = ("reinforce",)  # REINFORCE only: tfplace.policy.agent says why not PPO
ALLREDUCE_ALGORITHMS = ("ring", "tree")
OPTIMIZERS = ("sgd", "momentum", "adam")  # as in graph_defs.bundle.OPTIMIZERS
BASELINES = ("single", "dp_even_allreduce", "dp_even_ps", "dp_proportional_allreduce",
             "dp_proportional_ps", "dp_subset_even", "dp_subset_proportional", "dp_mp_hybrid",
             "horovod_even", "horovod_proportional")
DERIVE = "derive"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # entry names become file names

_pos = dict(check=lambda v: v > 0, must="be > 0")
#: Sizes a graph is built with (batch, image side, sequence length) stay below this: TensorFlow's
#: shapes are int32.
SIZE_LIMIT = 2 ** 31
_size = dict(check=lambda v: 0 < v < SIZE_LIMIT, must="be > 0 and below 2**31 (TensorFlow sizes are int32)")
_non_neg = dict(check=lambda v: v >= 0, must="be >= 0")


# ---- train config ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GraphEntry:
    """One training graph: a zoo `model` (exported on demand) or a `graph` path: a bundle .json or a
    bare training step .pb/.pbtxt/.meta (train op, loss and inputs inferred: tfplace.ir.step_roles;
    `train_ops`, `loss`, `loss_reduction`, `inputs` name them where inference is ambiguous, as the
    command lines' --train_op, --loss, --loss_reduction, --inputs do).
    Sizes in samples (batch_size: global batch), pixels (image_size), tokens (seq_len)."""
    batch_size: int
    model: Optional[str] = None
    graph: Optional[str] = None
    image_size: Optional[int] = None
    seq_len: Optional[int] = None
    num_layers: Optional[int] = None
    optimizer: Optional[str] = None
    train_ops: Tuple[str, ...] = ()
    loss: Optional[str] = None
    loss_reduction: Optional[str] = None
    inputs: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """Short unique name used for output folders, e.g. "tiny_cnn_b64"."""
        parts = [self.model or os.path.splitext(os.path.basename(self.graph or "graph"))[0]]
        parts += [f"b{self.batch_size}"] if self.batch_size is not None else []  # None: the zoo's default (plan)
        for tag, value in (("s", self.image_size), ("t", self.seq_len), ("n", self.num_layers)):
            if value is not None:
                parts.append(f"{tag}{value}")
        return "_".join(parts + ([self.optimizer] if self.optimizer else []))

    @property
    def error_source(self) -> str:
        """What an error about this entry's options names when no config file is at hand (the
        export: tfplace.graph_defs.export.bundle_for_entry); `in_config` renames it."""
        return f"graph entry {self.label}"

    def in_config(self, err: InputError, source: str, field: str) -> InputError:
        """`err` named as the config's own field (e.g. graphs[2].batch_size of `source`) when it
        is about this entry's options; otherwise `err` itself."""
        if err.source != self.error_source:
            return err
        return InputError(source, f"{field}.{err.field}", err.problem, err.fix)


@dataclasses.dataclass(frozen=True)
class Budget:
    """When training stops: after `steps` policy updates and/or `minutes` of wall time."""
    steps: Optional[int] = 200
    minutes: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Graph-network sizes. device_rank_feature = 1: the device encoder also reads each device's
    rank among the devices identical to it (tfplace.policy.features), so identical devices can
    get different outputs; 0: it reads only the other device columns (policies made before)."""
    hidden_size: int = 64
    num_message_passing_steps: int = 3
    num_heads: int = 4
    mlp_layers: int = 2
    device_rank_feature: int = 0


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Policy training. oom_penalty multiplies the simulated step time of a strategy that runs
    out of memory, so that it ranks below feasible ones; baseline_decay is the moving-average
    factor of the REINFORCE reward baseline; pool_size is the number of best strategies kept."""
    algorithm: str = "reinforce"
    learning_rate: float = 1e-3
    entropy_coef: float = 0.01
    samples_per_step: int = 4
    oom_penalty: float = 10.0
    pool_size: int = 8
    baseline_decay: float = 0.95
    imitate_best: bool = True  # after each update, one imitation step towards each task's best action


@dataclasses.dataclass(frozen=True)
class SimulatorConfig:
    """straggler_seed None means: use the config's `seed`."""
    straggler_seed: Optional[int] = None
    allreduce_algorithm: str = "ring"


# section field -> (JSON type, range check); the defaults are the dataclass defaults above.
_RULES: Dict[type, Dict[str, Tuple[type, Dict[str, Any]]]] = {
    NetworkConfig: {"hidden_size": (int, _pos), "num_message_passing_steps": (int, _pos),
                    "num_heads": (int, _pos), "mlp_layers": (int, _pos),
                    "device_rank_feature": (int, dict(check=lambda v: v in (0, 1), must="be 0 or 1"))},
    RLConfig: {"algorithm": (str, dict(check=lambda v: v in RL_ALGORITHMS, must=f"be one of {list(RL_ALGORITHMS)}")),
               "learning_rate": (float, _pos), "entropy_coef": (float, _non_neg),
               "samples_per_step": (int, _pos), "oom_penalty": (float, dict(check=lambda v: v >= 1, must="be >= 1")),
               "pool_size": (int, _pos), "imitate_best": (bool, {}),
               "baseline_decay": (float, dict(check=lambda v: 0 <= v < 1, must="be in [0, 1)"))},
    SimulatorConfig: {"straggler_seed": (int, _non_neg),
                      "allreduce_algorithm": (str, dict(check=lambda v: v in ALLREDUCE_ALGORITHMS,
                                                        must=f"be one of {list(ALLREDUCE_ALGORITHMS)}"))},
}


# TrainConfig fields a resumed run may change: how long to train, how often to checkpoint, where
# the outputs go and how the result is judged. Every other field changes the problem or the
# learning, so it enters the run's fingerprint (tfplace.policy.train_lib) and a changed value
# refuses to resume; a new field is in the fingerprint unless it is added here.
RESUMABLE_FIELDS = ("budget", "checkpoint_every_steps", "output_dir", "accept_infeasible", "source")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A loaded config.json. `profiles` has one entry per graph: an absolute path, or None to
    derive the costs with the device model; `overheads` one per cluster: the runtime overheads
    measured on it (tfplace.overheads; CPU-emulated clusters), or None. Paths are absolute."""
    graphs: Tuple[GraphEntry, ...]
    clusters: Tuple[str, ...]
    profiles: Tuple[Optional[str], ...]
    output_dir: str
    overheads: Tuple[Optional[str], ...] = ()  # per cluster: a runtime-overheads file, or None
    max_groups: int = 64
    budget: Budget = Budget()
    seed: int = 0
    checkpoint_every_steps: int = 50
    network: NetworkConfig = NetworkConfig()
    rl: RLConfig = RLConfig()
    simulator: SimulatorConfig = SimulatorConfig()
    accept_infeasible: bool = False  # a best strategy that runs out of memory fails the run unless set
    init_policy: Optional[str] = None  # weights file the policy starts from (absolute path), or None: random
    source: str = dataclasses.field(default="", compare=False)

    def to_json(self) -> Dict[str, Any]:
        """The config with every default filled in and absolute paths (loads back equal)."""
        out = {"format": TRAIN_FORMAT, "version": 1}
        for f in dataclasses.fields(self):
            if f.name != "source":
                out[f.name] = _plain(getattr(self, f.name))
        out["profiles"] = [DERIVE if p is None else p for p in self.profiles]
        out["graphs"] = [{k: v for k, v in g.items() if v is not None and v != []} for g in out["graphs"]]  # unset keys stay out
        return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def train_config_defaults() -> Dict[str, Any]:
    """Every default of config.json, nested as in the file."""
    out = {f.name: f.default for f in dataclasses.fields(TrainConfig)
           if f.default is not dataclasses.MISSING and f.name != "source"}
    return {k: _plain(v) for k, v in out.items()}


def _section(r: FieldReader, key: str, cls: type) -> Any:
    sub = r.child(key, default_empty=True)
    rules = _RULES[cls]
    sub.expect_keys(tuple(rules), also_allowed=("comment",))
    defaults = cls()
    return cls(**{name: sub.get(name, t, default=getattr(defaults, name), **checks)
                  for name, (t, checks) in rules.items()})


def _budget(r: FieldReader) -> Budget:
    if not r.has("budget"):
        return Budget()
    b = r.child("budget")
    b.expect_keys(("steps", "minutes"), also_allowed=("comment",))
    budget = Budget(b.get("steps", int, default=None, **_pos), b.get("minutes", float, default=None, **_pos))
    if budget.steps is None and budget.minutes is None:
        raise b.error(None, "gives neither steps nor minutes", 'add "steps" (policy updates) and/or "minutes"')
    return budget


# check_model(name, batch_size, image_size=, seq_len=, num_layers=, optimizer=) raises ValueError
# naming the problem (with a `fix` attribute when it knows one) and returns (spec, model config,
# every option resolved: a dict), e.g. tfplace.graph_defs.export.resolve_options. Core may not
# import the zoo, so callers that have it pass it in; without it model names are checked at export.
ModelCheck = Callable[..., Any]


_ZOO_OPTIONS = ("image_size", "seq_len", "num_layers", "optimizer", "batch_size")


def _check_zoo(g: FieldReader, e: GraphEntry, check_model: Optional[ModelCheck]) -> None:
    if check_model is None:
        return
    try:
        check_model(e.model, e.batch_size, image_size=e.image_size, seq_len=e.seq_len,
                    num_layers=e.num_layers, optimizer=e.optimizer or "sgd")
    except ValueError as err:
        # name the option the model refuses (e.g. image_size of an MLP), else the model itself
        field = next((k for k in _ZOO_OPTIONS if g.has(k) and re.search(rf"\b{k}\b", str(err))), "model")
        fix = getattr(err, "fix", "use a zoo model name and options that apply to it")  # export.OptionError's
        raise g.error(field, str(err), fix) from None


_STEP_ROLE_KEYS = ("train_ops", "loss", "loss_reduction", "inputs")


def _graph_entry(g: FieldReader, bases: List[str], check_model: Optional[ModelCheck]) -> GraphEntry:
    g.expect_keys(("model", "graph", "batch_size", "image_size", "seq_len", "num_layers", "optimizer")
                  + _STEP_ROLE_KEYS, also_allowed=("comment",))
    if g.has("model") == g.has("graph"):
        raise g.error(None, 'needs exactly one of "model" (a zoo model name) and "graph" (a bundle .json path)',
                      'keep one of the two keys')
    options = {key: g.get(key, int, default=None, **_size) for key in ("image_size", "seq_len", "num_layers")}
    options["optimizer"] = g.get("optimizer", str, default=None, check=lambda v: v in OPTIMIZERS,
                                 must=f"be one of {list(OPTIMIZERS)}")
    batch = g.get("batch_size", int, **_size)
    if g.has("graph"):
        for key, value in options.items():
            if value is not None:
                raise g.error(key, 'applies only to zoo models ("model"); a bundle fixes it',
                              "remove it, or export a bundle with this option")
        raw = g.get("graph", str)
        problem = next(filter(None, (saved_model_problem(os.path.join(base, raw)) for base in [""] + list(bases))),
                       None)
        if problem:
            raise g.error("graph", f"{raw} {problem[0]}", problem[1])
        path = g.get_path("graph", bases, what="graph bundle")
        roles = {"train_ops": tuple(g.strings("train_ops", default=[])), "inputs": tuple(g.strings("inputs", default=[])),
                 "loss": g.get("loss", str, default=None),
                 "loss_reduction": g.get("loss_reduction", str, default=None, check=lambda v: v in ("mean", "sum"),
                                         must='be "mean" or "sum"')}
        if any(roles.values()) and not path.endswith(STEP_SUFFIXES):
            key = next(k for k in _STEP_ROLE_KEYS if roles[k])
            raise g.error(key, "names a role of a bare training step, but the graph is a bundle (its metadata names it)",
                          "remove it, or point \"graph\" at the .pb/.pbtxt/.meta step")
        return GraphEntry(batch, graph=path, **roles)
    for key in _STEP_ROLE_KEYS:
        if g.has(key):
            raise g.error(key, 'applies only to a bare training step ("graph": .pb/.pbtxt/.meta)',
                          "remove it: a zoo model's bundle names its roles")
    entry = GraphEntry(batch, model=g.get("model", str, check=lambda v: bool(v.strip()), must="be non-empty"),
                       **options)
    _check_zoo(g, entry, check_model)
    return _without_defaults(entry, check_model)


def _without_defaults(entry: GraphEntry, check_model: Optional[ModelCheck]) -> GraphEntry:
    """`entry` with the zoo options that spell out the model's defaults left out ("optimizer": "sgd",
    a model's own image size): they name the same graph (the same bundle) as leaving them out, so
    the entry's label (its output folder) and a training run's fingerprint must not tell them apart.
    The defaults are those check_model fills in (its third result, as resolve_options returns)."""
    try:
        defaults = check_model(entry.model, entry.batch_size)[2] if check_model is not None else {}
    except (ValueError, TypeError, IndexError, KeyError):
        return entry
    spelled = {k: None for k in ("image_size", "seq_len", "num_layers", "optimizer")
               if getattr(entry, k) is not None and getattr(entry, k) == defaults.get(k)}
    return dataclasses.replace(entry, **spelled) if spelled else entry


def _graph_entries(r: FieldReader, key: str, bases: List[str], min_len: int,
                   check_model: Optional[ModelCheck]) -> Tuple[GraphEntry, ...]:
    graphs = []
    for g in r.items(key, default_empty=min_len == 0, min_len=min_len):
        entry = _graph_entry(g, bases, check_model)
        if any(e.label == entry.label for e in graphs):
            raise g.error(None, f"graph {entry.label!r} is listed twice", "remove the second entry")
        graphs.append(entry)
    return tuple(graphs)


def _profiles(r: FieldReader, bases: List[str], num_graphs: int) -> Tuple[Optional[str], ...]:
    value = r.get("profiles", (str, list), default=DERIVE)
    if isinstance(value, str):
        if value != DERIVE:
            raise r.error("profiles", f"must be {DERIVE!r} or a list, got {value!r}",
                          f'write "{DERIVE}" or list one profile path (or "{DERIVE}") per graph')
        return (None,) * num_graphs
    if len(value) != num_graphs:
        raise r.error("profiles", f"has {len(value)} entries for {num_graphs} graphs",
                      f'give one profile path (or "{DERIVE}") per entry of "graphs", in the same order')
    out = []
    for i, p in enumerate(value):
        if not isinstance(p, str) or not p:
            raise r.error(f"profiles[{i}]", f"must be a path or {DERIVE!r}, got {p!r}", "give a string")
        out.append(None if p == DERIVE else
                   _resolve(r, f"profiles[{i}]", p, bases, "profile"))
    return tuple(out)


def _resolve(r: FieldReader, field: str, value: str, bases: List[str], what: str) -> str:
    return resolve_path(value, r.source, r.field_path(field), bases, what)


def _output_dir(r: FieldReader, workdir: Optional[str]) -> str:
    stem = os.path.splitext(os.path.basename(r.source))[0]
    value = r.get("output_dir", str, default=os.path.join("runs", stem),
                  check=lambda v: bool(v.strip()), must="be non-empty")
    return os.path.normpath(os.path.join(workdir or os.getcwd(), os.path.expanduser(value)))


def load_train_config(path: Union[str, os.PathLike], workdir: Optional[str] = None,
                      check_model: Optional[ModelCheck] = None) -> TrainConfig:
    """Reads and validates config.json; loads every cluster it names (their errors name the
    cluster file). workdir: base of a relative output_dir (default: the current directory);
    check_model: see `ModelCheck`."""
    r = FieldReader.from_file(path, expected_format=TRAIN_FORMAT)
    bases = [os.path.dirname(os.path.abspath(r.source)), bundled_root()]
    r.expect_keys(("graphs", "clusters", "profiles", "overheads", "max_groups", "budget", "seed", "output_dir",
                   "checkpoint_every_steps", "network", "rl", "simulator", "accept_infeasible", "init_policy"))
    graphs = _graph_entries(r, "graphs", bases, min_len=1, check_model=check_model)
    clusters = tuple(_resolve(r, f"clusters[{i}]", c, bases, "cluster file")
                     for i, c in enumerate(r.strings("clusters", min_len=1)))
    for c in clusters:
        load_cluster(c)
    init_policy, network = _init_policy(r, bases)
    return TrainConfig(
        graphs=graphs, clusters=clusters, profiles=_profiles(r, bases, len(graphs)),
        output_dir=_output_dir(r, workdir), overheads=_overheads_per_cluster(r, bases, len(clusters)),
        max_groups=r.get("max_groups", int, default=TrainConfig.max_groups, **_pos),
        budget=_budget(r), seed=r.get("seed", int, default=TrainConfig.seed, **_non_neg),
        checkpoint_every_steps=r.get("checkpoint_every_steps", int, default=TrainConfig.checkpoint_every_steps, **_pos),
        network=network, rl=_section(r, "rl", RLConfig), simulator=_section(r, "simulator", SimulatorConfig),
        accept_infeasible=r.get("accept_infeasible", bool, default=TrainConfig.accept_infeasible),
        init_policy=init_policy, source=r.source)


PRETRAINED = "pretrained"


def _init_policy(r: FieldReader, bases: List[str]) -> Tuple[Optional[str], NetworkConfig]:
    """`init_policy`: "pretrained" (the policy shipped with tfplace), a policy weights file
    (python -m tfplace.pretrain), or absent / null (random initial weights). With a file, the
    network sizes are the file's; a `network` section that differs from them is refused."""
    value = r.get("init_policy", (str, type(None)), default=None)
    if value is None:
        return None, _section(r, "network", NetworkConfig)
    from tfplace.formats.policy_weights import pretrained_path, read_weights  # it imports this module
    if value != PRETRAINED and difflib.get_close_matches(value, [PRETRAINED], n=1, cutoff=0.8) \
            and not any(os.path.exists(os.path.join(base, value)) for base in bases + [""]):
        raise r.error("init_policy", f"{value!r} is no file (did you mean {PRETRAINED!r}?)",
                      f'write "{PRETRAINED}" for the shipped policy, or give a policy weights file')
    path = pretrained_path() if value == PRETRAINED else _resolve(r, "init_policy", value, bases, "policy weights file")
    weights, _ = read_weights(path)
    if r.has("network") and _section(r, "network", NetworkConfig) != weights.network:
        raise r.error("network", f"differs from the network of init_policy {value!r} ({weights.network})",
                      "remove the network section (the weights file gives the sizes), or drop init_policy")
    return path, weights.network


def _overheads_per_cluster(r: FieldReader, bases: List[str], num_clusters: int) -> Tuple[Optional[str], ...]:
    """`overheads`: a list with one entry per cluster, a runtime-overheads file (python -m
    tfplace.cli.overheads) or null (none: GPU clusters); absent, none for every cluster."""
    values = r.get("overheads", list, default=[None] * num_clusters)
    if len(values) != num_clusters:
        raise r.error("overheads", f"has {len(values)} entries for {num_clusters} clusters",
                      "give one entry per cluster (null where a cluster has no overheads file)")
    out = []
    for i, value in enumerate(values):
        if value is not None and not isinstance(value, str):
            raise r.error(f"overheads[{i}]", f"must be a path or null, got {value!r}", "give a string or null")
        out.append(None if value is None else _resolve(r, f"overheads[{i}]", value, bases, "runtime-overheads file"))
    return tuple(out)


def save_train_config(config: TrainConfig, path: Union[str, os.PathLike]) -> None:
    """Writes the resolved config (e.g. into the run's output_dir, for reproducibility)."""
    write_json(path, config.to_json())


# ---- activate config ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StrategyEntry:
    """One strategy to deploy. `strategy`/`graph` are absolute paths; `model` is a zoo name
    (exported at the strategy's global batch size) used when `graph` is None. `error` holds
    the problem found while reading the entry when the config was loaded with strict=False."""
    name: str
    field: str
    strategy: str = ""
    graph: Optional[str] = None
    model: Optional[str] = None
    error: Optional[InputError] = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class ActivateConfig:
    """A loaded activate_config.txt. Baselines run on every graph of the strategy entries
    (at the strategy's batch size) and on every entry of `graphs`."""
    cluster: str
    strategies: Tuple[StrategyEntry, ...]
    baselines: Tuple[str, ...]
    graphs: Tuple[GraphEntry, ...]
    output_dir: str
    steps: int = 10
    warmup_steps: int = 5
    rounds: int = 1  # every entry runs this many times, each round on fresh servers; the median round counts
    trace: bool = True
    # the cluster's runtime-overheads file for the simulated column, or MEASURE: measured on the
    # cluster at the start of the run (tfplace.cli.overheads.measure), so they are this machine's
    overheads: Optional[str] = None
    # the op costs of the simulated column: "device_model" (the bundled / roofline profile) or
    # "measure" (each graph profiled on the cluster's kinds, as its devices' emulation runs them)
    profile: str = "device_model"
    source: str = dataclasses.field(default="", compare=False)


ACTIVATE_PROFILES = ("device_model", "measure")
MEASURE = "measure"  # "overheads": "measure" in an activate config


def _entry_name(s: FieldReader, i: int) -> str:
    name = s.data.get("name")
    return name if isinstance(name, str) and _NAME.fullmatch(name) else f"strategies[{i}]"


def _strategy_entry(s: FieldReader, i: int, bases: List[str], check_model: Optional[ModelCheck]) -> StrategyEntry:
    field = s.field_path()
    try:
        s.expect_keys(("name", "strategy", "graph", "model"), also_allowed=("comment",))
        name = s.get("name", str, check=lambda v: bool(_NAME.fullmatch(v)),
                     must="use only letters, digits, '_', '.', '-' (it names output files)",
                     fix='rename the entry, e.g. "my_run"')
        if s.has("model") == s.has("graph"):
            raise s.error(None, 'needs exactly one of "graph" (a bundle .json path) and "model" (a zoo name)',
                          "keep one of the two keys")
        strategy = s.get_path("strategy", bases, what="strategy file")
        graph = s.get_path("graph", bases, default=None, what="graph bundle")
        model = s.get("model", str, default=None, check=lambda v: bool(v.strip()), must="be non-empty")
        if model is not None and check_model is not None:
            try:
                check_model(model, None)
            except ValueError as err:
                raise s.error("model", str(err), "use a zoo model name") from None
        return StrategyEntry(name, field, strategy, graph, model)
    except InputError as e:
        return StrategyEntry(_entry_name(s, i), field, error=e)


def _activate_overheads(r: FieldReader, bases: List[str]) -> Optional[str]:
    """An activate config's `overheads`: MEASURE, a runtime-overheads file (absolute), or None."""
    if r.data.get("overheads") == MEASURE:
        return MEASURE
    try:
        return r.get_path("overheads", bases, default=None, what="runtime-overheads file")
    except InputError as err:
        raise InputError(err.source, err.field, err.problem,
                         f'{err.fix}; or write "{MEASURE}" to measure them on the cluster first') from None


def load_activate_config(path: Union[str, os.PathLike], strict: bool = True,
                         workdir: Optional[str] = None, check_model: Optional[ModelCheck] = None) -> ActivateConfig:
    """Reads activate_config.txt. Problems of the file as a whole always raise. Problems of one
    strategy or baseline entry raise when strict (as activate.py reads it: a bad entry stops the
    run before any work); otherwise they are kept for `validate_entries`, which lists them all."""
    r = FieldReader.from_file(path, expected_format=ACTIVATE_FORMAT)
    bases = [os.path.dirname(os.path.abspath(r.source)), bundled_root()]
    r.expect_keys(("cluster", "strategies", "baselines", "graphs", "steps", "warmup_steps", "rounds",
                   "output_dir", "trace", "overheads", "profile"))
    cluster = r.get_path("cluster", bases, default=None, what="cluster file") or \
        os.path.join(bundled_root(), "clusters", "local_cpu.json")
    load_cluster(cluster)
    strategies = tuple(_strategy_entry(s, i, bases, check_model) for i, s in enumerate(r.items("strategies", default_empty=True)))
    baselines = tuple(r.strings("baselines", default=[]))
    graphs = _graph_entries(r, "graphs", bases, min_len=0, check_model=check_model)
    if not strategies and not baselines:
        raise r.error("strategies", "nothing to run: no strategies and no baselines",
                      'list strategy entries and/or "baselines"')
    if baselines and not strategies and not graphs:
        raise r.error("baselines", "no graph to run the baselines on",
                      'add a strategy entry or a "graphs" entry ({"model": ..., "batch_size": ...})')
    config = ActivateConfig(
        cluster=cluster, strategies=strategies, baselines=baselines, graphs=graphs,
        output_dir=_output_dir(r, workdir),
        steps=r.get("steps", int, default=ActivateConfig.steps, **_pos),
        warmup_steps=r.get("warmup_steps", int, default=ActivateConfig.warmup_steps, **_non_neg),
        rounds=r.get("rounds", int, default=ActivateConfig.rounds, **_pos),
        trace=r.get("trace", bool, default=ActivateConfig.trace),
        overheads=_activate_overheads(r, bases),
        profile=r.get("profile", str, default=ActivateConfig.profile, check=lambda v: v in ACTIVATE_PROFILES,
                      must=f"be one of {', '.join(ACTIVATE_PROFILES)}",
                      fix='write "measure" to profile each graph on the cluster, or leave the key out'),
        source=r.source)
    check_unique_names(config)  # always: a shared name would mix two entries' results
    if strict:
        for _, error in validate_entries(config):
            if error is not None:
                raise error
    return config


def check_unique_names(config: ActivateConfig) -> None:
    """Raises InputError naming both entries' fields when two entries share a name: strategy
    entries and baselines name their results rows and timeline files, and a run reports errors
    by name, so a shared name would fail (or drop) the other entry too."""
    first: Dict[str, str] = {}
    for name, field in ([(e.name, f"{e.field}.name") for e in config.strategies] +
                        [(b, f"baselines[{i}]") for i, b in enumerate(config.baselines)]):
        if name in first:
            raise InputError(config.source or "activate config", field,
                             f"entry name {name!r} is used twice (also by {first[name]})",
                             "give every strategy entry its own name (not a baseline's) and list each baseline once")
        first[name] = field


def validate_entries(config: ActivateConfig) -> List[Tuple[str, Optional[InputError]]]:
    """(entry name, problem or None) for every strategy entry, then every baseline, in file
    order; the names are unique (a shared one raises, `check_unique_names`). Strategy files are
    loaded and checked against the cluster's devices (the grouping check needs the graph and
    happens when the entry runs)."""
    src = config.source or "activate config"
    check_unique_names(config)  # names are unique below: callers may key results by name
    devices = load_cluster(config.cluster).device_names
    out: List[Tuple[str, Optional[InputError]]] = []
    for e in config.strategies:
        error = e.error
        if error is None:
            try:
                validate_strategy(load_strategy(e.strategy), None, devices)
            except InputError as err:
                error = err
        out.append((e.name, error))
    for i, name in enumerate(config.baselines):
        error = None
        if name not in BASELINES:
            close = difflib.get_close_matches(name, BASELINES, n=1)
            error = InputError(src, f"baselines[{i}]", f"unknown baseline {name!r}"
                               + (f" (did you mean {close[0]!r}?)" if close else ""), f"use one of {list(BASELINES)}")
        out.append((name, error))
    return out
