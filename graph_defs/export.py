"""Exports zoo models as tfplace graph bundles (see bundle.py for the format).

  python -m tfplace.cli.export --model resnet50 --batch-size 64 --optimizer momentum
  python -m tfplace.cli.export --all [--manifest]   # every model at its defaults, cached
  python -m tfplace.cli.export --tiny               # only the tiny test models

Bundle stems spell out the options that shape the graph:
  <model>[_<variant>]_b<batch>[_s<image px>][_t<seq len>][_n<layers>][_c<classes>]_<opt>
    [_lr<x>][_seed<k>]
The parts in brackets appear when they apply to the model (s/t/n) or differ from the default
(variant, classes, learning rate 0.01, seed 0); e.g. resnet50_b64_s224_sgd,
bert_large_b16_t128_n24_sgd, tiny_mlp_b16_sgd.

The command line is tfplace.cli.export.
"""

import contextlib
import hashlib
import json
import math
import os
import re
import time

from tfplace.formats.errors import INT32_OVERFLOW, InputError, size_overflow_problem
from tfplace.formats.config import SIZE_LIMIT

from . import bundle
from . import models
from .user_step import cache_root

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ZOO_DIR = os.path.join(PACKAGE_DIR, "zoo")  # the shipped (committed) bundles
# Installed, graph_defs/ is tfplace/graph_defs/, inside the tfplace package (an __init__.py above it);
# in a checkout it sits beside tfplace/ at the repository root (no __init__.py there).
INSTALLED = os.path.isfile(os.path.join(os.path.dirname(PACKAGE_DIR), "__init__.py"))
MANIFEST_PATH = os.path.join(PACKAGE_DIR, "manifest.json")
# Bundles whose .pb is at most this many bytes are committed; larger ones are generated.
COMMIT_LIMIT_BYTES = 3_000_000
DEFAULT_LR = 0.01


class OptionError(ValueError):
    """An option a model does not take (resolve_options), with what would fix it in `fix`."""

    def __init__(self, message, fix):
        super().__init__(message)
        self.fix = fix


def _check_int(field, value, minimum, model):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < SIZE_LIMIT:
        raise ValueError(f"{model}: {field} must be an integer >= {minimum} and below 2**31, got {value!r}")
    return value


def resolve_options(name, batch_size=None, *, image_size=None, seq_len=None, num_layers=None,
                    num_classes=None, variant=None, optimizer="sgd",
                    learning_rate=DEFAULT_LR, seed=0):
    """Validates options against the model and fills defaults.

    Returns (spec, cfg, opts) where opts is a dict of every resolved option (batch_size,
    image_size, seq_len, num_layers, num_classes, variant, optimizer, learning_rate, seed).
    Raises ValueError with the option, the bad value and what is accepted (an OptionError, whose
    `fix` says what to give, for a size outside the model's range: images under its
    min_image_size pixels, sequences over its max_seq_len tokens).
    """
    spec = models.get_spec(name)
    batch_size = spec.default_batch if batch_size is None else batch_size
    _check_int("batch_size", batch_size, 1, name)
    given = {"image_size": image_size, "seq_len": seq_len, "num_layers": num_layers,
             "num_classes": num_classes}
    for field, value in given.items():
        if value is not None and getattr(spec, field) is None:
            raise ValueError(f"{name}: option {field} does not apply to this model "
                             f"(a {spec.kind} model); leave it unset")
    if variant is not None and variant not in spec.variants:
        accepted = list(spec.variants) or "none"
        raise ValueError(f"{name}: unknown variant {variant!r}; accepted: {accepted}")
    variant = variant or (spec.variants[0] if spec.variants else None)
    if spec.image_size is not None and image_size is None:
        image_size = models.default_image_size(spec, variant)
    image_size = _check_int("image_size", image_size, 1, name)
    if image_size is not None and image_size < spec.min_image_size:
        raise OptionError(f"{name}: image_size must be >= {spec.min_image_size} pixels (the smallest image "
                          f"its layers take), got {image_size}",
                          f"give an image side of at least {spec.min_image_size} pixels")
    seq_len = _check_int("seq_len", spec.seq_len if seq_len is None else seq_len, 1, name)
    if seq_len is not None and spec.max_seq_len is not None and seq_len > spec.max_seq_len:
        raise OptionError(f"{name}: seq_len must be <= {spec.max_seq_len} tokens (its learned positions), "
                          f"got {seq_len}", f"give a sequence length of at most {spec.max_seq_len} tokens")
    num_layers = _check_int("num_layers", spec.num_layers if num_layers is None else num_layers,
                            1, name)
    num_classes = _check_int("num_classes",
                             spec.num_classes if num_classes is None else num_classes, 2, name)
    if optimizer not in bundle.OPTIMIZERS:
        raise ValueError(f"{name}: unknown optimizer {optimizer!r}; "
                         f"choose one of {list(bundle.OPTIMIZERS)}")
    if (isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float))
            or not math.isfinite(learning_rate) or learning_rate <= 0):
        raise ValueError(f"{name}: learning_rate must be a positive number, got {learning_rate!r}")
    _check_int("seed", seed, 0, name)
    cfg = models.ModelConfig(name, image_size, seq_len, num_layers, num_classes, variant)
    opts = dict(batch_size=batch_size, image_size=image_size, seq_len=seq_len,
                num_layers=num_layers, num_classes=num_classes, variant=variant,
                optimizer=optimizer, learning_rate=float(learning_rate), seed=seed)
    return spec, cfg, opts


