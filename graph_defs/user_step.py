"""Turns a user's bare training step (GraphDef .pb/.pbtxt or MetaGraphDef .meta) into a bundle.

    import_step("step.pb")                                  # every role inferred
    import_step("gan.meta", train_ops=["d_train"], loss="d_loss", batch_size=64)

The roles the graph does not name are inferred by tfplace.ir.step_roles (train op, loss, inputs
with batch axes, init op); the step is then loaded once by tfplace.ir.loader (which checks it and
finds the loss reduction and the variables), pruned to the train op, loss and init op, shaped at
the batch size, and written with `bundle.write_bundle`. Every command that takes a graph reads
the result like a zoo bundle (the profiler, the runtime and Horovod need its init op and inputs).

Bundles are cached in `cache_dir()` under `<file stem>_<hash>`, the hash covering the file's bytes
and the options, so a second command on the same file reuses the bundle. Metadata: `model` is the
file stem; `optimizer` is sgd/momentum/adam when the update ops say so, else "sgd" with `variant`
naming the update op type (e.g. ResourceApplyRMSProp); `learning_rate` is the constant rate, 0.0
when the rate is not a constant.
"""

import hashlib
import json
import os
import time

from tfplace.formats.errors import InputError
from tfplace.formats.files import STEP_SUFFIXES

from . import bundle

CACHE_ENV = "TFPLACE_CACHE_DIR"
ROOT_CACHE_ENV = "TFPLACE_CACHE"  # tfplace's whole cache (scripts/setup_env.sh, the Grappler plugin)


