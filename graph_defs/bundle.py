"""The tfplace graph bundle: a training-step GraphDef plus a metadata JSON beside it.

A bundle is two files in one folder:

  <stem>.pb    binary `GraphDef` of one training step. Placeholders carry the concrete global
               batch size in their `shape` attr, and every node carries `_output_shapes`
               (shapes at that global batch). No op bakes the batch size in, so the graph can be
               re-shaped to another batch with `with_batch_size`.
  <stem>.json  metadata (keys in REQUIRED_FIELDS; see write_bundle). `graph_file` is relative
               to the JSON file.

This module is the contract with the graph IR (tfplace.ir.loader); keep the key names and
meanings stable and bump FORMAT_VERSION on any incompatible change.
"""

import copy
import json
import os

FORMAT_NAME = "tfplace.graph"
FORMAT_VERSION = 1
OPTIMIZERS = ("sgd", "momentum", "adam")
LOSS_REDUCTIONS = ("mean", "sum")

_INT = (int,)
_NUM = (int, float)
_OPT_INT = (int, type(None))

# field -> (accepted python types, hint on how to fix it when missing or wrong)
REQUIRED_FIELDS = {
    "format": ((str,), f"set it to '{FORMAT_NAME}'"),
    "version": (_INT, f"set it to {FORMAT_VERSION}"),
    "model": ((str,), "add the model name, e.g. 'vgg19'"),
    "graph_file": ((str,), "add the .pb file name, relative to the JSON"),
    "global_batch_size": (_INT, "add the global batch size the shapes were recorded at"),
    "image_size": (_OPT_INT, "add the image side in pixels, or null for non-image models"),
    "seq_len": (_OPT_INT, "add the sequence length in tokens, or null for non-sequence models"),
    "num_layers": (_OPT_INT, "add the layer count, or null where it does not apply"),
    "optimizer": ((str,), f"add one of {list(OPTIMIZERS)}"),
    "learning_rate": (_NUM, "add the learning rate, e.g. 0.01"),
    "inputs": ((list,), "add the list of input placeholders (name, dtype, shape, batch_axis)"),
    "sink": ((str,), "add the name of the train op"),
    "init_op": ((str,), "add the name of the variable initializer op"),
    "loss": ((str,), "add the name of the scalar loss tensor's op"),
    "loss_reduction": ((str,), f"add one of {list(LOSS_REDUCTIONS)}"),
    "op_count": (_INT, "add the number of nodes in the GraphDef"),
    "variable_count": (_INT, "add the number of model variables"),
    "param_count": (_INT, "add the number of model parameters (elements)"),
    "param_bytes": (_INT, "add the model parameter size in bytes"),
    "graph_bytes": (_INT, "add the size of the .pb file in bytes"),
    "tf_version": ((str,), "add the TensorFlow version that exported the graph"),
    "seed": (_INT, "add the graph-level random seed"),
}
INPUT_FIELDS = {
    "name": ((str,), "add the placeholder op name"),
    "dtype": ((str,), "add the dtype name, e.g. 'float32'"),
    "shape": ((list,), "add the shape with -1 at the batch axis"),
    "batch_axis": (_INT, "add the axis that holds the batch (usually 0)"),
}


def _fail(path, field, problem, fix):
    raise ValueError(f"{os.path.basename(path)}: field '{field}': {problem}; {fix}")


def _check_fields(path, obj, fields, prefix=""):
    for key, (types, fix) in fields.items():
        name = prefix + key
        if key not in obj:
            _fail(path, name, "missing", fix)
        value = obj[key]
        # bool is an int subclass in Python; it is never a valid count or size here.
        if isinstance(value, bool) or not isinstance(value, types):
            _fail(path, name, f"has type {type(value).__name__} (value {value!r})", fix)


def validate_meta(meta, path="<meta>"):
    """Checks a metadata dict; raises ValueError naming the file, the field and the fix."""
    if not isinstance(meta, dict):
        raise ValueError(f"{os.path.basename(path)}: top level is not a JSON object; "
                         "re-export the bundle")
    _check_fields(path, meta, REQUIRED_FIELDS)
    if meta["format"] != FORMAT_NAME:
        _fail(path, "format", f"is {meta['format']!r}", f"set it to '{FORMAT_NAME}'")
    if meta["version"] != FORMAT_VERSION:
        _fail(path, "version", f"is {meta['version']}, this reader knows {FORMAT_VERSION}",
              "re-export the bundle with this version of tfplace")
    if meta["global_batch_size"] <= 0:
        _fail(path, "global_batch_size", f"is {meta['global_batch_size']}", "use a positive size")
    if meta["optimizer"] not in OPTIMIZERS:
        _fail(path, "optimizer", f"is {meta['optimizer']!r}", f"use one of {list(OPTIMIZERS)}")
    if meta["loss_reduction"] not in LOSS_REDUCTIONS:
        _fail(path, "loss_reduction", f"is {meta['loss_reduction']!r}",
              f"use one of {list(LOSS_REDUCTIONS)}")
    if not meta["inputs"]:
        _fail(path, "inputs", "is empty", "list at least one input placeholder")
    for i, inp in enumerate(meta["inputs"]):
        prefix = f"inputs[{i}]."
        if not isinstance(inp, dict):
            _fail(path, f"inputs[{i}]", "is not an object", "use {name, dtype, shape, batch_axis}")
        _check_fields(path, inp, INPUT_FIELDS, prefix)
        shape, axis = inp["shape"], inp["batch_axis"]
        if not 0 <= axis < len(shape) or shape[axis] != -1:
            _fail(path, prefix + "batch_axis", f"is {axis} for shape {shape}",
                  "point it at the -1 (batch) entry of the shape")
        if "max_value" in inp and not isinstance(inp["max_value"], int):
            _fail(path, prefix + "max_value", f"is {inp['max_value']!r}",
                  "use the exclusive upper bound of valid integer values")
    return meta


