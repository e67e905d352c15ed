"""The Grappler plugin (tfplace.rewrite.grappler): the same rewrite as the session hook, applied by
TensorFlow's meta optimizer to an unchanged tf.compat.v1 graph.

Unit: grappler_entry.optimize returns exactly rewrite_step's GraphDef for the graph Grappler hands
it, aliases fetched variable reads, refuses renamed fetches, and leaves function bodies alone.
Plugin: a failed rewrite fails the session's run (fail closed); on a 3-task LocalCluster the plugin
session trains like the hooked session (losses and variables to 1e-6 relative after N steps), and
its partition graphs hold the replicas on every task (the rewrite ran, in the master).
"""

import os

import numpy as np
import pytest

from tfplace.testing import mlp_training_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGY = os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")
STEPS, BATCH = 3, 16


def _graph_def():
    import tensorflow as tf
    with tf.Graph().as_default() as g:
        mlp_training_script()
    return g.as_graph_def()


def _params(**overrides):
    params = {"strategy": STRATEGY, "cluster": CLUSTER, "train_op": "train_op", "loss": "loss"}
    params.update(overrides)
    return params


def _feeds():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((BATCH, 16)).astype(np.float32), rng.integers(0, 4, BATCH).astype(np.int32))
            for _ in range(STEPS)]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-8))


@pytest.fixture(scope="module")
def plugin():
    from tfplace.rewrite import grappler
    try:
        return grappler.load_plugin()
    except grappler.PluginBuildError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("params,field", [
    (_params(strategy=""), "parameter_map.strategy"),
    ({"strategy": "s", "cluster": "c"}, "parameter_map.train_op"),
    (_params(loss_reduction="max"), "parameter_map.loss_reduction"),
    (_params(strategy_path="s"), "parameter_map"),
], ids=["empty_strategy", "no_train_op", "bad_reduction", "unknown_key"])
def test_params_are_validated(params, field):
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.grappler_entry import PluginParams
    with pytest.raises(InputError) as err:
        PluginParams.from_map(params)
    assert err.value.field == field


def test_entry_returns_the_rewritten_step():
    from tensorflow.core.framework import graph_pb2
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite
    from tfplace.rewrite.grappler_entry import optimize
    gd = _graph_def()
    strategy = load_strategy(STRATEGY)
    expected = rewrite(load_op_graph(gd, sinks=["train_op"], batch_size=strategy.global_batch_size, loss="loss"),
                       strategy, load_cluster(CLUSTER), init_op="init")
    out = graph_pb2.GraphDef.FromString(optimize(gd.SerializeToString(), ["train_op", "loss:0"], _params()))
    assert out == expected
    names = {n.name for n in out.node}
    assert {"train_op", "init", "loss", "features", "labels"} <= names  # what the script fetches / feeds
    assert any(n.name.endswith("/replica_1") for n in out.node)


def test_entry_aliases_variable_reads_and_refuses_renamed_fetches():
    from tensorflow.core.framework import graph_pb2
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.grappler_entry import optimize
    gd = _graph_def().SerializeToString()
    read = "dense_0/kernel/Read/ReadVariableOp"
    out = graph_pb2.GraphDef.FromString(optimize(gd, ["train_op", read + ":0"], _params()))
    alias = next(n for n in out.node if n.name == read)
    assert alias.op == "Identity" and list(alias.input) == ["tfplace/read/dense_0/kernel/replica_0:0"]
    with pytest.raises(InputError, match="dense_0/MatMul:0"):
        optimize(gd, ["train_op", "dense_0/MatMul:0"], _params())


def test_entry_keeps_function_bodies_and_rewritten_graphs():
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.grappler_entry import optimize
    gd = _graph_def().SerializeToString()
    assert optimize(gd, [], _params(train_op="not_here"), item_id="some_function") is None
    rewritten = optimize(gd, ["train_op"], _params())
    assert optimize(rewritten, ["train_op"], _params()) is None
    with pytest.raises(InputError, match="not_here"):
        optimize(gd, ["train_op"], _params(train_op="not_here"))