def bundle_stem(spec, opts):
    """File stem for a bundle, e.g. 'resnet50_b64_s224_sgd' (rule in the module docstring)."""
    parts = [spec.name]
    if opts["variant"] is not None and opts["variant"] != spec.variants[0]:
        parts.append(opts["variant"])
    parts.append(f"b{opts['batch_size']}")
    for key, tag in (("image_size", "s"), ("seq_len", "t"), ("num_layers", "n")):
        if opts[key] is not None:
            parts.append(f"{tag}{opts[key]}")
    if opts["num_classes"] is not None and opts["num_classes"] != spec.num_classes:
        parts.append(f"c{opts['num_classes']}")
    parts.append(opts["optimizer"])
    if opts["learning_rate"] != DEFAULT_LR:
        parts.append(f"lr{opts['learning_rate']:g}")
    if opts["seed"]:
        parts.append(f"seed{opts['seed']}")
    return "_".join(parts)


def source_hash(spec):
    """Hash of the code that shapes this model's graph: bundle.py, the family module and the
    sibling modules it imports (`from .x import ...`), transitively. A change marks the
    bundle stale."""
    mdir = os.path.dirname(models.__file__)
    seen, todo = set(), [spec.family]
    while todo:  # transitive closure over sibling imports
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            with open(os.path.join(mdir, name + ".py")) as f:
                todo += re.findall(r"^from \.(\w+) import", f.read(), flags=re.M)
    h = hashlib.sha256()
    with open(bundle.__file__, "rb") as f:  # with_batch_size shapes every stored graph
        h.update(f.read())
    for name in sorted(seen):
        with open(os.path.join(mdir, name + ".py"), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def quiet_tf_warnings():
    """TensorFlow's Python warnings (deprecation notices of the tf.compat.v1 and Keras APIs a
    training step is built with) left out while the block runs; errors still show."""
    import tensorflow as tf
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        yield
    finally:
        logger.setLevel(level)


class SizeOverflowError(ValueError):
    """A batch size at which a size the training step computes overflows TensorFlow's int32 shape
    values. `problem` says so in words (for an InputError about the batch size)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.problem = size_overflow_problem(batch_size)
        super().__init__(f"batch_size {self.problem}; use a smaller batch size")


def export_model(name, batch_size=None, *, image_size=None, seq_len=None, num_layers=None,
                 num_classes=None, variant=None, optimizer="sgd", learning_rate=DEFAULT_LR,
                 seed=0, out_dir=None):
    """Builds the training step of `name` and writes its bundle into `out_dir` (None:
    export_dir()); returns the .json path.

    batch_size None means the model's default (64 for CNNs, 32 for the transformer, 16 for
    BERT/XLNet and the tiny models). Sizes are in pixels (image_size) and tokens (seq_len).
    """
    spec, cfg, opts = resolve_options(
        name, batch_size, image_size=image_size, seq_len=seq_len, num_layers=num_layers,
        num_classes=num_classes, variant=variant, optimizer=optimizer,
        learning_rate=learning_rate, seed=seed)
    start = time.time()
    import tensorflow as tf  # Deferred: option errors above come back without loading TF.

    from .models import _train

    build_fn = models.family_module(spec).build
    with quiet_tf_warnings():
        graph_def, info = _train.build_train_graph(build_fn, cfg, optimizer, opts["learning_rate"], seed)
    try:
        graph_def = bundle.with_batch_size(graph_def, info["inputs"], opts["batch_size"])
    except ValueError as err:
        if INT32_OVERFLOW not in str(err):
            raise
        raise SizeOverflowError(opts["batch_size"]) from None
    meta = {
        "format": bundle.FORMAT_NAME, "version": bundle.FORMAT_VERSION, "model": name,
        "global_batch_size": opts["batch_size"], "image_size": opts["image_size"],
        "seq_len": opts["seq_len"], "num_layers": opts["num_layers"],
        "optimizer": optimizer, "learning_rate": opts["learning_rate"],
        "inputs": info["inputs"], "sink": _train.SINK, "init_op": _train.INIT_OP,
        "loss": _train.LOSS, "loss_reduction": "mean",
        "variable_count": info["variable_count"], "param_count": info["param_count"],
        "param_bytes": info["param_bytes"], "tf_version": tf.__version__, "seed": seed,
        # Extra keys (not part of the required contract):
        "num_classes": opts["num_classes"], "variant": opts["variant"],
        "trainable_param_count": info["trainable_param_count"],
        "source_hash": source_hash(spec),
        "export_seconds": round(time.time() - start, 2),
    }
    return bundle.write_bundle(export_dir() if out_dir is None else out_dir, bundle_stem(spec, opts), graph_def, meta)


def bundle_is_current(meta_path, spec):
    """True when the bundle exists, validates, matches its .pb size and the current code."""
    try:
        meta = bundle.read_meta(meta_path)
    except ValueError:
        return False
    graph_path = os.path.join(os.path.dirname(meta_path), meta["graph_file"])
    return (os.path.exists(graph_path) and os.path.getsize(graph_path) == meta["graph_bytes"]
            and meta.get("source_hash") == source_hash(spec))


def export_dir(installed=INSTALLED):
    """Where zoo bundles are exported on demand: graph_defs/zoo/ in a checkout (git-ignored beside
    the committed ones); installed, ${TFPLACE_CACHE:-~/.cache/tfplace}/zoo, since the installed
    package folder may be read-only and is not ours to write into (pip owns it)."""
    return os.path.join(cache_root(), "zoo") if installed else ZOO_DIR


def _zoo_bundle(spec, stem, out_dir):
    """(meta path of a current bundle named `stem`, or None; the folder to export it into).
    out_dir None means the zoo: the shipped bundles (ZOO_DIR), then export_dir()."""
    if out_dir is None:
        shipped = bundle.bundle_paths(ZOO_DIR, stem)[1]
        if bundle_is_current(shipped, spec):
            return shipped, ZOO_DIR
        out_dir = export_dir()
    meta_path = bundle.bundle_paths(out_dir, stem)[1]
    return (meta_path if bundle_is_current(meta_path, spec) else None), out_dir


def ensure_bundle(model, *, out_dir=None, **opts):
    """Returns the .json path of `model`'s bundle with `opts`, exporting it only if missing or
    stale. out_dir None: the zoo (a shipped bundle, else one exported into export_dir()). opts are
    export_model's keyword options."""
    spec, _, resolved = resolve_options(model, **opts)
    meta_path, out_dir = _zoo_bundle(spec, bundle_stem(spec, resolved), out_dir)
    if meta_path:
        return meta_path
    return export_model(model, out_dir=out_dir, **opts)