def cache_root():
    """tfplace's cache folder for this user: $TFPLACE_CACHE, else ~/.cache/tfplace."""
    return os.environ.get(ROOT_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tfplace")


def cache_dir():
    """Folder of imported bundles: $TFPLACE_CACHE_DIR, else $TFPLACE_CACHE/steps, else
    ~/.cache/tfplace/steps."""
    return os.environ.get(CACHE_ENV) or os.path.join(cache_root(), "steps")


def is_step_file(path):
    """True for a path that names a bare step by its suffix (.pb, .pbtxt, .meta)."""
    return str(path).endswith(STEP_SUFFIXES)


def step_name(path):
    """The name a bare step's file gives its graph (a strategy's "graph" field): the file name
    without its suffix, or "step"."""
    return os.path.basename(path).rsplit(".", 1)[0] or "step"


def _stem(path, options):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    h.update(json.dumps(options, sort_keys=True).encode())
    return f"{step_name(path)}_{h.hexdigest()[:12]}"


def import_step(path, *, train_ops=None, loss=None, loss_reduction=None, inputs=None, batch_size=None,
                out_dir=None):
    """Bundle .json path of the step in `path`, written into `out_dir` (default cache_dir()) unless
    a bundle of the same file and options is there. Options as in tfplace.ir.loader.load_op_graph
    (`train_ops` is its `sinks`; `inputs`: "name" or "name:batch_axis" each). Raises InputError
    naming `path`, the role and the flag to pass when a role is missing or ambiguous."""
    from tfplace.formats.files import require_regular_file

    path = os.fspath(path)
    require_regular_file(path, field="")
    options = {"train_ops": list(train_ops or []), "loss": loss, "loss_reduction": loss_reduction,
               "inputs": list(inputs or []), "batch_size": batch_size, "format": bundle.FORMAT_VERSION}
    out_dir = out_dir or cache_dir()
    meta_path = bundle.bundle_paths(out_dir, _stem(path, options))[1]
    if os.path.exists(meta_path):
        try:
            bundle.read_meta(meta_path)
            return meta_path
        except ValueError:
            pass  # a damaged cache entry is rewritten
    return _write(path, options, out_dir, meta_path)


def _write(path, options, out_dir, meta_path):
    from tfplace.ir import loader

    graph_def, meta, src = loader.read_graph_source(path, None)
    stem = os.path.basename(meta_path)[:-len(".json")]
    return write_step(graph_def, out_dir, stem, model=step_name(path), src=src,
                      hints=meta.get("hints"), **{k: v for k, v in options.items() if k != "format"})


def write_step(graph_def, out_dir, stem, *, model, src, hints=None, train_ops=None, loss=None, loss_reduction=None,
               inputs=None, batch_size=None, max_values=None, seed=0):
    """Writes the bundle `<out_dir>/<stem>.json` of the step in `graph_def` (roles as in
    `import_step`; `hints` from a MetaGraphDef, see step_roles.infer_step) and returns its path.
    max_values: {input name: exclusive bound} for integer inputs the runtime feeds at random."""
    start = time.time()
    import tensorflow as tf

    from tfplace.ir import loader, step_roles

    roles = step_roles.infer_step(graph_def, train_ops=train_ops or None, loss=loss, inputs=inputs or None,
                                  loss_reduction=loss_reduction, hints=hints, src=src)
    if roles.loss is None:
        raise InputError(src, "loss", "a bundle needs the loss, and none was found",
                         "name the scalar loss with --loss NAME (Python: loss=)")
    if roles.init_op is None:
        raise InputError(src, "init_op", "some variable of the step has no initializer in the graph",
                         "export the graph after tf.compat.v1.global_variables_initializer(), or as a "
                         ".meta (tf.compat.v1.train.export_meta_graph)")
    graph_def, sink = step_roles.add_role_ops(graph_def, roles)
    specs = [f"{s['name']}:{s['batch_axis']}" for s in roles.inputs]
    graph = loader.load_op_graph(graph_def, sinks=[sink], loss=roles.loss, loss_reduction=loss_reduction,
                                 inputs=specs, batch_size=batch_size, source=src)
    keep = [sink, roles.init_op, roles.loss.split(":")[0]]
    graph_def = _subgraph(graph_def, keep)
    graph_def = bundle.with_batch_size(graph_def, list(roles.inputs), graph.reference_batch_size)
    model_vars = [v for v in graph.variables if not v.is_slot]
    known = roles.optimizer in bundle.OPTIMIZERS
    max_values = max_values or {}
    meta = {
        "format": bundle.FORMAT_NAME, "version": bundle.FORMAT_VERSION, "model": model,
        "global_batch_size": graph.reference_batch_size, "image_size": None, "seq_len": None, "num_layers": None,
        "optimizer": roles.optimizer if known else "sgd", "learning_rate": roles.learning_rate or 0.0,
        "inputs": [dict(s, **({"max_value": int(max_values[s["name"]])} if s["name"] in max_values else {}))
                   for s in roles.inputs],
        "sink": sink, "init_op": roles.init_op, "loss": roles.loss,
        "loss_reduction": graph.loss_reduction, "variable_count": len(model_vars),
        "param_count": sum(_elements(v.shape) for v in model_vars),
        "param_bytes": sum(int(v.num_bytes) for v in model_vars), "tf_version": tf.__version__, "seed": seed,
        "trainable_param_count": sum(_elements(v.shape) for v in model_vars if v.trainable),
        "export_seconds": round(time.time() - start, 2),
    }
    if not known:
        meta["variant"] = roles.optimizer
    return bundle.write_bundle(out_dir, stem, graph_def, meta)


def _subgraph(graph_def, keep):
    """A copy of `graph_def` with only the nodes `keep` (op names) need through data and control
    inputs, in their order; what tf.compat.v1.graph_util.extract_sub_graph does, without its
    deprecation warning on every import."""
    by_name = {n.name: n for n in graph_def.node}
    needed, todo = set(), list(keep)
    while todo:
        name = todo.pop()
        if name in needed or name not in by_name:
            continue
        needed.add(name)
        todo.extend(x.lstrip("^").split(":")[0] for x in by_name[name].input)
    out = type(graph_def)()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(n for n in graph_def.node if n.name in needed)
    return out


def _elements(shape):
    n = 1
    for d in shape:
        n *= max(int(d), 1)
    return n
