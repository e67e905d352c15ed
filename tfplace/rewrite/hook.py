"""A session hook that runs an unchanged tf.compat.v1 training script under a strategy.

    hook = PlacementHook("strategy.json", "clusters/local_cpu.json", train_op=train_op, loss=loss)
    with tf.compat.v1.train.MonitoredTrainingSession(master=target, config=hook.session_config(base),
                                                     checkpoint_dir=ckpt, hooks=[hook]) as sess:
        sess.run(train_op, feed_dict={x: ..., y: ...})      # runs the rewritten step

`begin()` (called before the session exists) rewrites the default graph's training step with
tfplace.rewrite.graph_rewrite, imports the result under the scope `tfplace_step/` with the script's
placeholders mapped onto the rewritten graph's (so the script's feeds feed it: the batch, and
placeholders such as a learning rate or keep_prob, which every replica reads), and
re-points the script's train op (`train_op=`, by default the op the script runs as
tfplace.ir.step_roles finds it for a bare step): it must be a NoOp (`tf.group(...)`); its control inputs are
replaced by the rewritten step's train op (and the global step's copy, below), so the original
single-device update no longer runs.

State. The script's own variables stay the state the session creates, restores and saves;
the rewritten step trains its replicas (`<var>/replica_<k>`, every optimizer slot and the
global step included):
  - after the session is created (the Scaffold initialised or restored the script's
    variables), `after_create_session` copies every script variable into all its replicas
    (`copy_op`), so a restart continues from the checkpoint;
  - every save copies replica 0 of every variable into the script's variable first (`sync_op`),
    in the graph: begin() re-points the variable reads of every Saver the graph holds (the
    script's own, one passed in MonitoredTrainingSession's Scaffold, one in the SAVERS
    collection, or the hook's, `hook.saver`, added there when the collection is empty) onto
    reads that run the sync first. The sync runs only while the replicas hold the session's
    state (from `copy_op` until `end`; after a session that ended without `end`, also when the
    next one restores or initialises, which writes every replica too), so the save
    CheckpointSaverHook makes when a session is created, before any hook of the script runs,
    writes the restored or initial values. The checkpoint holds the trained values under the
    script's names, readable by the plain single-device script; between saves the script's
    variables (the global step aside) hold the last saved values, and the trained ones once the
    session has ended (`end`). A second MonitoredTrainingSession on the same graph takes the same hook (begin() sets the
    step up once, and what the script built in between);
  - the global step is copied back after every step (one scalar), as part of the re-pointed
    train op: StopAtStepHook, CheckpointSaverHook and the script read it every step;
  - a write of the script to a step variable outside the step (`lr.assign(new_lr)`, assign_add,
    assign_sub: a learning-rate schedule; its initializer run again: `var.load(value, sess)`,
    re-initialised optimizer slots; a Saver's restore) writes every replica too (`_mirror_writes`);
    an update the hook cannot mirror (a second train op, a scatter, a cond that assigns) is
    refused when begin() runs.

`hook.loss` is the global loss tensor of the rewritten step, and the script's own loss tensor
reads it (an Identity, Mean or Sum loss: `_alias_script_loss`), so an unchanged loop that fetches
its loss sees the step's. The script's other reads of its trained variables read replica 0
(`_read_replicas`: variable reads, embedding lookups, and v2 conds, loops and function calls that
write no variable), so an accuracy, a summary, a batch-norm evaluation or a fetch of a variable
sees the trained values; a value read where the hook cannot re-point the read (a v1 cond, or a
cond or function that also writes) still reads the script's variable and is warned about once
when fetched. `hook.variables` maps variable names to their mirror-0 read tensors.
"""

from __future__ import annotations

import uuid
import warnings
from typing import Optional

import numpy as np
import tensorflow as tf

SCOPE = "tfplace_step"
_SET_UP = "tfplace_placement_hook"  # graph collection: the copy op of the hook that set the graph up


class PlacementHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, strategy_path: str, cluster_path: str, train_op=None, loss=None,
                 loss_reduction: Optional[str] = None):
        from tfplace.formats.cluster import load_cluster
        from tfplace.formats.strategy import load_strategy, validate_strategy
        self.strategy = load_strategy(strategy_path)
        self.cluster = load_cluster(cluster_path)
        # a strategy made for another cluster is refused here, before a script starts its servers
        validate_strategy(self.strategy, None, self.cluster.device_names)
        self._train_op, self._loss, self._reduction = train_op, loss, loss_reduction
        self.step = None
        self.loss = None
        self.variables = {}
        self.copy_op = self.sync_op = self.saver = None
        self._sync_if_live = self._end_op = None  # sync_op while the replicas hold the state; end(): it, then not
        self._graph = None  # the graph begin() set up
        self._ops_seen, self._step_ops = 0, set()  # its number of ops then; the step's op names
        self._stale_vars, self._stale, self._warned = set(), {}, set()  # stale variables, op -> reads them, warned

    def session_config(self, base=None):
        """The ConfigProto to create the session with: a copy of `base` (e.g. the cluster's) with
        Grappler's meta optimizer off, as every rewritten step runs (`runtime.step_session_config`)."""
        from tfplace.runtime.step_runner import step_session_config
        return step_session_config(base)

    def begin(self):
        from tfplace.ir.loader import load_op_graph
        from tfplace.rewrite.graph_rewrite import rewrite_step
        g = tf.compat.v1.get_default_graph()
        set_up = tf.compat.v1.get_collection(_SET_UP)
        if set_up and self._graph is g:
            # a second MonitoredTrainingSession on this graph (the first unfinalizes it on close): the
            # rewritten step is imported and the train op re-pointed already (doing it again would
            # rewrite the rewritten graph); what the script built since (a Saver, an assign) is set up
            new_ops, feeding_init = g.get_operations()[self._ops_seen:], _upstream(_initializers())
            _refuse_other_updates(new_ops, feeding_init | self._step_ops, set(self.step.variables))
            self._adopt(g, new_ops, feeding_init)
            self._ops_seen = len(g.get_operations())
            return
        if set_up:
            raise ValueError("PlacementHook: another PlacementHook has set up this graph (its train op runs that "
                             "hook's rewritten step); pass the same hook to every session made on this graph")
        train_op = self._train_op if self._train_op is not None else _inferred_train_op(g)
        train_op = getattr(train_op, "op", train_op)
        if train_op.type != "NoOp":
            raise ValueError(f"PlacementHook: train op {train_op.name!r} is a {train_op.type}; group it "
                             "with tf.group(...) so that the hook can re-point it")
        if not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
            # the Scaffold would build this one after begin(), out of reach; built before the script's ops
            # are taken, its restores reach the replicas as the script's own Saver's do (_mirror_writes)
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS,
                                           tf.compat.v1.train.Saver(sharded=True, allow_empty=True))
        self.saver = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)[0]
        script_ops = g.get_operations()
        # the rewrite needs an init op; the hook itself initialises replicas with copy_op
        init = tf.compat.v1.variables_initializer(tf.compat.v1.global_variables(), name="tfplace_hook_init")
        loss = getattr(self._loss, "name", self._loss)
        graph = load_op_graph(g.as_graph_def(), sinks=[train_op.name], batch_size=self.strategy.global_batch_size,
                              loss=loss.split(":")[0] if loss else None, loss_reduction=self._reduction,
                              source="default graph")
        for v in graph.variables:  # the step's only: the rewrite cannot import reference variables
            _handle(g, v.name)
        # before the step is imported: a refused script's train op still runs its own update
        self._step_ops = set(graph.names)
        feeding_init = _upstream(_initializers())  # the initializers and what they read
        _refuse_other_updates(script_ops, feeding_init | self._step_ops, {v.name for v in graph.variables})
        self.step = rewrite_step(graph, self.strategy, self.cluster, init_op=init.name)
        # the script's placeholders (the batch and the others: a fed learning rate, keep_prob)
        fed = [spec.tensor for spec in self.step.inputs] + list(self.step.feeds)
        input_map = {name: g.get_tensor_by_name(name) for name in fed}
        tf.graph_util.import_graph_def(self.step.graph_def, input_map=input_map, name=SCOPE)
        self.loss = g.get_tensor_by_name(f"{SCOPE}/{self.step.loss}") if self.step.loss else None
        self.variables = {k: g.get_tensor_by_name(f"{SCOPE}/{v[0]}") for k, v in self.step.variables.items()}
        self._state_ops(g)
        self._repoint(g, train_op)
        self._alias_script_loss(g, loss)
        step_var = tf.compat.v1.train.get_global_step(g)
        # variables whose script copy holds the last saved values (the global step is kept current)
        self._stale_vars = set(self.step.variables) - ({step_var.op.name} if step_var is not None else set())
        self._stale, self._warned = {}, set()
        self._adopt(g, script_ops, feeding_init)
        tf.compat.v1.add_to_collection(_SET_UP, self.copy_op)
        self._graph, self._ops_seen = g, len(g.get_operations())

    def _adopt(self, g, script_ops, feeding_init) -> None:
        """Sets the script's own ops up to work on the replicas: every save syncs first, the reads
        of trained variables read replica 0, the writes of step variables write every replica.
        `feeding_init`: names of the variables' initializers and of every op they depend on."""
        script_var = {self.variables[name].op.inputs[0].op.name: _handle(g, name) for name in self.step.variables}
        _sync_every_save(g, script_ops, self._sync_if_live, script_var)
        self._read_replicas(g, script_ops, feeding_init)
        self._mirror_writes(g, script_ops, feeding_init)

    def _alias_script_loss(self, g, loss_name) -> Optional[str]:
        """Makes the script's loss tensor read the rewritten step's global loss, so that a loop
        that fetches its own `loss` sees the loss of the step it runs (it would otherwise compute
        a second forward pass on the script's variables, which hold the last saved values). An
        Identity takes the global loss; a Mean or Sum (tf.reduce_mean(..., name="loss")) takes it
        reshaped to its input's rank, whose reduction is then the value itself. Returns the op's
        name, or None for other ops (fetching them is warned about in before_run)."""
        if self.loss is None or not loss_name:
            return None
        op = g.get_tensor_by_name(loss_name if ":" in loss_name else loss_name + ":0").op
        if op.outputs[0].shape.rank != 0 or op.outputs[0].dtype != self.loss.dtype:
            return None
        if op.type in ("Identity", "StopGradient"):
            op._update_input(0, self.loss)  # noqa: SLF001 (no public API rewires an op's input)
            return op.name
        rank = op.inputs[0].shape.rank if op.type in ("Mean", "Sum") else None
        if rank is None:
            return None
        with g.name_scope("tfplace_loss_alias"):
            value = tf.reshape(self.loss, [1] * rank)
        op._update_input(0, value)  # noqa: SLF001
        return op.name

    def _state_ops(self, g) -> None:
        """copy_op: every script variable into all its replicas; sync_op: replica 0 into the script's
        variable; _sync_if_live: sync_op's copy that runs only while the replicas hold the session's
        state. Un-deviced ops that take a handle run on the handle's device (TF's placer)."""
        copies = []
        for name in self.step.variables:
            original = _handle(g, name)
            dtype = original.op.get_attr("dtype")
            value = tf.raw_ops.ReadVariableOp(resource=original, dtype=dtype, name=f"tfplace_copy/{name}/read")
            for k, replica in enumerate(self._replica_handles(g, name)):
                copies.append(tf.raw_ops.AssignVariableOp(resource=replica, value=value,
                                                          name=f"tfplace_copy/{name}/replica_{k}"))
        self.sync_op = tf.group(*self._syncs(g), name="tfplace_sync")
        # "the replicas hold the session's state": a flag that exists (is initialised) from the copy
        # until end() destroys it; no collection holds it, so the Scaffold neither initialises nor
        # waits for it. A flag cannot be fed: a Saver's run feeds only its file name.
        # A session that ends without end() (an error, MonitoredSession's recovery) leaves the flag set
        # on the servers: the next session's first save then syncs, before the copy, which is harmless
        # (the restore or init that just ran wrote every replica too, _mirror_writes) unless replica 0 is
        # gone with a restarted task: the sync also waits for every replica 0 to exist.
        live = tf.raw_ops.VarHandleOp(dtype=tf.bool, shape=[], shared_name=f"tfplace_hook_live_{uuid.uuid4().hex}",
                                      name="tfplace_live")
        with tf.control_dependencies(copies):
            mark = tf.raw_ops.AssignVariableOp(resource=live, value=True, name="tfplace_live/set")
        self.copy_op = tf.group(*copies, mark, name="tfplace_copy")
        with g.name_scope("tfplace_sync_if_live"):
            # the branch builds its own reads: a tensor made outside a branch is computed whatever
            # the condition, and a replica read before the first copy fails
            exist = [tf.raw_ops.VarIsInitializedOp(resource=h) for h in [live] + [
                self._replica_handles(g, name)[0] for name in self.step.variables]]
            self._sync_if_live = tf.compat.v1.cond(tf.reduce_all(tf.stack(exist)),
                                                   lambda: _after(self._syncs(g), True),
                                                   lambda: tf.constant(False)).op
            with tf.control_dependencies([self._sync_if_live]):
                self._end_op = tf.raw_ops.DestroyResourceOp(resource=live, ignore_lookup_error=True)

    def _syncs(self, g) -> list:
        """[an op assigning replica 0's value to the script's variable, per variable of the step]"""
        syncs = []
        for name in self.step.variables:
            replica = self._replica_handles(g, name)[0]
            value = tf.raw_ops.ReadVariableOp(resource=replica, dtype=replica.op.get_attr("dtype"),
                                              name=f"tfplace_sync/{name}/read")
            syncs.append(tf.raw_ops.AssignVariableOp(resource=_handle(g, name), value=value,
                                                     name=f"tfplace_sync/{name}"))
        return syncs

    def _read_replicas(self, g, script_ops, feeding_init) -> None:
        """Re-points the script's reads of its trained variables (ReadVariableOps among
        `script_ops` that take the variable's handle) onto replica 0, so that what the script
        computes besides its step (an accuracy, a summary, a fetch of the variable) sees the
        trained values. A gather (`tf.nn.embedding_lookup` of a resource variable: ResourceGather)
        is such a read too: an accuracy of an embedding model read the stale table. Left alone:
        the reads feeding a variable's initializer (replicas hold
        nothing before the copy that follows initialisation) and the Savers' reads
        (`_sync_every_save` replaced them). A v2 cond, loop or function call (an If: a batch-norm
        layer's moving mean under a `training` placeholder) takes the handle as an input, re-pointed
        too unless one of its functions writes a variable (it would write replica 0 alone); a read
        of a v1 cond/while takes the handle through a Switch and keeps the script's variable
        (`_warn_stale` says so)."""
        replica = {name: self.variables[name].op.inputs[0] for name in self._stale_vars}
        for op in script_ops:
            if op.name in feeding_init:
                continue
            if op.type in _CALL_OPS and not _writes(g, op):
                for i, tensor in enumerate(op.inputs):
                    if tensor.op.type == "VarHandleOp" and tensor.op.name in replica:
                        op._update_input(i, replica[tensor.op.name])  # noqa: SLF001
                continue
            if op.type not in _READ_OPS:
                continue
            handle = op.inputs[0].op
            if handle.type == "VarHandleOp" and handle.name in replica:
                op._update_input(0, replica[handle.name])  # noqa: SLF001 (as _alias_script_loss)
                # placed where the replica is: its own device and colocation were the script variable's
                op._set_device("")  # noqa: SLF001
                if "_class" in op.node_def.attr:
                    op._clear_attr("_class")  # noqa: SLF001

    def _mirror_writes(self, g, script_ops, feeding_init) -> None:
        """Makes the script's own writes of a step variable (an AssignVariableOp, AssignAdd or
        AssignSub outside the step: `lr.assign(new_lr)` for a schedule) write every replica too,
        with the same value, before the script's variable: the step reads the replicas, so a
        learning rate set by the script was ignored. A variable's own initializer is such a write
        too: `var.load(value, sess)` runs it with the value fed, and a script that re-initialises
        its optimizer's slots (`variables_initializer(opt.variables())`) runs it mid-training (at
        session creation the copy that follows overwrites the replicas anyway). Not the writes
        feeding an initializer and not the step's own updates (the step writes those).
        An update the hook cannot mirror (an optimizer's, a scatter) begin() refused
        (`_refuse_other_updates`)."""
        skip = (feeding_init - {op.name for op in _initializers()}) | self._step_ops
        for op in script_ops:
            if op.type not in _WRITE_OPS or op.name in skip or op.inputs[0].op.type != "VarHandleOp":
                continue
            name = op.inputs[0].op.name
            if name not in self.step.variables:
                continue
            write = getattr(tf.raw_ops, op.type)
            mirrors = [write(resource=replica, value=op.inputs[1], name=f"tfplace_mirror/{op.name}_{k}")
                       for k, replica in enumerate(self._replica_handles(g, name))]
            op._add_control_inputs(mirrors)  # noqa: SLF001 (as _repoint)

    def _replica_handles(self, g, name: str) -> list:
        """The resource handles of every replica of variable `name` in the imported step, replica 0 first."""
        return [g.get_tensor_by_name(f"{SCOPE}/{read}").op.inputs[0] for read in self.step.variables[name]]

    def _repoint(self, g, train_op) -> None:
        """The script's train op runs the rewritten step, then copies its global step back."""
        new_train = g.get_operation_by_name(f"{SCOPE}/{self.step.train_op}")
        # No public TF API edits an existing op's control inputs (tf.contrib.graph_editor is gone;
        # tf.Operation is read-only in TF 2.15) and the script runs its own train op object, so the
        # hook re-points it in place with these two private Operation methods.
        train_op._remove_all_control_inputs()
        train_op._add_control_inputs([new_train] + self._global_step_sync(g, new_train))

    def _global_step_sync(self, g, new_train) -> list:
        """[an op that assigns replica 0 of the global step to the script's global step after
        `new_train`], or [] when the step does not update a global step."""
        step_var = tf.compat.v1.train.get_global_step(g)
        name = step_var.op.name if step_var is not None else None
        if name not in self.step.variables:
            return []
        replica = self.variables[name].op.inputs[0]
        with g.control_dependencies([new_train]):
            value = tf.raw_ops.ReadVariableOp(resource=replica, dtype=replica.op.get_attr("dtype"),
                                              name="tfplace_sync_global_step/read")
        return [tf.raw_ops.AssignVariableOp(resource=_handle(g, name), value=value, name="tfplace_sync_global_step")]

    def after_create_session(self, session, coord):
        session.run(self.copy_op)

    def end(self, session):
        """Copies the trained replicas into the script's variables: once the session has ended, a
        plain Session on the same servers reads the trained values, as after the plain script
        (they held the initial or the last saved ones). The replicas no longer hold the state of
        a session then: the next session's first save writes what it restored."""
        session.run(self._end_op)

    def before_run(self, run_context):
        """Checks the run's feeds of the step's inputs: each must hold the strategy's global batch
        on its batch axis (the rewritten step cuts each replica's rows out of it at fixed offsets,
        so a smaller feed would train on rows that are not there and a larger one would leave
        rows out, silently). Raises InputError (a ValueError) naming the placeholder."""
        check_feed_batches(self.step.inputs, run_context.original_args.feed_dict, self.strategy)
        self._warn_stale(run_context.original_args.fetches)
        return None

    def _reads_stale(self, op) -> bool:
        """Whether `op` reads one of the script's trained variables (other than through the
        rewritten step's scope); cached per op."""
        todo, seen, found = [op], set(), False
        while todo and not found:
            o = todo.pop()
            if o.name in seen or o.name.startswith(SCOPE + "/"):
                continue
            seen.add(o.name)
            if o.name in self._stale:
                found = self._stale[o.name]
                continue
            found = o.type in ("VarHandleOp", "VariableV2") and o.name in self._stale_vars
            todo.extend(t.op for t in o.inputs)
        self._stale[op.name] = found
        return found

    def _warn_stale(self, fetches) -> None:
        """Warns once per tensor when the run fetches one computed from the script's trained
        variables through a read `_read_replicas` could not re-point (a v1 cond, or a cond or
        function that also writes): they hold the last saved values, not the trained replicas.
        Names are looked up in the graph begin() set up (the session's), which need not be the
        default graph where the script runs its loop."""
        g = self._graph or tf.compat.v1.get_default_graph()
        for item in tf.nest.flatten(fetches):
            try:  # as the session reads a fetch: a variable is its read, a name an op or a tensor
                element = g.as_graph_element(item.lstrip("^") if isinstance(item, str) else item)
            except (KeyError, ValueError, TypeError):
                continue
            op = getattr(element, "op", element)
            if not isinstance(op, tf.Operation) or op.type == "NoOp":
                continue  # the train op (re-pointed) or a group
            if op.type in _WRITE_OPS:  # mirrored (`_mirror_writes`): only its value can be stale
                op = op.inputs[1].op
            name = op.name
            if name not in self._warned and self._reads_stale(op):
                self._warned.add(name)
                warnings.warn(f"PlacementHook: {name!r} is computed from the script's variables, which hold the values "
                              "of the last checkpoint save, not the trained replicas; fetch hook.loss, or compute it "
                              "from hook.variables", stacklevel=2)