#: A step role the import could not infer or find -> how a config's graph entry names it.
_ENTRY_ROLE_FIXES = {
    "train_op": 'name it with "train_ops": ["NAME"] (several to run them together)',
    "loss": 'name the scalar loss with "loss": "NAME", or give "loss_reduction": "mean" or "sum" to go without one',
    "loss_reduction": 'give "loss_reduction": "mean" or "sum"',
    "inputs": 'list the batched input placeholders with "inputs": ["NAME:BATCH_AXIS", ...]',
}


#: A step role -> the config graph entry's key that names it (its errors are named as that key).
_ENTRY_ROLE_KEYS = {"train_op": "train_ops", "loss": "loss", "loss_reduction": "loss_reduction", "inputs": "inputs"}


def bundle_for_entry(entry):
    """Bundle path for a config graph entry (`tfplace.formats.config.GraphEntry`): its `graph` path as
    given (a bare training step .pb/.pbtxt/.meta imported into a cached bundle at the entry's batch,
    roles inferred or named by the entry: graph_defs/user_step.py), or the zoo `model` exported on demand with the entry's
    sizes and optimizer."""
    if entry.graph is not None:
        from .user_step import import_step, is_step_file
        if not is_step_file(entry.graph):
            return entry.graph
        try:
            return import_step(entry.graph, batch_size=entry.batch_size, train_ops=entry.train_ops, loss=entry.loss,
                               loss_reduction=entry.loss_reduction, inputs=entry.inputs)
        except InputError as err:  # the fix names the entry's key, not the command line's flag
            fix = _ENTRY_ROLE_FIXES.get("inputs" if err.field.endswith(".attr.shape") else err.field)
            if fix is None:
                raise
            key = _ENTRY_ROLE_KEYS.get(err.field)
            if key and getattr(entry, key):  # a role the entry names (e.g. an op the step lacks): its own key
                raise InputError(entry.error_source, key, f"{err.problem} ({entry.graph})", fix) from None
            raise InputError(err.source, err.field, err.problem, f"{fix} in the config's graph entry") from None
    opts = {k: getattr(entry, k) for k in ("image_size", "seq_len", "num_layers") if getattr(entry, k) is not None}
    opts.update(batch_size=entry.batch_size, optimizer=entry.optimizer or "sgd")
    try:
        resolve_options(entry.model, **opts)  # before any export: a bad name is one clear error
    except ValueError as err:
        fix = getattr(err, "fix", "use a zoo model name and options that apply to it")
        raise InputError(entry.error_source, option_field(str(err), opts), str(err), fix) from None
    try:
        return ensure_bundle(entry.model, **opts)
    except SizeOverflowError as err:  # sizes the options take, but TensorFlow's int32 shapes do not
        raise InputError(entry.error_source, "batch_size", err.problem, "use a smaller batch size") from None