def bundle_paths(out_dir, stem):
    """Returns (graph_path, meta_path) for a bundle stem in out_dir."""
    return os.path.join(out_dir, stem + ".pb"), os.path.join(out_dir, stem + ".json")


def write_bundle(out_dir, stem, graph_def, meta):
    """Writes <out_dir>/<stem>.pb and <stem>.json; fills graph_file/graph_bytes/op_count.

    Args:
      out_dir: folder, created if missing.
      stem: file name stem, e.g. 'resnet50_b64_s224_sgd'.
      graph_def: tf.compat.v1.GraphDef, already shaped at meta['global_batch_size'].
      meta: dict with the REQUIRED_FIELDS (graph_file, graph_bytes and op_count may be left out).
    Returns:
      The path of the JSON file.
    """
    os.makedirs(out_dir, exist_ok=True)
    graph_path, meta_path = bundle_paths(out_dir, stem)
    # Deterministic serialization keeps re-exports byte-identical (attr maps are sorted).
    data = graph_def.SerializeToString(deterministic=True)
    meta = dict(meta)
    meta.update(graph_file=os.path.basename(graph_path), graph_bytes=len(data),
                op_count=len(graph_def.node))
    ordered = {k: meta[k] for k in REQUIRED_FIELDS if k in meta}
    ordered.update({k: v for k, v in meta.items() if k not in ordered})
    validate_meta(ordered, meta_path)
    # Write to temporaries and rename, so a killed export never leaves a half-written bundle.
    for path, payload, mode in ((graph_path, data, "wb"),
                                (meta_path, json.dumps(ordered, indent=2) + "\n", "w")):
        tmp = f"{path}.tmp{os.getpid()}"  # per process: concurrent exporters don't collide
        with open(tmp, mode) as f:
            f.write(payload)
        os.replace(tmp, path)
    return meta_path


def read_meta(meta_path):
    """Reads and validates only the JSON (no TensorFlow import)."""
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{os.path.basename(meta_path)}: file not found at {meta_path}; "
                         "export it with `python -m tfplace.cli.export`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{os.path.basename(meta_path)}: not valid JSON ({e}); "
                         "re-export the bundle") from None
    return validate_meta(meta, meta_path)


def read_bundle(meta_path):
    """Loads a bundle. Returns (graph_def, meta_dict); raises ValueError on any inconsistency."""
    import tensorflow as tf  # Lazy: read_meta users need no TensorFlow.

    meta = read_meta(meta_path)
    name = os.path.basename(meta_path)
    graph_path = os.path.join(os.path.dirname(meta_path), meta["graph_file"])
    if not os.path.exists(graph_path):
        _fail(meta_path, "graph_file", f"{meta['graph_file']} does not exist",
              "re-export the bundle (python -m tfplace.cli.export)")
    with open(graph_path, "rb") as f:
        data = f.read()
    if len(data) != meta["graph_bytes"]:
        _fail(meta_path, "graph_bytes", f"is {meta['graph_bytes']} but the file has {len(data)}",
              "re-export the bundle; the .pb and .json are out of step")
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, a plain Exception subclass
        raise ValueError(f"{name}: {meta['graph_file']} is not a GraphDef ({e}); "
                         "re-export the bundle") from None
    nodes = {n.name: n for n in graph_def.node}
    for field in ("sink", "init_op", "loss"):
        if meta[field] not in nodes:
            _fail(meta_path, field, f"node {meta[field]!r} is not in {meta['graph_file']}",
                  "set it to the name of an existing node")
    for i, inp in enumerate(meta["inputs"]):
        node = nodes.get(inp["name"])
        if node is None or node.op != "Placeholder":
            _fail(meta_path, f"inputs[{i}].name", f"{inp['name']!r} is not a Placeholder",
                  "name an existing placeholder")
    return graph_def, meta


def with_batch_size(graph_def, inputs, batch_size, add_shapes=True):
    """Returns a copy of graph_def with every input placeholder set to `batch_size`.

    Args:
      graph_def: a bundle GraphDef.
      inputs: meta['inputs'] (each with name and batch_axis).
      batch_size: new global batch size (> 0).
      add_shapes: re-run shape inference and store `_output_shapes` at the new batch on every
        node (an empty list on ops without outputs).
    The stale `_output_shapes` are dropped first: TensorFlow's importer checks them against the
    inferred shapes and refuses a graph whose placeholder batch changed.
    """
    import tensorflow as tf

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    gd = copy.deepcopy(graph_def)
    by_name = {inp["name"]: inp for inp in inputs}
    for node in gd.node:
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
        if node.name in by_name:
            dims = node.attr["shape"].shape.dim
            dims[by_name[node.name]["batch_axis"]].size = batch_size
    if not add_shapes:
        return gd
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(gd, name="")
        shaped = graph.as_graph_def(add_shapes=True)
    # TF writes no attr for ops without outputs (NoOp, AssignVariableOp, ResourceApply*); an
    # empty list there lets readers rely on every node having `_output_shapes`.
    for node in shaped.node:
        if "_output_shapes" not in node.attr:
            node.attr["_output_shapes"].list.SetInParent()
    return shaped