def _inferred_train_op(g):
    """The op the script runs to train, found as for a bare step (tfplace.ir.step_roles): the
    TRAIN_OP collection's entry lifted to the group that runs it, else the outermost op that runs
    the updates. ValueError naming `train_op=` when there is none or several could be."""
    from tfplace.formats.errors import InputError
    from tfplace.ir.step_roles import infer_train_ops
    collected = [getattr(t, "op", t).name for t in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)]
    try:
        names = infer_train_ops(g.as_graph_def(), collection=collected, src="default graph")
    except InputError as err:
        raise ValueError(f"PlacementHook: {err.problem}; pass the op the script runs as train_op=") from None
    if len(names) > 1:
        raise ValueError(f"PlacementHook: the script has {len(names)} train ops ({', '.join(names)}); group them "
                         "with tf.group(...) and pass the group as train_op=")
    return g.get_operation_by_name(names[0])


def _initializers() -> list:
    """The initializer ops of the default graph's global and local variables."""
    return [v.initializer for v in tf.compat.v1.global_variables() + tf.compat.v1.local_variables()]


def _upstream(ops) -> set:
    """Names of `ops` and of every op they depend on (data and control inputs)."""
    todo, seen = list(ops), set()
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo.extend(t.op for t in op.inputs)
            todo.extend(op.control_inputs)
    return seen