def option_field(message, given=()):
    """The option a resolve_options message is about ("image_size", ...): the first option of
    `given` (or of every option) the message names, else "model"."""
    for field in (*given, "batch_size", "image_size", "seq_len", "num_layers", "num_classes", "variant",
                  "optimizer", "learning_rate", "seed"):
        if re.search(rf"\b{field}\b", message):
            return field
    return "model"


def _human_bytes(n):
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def export_all(names, *, out_dir=None, force=False, log=print):
    """Exports each model at its defaults unless its bundle is current; returns meta paths.
    out_dir None: the zoo, as ensure_bundle."""
    paths = []
    for i, name in enumerate(names, 1):
        spec, _, opts = resolve_options(name)
        start = time.time()
        meta_path, _ = _zoo_bundle(spec, bundle_stem(spec, opts), out_dir)
        cached = not force and meta_path is not None
        if not cached:
            meta_path = export_model(name, out_dir=out_dir)
        meta = bundle.read_meta(meta_path)
        status = "cached  " if cached else "exported"
        log(f"[{i}/{len(names)}] {bundle_stem(spec, opts):32s} {status} "
            f"{time.time() - start:7.1f}s  ops={meta['op_count']:<6d} "
            f"params={meta['param_count'] / 1e6:8.2f}M  {_human_bytes(meta['graph_bytes'])}")
        paths.append(meta_path)
    return paths


def write_manifest(meta_paths, manifest_path=MANIFEST_PATH, zoo_dir=ZOO_DIR):
    """Merges the bundles' summaries into manifest.json and rewrites zoo/.gitignore so that
    bundles over COMMIT_LIMIT_BYTES are generated, not committed."""
    entries = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            entries = {e["model"]: e for e in json.load(f)["models"]}
    for path in meta_paths:
        meta = bundle.read_meta(path)
        entries[meta["model"]] = {
            "model": meta["model"], "stem": os.path.splitext(meta["graph_file"])[0],
            "op_count": meta["op_count"], "variable_count": meta["variable_count"],
            "param_count": meta["param_count"], "param_bytes": meta["param_bytes"],
            "graph_bytes": meta["graph_bytes"], "export_seconds": meta.get("export_seconds"),
            "committed": meta["graph_bytes"] <= COMMIT_LIMIT_BYTES}
    order = models.model_names()
    rows = [entries[n] for n in order if n in entries]
    with open(manifest_path, "w") as f:
        json.dump({"format": "tfplace.zoo_manifest", "commit_limit_bytes": COMMIT_LIMIT_BYTES,
                   "models": rows}, f, indent=2)
        f.write("\n")
    lines = ["# Written by `python -m tfplace.cli.export --all --manifest`.",
             "# Bundles are ignored unless listed below as committed (.pb <= "
             f"{COMMIT_LIMIT_BYTES} bytes);", "# the rest are generated on demand by "
             "`export --all` or ensure_bundle().", "*.pb", "*.json", "*.tmp*"]
    lines += [f"!{r['stem']}{ext}" for r in rows if r["committed"] for ext in (".pb", ".json")]
    lines += [f"# generated: {r['stem']} ({_human_bytes(r['graph_bytes'])})"
              for r in rows if not r["committed"]]
    os.makedirs(zoo_dir, exist_ok=True)
    with open(os.path.join(zoo_dir, ".gitignore"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return manifest_path
