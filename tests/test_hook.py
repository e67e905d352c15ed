"""Session hook: an unchanged tf.compat.v1 script with `PlacementHook` on a
MonitoredTrainingSession trains exactly like the rewritten graph run directly.

The hooked run and a direct StepRunner run of the hook's own RewrittenStep start from the same
initial values (the rewritten init runs the script's seeded initializers once and copies them
to every mirror: checked) and get the same feeds; after N steps every mirror of every variable
agrees to 1e-6 relative, and so does the loss of each step.
"""

import os
import warnings

import numpy as np
import pytest

from tfplace.testing import mlp_training_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, BATCH = 3, 16


def _feeds():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((BATCH, 16)).astype(np.float32), rng.integers(0, 4, BATCH).astype(np.int32))
            for _ in range(STEPS)]


@pytest.fixture(scope="module")
def local_cluster():
    from tfplace.runtime.local_cluster import LocalCluster
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1]) as lc:
        yield lc


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-8))


@pytest.mark.multiprocess
def test_hooked_steps_equal_the_rewritten_graph(local_cluster, tmp_path):
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    from tfplace.runtime.step_runner import StepRunner
    strategy = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    cluster = os.path.join(ROOT, "clusters", "local_cpu.json")
    feeds = _feeds()
    hooked_losses = []
    with tf.Graph().as_default():
        x, y, loss, train_op, _, _ = mlp_training_script()
        hook = PlacementHook(strategy, cluster, train_op, loss)
        with tf.compat.v1.train.MonitoredTrainingSession(master=local_cluster.target,
                                                         config=hook.session_config(local_cluster.session_config()),
                                                         hooks=[hook]) as sess:
            hooked_init = sess.run(hook.variables)
            for fx, fy in feeds:
                _, value = sess.run([train_op, hook.loss], feed_dict={x: fx, y: fy})  # unchanged loop
                hooked_losses.append(value)
            hooked = sess.run(hook.variables)
    step = hook.step
    assert len(step.variables) == 2 * 4  # 2 kernels + 2 biases, each with a momentum slot
    by_name = {spec.tensor: spec for spec in step.inputs}
    assert set(by_name) == {"features:0", "labels:0"}
    direct_losses = []
    with StepRunner(local_cluster, step, timeout_s=120) as runner:
        runner.initialize()
        init = runner.variables()
        for name, mirrors in init.items():
            assert _rel(mirrors[0], hooked_init[name]) == 0.0, f"{name}: hooked init differs"
            for m in mirrors:
                assert np.array_equal(m, mirrors[0]), f"mirrors of {name} initialised differently"
        for fx, fy in feeds:
            direct_losses.append(runner.step({"features:0": fx, "labels:0": fy}))
        direct = runner.variables()
    assert np.allclose(hooked_losses, direct_losses, rtol=1e-6, atol=0)
    for name, mirrors in direct.items():
        assert not np.array_equal(mirrors[0], init[name][0]) or "bias" in name, f"{name} did not train"
        for m in mirrors:
            assert _rel(m, hooked[name]) <= 1e-6, f"{name}: hooked and direct runs differ"


@pytest.mark.multiprocess
def test_run_steps_trains_and_times_every_step(local_cluster):
    """StepRunner.run_steps (what the fidelity bench times) runs train_op once per step: n wall
    times, and the variables move exactly as n direct steps move them."""
    from tfplace.formats.cluster import load_cluster
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner, random_feed
    from tfplace.formats.strategy import even_strategy
    from tfplace.testing import tiny_graph
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = tiny_graph("mlp", 6, "sgd")
    step = rewrite_step(graph, even_strategy(list(cluster.device_names), 6, 1), cluster)
    feed = random_feed(step.inputs, 6, 0)
    after = {}
    for how in ("run_steps", "step"):
        with StepRunner(local_cluster, step, timeout_s=120) as runner:
            runner.initialize()
            before = runner.variables()
            if how == "run_steps":
                times = runner.run_steps(3, feed)
                assert len(times) == 3 and all(t > 0 for t in times)
            else:
                for _ in range(3):
                    runner.step(feed)
            after[how] = runner.variables()
    assert any(not np.array_equal(after["step"][k][0], before[k][0]) for k in before), "nothing trained"
    for name, mirrors in after["step"].items():
        assert _rel(after["run_steps"][name][0], mirrors[0]) <= 1e-6, f"{name}: run_steps did not train like step"