def _after(ops, value):
    with tf.control_dependencies(ops):
        return tf.constant(value)


_SAVE_OPS = ("SaveV2", "Save", "SaveSlices")
_WRITE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
_READ_OPS = ("ReadVariableOp", "ResourceGather", "ResourceGatherNd")  # a handle at input 0, no write
# writes the hook cannot mirror: an optimizer's update (ResourceApplyAdam, ResourceSparseApply...), a scatter
_UPDATE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter", "ResourceStridedSliceAssign")


_CALL_OPS = ("If", "StatelessIf", "Case", "StatelessCase", "While", "StatelessWhile", "PartitionedCall",
             "StatefulPartitionedCall")


def _func_names(value) -> list:
    """The function names an AttrValue holds (a `func`, or a list of them: a Case's branches)."""
    return [f.name for f in value.list.func] + ([value.func.name] if value.func.name else [])


def _is_write(op_type: str) -> bool:
    """Whether an op of `op_type` writes a variable: an assign, a scatter or an optimizer's update."""
    return "Assign" in op_type or "Scatter" in op_type or op_type.startswith(_UPDATE_PREFIXES)


def _writes(g, op) -> bool:
    """Whether a function-call op (a v2 cond, while or call) may write a variable: a function of
    its attributes, or one they call, holds an assign, an optimizer update or a scatter."""
    todo, seen = [op.node_def.attr], set()
    while todo:
        for value in todo.pop().values():
            for name in _func_names(value):
                if name in seen:
                    continue
                seen.add(name)
                fn = g._get_function(name)  # noqa: SLF001 (the graph's function library)
                if fn is None:
                    return True
                for node in fn.definition.node_def:
                    if _is_write(node.op):
                        return True
                    todo.append(node.attr)
    return False


