"""Running rewritten steps on a TF cluster: init once, warm-up, timed steps, a
FULL_TRACE Chrome timeline; and the single-device reference the equivalence tests compare with.

    with LocalCluster(num_tasks=3) as lc:
        runner = StepRunner(lc, rewrite_step(graph, strategy, cluster))
        runner.initialize()
        loss = runner.step(feed)                       # one step on the global batch
        times_s, trace = runner.timed(steps=10, warmup=2, feed=feed)

Feeds: the runtime feeds every input placeholder of the *original* graph with the global batch
(`random_feed`); the rewritten graph slices it per replica (see tfplace.rewrite.graph_rewrite).
Every `session.run` goes through `LocalCluster.run` when a LocalCluster is given, so a dead
worker raises WorkerDiedError within a fraction of a second instead of hanging.
"""

from __future__ import annotations

import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfplace.ir.graph_ir import OpGraph


def random_feed(inputs, batch_size: int, seed: int) -> Dict[str, np.ndarray]:
    """Global-batch values for each InputSpec (floats ~ N(0,1); ints in [0, max_value))."""
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in inputs:
        shape = [batch_size if (i == spec.batch_axis or d < 0) else d for i, d in enumerate(spec.shape)]
        if spec.dtype.startswith("int"):
            feed[spec.tensor] = rng.integers(0, spec.max_value or 4, size=shape).astype(spec.dtype)
        else:
            feed[spec.tensor] = rng.standard_normal(shape).astype(spec.dtype)
    return feed


def check_runnable(step) -> None:
    """Raises InputError when `step` (a RewrittenStep) cannot run without the script that made it:
    a placeholder that is not a batch input and has no default (a keep_prob, a learning rate: a
    run without the script's feeds, as activate's or plan --confirm_real's, cannot know its
    value), or reference variables (VariableV2: the rewrite reads variables as resources)."""
    from tfplace.formats.errors import InputError
    from tfplace.ir.roles import REFERENCE_VARIABLE_OPS, RESOURCE_VARIABLES_FIX
    from tfplace.ir.step_roles import unfed_placeholders_error
    source = step.source or "training step"
    required = [name[:-len(":0")] for name, must in step.feeds.items() if must]
    if required:
        raise unfed_placeholders_error(source, required)
    refs = sorted({n.name.split("/replica_")[0] for n in step.graph_def.node if n.op in REFERENCE_VARIABLE_OPS})
    if refs:
        raise InputError(source, "variables", f"{len(refs)} reference variables (VariableV2, e.g. {refs[0]!r}); a "
                         "rewritten step reads its variables as resources",
                         RESOURCE_VARIABLES_FIX + " and export again")


def step_session_config(config=None, cluster=None):
    """The ConfigProto a rewritten step must run under: Grappler's meta optimizer off.

    The rewrite is the graph optimisation; its priority chains encode a schedule
    across devices that Grappler does not know about. With Grappler on, the rewritten ResNet-50
    step deadlocked with every worker idle although the emitted graph is acyclic even with every
    collective's participants contracted into one node (checked); with the meta optimizer off it
    runs, and so it does with no chains at all. So Grappler's rewrite of the chained,
    partitioned graph (its passes merge, fold and re-wire nodes and control edges per partition)
    is what hangs. The profiler measures with Grappler off too (ProfileOptions.grappler), so the
    simulator's per-op times describe the same graph the runtime executes.
    `config` (or the cluster's `session_config()`) is copied, not changed."""
    import tensorflow as tf
    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    elif cluster is not None and hasattr(cluster, "session_config"):
        out.CopyFrom(cluster.session_config())
    out.graph_options.rewrite_options.disable_meta_optimizer = True
    return out


def _import(graph_def):
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return g


