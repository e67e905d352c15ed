"""One Horovod rank of the data-parallel baseline (started by horovod_runner with Horovod's Gloo
controller; `python -m tfplace.baselines.horovod_worker --config cfg.json`).

What runs is the model's original single-device training step, the exported bundle GraphDef,
unchanged except for the gradient path (tf.compat.v1 graph mode):

  1. the placeholders' batch dimension is made unknown (each rank feeds its own batch size);
  2. the optimizer's dense update ops (ResourceApply*: SGD, Momentum, Adam, ...) are taken out of
     the GraphDef before import; everything else (forward, backward, batch-norm statistic
     updates, the sink) is imported as it is;
  3. each removed update is re-created with the same type and attributes, its gradient input
     replaced by   hvd.allreduce(grad · n_r·N/Σn, op=Average)   = Σ_r n_r·grad_r / Σn,
     the gradient of the mean loss over the global batch (HetSeq's sample-weighted gradients:
     the graph's loss is a mean over the rank's n_r samples, so one step equals the step of a
     single device on the concatenated global batch, for even and uneven batches alike);
  4. after the graph's init op, every variable is broadcast from rank 0.
The train op is a group of the new updates and the original sink. Sparse updates
(ResourceScatter*/ResourceSparseApply*) are not supported: the worker exits with a message.

Why this route rather than hvd.DistributedOptimizer on rebuilt Keras code: the bundle is the
graph that tfplace places, so the baseline and the placed strategies train the same ops, and the
worker needs neither the zoo builders nor their Python dependencies.

Data: step i's global batch is drawn from numpy's default_rng(seed + i) (`global_batch`); rank r
feeds rows [Σ_{q<r} n_q, Σ_{q<=r} n_q) of it. `reference_training` runs the unmodified graph on
the whole global batch, for the equivalence test.

Emulation: the runner starts rank r pinned and in its CPU quota (config["emulation_per_rank"][r],
a cluster file's device emulation). Before TensorFlow starts, the rank reads its affinity and
its cgroup's quota back from the kernel and exits with a message when they are not the config's.

Launcher: the rank ends (exit status 1) once the process that started it (config["parent_pid"])
is gone, removing config["orphan_cleanup_dir"] (the runner's temporary folder) first.

Output (in config["out_dir"]): rank_<r>.json with step_times_s (wall time of each timed
sess.run of the train op), losses, the batch sizes, thread limits and the limits the kernel
applies to the rank (cpus, cgroup, quota_us, period_us); with dump_variables, rank 0 also
writes variables.npz (every variable after the last step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from typing import Dict, List, Sequence

import numpy as np

_GRAD_ARGS = ("grad", "delta")
_UNSUPPORTED_PREFIXES = ("ResourceSparseApply", "ResourceScatter")


def read_bundle(meta_path: str):
    """(meta dict, GraphDef) of a bundle .json."""
    from tensorflow.core.framework import graph_pb2
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    graph_def = graph_pb2.GraphDef()
    with open(os.path.join(os.path.dirname(os.path.abspath(meta_path)), meta["graph_file"]), "rb") as f:
        graph_def.ParseFromString(f.read())
    return meta, graph_def


def free_batch_dimension(graph_def, meta) -> None:
    """Placeholders' batch axis -> unknown; recorded output shapes dropped (they hold the old batch)."""
    axes = {spec["name"]: spec.get("batch_axis", 0) for spec in meta["inputs"]}
    for node in graph_def.node:
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
        if node.name in axes and "shape" in node.attr:
            dims = node.attr["shape"].shape.dim
            if len(dims) > axes[node.name]:
                dims[axes[node.name]].size = -1


def global_batch(meta, step: int, batch_size: int, seed: int) -> Dict[str, np.ndarray]:
    """Input name -> array for step `step` of a `batch_size` global batch (deterministic)."""
    rng = np.random.default_rng(seed + step)
    out = {}
    for spec in meta["inputs"]:
        shape = [batch_size if i == spec.get("batch_axis", 0) else d for i, d in enumerate(spec["shape"])]
        if spec["dtype"].startswith("int"):
            high = int(spec.get("max_value", 2))
            out[spec["name"]] = rng.integers(0, high, size=shape).astype(spec["dtype"])
        else:
            out[spec["name"]] = rng.standard_normal(shape).astype(spec["dtype"])
    return out