def test_an_edited_strategy_file_is_rewritten_anew(tmp_path):
    """One process, two sessions, the strategy file edited between them: the second gets the new
    strategy's rewrite (the cache was keyed by the file's path and returned the old one)."""
    import json
    import shutil
    from tensorflow.core.framework import graph_pb2
    from tfplace.rewrite.grappler_entry import optimize
    path = str(tmp_path / "strategy.json")
    shutil.copy(STRATEGY, path)
    gd = _graph_def().SerializeToString()

    def tasks():
        out = graph_pb2.GraphDef.FromString(optimize(gd, ["train_op"], _params(strategy=path)))
        return {n.device.split("/task:")[1][0] for n in out.node if "/replica_" in n.name and "/task:" in n.device}
    assert tasks() == {"0", "1", "2"}
    with open(path) as f:
        strategy = json.load(f)
    strategy["default"]["shares"] = {"cpu0": 16}
    with open(path, "w") as f:
        json.dump(strategy, f)
    assert tasks() == {"0"}


def test_an_init_op_the_graph_lacks_is_named_with_the_parameter_to_pass():
    from tfplace.formats.errors import InputError
    from tfplace.rewrite.grappler_entry import optimize
    with pytest.raises(InputError) as err:
        optimize(_graph_def().SerializeToString(), ["train_op"], _params(init_op="my_init"))
    assert err.value.field == "parameter_map.init_op" and "'my_init'" in err.value.problem
    assert "session_config(..., init_op=...)" in err.value.fix


def test_a_failed_rewrite_fails_the_run(plugin):
    """TensorFlow would run the original graph after an optimizer error; the plugin makes it fail."""
    import tensorflow as tf
    from tfplace.rewrite.grappler import session_config
    with tf.Graph().as_default() as g:
        x, y, loss, train_op, init, _ = mlp_training_script()
        config = session_config(STRATEGY, CLUSTER, train_op="no_such_op", loss=loss)
        with tf.compat.v1.Session(graph=g, config=config) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="no_such_op"):
                sess.run(init)


@pytest.fixture(scope="module")
def local_cluster(plugin):
    from tfplace.rewrite.grappler import worker_env
    from tfplace.runtime.local_cluster import LocalCluster
    env = worker_env(plugin)
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1], env_per_task=[env] * 3) as lc:
        yield lc


def _plugin_run(lc, feeds, script=mlp_training_script):
    """The script, unchanged, on a session configured with the plugin: losses, variables before and
    after, and the partition graphs of one step."""
    import tensorflow as tf
    from tfplace.rewrite.grappler import session_config
    with tf.Graph().as_default() as g:
        x, y, loss, train_op, init = script()[:5]
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        config = session_config(STRATEGY, CLUSTER, lc.session_config(), train_op=train_op, loss=loss)
        with lc.session(graph=g, config=config) as sess:
            sess.run(init)
            before = sess.run(variables)
            meta = tf.compat.v1.RunMetadata()
            losses = [sess.run([train_op, loss], feed_dict={x: fx, y: fy},
                               options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                               run_metadata=meta)[1] for fx, fy in feeds]
            after = sess.run(variables)
    return losses, before, after, meta.partition_graphs


def _hook_run(lc, feeds, script=mlp_training_script):
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    with tf.Graph().as_default():
        x, y, loss, train_op = script()[:4]
        hook = PlacementHook(STRATEGY, CLUSTER, train_op, loss)
        with tf.compat.v1.train.MonitoredTrainingSession(master=lc.target, hooks=[hook],
                                                         config=hook.session_config(lc.session_config())) as sess:
            before = sess.run(hook.variables)
            losses = [sess.run([train_op, hook.loss], feed_dict={x: fx, y: fy})[1] for fx, fy in feeds]
            after = sess.run(hook.variables)
    return losses, before, after


@pytest.mark.multiprocess
def test_plugin_session_trains_like_the_hook(local_cluster):
    feeds = _feeds()
    losses, before, after, partitions = _plugin_run(local_cluster, feeds)
    hook_losses, hook_before, hook_after = _hook_run(local_cluster, feeds)
    tasks = {n.device.split("/task:")[1].split("/")[0] for p in partitions for n in p.node
             if "/replica_" in n.name and "/task:" in n.device}
    assert tasks == {"0", "1", "2"}, "the step that ran is not the rewritten one"
    assert set(after) == set(hook_after) and len(after) == 2 * 4  # kernels, biases, momentum slots
    for name in before:
        assert _rel(before[name], hook_before[name]) == 0.0, f"{name}: initialised differently"
        assert not np.array_equal(after[name], before[name]) or "bias" in name, f"{name} did not train"
        assert _rel(after[name], hook_after[name]) <= 1e-6, f"{name}: plugin and hook runs differ"
    assert np.allclose(losses, hook_losses, rtol=1e-6, atol=0)