class StepRunner:
    """One rewritten step in a session on a cluster (a LocalCluster, or a gRPC target string
    with a ConfigProto)."""

    def __init__(self, cluster, step, config=None, timeout_s: Optional[float] = 300.0):
        check_runnable(step)
        self.cluster, self.step_def, self.timeout_s = cluster, step, timeout_s
        self.graph = _import(step.graph_def)
        config = step_session_config(config, cluster)
        if hasattr(cluster, "session"):
            self.session = cluster.session(graph=self.graph, config=config)
        else:
            import tensorflow as tf
            self.session = tf.compat.v1.Session(cluster, graph=self.graph, config=config)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.session.close()

    def _run(self, fetches, feed=None, options=None, run_metadata=None):
        if hasattr(self.cluster, "run"):
            return self.cluster.run(self.session, fetches, feed_dict=feed, options=options,
                                    run_metadata=run_metadata, timeout_s=self.timeout_s)
        return self.session.run(fetches, feed_dict=feed, options=options, run_metadata=run_metadata)

    def initialize(self) -> None:
        self._run(self.step_def.init_op)

    def step(self, feed: Mapping[str, np.ndarray]) -> Optional[float]:
        """Runs one training step; returns the global loss (None if the graph has none)."""
        fetches = [self.step_def.train_op] + ([self.step_def.loss] if self.step_def.loss else [])
        out = self._run(fetches, dict(feed))
        return float(out[1]) if self.step_def.loss else None

    def variables(self) -> Dict[str, List[np.ndarray]]:
        """Original variable name -> values of its mirrors (instance order)."""
        names = list(self.step_def.variables)
        values = self._run([list(self.step_def.variables[n]) for n in names])
        return dict(zip(names, values))

    def run_steps(self, steps: int, feed: Mapping[str, np.ndarray]) -> List[float]:
        """Runs `steps` training steps (train_op only, no trace); returns each one's wall seconds."""
        fetch = self.step_def.train_op
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self._run(fetch, dict(feed))
            times.append(time.perf_counter() - t0)
        return times

    def timed(self, steps: int, warmup: int, feed: Mapping[str, np.ndarray]) -> Tuple[List[float], str]:
        """(per-step wall seconds of `steps` timed steps after `warmup` ones, Chrome trace JSON
        of one extra FULL_TRACE step)."""
        self.run_steps(warmup, feed)
        times = self.run_steps(steps, feed)
        return times, self.traced_step(feed)

    def traced_step(self, feed: Mapping[str, np.ndarray]) -> str:
        """Runs one FULL_TRACE training step; returns its Chrome trace JSON."""
        from tensorflow.python.client import timeline
        return timeline.Timeline(self.traced_metadata(feed).step_stats).generate_chrome_trace_format()

    def traced_metadata(self, feed: Mapping[str, np.ndarray], partition_graphs: bool = False):
        """Runs one FULL_TRACE training step; returns its RunMetadata (step stats with allocation
        records; with `partition_graphs`, the graph each device ran, its _Send/_Recv pairs included)."""
        import tensorflow as tf
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                          output_partition_graphs=partition_graphs)
        meta = tf.compat.v1.RunMetadata()
        self._run(self.step_def.train_op, dict(feed), options=options, run_metadata=meta)
        return meta


def reference_run(graph: OpGraph, feeds: Sequence[Mapping[str, np.ndarray]],
                  init_values: Optional[Mapping[str, np.ndarray]] = None):
    """The original step on this process's CPU: (losses per step, variable values after each
    step as a list of dicts). `init_values` overrides the initial values (by variable name).

    Runs on 1 intra-op thread, which TensorFlow honours only where TF_OVERRIDE_GLOBAL_THREADPOOL=1
    was set before the process's first session, or that session asked for 1 thread too: otherwise
    every session shares the first one's CPU pool (the test tree sets it, conftest.py)."""
    import tensorflow as tf
    g = _import(graph.graph_def)
    loss = graph.names[graph.tensor_op[graph.loss_tensor]] + f":{int(graph.tensor_port[graph.loss_tensor])}" \
        if graph.loss_tensor >= 0 else None
    with g.as_default():
        reads = {v.name: tf.raw_ops.ReadVariableOp(resource=g.get_tensor_by_name(v.name + ":0"),
                                                   dtype=tf.as_dtype(v.dtype)) for v in graph.variables}
        assigns = {}
        if init_values:
            for name, value in init_values.items():
                ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype))
                assigns[name] = (ph, tf.raw_ops.AssignVariableOp(resource=g.get_tensor_by_name(name + ":0"), value=ph))
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    losses, states = [], []
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        sess.run(graph.meta.get("init_op") or "init")
        for name, (ph, op) in assigns.items():
            sess.run(op, {ph: init_values[name]})
        for feed in feeds:
            out = sess.run([graph.names[graph.sink]] + ([loss] if loss else []), dict(feed))
            losses.append(float(out[1]) if loss else None)
            states.append(sess.run(reads))
    return losses, states


