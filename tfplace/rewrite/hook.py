"""A session hook that runs an unchanged tf.compat.v1 training script under a strategy.

    hook = PlacementHook("strategy.json", "clusters/local_cpu.json", train_op=train_op, loss=loss)
    with tf.compat.v1.train.MonitoredTrainingSession(master=target, config=hook.session_config(base),
                                                     hooks=[hook]) as sess:
        sess.run(train_op, feed_dict={x: ..., y: ...})      # runs the rewritten step

`begin()` (called before the session exists) rewrites the default graph's training step with
tfplace.rewrite.graph_rewrite, imports the result under the scope `tfplace_step/` with the script's
placeholders mapped onto the rewritten graph's inputs (so the script's feeds feed it), and
re-points the script's train op: it must be a NoOp (`tf.group`, `minimize` without
global_step); its control inputs are replaced by the rewritten step's train op, so the
original single-device update no longer runs. `after_create_session` runs the rewritten
init once (initialise, then copy to mirrors). `hook.loss` is the global loss tensor of the
rewritten step; `hook.variables` maps variable names to their mirror-0 read tensors.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

SCOPE = "tfplace_step"


class PlacementHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, strategy_path: str, cluster_path: str, train_op=None, loss=None,
                 loss_reduction: Optional[str] = None):
        from tfplace.formats.cluster import load_cluster
        from tfplace.formats.strategy import load_strategy
        self.strategy = load_strategy(strategy_path)
        self.cluster = load_cluster(cluster_path)
        self._train_op, self._loss, self._reduction = train_op, loss, loss_reduction
        self.step = None
        self.loss = None
        self.variables = {}

    def session_config(self, base=None):
        """The ConfigProto to create the session with: a copy of `base` (e.g. the cluster's) with
        Grappler's meta optimizer off, as every rewritten step runs (`runtime.step_session_config`)."""
        from tfplace.runtime.step_runner import step_session_config
        return step_session_config(base)

    def begin(self):
        from tfplace.ir.loader import load_op_graph
        from tfplace.rewrite.graph_rewrite import rewrite_step
        g = tf.compat.v1.get_default_graph()
        train_op = self._train_op if self._train_op is not None else tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.TRAIN_OP)[0]
        train_op = getattr(train_op, "op", train_op)
        if train_op.type != "NoOp":
            raise ValueError(f"PlacementHook: train op {train_op.name!r} is a {train_op.type}; group it "
                             "with tf.group(...) so that the hook can re-point it")
        init = tf.compat.v1.variables_initializer(tf.compat.v1.global_variables(), name="tfplace_hook_init")
        loss = getattr(self._loss, "name", self._loss)
        graph = load_op_graph(g.as_graph_def(), sinks=[train_op.name], batch_size=self.strategy.global_batch_size,
                              loss=loss.split(":")[0] if loss else None, loss_reduction=self._reduction,
                              source="default graph")
        self.step = rewrite_step(graph, self.strategy, self.cluster, init_op=init.name)
        input_map = {spec.tensor: g.get_tensor_by_name(spec.tensor) for spec in self.step.inputs}
        tf.graph_util.import_graph_def(self.step.graph_def, input_map=input_map, name=SCOPE)
        new_train = g.get_operation_by_name(f"{SCOPE}/{self.step.train_op}")
        train_op._remove_all_control_inputs()
        train_op._add_control_input(new_train)
        self.init_op = g.get_operation_by_name(f"{SCOPE}/{self.step.init_op}")
        self.loss = g.get_tensor_by_name(f"{SCOPE}/{self.step.loss}") if self.step.loss else None
        self.variables = {k: g.get_tensor_by_name(f"{SCOPE}/{v[0]}") for k, v in self.step.variables.items()}

    def after_create_session(self, session, coord):
        session.run(self.init_op)