@pytest.mark.multiprocess
def test_a_batch_norm_under_a_training_placeholder_trains_under_the_plugin_like_the_hook(local_cluster):
    """The batch norm's moving averages update in v2 conds, which TensorFlow lowered to Switch/Merge
    before the plugin ran: the rewrite refused the graph as TF1 control flow (with a fix the script
    had already applied). session_config keeps If ops whole; the step trains like the hook's."""
    from tfplace.testing import batch_norm_training_script
    feeds = _feeds()
    losses, before, after, _ = _plugin_run(local_cluster, feeds, batch_norm_training_script)
    hook_losses, _, hook_after = _hook_run(local_cluster, feeds, batch_norm_training_script)
    assert "bn/moving_mean" in after and not np.array_equal(after["bn/moving_mean"], before["bn/moving_mean"])
    assert np.allclose(losses, hook_losses, rtol=1e-6, atol=0)
    for name, value in hook_after.items():
        # atol: d0/bias, before the batch norm, has a zero gradient: it holds round-off (~1e-8)
        assert np.allclose(after[name], value, rtol=1e-6, atol=1e-7), f"{name}: plugin and hook runs differ"


def test_a_plugin_config_needs_the_plugin_loaded_here(monkeypatch):
    """Without the library, TensorFlow skips the unknown optimizer and runs the graph unplaced with
    no error: session_config refuses before that can happen."""
    from tfplace.formats.errors import InputError
    from tfplace.rewrite import grappler
    monkeypatch.setattr(grappler, "_loaded", [])
    with pytest.raises(InputError, match=r"not loaded in this process") as err:
        grappler.session_config(STRATEGY, CLUSTER, train_op="train_op")
    assert "load_plugin()" in err.value.fix
    monkeypatch.setattr(grappler, "_loaded", ["/some/libtfplace_grappler.so"])
    assert grappler.session_config(STRATEGY, CLUSTER, train_op="train_op").graph_options.rewrite_options.optimizers


def test_a_train_op_given_as_a_tensor_is_named_by_its_op(monkeypatch):
    """session_config takes ops, tensors or names; a tensor's name ("step_out:0") is no node of the
    graph, and the plugin failed the run with "no op 'step_out:0'" for the tensor the script passed."""
    import tensorflow as tf
    from tfplace.rewrite import grappler
    monkeypatch.setattr(grappler, "_loaded", ["/some/libtfplace_grappler.so"])
    with tf.Graph().as_default():
        _, _, loss, train_op, init, _ = mlp_training_script()
        with tf.control_dependencies([train_op]):
            step_out = tf.identity(loss, name="step_out")
        config = grappler.session_config(STRATEGY, CLUSTER, train_op=step_out, init_op=init, loss=loss)
    custom, = config.graph_options.rewrite_options.custom_optimizers
    params = {k: v.s.decode() for k, v in custom.parameter_map.items()}
    assert (params["train_op"], params["init_op"], params["loss"]) == ("step_out", "init", "loss:0")


def test_a_library_that_does_not_load_is_a_plugin_build_error_with_the_fix(monkeypatch, tmp_path):
    from tfplace.rewrite import grappler
    monkeypatch.setattr(grappler, "_loaded", [])
    path = tmp_path / "libtfplace_grappler.so"
    path.write_bytes(b"not a shared library")
    with pytest.raises(grappler.PluginBuildError, match="cannot load the tfplace Grappler plugin .*"
                                                        r"build_plugin\(force=True\)"):
        grappler.load_plugin(str(path))
    assert grappler._loaded == []


@pytest.mark.parametrize("compiler, says", [
    ("false", "building the tfplace Grappler plugin failed"),    # the compiler fails
    ("not_a_program", "cannot run the C\\+\\+ compiler"),         # an executable file that is not one
])
def test_a_failed_build_says_why_and_leaves_no_file(monkeypatch, tmp_path, compiler, says):
    from tfplace.rewrite import grappler
    if compiler == "not_a_program":
        compiler = str(tmp_path / "cxx")
        with open(compiler, "wb") as f:
            f.write(b"\x00\x01 neither ELF nor a script")
        os.chmod(compiler, 0o755)
    monkeypatch.setenv("CXX", compiler)
    cache = tmp_path / "cache"
    with pytest.raises(grappler.PluginBuildError, match=says):
        grappler.build_plugin(cache_dir=str(cache))
    assert [f for _, _, files in os.walk(cache) for f in files] == []