def _written_inputs(g, op) -> list:
    """Positions of the inputs of a function-call op that one of its functions may write: the
    argument a write's resource comes from, in each function of the op's attributes; every input
    when a write is deeper (in a function those call) or its resource is no argument."""
    offset = 1 if op.type in ("If", "StatelessIf", "Case", "StatelessCase") else 0  # the predicate / index
    everything = list(range(len(op.inputs)))
    written = set()
    for value in op.node_def.attr.values():
        for name in _func_names(value):
            fn = g._get_function(name)  # noqa: SLF001 (the graph's function library)
            if fn is None:
                return everything
            args = [a.name for a in fn.definition.signature.input_arg]
            for node in fn.definition.node_def:
                if any(attr.func.name or attr.list.func for attr in node.attr.values()):
                    return everything  # a nested call: its writes are not traced to arguments
                if _is_write(node.op):
                    source = node.input[0].split(":")[0] if node.input else ""
                    if source not in args:
                        return everything
                    written.add(offset + args.index(source))
    return sorted(i for i in written if i < len(op.inputs))


def _refuse_other_updates(script_ops, skip, step_variables) -> None:
    """ValueError naming the first op among `script_ops` (not in `skip`: the step's and what
    feeds an initializer) that updates one of `step_variables` by an op the hook cannot mirror: a
    second train op (a GAN's generator step run apart from the discriminator's) or a scatter
    update. It would update the script's variable alone, which the step never reads (it
    trains the replicas) and the next save overwrites: its training was silently lost."""
    for op in script_ops:
        if op.name in skip or not op.inputs:
            continue
        if op.type.startswith(_UPDATE_PREFIXES):
            handles = [op.inputs[0].op]
        elif op.type in _CALL_OPS and _writes(op.graph, op):  # a v2 cond that assigns: not mirrored either
            handles = [op.inputs[i].op for i in _written_inputs(op.graph, op)]
        else:
            continue
        for handle in handles:
            if handle.type == "VarHandleOp" and handle.name in step_variables:
                raise ValueError(f"PlacementHook: {op.name!r} ({op.type}) updates {handle.name!r} outside the train op "
                                 "the hook runs (the step trains replicas of it, and this update would be lost); run "
                                 "every update in the one train op (tf.group(...), passed as train_op=)")