def _script_with_fed_scalars():
    """The MLP script with two common non-batch placeholders: a fed learning rate and a
    `scale` with a default (as keep_prob or is_training are written); loss = mean CE x scale."""
    import tensorflow as tf
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, 16], name="features")
    y = v1.placeholder(tf.int32, [None], name="labels")
    lr = v1.placeholder(tf.float32, [], name="learning_rate")
    scale = v1.placeholder_with_default(1.0, [], name="scale")
    h = v1.layers.dense(x, 32, activation=tf.nn.relu, name="dense_0",
                        kernel_initializer=v1.glorot_uniform_initializer(seed=1))
    logits = v1.layers.dense(h, 4, name="dense_1", kernel_initializer=v1.glorot_uniform_initializer(seed=2))
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    loss = tf.identity(ce * scale, name="loss")
    train_op = tf.group(v1.train.GradientDescentOptimizer(lr).minimize(loss), name="train_op")
    return x, y, lr, scale, loss, train_op


# (learning rate, scale or None: its default 1.0) per step; scale 0 must not train at all
FED_SCALARS = [(0.5, None), (0.25, 0.0), (0.1, 2.0)]


@pytest.mark.multiprocess
def test_placeholders_that_are_not_the_batch_are_fed_as_the_script_feeds_them(local_cluster):
    """A fed learning rate and a placeholder_with_default reach every replica: losses and
    variables equal the plain single-device script's (the rewrite replicated them per replica, so
    the hook's run asked for 'learning_rate/replica_1' and ignored a fed default)."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    strategy = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    cluster = os.path.join(ROOT, "clusters", "local_cpu.json")
    feeds = _feeds()
    runs = {}
    for how in ("plain", "hooked"):
        losses = []
        with tf.Graph().as_default() as g:
            x, y, lr, scale, loss, train_op = _script_with_fed_scalars()
            names = [v.op.name for v in tf.compat.v1.trainable_variables()]
            if how == "plain":
                sess = tf.compat.v1.Session(graph=g)
                sess.run(tf.compat.v1.global_variables_initializer())
                fetch_loss, read = loss, lambda s: dict(zip(names, s.run(tf.compat.v1.trainable_variables())))
            else:
                hook = PlacementHook(strategy, cluster, train_op, loss)
                sess = tf.compat.v1.train.MonitoredTrainingSession(
                    master=local_cluster.target, config=hook.session_config(local_cluster.session_config()),
                    hooks=[hook])
                fetch_loss, read = hook.loss, lambda s: {n: s.run(hook.variables[n]) for n in names}
            with sess:
                for (fx, fy), (rate, factor) in zip(feeds, FED_SCALARS):
                    feed = {x: fx, y: fy, lr: rate, **({} if factor is None else {scale: factor})}
                    losses.append(sess.run([train_op, fetch_loss], feed_dict=feed)[1])
                    if factor == 0.0:
                        assert losses[-1] == 0.0, how
                runs[how] = (losses, read(sess))
    assert np.allclose(runs["hooked"][0], runs["plain"][0], rtol=1e-5, atol=0), runs
    for name, value in runs["plain"][1].items():
        assert _rel(runs["hooked"][1][name], value) <= 1e-5, f"{name}: hooked and plain runs differ"


@pytest.mark.multiprocess
def test_a_second_session_on_the_same_graph_and_hook_continues_training(local_cluster, tmp_path):
    """A script that opens MonitoredTrainingSession twice on one graph with one hook and one
    checkpoint dir: 2 + 2 steps train like 4 steps in one session (begin() ran again and set the graph up a
    second time). Once a session has ended, even
    one without checkpoints, the script's variables hold the trained values, as the plain script's
    do, for a plain Session that reads them (they held the initial values)."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    strategy = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    cluster = os.path.join(ROOT, "clusters", "local_cpu.json")
    fx, fy = _feeds()[0]
    losses = {}
    for sessions in (1, 2):
        tf.compat.v1.Session.reset(local_cluster.target)  # the servers forget the other run's variables
        losses[sessions] = []
        with tf.Graph().as_default() as g:
            x, y, loss, train_op, _, _ = mlp_training_script(global_step=True)
            hook = PlacementHook(strategy, cluster, train_op, loss)
            for _ in range(sessions):
                with tf.compat.v1.train.MonitoredTrainingSession(
                        master=local_cluster.target, hooks=[hook], log_step_count_steps=None,
                        checkpoint_dir=str(tmp_path) if sessions == 2 else None,  # restored by session 2
                        config=hook.session_config(local_cluster.session_config())) as sess:
                    for _ in range(4 // sessions):
                        losses[sessions].append(sess.run([train_op, hook.loss], feed_dict={x: fx, y: fy})[1])
                    trained = sess.run(hook.variables["dense_0/kernel"])
            with tf.compat.v1.Session(local_cluster.target, graph=g, config=local_cluster.session_config()) as plain:
                assert np.array_equal(plain.run(g.get_tensor_by_name("dense_0/kernel/Read/ReadVariableOp:0")), trained)
            if sessions == 2:
                with pytest.raises(ValueError, match="another PlacementHook has set up this graph"):
                    PlacementHook(strategy, cluster, train_op, loss).begin()
    tf.compat.v1.Session.reset(local_cluster.target)
    assert np.allclose(losses[2], losses[1], rtol=1e-6, atol=0), losses


def test_every_saver_of_the_graph_reads_what_the_sync_left():
    """Every Save op's variable reads (the script's own Saver's and the hook's, added to the SAVERS
    collection) are fresh reads that wait for the conditional sync, never the variable's own read
    (`<var>/Read/ReadVariableOp`, which a plain fetch of the variable runs: it must not sync)."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    with tf.Graph().as_default() as g:
        _, _, loss, train_op, _, _ = mlp_training_script(global_step=True)
        tf.compat.v1.train.Saver(max_to_keep=3)  # e.g. for MonitoredTrainingSession's Scaffold(saver=...)
        hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        hook.begin()
        assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS) == [hook.saver]
        saves = [op for op in g.get_operations() if op.type == "SaveV2"]
        assert len(saves) == 2
        for op in saves:
            reads = [t.op for t in op.inputs if t.op.type == "ReadVariableOp"]
            assert len(reads) == len(hook.step.variables), op.name
            for read in reads:
                assert read.name.startswith("tfplace_save_read/"), read.name
                assert [c.name for c in read.control_inputs] == [hook._sync_if_live.name]  # noqa: SLF001
        kernel = g.get_operation_by_name("dense_0/kernel/Read/ReadVariableOp")
        assert kernel.control_inputs == []


def test_a_run_without_the_scripts_feeds_refuses_a_placeholder_it_cannot_fill():
    """activate and plan --confirm_real feed only the batch: a placeholder without a default
    (the learning rate here) is one InputError naming it before any session; one with a default
    runs with it."""
    import tensorflow as tf
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner
    with tf.Graph().as_default() as g:
        _script_with_fed_scalars()
        init = tf.compat.v1.global_variables_initializer()
    graph = load_op_graph(g.as_graph_def(), sinks=["train_op"], batch_size=BATCH, loss="loss", source="script.pb")
    strategy = load_strategy(os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json"))
    step = rewrite_step(graph, strategy, load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json")),
                        init_op=init.name)
    assert dict(step.feeds) == {"learning_rate:0": True, "scale:0": False}
    names = [n.name for n in step.graph_def.node]
    assert names.count("learning_rate") == 1 and "learning_rate/replica_1" in names  # one fed node, per-replica reads
    with pytest.raises(InputError, match=r"script.pb: placeholders: 'learning_rate' must be fed.*"
                                         r"placeholder_with_default"):
        StepRunner("grpc://localhost:1", step)


@pytest.mark.multiprocess
@pytest.mark.parametrize("loss_op", ["Identity", "Mean", "Sum"])
def test_an_unchanged_loop_that_fetches_its_own_loss_sees_the_steps_loss(local_cluster, loss_op):
    """The script's loss tensor reads the rewritten step's global loss (it computed a second
    forward pass on the script's stale variables: the same number every step). Other tensors of
    the script (an accuracy, a confidence, the kernel itself, a value read inside a cond) read the
    trained replica 0 (they read the values of the last save, with a warning); a value read inside
    a cond that also writes a variable, whose read the hook does not re-point, warns once."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    v1 = tf.compat.v1
    strategy = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    cluster = os.path.join(ROOT, "clusters", "local_cpu.json")
    fx, fy = _feeds()[0]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 16], name="features")
        y = v1.placeholder(tf.int32, [None], name="labels")
        logits = v1.layers.dense(x, 4, name="dense_0", kernel_initializer=v1.glorot_uniform_initializer(seed=1))
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = {"Identity": lambda: tf.identity(tf.reduce_mean(ce), name="loss"),
                "Mean": lambda: tf.reduce_mean(ce, name="loss"),
                "Sum": lambda: tf.reduce_sum(ce, name="loss")}[loss_op]()
        assert loss.op.type == loss_op
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.float32))
        confidence = tf.reduce_max(tf.nn.softmax(logits), name="confidence")
        rate = 0.5 / (BATCH if loss_op == "Sum" else 1)  # a summed loss's gradient is BATCH times larger
        train_op = tf.group(v1.train.GradientDescentOptimizer(rate).minimize(loss), name="train_op")
        hook = PlacementHook(strategy, cluster, train_op, loss)
        kernel = v1.trainable_variables()[0]
        in_cond = tf.cond(tf.reduce_all(y >= 0), lambda: tf.reduce_sum(kernel), lambda: tf.constant(0.0),
                          name="in_cond")
        counter = v1.get_variable("counter", [], initializer=tf.zeros_initializer(), trainable=False,
                                  use_resource=True)

        def count_and_sum():
            with tf.control_dependencies([counter.assign_add(1.0)]):
                return tf.reduce_sum(kernel)
        writes_in_cond = tf.cond(tf.reduce_all(y >= 0), count_and_sum, lambda: tf.constant(0.0), name="writes_in_cond")
        with v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook],
                                               config=hook.session_config(local_cluster.session_config())) as sess:
            seen = [sess.run([train_op, loss, hook.loss], feed_dict={x: fx, y: fy})[1:] for _ in range(3)]
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                # fetched by name while another graph is the default (looked up in the session's graph)
                with tf.Graph().as_default():
                    got = sess.run([accuracy, confidence.name, kernel, hook.variables, in_cond],
                                   feed_dict={x: fx, y: fy})
            with pytest.warns(UserWarning, match="'writes_in_cond.*' is computed from the script's variables"):
                sess.run([train_op, writes_in_cond], feed_dict={x: fx, y: fy})
    mine, theirs = np.array(seen).T
    assert np.array_equal(mine, theirs) and mine[0] > mine[1] > mine[2], seen  # the same batch: it falls
    accuracy_got, confidence_got, kernel_got, trained, in_cond_got = got
    logits_np = fx @ trained["dense_0/kernel"] + trained["dense_0/bias"]
    assert in_cond_got == pytest.approx(np.sum(trained["dense_0/kernel"]), rel=1e-5)  # a v2 cond reads replica 0
    assert np.array_equal(kernel_got, trained["dense_0/kernel"])
    assert accuracy_got == pytest.approx(np.mean(np.argmax(logits_np, 1) == fy))
    softmax = np.exp(logits_np - logits_np.max(1, keepdims=True))
    assert confidence_got == pytest.approx(np.max(softmax / softmax.sum(1, keepdims=True)), rel=1e-5)