def _unknown_batch(graph: OpGraph):
    """The GraphDef with the batch dimension of every input placeholder unknown, so that a
    replica's slice of the global batch can be fed (bundles are exported with a static batch)."""
    gd = type(graph.graph_def)()
    gd.CopyFrom(graph.graph_def)
    axes = {graph.names[i]: int(graph.tensor_batch_axis[graph.tensor_op == i][0]) for i in graph.inputs}
    for node in gd.node:
        axis = axes.get(node.name, -1)
        if axis >= 0 and "shape" in node.attr and len(node.attr["shape"].shape.dim) > axis:
            node.attr["shape"].shape.dim[axis].size = -1
        if "_output_shapes" in node.attr:  # recorded static shapes would pin the batch again
            del node.attr["_output_shapes"]
    return gd


def per_replica_reference_run(graph: OpGraph, feeds: Sequence[Mapping[str, np.ndarray]],
                              ranges: Sequence[Tuple[int, int]], init_values: Mapping[str, np.ndarray]):
    """Reference for graphs whose forward pass uses per-replica batch statistics (batch norm):
    each step runs the original step once per replica range [lo, hi) of the global batch, from
    the same variable values, and combines the results with weights (hi - lo) / B, the
    aggregation weights of a mean-reduced loss.

    For plain SGD this equals the data-parallel step exactly: the update w - lr * sum_r w_r g_r
    and the moving-average update m + (1 - d)(stat_r - m) are affine in the per-replica
    gradient / statistic, so averaging the per-replica results is averaging their inputs.
    Returns (losses per step, variable values after each step) like `reference_run`."""
    import tensorflow as tf
    g = _import(_unknown_batch(graph))
    batch = sum(hi - lo for lo, hi in ranges)
    loss = graph.names[graph.tensor_op[graph.loss_tensor]] + f":{int(graph.tensor_port[graph.loss_tensor])}"
    axes = {graph.names[i] + ":0": int(graph.tensor_batch_axis[graph.tensor_op == i][0]) for i in graph.inputs}
    with g.as_default():
        reads, assigns = {}, {}
        for v in graph.variables:
            handle = g.get_tensor_by_name(v.name + ":0")
            reads[v.name] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.as_dtype(v.dtype))
            ph = tf.compat.v1.placeholder(tf.as_dtype(v.dtype))
            assigns[v.name] = (ph, tf.raw_ops.AssignVariableOp(resource=handle, value=ph))
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    losses, states = [], []
    state = {k: np.asarray(v) for k, v in init_values.items()}
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        sess.run(graph.meta.get("init_op") or "init")
        for feed in feeds:
            total_loss, new = 0.0, {k: np.zeros_like(v, dtype=np.float64) for k, v in state.items()}
            for lo, hi in ranges:
                sess.run([op for _, op in assigns.values()], {ph: state[k] for k, (ph, _) in assigns.items()})
                part = {k: np.take(v, np.arange(lo, hi), axis=max(axes.get(k, 0), 0)) for k, v in feed.items()}
                out = sess.run([graph.names[graph.sink], loss], part)
                w = (hi - lo) / batch
                total_loss += w * float(out[1])
                for k, v in sess.run(reads).items():
                    new[k] += w * v
            state = {k: v.astype(state[k].dtype) for k, v in new.items()}
            losses.append(total_loss)
            states.append(state)
    return losses, states