def _sync_every_save(g, ops, sync, script_var) -> None:
    """Re-points every variable read of every Save op among `ops` onto a read of the script's
    variable that runs `sync` first (the Saver's own read, `<var>/Read/ReadVariableOp`, is the
    variable's too: fetching `var` must not sync). A save then writes the values the sync leaves.
    `script_var`: replica 0's handle op name -> the script variable's handle, for a read that
    _read_replicas re-pointed already (a Saver built between two sessions reads those)."""
    reads = {}
    for op in ops:
        if op.type not in _SAVE_OPS:
            continue
        for i, tensor in enumerate(op.inputs):
            if tensor.op.type != "ReadVariableOp":
                continue
            if tensor.name not in reads:
                handle = tensor.op.inputs[0]
                handle = script_var.get(handle.op.name, handle)
                with g.colocate_with(handle.op), tf.control_dependencies([sync]):
                    reads[tensor.name] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tensor.dtype,
                                                                    name=f"tfplace_save_read/{handle.op.name}")
            op._update_input(i, reads[tensor.name])  # noqa: SLF001 (no public API rewires an op's input)


def _handle(g, name: str):
    op = g.get_operation_by_name(name)
    if op.type != "VarHandleOp":
        from tfplace.ir.roles import RESOURCE_VARIABLES_FIX
        raise ValueError(f"PlacementHook: variable {name!r} is a {op.type}; the hook needs resource variables: "
                         f"{RESOURCE_VARIABLES_FIX}; the Grappler plugin takes either kind")
    return op.outputs[0]


def check_feed_batches(inputs, feed_dict, strategy) -> None:
    """Raises InputError when a feed of one of `inputs` (graph_rewrite.InputSpec; `feed_dict` keys
    are tensors or names) has another size than `strategy.global_batch_size` on its batch axis."""
    from tfplace.formats.errors import InputError
    if not feed_dict:
        return
    by_name = {getattr(k, "name", k): v for k, v in feed_dict.items()}
    want = strategy.global_batch_size
    for spec in inputs:
        value = by_name.get(spec.tensor)
        if value is None:
            continue
        shape = value.shape if hasattr(value, "shape") else np.shape(value)
        if len(shape) > spec.batch_axis and shape[spec.batch_axis] != want:
            raise InputError("feed_dict", spec.tensor, f"holds {shape[spec.batch_axis]} samples on axis "
                             f"{spec.batch_axis}; the strategy{' ' + strategy.source if strategy.source else ''} is for a "
                             f"global batch of "
                             f"{want}", f"feed {want} samples per step, or make a strategy for the batch you feed")