def test_a_run_of_a_step_with_reference_variables_is_refused_with_the_fix():
    """A TF1 script built after disable_v2_behavior() has VariableV2 variables: the rewritten step
    failed in TensorFlow's importer ("passed float_ref ... incompatible with expected resource")."""
    import tensorflow as tf
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 16], name="features")
        w = v1.Variable(tf.ones([16, 4]), name="w", use_resource=False)
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        init = v1.global_variables_initializer()
    assert any(n.op == "VariableV2" for n in g.as_graph_def().node)
    graph = load_op_graph(g.as_graph_def(), sinks=["train"], batch_size=BATCH, loss="loss", source="ref.pb")
    strategy = load_strategy(os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json"))
    step = rewrite_step(graph, strategy, load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json")),
                        init_op=init.name)
    with pytest.raises(InputError, match=r"ref.pb: variables: 1 reference variables \(VariableV2, e.g. 'w'\).*"
                                         r"enable_resource_variables"):
        StepRunner("grpc://localhost:1", step)


@pytest.mark.parametrize("feed_rows, label_rows, says", [
    (16, 16, None),
    (8, 8, "features:0: holds 8 samples on axis 0"),     # would train on rows that are not there
    (40, 40, "features:0: holds 40 samples on axis 0"),  # would leave 24 rows out
    (16, 12, "labels:0: holds 12 samples on axis 0"),
])
def test_a_feed_of_another_batch_than_the_strategys_is_refused(feed_rows, label_rows, says):
    from tfplace.formats.errors import InputError
    from tfplace.formats.strategy import load_strategy
    from tfplace.rewrite.graph_rewrite import InputSpec
    from tfplace.rewrite.hook import check_feed_batches
    strategy = load_strategy(os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json"))
    assert strategy.global_batch_size == 16
    inputs = [InputSpec("features:0", "float32", (16, 16), 0), InputSpec("labels:0", "int32", (16,), 0)]
    feed = {"features:0": np.zeros((feed_rows, 16), np.float32), "labels:0": [0] * label_rows}
    if says is None:
        check_feed_batches(inputs, feed, strategy)
        return
    with pytest.raises(InputError) as info:
        check_feed_batches(inputs, feed, strategy)
    assert says in str(info.value) and "global batch of 16" in str(info.value), str(info.value)


@pytest.mark.multiprocess
def test_the_hook_refuses_a_feed_of_another_batch_before_the_step_runs(local_cluster):
    import tensorflow as tf
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.hook import PlacementHook
    strategy = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    with tf.Graph().as_default():
        x, y, loss, train_op, _, _ = mlp_training_script()
        hook = PlacementHook(strategy, os.path.join(ROOT, "clusters", "local_cpu.json"), train_op, loss)
        with tf.compat.v1.train.MonitoredTrainingSession(master=local_cluster.target,
                                                         config=hook.session_config(local_cluster.session_config()),
                                                         hooks=[hook]) as sess:
            fx, fy = _feeds()[0]
            with pytest.raises(InputError, match="features:0: holds 8 samples"):
                sess.run(train_op, feed_dict={x: fx[:8], y: fy[:8]})


STRATEGY = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
LOCAL_CPU = os.path.join(ROOT, "clusters", "local_cpu.json")


@pytest.mark.parametrize("optimizer, global_step", [("adam", True), ("adam", False), ("momentum", True)])
def test_without_train_op_the_hook_repoints_the_group_the_script_runs(optimizer, global_step):
    """minimize() puts its own op in TRAIN_OP (with a global step, an AssignAddVariableOp); the
    script runs its tf.group around it, and that is the op the hook re-points."""
    import tensorflow as tf
    from tfplace.rewrite.hook import SCOPE, PlacementHook
    with tf.Graph().as_default() as g:
        _, _, loss, train_op, _, _ = mlp_training_script(optimizer=optimizer, global_step=global_step)
        hook = PlacementHook(STRATEGY, LOCAL_CPU, loss=loss)
        hook.begin()
        assert train_op.control_inputs[0].name.startswith(f"{SCOPE}/"), [op.name for op in train_op.control_inputs]
        assert g.get_operation_by_name(f"{SCOPE}/{hook.step.train_op}") is train_op.control_inputs[0]


def test_a_value_read_after_the_step_does_not_take_the_train_ops_place():
    """minimize's NoOp is in TRAIN_OP and the script also reads the loss after it: the hook keeps
    re-pointing the NoOp (a value computed after the step is no group the script trains with)."""
    import tensorflow as tf
    from tfplace.rewrite.hook import SCOPE, PlacementHook
    with tf.Graph().as_default() as g:
        _, _, loss, train_op, _, _ = mlp_training_script(optimizer="sgd")
        with tf.control_dependencies([train_op]):
            tf.identity(loss, name="loss_after")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        hook = PlacementHook(STRATEGY, LOCAL_CPU, loss=loss)
        hook.begin()
        assert g.get_operation_by_name(f"{SCOPE}/{hook.step.train_op}") is train_op.control_inputs[0]


@pytest.mark.parametrize("build, says", [
    ("two_groups", "2 ops could be the train op ('a', 'b'); pass the op the script runs as train_op="),
    ("reference_variables", "variable 'dense_0/kernel' is a VariableV2; the hook needs resource variables"),
])
def test_the_hook_says_what_to_change_in_the_script(build, says):
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    with tf.Graph().as_default():
        if build == "reference_variables":  # what tf.compat.v1.disable_v2_behavior() gives
            tf.compat.v1.disable_resource_variables()
            try:
                _, _, loss, train_op, _, _ = mlp_training_script(optimizer="sgd")
            finally:
                tf.compat.v1.enable_resource_variables()
            hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        else:
            _, _, loss, train_op, _, _ = mlp_training_script(optimizer="sgd")
            tf.group(train_op, name="a")
            tf.group(train_op, name="b")
            tf.compat.v1.get_default_graph().clear_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
            hook = PlacementHook(STRATEGY, LOCAL_CPU, loss=loss)
        with pytest.raises(ValueError, match="PlacementHook: .*" + says.replace("(", r"\(").replace(")", r"\)")):
            hook.begin()


_FAILING_SCRIPT = """
import os, sys
import tensorflow as tf
from tfplace.rewrite.hook import PlacementHook
from tfplace.runtime.local_cluster import LocalCluster
from tfplace.testing import mlp_training_script
tf.compat.v1.disable_eager_execution()

class Raises(tf.compat.v1.train.SessionRunHook):
    def after_create_session(self, session, coord):
        raise RuntimeError("a hook of the script failed")

with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1]) as lc, tf.Graph().as_default():
    x, y, loss, train_op, _, _ = mlp_training_script(optimizer="sgd")
    hook = PlacementHook(sys.argv[1], sys.argv[2], train_op, loss)
    with tf.compat.v1.train.MonitoredTrainingSession(master=lc.target, config=hook.session_config(lc.session_config()),
                                                     hooks=[hook, Raises()]) as sess:
        pass
"""


@pytest.mark.multiprocess
def test_a_script_whose_session_creation_fails_exits_instead_of_hanging(tmp_path):
    """The session MonitoredTrainingSession opened stays open when a hook raises while it is
    created; closed by its finalizer after the servers stopped, TensorFlow retried that RPC forever.
    The cluster now closes it first: the script ends with its error (a hang times out here)."""
    import subprocess
    import sys
    script = tmp_path / "script.py"
    script.write_text(_FAILING_SCRIPT)
    result = subprocess.run([sys.executable, str(script), STRATEGY, LOCAL_CPU], capture_output=True, text=True,
                            timeout=90, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.rstrip().endswith("RuntimeError: a hook of the script failed"), result.stderr[-2000:]


def test_a_reference_variable_outside_the_step_does_not_stop_the_hook():
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    with tf.Graph().as_default():
        _, _, loss, train_op, _, _ = mlp_training_script(optimizer="sgd")
        tf.compat.v1.disable_resource_variables()
        try:
            tf.compat.v1.Variable(0, name="epoch_counter")  # a VariableV2 the step never touches
        finally:
            tf.compat.v1.enable_resource_variables()
        hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        hook.begin()
        assert hook.step is not None and "epoch_counter" not in hook.step.variables


def test_a_strategy_for_another_cluster_is_refused_when_the_hook_is_made():
    """Before the script starts its servers or a session: the hook checks the strategy's devices."""
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.hook import PlacementHook
    with pytest.raises(InputError) as err:
        PlacementHook(os.path.join(ROOT, "examples", "formats", "strategy.json"),
                      os.path.join(ROOT, "clusters", "local_cpu.json"))
    assert err.value.field == "default.shares.v100_0" and "cpu0" in err.value.fix


# examples/hook_example.py's command line: usage on --help, one line and exit status 2 for bad input
EXAMPLE_ARGS = [
    (["--help"], 0, "python examples/hook_example.py [strategy.json]"),
    (["-h"], 0, "python examples/hook_example.py [strategy.json]"),
    ([os.path.join(ROOT, "examples", "formats", "strategy.json")], 2, "default.shares.v100_0: unknown device"),
    (["nope.json"], 2, "nope.json"),
    ([os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json"), "five"], 2, "steps as a whole number"),
    (["s.json", "5", "ckpt", "extra"], 2, "give at most these three arguments (4 given)"),
]


@pytest.mark.parametrize("argv, status, says", EXAMPLE_ARGS)
def test_the_hook_example_answers_help_and_bad_input_in_one_line(argv, status, says, tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "hook_example.py"), *argv],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == status and "Traceback" not in result.stderr, result.stderr[-2000:]
    if status == 0:
        assert says in result.stdout and not errors
    else:
        assert len(errors) == 1 and says in errors[0] and "Fix:" in errors[0], result.stderr[-2000:]


def _lr_schedule_script(optimizer="sgd"):
    """A script with a learning-rate variable the loop sets with its own assign ops (a schedule).
    Returns (x, y, loss, train_op, lr, lr value placeholder, {"set"|"add"|"sub": write}, an op that
    re-initialises the optimizer's slots)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, 16], name="features")
    y = v1.placeholder(tf.int32, [None], name="labels")
    logits = v1.layers.dense(x, 4, name="dense_0", kernel_initializer=v1.glorot_uniform_initializer(seed=1))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
    lr = v1.get_variable("lr", [], initializer=tf.constant_initializer(0.5), trainable=False, use_resource=True)
    value = v1.placeholder(tf.float32, [], name="lr_value")
    writes = {"set": lr.assign(value), "add": lr.assign_add(value), "sub": lr.assign_sub(value)}
    opt = v1.train.MomentumOptimizer(lr, 0.9) if optimizer == "momentum" else v1.train.GradientDescentOptimizer(lr)
    train_op = tf.group(opt.minimize(loss), name="train_op")
    return x, y, loss, train_op, lr, value, writes, v1.variables_initializer(opt.variables())


def _hooked_or_plain_session(run, local_cluster, train_op, loss):
    """A MonitoredTrainingSession of the script in the default graph: with a PlacementHook on the
    cluster (`run == "hooked"`), or the plain single-device one."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    if run != "hooked":
        return tf.compat.v1.train.MonitoredTrainingSession()
    hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
    return tf.compat.v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook],
                                                       config=hook.session_config(local_cluster.session_config()))


LR_SCHEDULE = [("step", None), ("set", 0.0), ("step", None), ("add", 0.25), ("step", None), ("sub", 0.125),
               ("step", None)]


@pytest.mark.multiprocess
def test_a_variable_the_script_assigns_reaches_the_steps_replicas(local_cluster):
    """The step reads the replicas of a learning-rate variable; the script's own `lr.assign(...)`
    (and assign_add/sub) wrote only the script's variable: a step after `lr = 0` still trained at 0.5,
    with no error. Hooked and plain runs of one schedule end with the same kernel."""
    import tensorflow as tf
    fx, fy = _feeds()[0]
    kernels = {}
    for run in ("hooked", "plain"):
        with tf.Graph().as_default() as g:
            x, y, loss, train_op, _, value, writes, _ = _lr_schedule_script()
            with _hooked_or_plain_session(run, local_cluster, train_op, loss) as sess:
                frozen = []
                for what, amount in LR_SCHEDULE:
                    if what == "step":
                        before = sess.run(g.get_tensor_by_name("dense_0/kernel/Read/ReadVariableOp:0"))
                        sess.run(train_op, feed_dict={x: fx, y: fy})
                        after = sess.run(g.get_tensor_by_name("dense_0/kernel/Read/ReadVariableOp:0"))
                        frozen.append(np.array_equal(before, after))
                    else:
                        sess.run(writes[what], feed_dict={value: amount})
                kernels[run] = sess.run(g.get_tensor_by_name("dense_0/kernel/Read/ReadVariableOp:0"))
        assert frozen == [False, True, False, False], (run, frozen)  # the step at lr 0 leaves the kernel
    assert _rel(kernels["hooked"], kernels["plain"]) <= 1e-5


@pytest.mark.multiprocess
@pytest.mark.parametrize("write", ["load", "reset_slots"])
def test_a_variable_the_script_initialises_again_reaches_the_steps_replicas(local_cluster, write):
    """`lr.load(0.0, sess)` runs lr's initializer with the value fed, and a script that resets its
    optimizer's slots runs their initializers mid-training: the hook did not mirror initializers,
    so the step kept training at lr 0.5 with the old momentum, silently. Hooked and plain kernels agree."""
    import tensorflow as tf
    kernels = {}
    for run in ("hooked", "plain"):
        with tf.Graph().as_default() as g:
            x, y, loss, train_op, lr, _, _, reset = _lr_schedule_script("momentum")
            with _hooked_or_plain_session(run, local_cluster, train_op, loss) as sess:
                for i, (fx, fy) in enumerate(_feeds()):
                    if i == 1:
                        lr.load(0.25, sess) if write == "load" else sess.run(reset)
                    sess.run(train_op, feed_dict={x: fx, y: fy})
                kernels[run] = sess.run(g.get_tensor_by_name("dense_0/kernel/Read/ReadVariableOp:0"))
    assert _rel(kernels["hooked"], kernels["plain"]) <= 1e-5


@pytest.mark.multiprocess
def test_an_embedding_lookup_of_the_script_reads_the_trained_table(local_cluster):
    """tf.nn.embedding_lookup of a resource variable is a ResourceGather, not a ReadVariableOp: a
    lookup the script fetched besides its step (an accuracy, a prediction) read the table of the
    last save, with a warning. It reads replica 0 now: the rows of the trained table, no warning."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    v1 = tf.compat.v1
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, (BATCH, 3)).astype(np.int32)
    labels = rng.integers(0, 4, BATCH).astype(np.int32)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.int32, [None, 3], name="ids")
        y = v1.placeholder(tf.int32, [None], name="labels")
        table = v1.get_variable("table", [4, 8], initializer=v1.glorot_uniform_initializer(seed=3), use_resource=True)
        rows = tf.nn.embedding_lookup(table, x)
        logits = v1.layers.dense(tf.reduce_mean(rows, 1), 4, name="dense_0",
                                 kernel_initializer=v1.glorot_uniform_initializer(seed=1))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train_op = tf.group(v1.train.GradientDescentOptimizer(1.0).minimize(loss), name="train_op")
        hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        with v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook],
                                               config=hook.session_config(local_cluster.session_config())) as sess:
            for _ in range(STEPS):
                sess.run(train_op, feed_dict={x: ids, y: labels})
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got, trained = sess.run([rows, hook.variables["table"]], feed_dict={x: ids})
    assert _rel(got, trained[ids]) == 0.0


def test_an_update_of_a_step_variable_outside_the_train_op_is_refused():
    """A GAN script that runs its generator's train op apart from the discriminator's (the one the
    hook re-points): the generator's updates wrote the script's variables, which the step never reads
    and the next save overwrote: the generator silently did not train. begin() refuses it, naming
    the update, before it changes the train op."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 16], name="features")
        y = v1.placeholder(tf.int32, [None], name="labels")
        fake = v1.layers.dense(x, 16, name="generator")
        logits = v1.layers.dense(fake, 4, name="discriminator")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        d_train = tf.group(v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, var_list=v1.trainable_variables("discriminator")), name="d_train")
        v1.train.GradientDescentOptimizer(0.1).minimize(-loss, var_list=v1.trainable_variables("generator"))
        hook = PlacementHook(STRATEGY, LOCAL_CPU, d_train, loss)
        before = [op.name for op in d_train.control_inputs]
        with pytest.raises(ValueError, match=r"PlacementHook: '.*ResourceApplyGradientDescent' .* updates "
                                             r"'generator/(kernel|bias)' outside the train op"):
            hook.begin()
        assert [op.name for op in d_train.control_inputs] == before


@pytest.mark.multiprocess
def test_a_batch_norm_under_a_training_placeholder_trains_on_several_tasks_and_evaluates_trained(local_cluster):
    """tf.compat.v1.layers.batch_normalization(training=<placeholder>) updates its moving averages
    in v2 conds whose branch functions colocate nodes by name: with the cond's replicas on two
    tasks the first step failed ("Cannot merge devices with incompatible tasks"). It trains now, and
    the script's evaluation (training=False: the moving averages, read inside a cond) computes from
    the trained replica 0, as numpy does from hook.variables."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    from tfplace.testing import batch_norm_training_script
    v1 = tf.compat.v1
    fx, fy = _feeds()[0]
    with tf.Graph().as_default() as g:
        x, y, loss, train_op, _, training = batch_norm_training_script()
        logits = g.get_tensor_by_name("d1/BiasAdd:0")
        hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        with v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook],
                                               config=hook.session_config(local_cluster.session_config())) as sess:
            initial = sess.run(hook.variables)
            losses = [sess.run([train_op, hook.loss], feed_dict={x: fx, y: fy})[1] for _ in range(3)]
            logits_eval, w = sess.run([logits, hook.variables], feed_dict={x: fx, training: False})
    assert losses[0] > losses[-1], losses
    assert not np.array_equal(w["bn/moving_mean"], initial["bn/moving_mean"])  # the updates ran
    h_np = (fx @ w["d0/kernel"] + w["d0/bias"] - w["bn/moving_mean"]) / np.sqrt(w["bn/moving_variance"] + 1e-3)
    h_np = np.maximum(h_np * w["bn/gamma"] + w["bn/beta"], 0.0)
    assert _rel(logits_eval, h_np @ w["d1/kernel"] + w["d1/bias"]) <= 1e-5


def test_a_cond_that_assigns_a_step_variable_is_refused_and_one_that_assigns_another_is_not():
    """A v2 cond that assigns the learning rate outside the step wrote the script's variable alone,
    which the step never reads, silently; one that assigns a counter of the script's own (not a step
    variable) while reading the kernel is left to run."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    v1 = tf.compat.v1
    for target, refused in (("lr", True), ("counter", False)):
        with tf.Graph().as_default():
            x, y, loss, train_op, lr, value, _, _ = _lr_schedule_script()
            counter = v1.get_variable("counter", [], initializer=tf.zeros_initializer(), use_resource=True,
                                      trainable=False)
            written = {"lr": lr, "counter": counter}[target]
            kernel = v1.trainable_variables()[0]

            def write():
                with tf.control_dependencies([written.assign(value)]):
                    return tf.reduce_sum(kernel)
            tf.cond(value > 0, write, lambda: tf.constant(0.0), name="maybe_write")
            hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
            if refused:
                with pytest.raises(ValueError, match=r"'maybe_write' \(If\) updates 'lr' outside the train op"):
                    hook.begin()
            else:
                hook.begin()


@pytest.mark.multiprocess
def test_a_write_the_script_builds_between_two_sessions_reaches_the_replicas(local_cluster):
    """A second MonitoredTrainingSession on the same graph and hook: an assign built after the first
    session closed (the graph is unfinalized then) was not set up, so it wrote the script's
    variable alone. begin() sets up what was built since: lr = 0 freezes the next step."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    fx, fy = _feeds()[0]
    with tf.Graph().as_default():
        x, y, loss, train_op, lr, _, _, _ = _lr_schedule_script()
        hook = PlacementHook(STRATEGY, LOCAL_CPU, train_op, loss)
        config = hook.session_config(local_cluster.session_config())
        with tf.compat.v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook], config=config) as s:
            s.run(train_op, feed_dict={x: fx, y: fy})
        freeze = lr.assign(0.0)
        with tf.compat.v1.train.MonitoredTrainingSession(master=local_cluster.target, hooks=[hook], config=config) as s:
            s.run(freeze)
            before = s.run(hook.variables["dense_0/kernel"])
            s.run(train_op, feed_dict={x: fx, y: fy})
            after = s.run(hook.variables["dense_0/kernel"])
    tf.compat.v1.Session.reset(local_cluster.target)
    assert np.array_equal(before, after)