def rank_slice(batch: Dict[str, np.ndarray], meta, lo: int, hi: int) -> Dict[str, np.ndarray]:
    axes = {spec["name"]: spec.get("batch_axis", 0) for spec in meta["inputs"]}
    return {name: np.take(arr, np.arange(lo, hi), axis=axes[name]) for name, arr in batch.items()}


def _split_updates(graph_def):
    """Removes the dense update ops; returns their NodeDefs. Control inputs on them are dropped."""
    removed = [n for n in graph_def.node if n.op.startswith("ResourceApply")]
    bad = [n for n in graph_def.node if n.op.startswith(_UNSUPPORTED_PREFIXES)]
    if bad:
        raise SystemExit(f"horovod baseline: sparse update op {bad[0].name} ({bad[0].op}) is not supported; "
                         "use a model with dense gradients")
    if not removed:
        raise SystemExit("horovod baseline: no ResourceApply* update op in the graph")
    names = {n.name for n in removed}
    kept = [n for n in graph_def.node if n.name not in names]
    for n in kept:
        inputs = [i for i in n.input if not (i.startswith("^") and i[1:] in names)]
        del n.input[:]
        n.input.extend(inputs)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    return removed


def _tensor(graph, name: str):
    return graph.get_tensor_by_name(name if ":" in name else name + ":0")