def test_the_build_is_keyed_by_the_compiler_command(monkeypatch, tmp_path):
    """A library built by another command (compiler, flags) is not reused; every checkout of the
    same source shares one (the source's path is not in the key)."""
    from tfplace.rewrite import grappler
    monkeypatch.setenv("CXX", "g++")
    gxx = grappler.plugin_path(str(tmp_path))
    monkeypatch.setenv("CXX", "clang++")
    assert grappler.plugin_path(str(tmp_path)) != gxx
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setattr(grappler, "SOURCE", str(tmp_path / "grappler_plugin.cc"))
    with open(grappler.SOURCE, "wb") as out, open(os.path.join(ROOT, "tfplace", "rewrite", "grappler_plugin.cc"),
                                                   "rb") as src:
        out.write(src.read())
    assert grappler.plugin_path(str(tmp_path)) == gxx


@pytest.mark.parametrize("env_per_task, refused", [
    (None, True),                                    # the docs' script without worker_env(): unplaced
    ([{"TFPLACE_WORKER_LIBRARIES": "/x.so"}, None], False),   # task 0 runs Grappler: it has the library
    ([None, {"TFPLACE_WORKER_LIBRARIES": "/x.so"}], True),
])
def test_a_local_cluster_session_refuses_a_plugin_config_its_master_cannot_run(monkeypatch, env_per_task, refused):
    from tfplace.formats.errors import InputError
    from tfplace.rewrite import grappler
    from tfplace.runtime.local_cluster import LocalCluster
    monkeypatch.delenv("TFPLACE_WORKER_LIBRARIES", raising=False)
    monkeypatch.setattr(grappler, "_loaded", ["/x.so"])
    lc = LocalCluster(num_tasks=2, env_per_task=env_per_task)
    config = grappler.session_config(STRATEGY, CLUSTER, train_op="train_op")
    if refused:
        with pytest.raises(InputError, match="task 0") as err:
            lc._check_grappler_plugin(config)
        assert "env_per_task=[grappler.worker_env()] * 2" in err.value.fix
    else:
        lc._check_grappler_plugin(config)
    lc._check_grappler_plugin(lc.session_config())  # no plugin in the config: nothing to check


def test_the_sentinel_waits_in_the_script_and_the_entry_removes_it():
    """session_config's sentinel: the train op waits for an Assert(false) (once, however often it
    is called); the rewrite the plugin returns has neither the Assert nor the wait, and equals the
    rewrite of the graph without them."""
    import tensorflow as tf
    from tfplace.rewrite import grappler
    from tfplace.rewrite.grappler_entry import SENTINEL, optimize, strip_sentinel
    with tf.Graph().as_default() as g:
        _, _, _, train_op, _, _ = mlp_training_script()
        with tf.name_scope("somewhere"):  # a script's scope does not move it
            assert grappler.add_sentinel(train_op) and grappler.add_sentinel(train_op)
        assert not grappler.add_sentinel("train_op")  # a name: nothing to change
    sentinel = g.get_operation_by_name(SENTINEL)
    assert sentinel.type == "Assert" and [c.name for c in train_op.control_inputs].count(SENTINEL) == 1
    with_sentinel = g.as_graph_def()
    stripped = type(with_sentinel)()
    stripped.CopyFrom(with_sentinel)
    assert strip_sentinel(stripped) and not strip_sentinel(stripped)
    assert not any(SENTINEL in n.name or any(SENTINEL in i for i in n.input) for n in stripped.node)
    assert len(stripped.node) == len(_graph_def().node)
    parse = type(with_sentinel).FromString  # (protobuf's serialisation of maps has no fixed order)
    out = parse(optimize(with_sentinel.SerializeToString(), ["train_op"], _params()))
    assert out == parse(optimize(_graph_def().SerializeToString(), ["train_op"], _params()))


@pytest.mark.multiprocess
def test_a_master_without_the_plugin_fails_the_step_instead_of_running_it_unplaced(plugin):
    """The docs' script with a plain tf.compat.v1.Session on servers started without worker_env():
    TensorFlow skips the unknown optimizer; the sentinel's Assert fails the first step, naming the fix
    (it trained on one device, exit 0, before)."""
    import tensorflow as tf
    from tfplace.rewrite.grappler import session_config
    from tfplace.runtime.local_cluster import LocalCluster
    (fx, fy), = _feeds()[:1]
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1]) as lc, tf.Graph().as_default() as g:
        x, y, loss, train_op, init, _ = mlp_training_script()
        config = session_config(STRATEGY, CLUSTER, lc.session_config(), train_op=train_op, loss=loss)
        with tf.compat.v1.Session(lc.target, graph=g, config=config) as sess:
            sess.run(init)
            with pytest.raises(tf.errors.InvalidArgumentError, match="did not rewrite this graph.*worker_env"):
                sess.run(train_op, feed_dict={x: fx, y: fy})