def build_step(meta, graph_def, scale: float, allreduce):
    """Imports the step and re-creates the updates with gradients through `allreduce(grad*scale)`.
    Returns (graph, train_op, loss tensor, variable handles)."""
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    removed = _split_updates(graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        updates = []
        for node in removed:
            arg_names = [a.name for a in op_def_registry.get(node.op).input_arg]
            inputs = [_tensor(graph, i) for i in node.input if not i.startswith("^")]
            k = next(i for i, a in enumerate(arg_names) if a in _GRAD_ARGS)
            inputs[k] = allreduce(inputs[k] * tf.constant(scale, inputs[k].dtype))
            updates.append(graph.create_op(node.op, inputs, [], attrs=dict(node.attr), name=node.name))
        train_op = tf.group(*updates, graph.get_operation_by_name(meta["sink"]), name="hvd_train_op")
        handles = [op.outputs[0] for op in graph.get_operations() if op.type == "VarHandleOp"]
    return graph, train_op, _tensor(graph, meta["loss"]), handles


def _read_all(sess, handles):
    import tensorflow as tf
    with sess.graph.as_default():
        reads = [tf.raw_ops.ReadVariableOp(resource=h, dtype=h.op.get_attr("dtype")) for h in handles]
    return {h.op.name: v for h, v in zip(handles, sess.run(reads))}


def reference_training(meta_path: str, steps: int, batch_size: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Runs the unmodified step `steps` times on the global batches; returns the variables."""
    import tensorflow as tf
    meta, graph_def = read_bundle(meta_path)
    free_batch_dimension(graph_def, meta)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        handles = [op.outputs[0] for op in graph.get_operations() if op.type == "VarHandleOp"]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(meta["init_op"])
        for step in range(steps):
            feed = {f"{k}:0": v for k, v in global_batch(meta, step, batch_size, seed).items()}
            sess.run(meta["sink"], feed_dict=feed)
        return _read_all(sess, handles)


def _broadcast_op(graph, handles, hvd):
    import tensorflow as tf
    with graph.as_default():
        ops = []
        for h in handles:
            value = tf.raw_ops.ReadVariableOp(resource=h, dtype=h.op.get_attr("dtype"))
            ops.append(tf.raw_ops.AssignVariableOp(resource=h, value=hvd.broadcast(value, 0)))
        return tf.group(*ops)


def check_limits(expected, rank: int) -> dict:
    """The affinity and CPU quota this process runs under (tfplace.emulation.tasks.process_limits)
    and its network namespace and interfaces, as a dict; exits when the limits differ from
    `expected` (a device's emulation JSON, or None)."""
    import dataclasses
    from tfplace.emulation.tasks import process_limits
    limits = process_limits(os.getpid())
    if expected:
        cpus = expected.get("cpus")
        if cpus is not None and tuple(sorted(cpus)) != limits.cpus:
            raise SystemExit(f"horovod baseline: rank {rank} runs on cores {list(limits.cpus)}, not {cpus}")
        fraction = expected.get("cpu_fraction")
        if fraction is not None and (limits.cpu_fraction is None or abs(limits.cpu_fraction - fraction) > 1e-6):
            raise SystemExit(f"horovod baseline: rank {rank} runs under CPU share {limits.cpu_fraction} "
                             f"({limits.cgroup}), not {fraction}")
    from tfplace.runtime.netns import interfaces
    # where the rank's traffic goes: its network namespace and interfaces (an emulated host's, or the run's)
    return dict(dataclasses.asdict(limits), net_namespace=os.readlink("/proc/self/ns/net"),
                interfaces=interfaces())


def run_rank(config: dict) -> None:
    emulation = config.get("emulation_per_rank")
    rank_env = int(os.environ.get("HOROVOD_RANK", "0"))
    limits = check_limits(emulation[rank_env] if emulation else None, rank_env)  # before TensorFlow starts
    import horovod.tensorflow as hvd
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    batches: List[int] = [int(b) for b in config["batch_per_rank"]]
    if len(batches) != size:
        raise SystemExit(f"horovod baseline: {len(batches)} batch sizes for {size} ranks")
    total = sum(batches)
    meta, graph_def = read_bundle(config["bundle"])
    free_batch_dimension(graph_def, meta)
    # Then Average over ranks gives Σ n_r g_r / Σ n. sample_weighted=False is the naive average
    # (a negative control for the tests: wrong whenever the batches are uneven).
    scale = batches[rank] * size / total if config.get("sample_weighted", True) else 1.0
    graph, train_op, loss, handles = build_step(meta, graph_def, scale,
                                                lambda g: hvd.allreduce(g, op=hvd.Average))
    broadcast = _broadcast_op(graph, handles, hvd)
    threads = config.get("threads_per_rank")
    proto = tf.compat.v1.ConfigProto()
    if threads:
        proto.intra_op_parallelism_threads, proto.inter_op_parallelism_threads = threads[rank]
    lo = sum(batches[:rank])
    warmup, steps, seed = int(config["warmup_steps"]), int(config["steps"]), int(config.get("seed", 0))
    times, losses = [], []
    with tf.compat.v1.Session(graph=graph, config=proto) as sess:
        sess.run(meta["init_op"])
        sess.run(broadcast)
        for step in range(warmup + steps):
            part = rank_slice(global_batch(meta, step, total, seed), meta, lo, lo + batches[rank])
            feed = {f"{k}:0": v for k, v in part.items()}
            t0 = time.perf_counter()
            _, value = sess.run([train_op, loss], feed_dict=feed)
            dt = time.perf_counter() - t0
            if step >= warmup:
                times.append(dt)
            losses.append(float(value))
        variables = _read_all(sess, handles) if config.get("dump_variables") and rank == 0 else None
    out_dir = config["out_dir"]
    if variables is not None:
        np.savez(os.path.join(out_dir, "variables.npz"), **{k.replace("/", "__"): v for k, v in variables.items()})
    result = {"rank": rank, "size": size, "batch_per_rank": batches, "warmup_steps": warmup, "steps": steps,
              "step_times_s": times, "losses": losses, "threads": threads[rank] if threads else None,
              "limits": limits}
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def exit_with_launcher(parent_pid: int, orphan_dir: str = "") -> threading.Thread:
    """Starts a daemon thread that ends this rank (exit status 1) once its launcher (`parent_pid`)
    is gone, removing `orphan_dir` (the launcher's temporary folder) first: a SIGKILLed launcher
    cannot stop its ranks or remove its folder, and the ranks would train on to the end."""
    from tfplace.runtime.worker import PARENT_POLL_S, parent_alive

    def watch() -> None:
        while parent_alive(parent_pid):
            time.sleep(PARENT_POLL_S)
        if orphan_dir:
            shutil.rmtree(orphan_dir, ignore_errors=True)
        os._exit(1)
    thread = threading.Thread(target=watch, name="launcher-watch", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="JSON written by horovod_runner")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    exit_with_launcher(int(config.get("parent_pid", 0)), config.get("orphan_cleanup_dir", ""))
    run_rank(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
