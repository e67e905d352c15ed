"""Your own training step in, with one command (docs/your_own_model.md).

A hand-built tf.compat.v1 step written as .pb, .pbtxt and .meta works in groups, compare and
simulate with no flags (train op, loss, reduction, inputs and init op inferred); ambiguous steps
give exit 2 naming the flag; the page's commands (a Keras model outside the zoo exported with
`export_keras`, then compare and simulate) run as written."""

import json
import os
import re
import shlex
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from tfplace.cli import common, compare, groups, simulate
from tfplace.formats.errors import InputError
from tfplace.ir.loader import load_op_graph

v1 = tf.compat.v1
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
CLUSTER = os.path.join(ROOT, "clusters", "two_kind_4gpu.json")


def _step(kind="plain", reduce=tf.reduce_mean):
    """A tiny step: placeholders x [None, 8], y [None]; `kind` "two_losses" (one train op over two
    minimizes) or "two_train_ops" (two ungrouped minimizes)."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        h = v1.layers.Dense(16, activation=tf.nn.relu, name="hidden")(x)
        losses = []
        for k in range(1 if kind == "plain" else 2):
            logits = v1.layers.Dense(4, name=f"head{k}")(h)
            losses.append(reduce(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                                 name=f"loss{k}"))
        steps = [v1.train.GradientDescentOptimizer(0.1).minimize(l, name=f"step{k}") for k, l in enumerate(losses)]
        if kind != "two_train_ops":
            v1.add_to_collection(v1.GraphKeys.TRAIN_OP, tf.group(*steps, name="train"))
        v1.global_variables_initializer()
    return graph


def _write(graph, folder, suffix):
    path = str(folder / f"step{suffix}")
    if suffix == ".meta":
        with graph.as_default():
            v1.train.export_meta_graph(filename=path, graph=graph)
    else:
        tf.io.write_graph(graph.as_graph_def(add_shapes=True), str(folder), f"step{suffix}", as_text=suffix == ".pbtxt")
    return path


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt", ".meta"])
def test_bare_step_loads_with_every_role_inferred(tmp_path, suffix):
    g = load_op_graph(_write(_step(), tmp_path, suffix), batch_size=8)
    assert g.names[g.sink] == "train"
    assert g.names[g.tensor_op[g.loss_tensor]] == "loss0" and g.loss_reduction == "mean"
    assert sorted(g.names[i] for i in g.inputs) == ["x", "y"]
    assert g.meta["init_op"] == "init" and g.meta["optimizer"] == "sgd" and g.meta["learning_rate"] == 0.1


def test_sum_reduction_is_detected(tmp_path):
    g = load_op_graph(_write(_step(reduce=tf.reduce_sum), tmp_path, ".pb"), batch_size=8)
    assert g.loss_reduction == "sum"


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt", ".meta"])
def test_commands_take_a_bare_step_with_no_flags(tmp_path, suffix, capsys):
    path = _write(_step(), tmp_path, suffix)
    assert common.call(groups, ["--graph", path, "--max-groups", "3"]) == 0
    out = tmp_path / "cmp"
    assert common.call(compare, ["--graph", path, "--cluster", CLUSTER, "--out", str(out), "--no-plot",
                                 "--strategies", "dp_even_allreduce,heft"]) == 0
    assert "batch 32" in capsys.readouterr().out  # the default batch of a None-batch step
    strategy = str(out / "strategies" / "heft.json")
    assert common.call(simulate, ["--graph", path, "--cluster", CLUSTER, "--strategy", strategy]) == 0
    assert "iteration time" in capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".pb", ".meta"])
def test_plan_takes_a_bare_step_with_no_flags(tmp_path, suffix, monkeypatch, capsys):
    """plan makes a bundle of the step (import_step) at the default batch of a None-batch step, and
    calls the graph by the step's name, as the strategy does (not the cached bundle's stem)."""
    from tfplace.cli import plan
    from tfplace.formats.strategy import load_strategy
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step(), tmp_path, suffix)
    name = os.path.basename(path)[:-len(suffix)]
    out = tmp_path / "s.json"
    assert common.call(plan, ["--graph", path, "--cluster", CLUSTER, "--samples", "0", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    strategy = load_strategy(str(out))
    assert strategy.global_batch_size == 32 and strategy.graph == name
    assert capsys.readouterr().out.startswith(f"{name}: best "), "the result line names the step"


@pytest.mark.parametrize("loss", ["nope", "nope:0"])
def test_a_loss_the_step_lacks_is_one_line_naming_the_seeded_one(tmp_path, loss, capsys):
    path = _write(_step(), tmp_path, ".pb")
    assert common.call(groups, ["--graph", path, "--max-groups", "3", "--loss", loss]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "loss: no op named 'nope'; the gradients flow from 'loss0'. Fix: name the scalar loss's op" in err, err


@pytest.mark.parametrize("args", [["--train_op", "nosuch"], ["--train_op", "train,nosuch"],
                                  ["--train_op", "nosuch", "--loss", "loss0", "--loss_reduction", "mean"]])
def test_a_train_op_the_step_lacks_is_one_line_naming_the_flag(tmp_path, args, capsys):
    """The role the user gave (--train_op), not the loader's argument (sinks)."""
    path = _write(_step(), tmp_path, ".pb")
    assert common.call(groups, ["--graph", path, "--max-groups", "3", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and ": sinks:" not in err, err
    assert f"{path}: train_op: no node named 'nosuch'" in err and "--train_op" in err.split("Fix:")[1], err


@pytest.mark.parametrize("role, key, value", [("train_op", "train_ops", ["nosuch"]), ("loss", "loss", "nosuch")])
def test_a_role_a_config_entry_names_and_the_step_lacks_is_that_entrys_key(tmp_path, monkeypatch, role, key, value):
    from tfplace.formats.config import load_train_config
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import train_lib
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step(), tmp_path, ".pb")
    config = load_train_config(_train_config(tmp_path, {"graph": path, "batch_size": 8, key: value}))
    with pytest.raises(InputError) as err:
        train_lib.config_bundles(config, bundle_for_entry)
    assert (err.value.source, err.value.field) == (config.source, f"graphs[0].{key}")
    assert "'nosuch'" in err.value.problem and path in err.value.problem and f'"{key}"' in err.value.fix
    assert "--" not in err.value.fix


def _optimizer_step(optimizer, grouped, global_step):
    """A tiny step trained by `optimizer` (a tf.compat.v1.train optimizer name), with a global step
    or not, its minimize op run as is or in `tf.group(..., name="train_op")`."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        logits = v1.layers.Dense(4, name="head")(v1.layers.Dense(16, activation=tf.nn.relu, name="hidden")(x))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        opt = {"Adam": lambda: v1.train.AdamOptimizer(0.01), "RMSProp": lambda: v1.train.RMSPropOptimizer(0.01),
               "Momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9)}[optimizer]()
        step = opt.minimize(loss, global_step=v1.train.get_or_create_global_step() if global_step else None)
        if grouped:
            tf.group(step, name="train_op")
        v1.global_variables_initializer()
    return graph


@pytest.mark.parametrize("suffix", [".pb", ".meta"])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("optimizer, global_step", [("Adam", False), ("Adam", True), ("RMSProp", True),
                                                    ("Momentum", False)])
def test_the_train_op_a_script_runs_is_inferred(tmp_path, suffix, grouped, optimizer, global_step):
    """Adam leaves reads of its beta powers that nothing consumes: no train op. A .meta's train_op
    collection holds minimize's op; the script runs the group around it, and so must the plan (the
    hook groups the script's graph with that group in it)."""
    g = load_op_graph(_write(_optimizer_step(optimizer, grouped, global_step), tmp_path, suffix), batch_size=8)
    assert g.names[g.sink] == ("train_op" if grouped else optimizer)


def test_of_two_groups_the_one_that_also_runs_the_other_is_the_train_op(tmp_path):
    """An exponential moving average updated after the train op: the EMA's group runs the step too."""
    graph = _step()
    with graph.as_default():
        train = graph.get_operation_by_name("train")
        with tf.control_dependencies([train]):
            ema = tf.train.ExponentialMovingAverage(0.9)
            tf.group(ema.apply(v1.trainable_variables()), name="train_and_average")
    graph.clear_collection(v1.GraphKeys.TRAIN_OP)
    g = load_op_graph(_write(graph, tmp_path, ".pb"), batch_size=8)
    assert g.names[g.sink] == "train_and_average"


def test_a_logging_write_beside_the_step_is_no_train_op(tmp_path):
    """A running average of the loss (a variable write of its own) and a read of the loss after the
    step: neither runs all the other runs, so the step is ambiguous and says so, rather than
    training nothing but the average."""
    graph = _step()
    with graph.as_default():
        loss = graph.get_tensor_by_name("loss0:0")
        with tf.control_dependencies([graph.get_operation_by_name("train")]):
            tf.identity(loss, name="loss_after")
        average = v1.get_variable("loss_average", [], initializer=v1.zeros_initializer(), use_resource=True)
        average.assign(0.9 * average + 0.1 * loss, name="log_loss_average")
    graph.clear_collection(v1.GraphKeys.TRAIN_OP)
    with pytest.raises(InputError, match=r"2 ops could be the train op \(.*'loss_after'\)"):
        load_op_graph(_write(graph, tmp_path, ".pb"), batch_size=8)


def test_two_groups_of_the_same_updates_are_ambiguous(tmp_path):
    graph = _step()
    with graph.as_default():
        tf.group(graph.get_operation_by_name("train"), name="other")
        tf.group(graph.get_operation_by_name("train"), name="another")
    graph.clear_collection(v1.GraphKeys.TRAIN_OP)
    with pytest.raises(InputError, match=r"2 ops could be the train op \('another', 'other'\)"):
        load_op_graph(_write(graph, tmp_path, ".pb"), batch_size=8)


@pytest.mark.parametrize("kind,flag,fix_args", [
    ("two_train_ops", "--train_op", ["--train_op", "step0"]),  # a named train op: the default batch too
    ("two_losses", "--loss", ["--loss", "loss1"]),
])
def test_ambiguous_step_names_the_flag(tmp_path, kind, flag, fix_args, capsys):
    path = _write(_step(kind), tmp_path, ".pb")
    assert common.call(groups, ["--graph", path, "--max-groups", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and "step.pb" in err
    assert common.call(groups, ["--graph", path, "--max-groups", "3", *fix_args]) == 0


def test_bare_step_becomes_a_bundle_for_profile_and_runtime(tmp_path, monkeypatch):
    from tfplace.graph_defs import import_step, read_bundle

    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step("two_train_ops"), tmp_path, ".pb")
    meta_path = import_step(path, train_ops=["step0", "step1"], loss="loss0", batch_size=16)
    assert import_step(path, train_ops=["step0", "step1"], loss="loss0", batch_size=16) == meta_path  # cached
    graph_def, meta = read_bundle(meta_path)
    assert meta["sink"] == "tfplace_train_op" and meta["global_batch_size"] == 16 and meta["init_op"] == "init"
    assert meta["loss"] == "loss0" and meta["loss_reduction"] == "mean" and meta["optimizer"] == "sgd"
    assert load_op_graph(meta_path).num_ops > 0


def _train_config(tmp_path, entry):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"format": "tfplace.train_config", "graphs": [entry], "clusters": [CLUSTER],
                                "output_dir": str(tmp_path / "run")}))
    return str(path)


def test_a_config_entry_names_the_roles_of_an_ambiguous_step(tmp_path, monkeypatch):
    from tfplace.formats.config import load_train_config
    from tfplace.graph_defs.export import bundle_for_entry
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step("two_train_ops"), tmp_path, ".pb")
    bare = load_train_config(_train_config(tmp_path, {"graph": path, "batch_size": 8})).graphs[0]
    with pytest.raises(InputError) as err:
        bundle_for_entry(bare)
    assert '"train_ops": ["NAME"]' in err.value.fix and "--train_op" not in err.value.fix  # the config's key
    named = load_train_config(_train_config(tmp_path, {"graph": path, "batch_size": 8, "train_ops": ["step0"]})).graphs[0]
    assert named.train_ops == ("step0",)
    graph = load_op_graph(bundle_for_entry(named))
    assert graph.names[graph.sink] == "step0" and graph.reference_batch_size == 8
    # the role keys belong to a bare step only
    with pytest.raises(InputError) as err:
        load_train_config(_train_config(tmp_path, {"model": "tiny_mlp", "batch_size": 8, "loss": "loss"}))
    assert err.value.field.endswith("loss")


def test_train_runs_a_bare_step_with_the_roles_its_config_entry_names(tmp_path, monkeypatch):
    """train's config entry names the roles of an ambiguous step ("train_ops"); the run takes them
    (it once read the .pb with every role inferred, and stopped on the ambiguity they resolve)."""
    from tfplace.formats.config import load_train_config
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import train_lib
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step("two_train_ops"), tmp_path, ".pb")
    config = load_train_config(_train_config(tmp_path, {"graph": path, "batch_size": 8, "train_ops": ["step1"]}))
    [bundle] = train_lib.config_bundles(config, bundle_for_entry)
    graph = load_op_graph(bundle)
    assert graph.names[graph.sink] == "step1" and graph.reference_batch_size == 8
    bare = load_train_config(_train_config(tmp_path, {"graph": path, "batch_size": 8}))
    with pytest.raises(InputError) as err:
        train_lib.config_bundles(bare, bundle_for_entry)
    assert err.value.field == "train_op" and '"train_ops"' in err.value.fix


def test_activate_names_a_bare_steps_rows_by_the_step_and_its_batch(tmp_path, monkeypatch):
    """Not by the hashed stem of the cached bundle it is imported into: the same step at two
    batches gives two rows a reader tells apart."""
    from tfplace.cli import activate
    from tfplace.formats.config import load_activate_config
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(_step(), tmp_path, ".pb")
    config = tmp_path / "a.json"
    config.write_text(json.dumps({"cluster": os.path.join(ROOT, "clusters", "local_cpu.json"), "baselines": ["single"],
                                  "graphs": [{"graph": path, "batch_size": 6}, {"graph": path, "batch_size": 12}]}))
    jobs = activate._jobs(load_activate_config(str(config)))
    assert [j["name"] for j in jobs] == ["single.step_b6", "single.step_b12"]
    assert all(os.path.dirname(j["graph"]) == str(tmp_path / "cache") for j in jobs)  # run from the cached bundles


@pytest.mark.parametrize("kind, field, key", [("two_train_ops", "train_op", '"train_ops"'),
                                               ("two_losses", "loss", '"loss"')])
def test_activate_refuses_an_ambiguous_step_before_any_server_or_folder(tmp_path, monkeypatch, capsys, kind, field,
                                                                         key):
    """A role the import cannot infer is bad input of the config (exit 2, the entry's key in the
    fix), found before a server starts or the output folder is made, as train finds it."""
    from tfplace.cli import activate
    from tfplace.runtime import local_cluster
    monkeypatch.setenv("TFPLACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(local_cluster.LocalCluster, "start", lambda self: pytest.fail("a server was started"))
    path = _write(_step(kind), tmp_path, ".pb")
    config = tmp_path / "a.json"
    config.write_text(json.dumps({"cluster": os.path.join(ROOT, "clusters", "local_cpu.json"), "baselines": ["single"],
                                  "graphs": [{"graph": path, "batch_size": 6}], "output_dir": str(tmp_path / "out")}))
    assert common.call(activate, [str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {field}: ") and err.count("\n") == 1, err
    assert "Fix: name" in err and key in err and "config's graph entry" in err and "--" not in err.split("Fix:")[1]
    assert not (tmp_path / "out").exists()


def _step_with_a_learning_rate_placeholder():
    """A step whose learning rate is a placeholder with no default: a run that feeds the batch
    alone cannot run it."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        lr = v1.placeholder(tf.float32, [], name="lr")
        logits = v1.layers.Dense(4, name="head")(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        v1.train.GradientDescentOptimizer(lr).minimize(loss, name="train")
        v1.global_variables_initializer()
    return graph


@pytest.mark.parametrize("command, args", [
    # one child per kind used to fail, and the parent died with a RuntimeError traceback (exit 1)
    ("tfplace.profile", ["--cluster", "clusters/local_cpu.json", "--batch-sizes", "4", "--repeats", "1",
                         "--out", "p.json"]),
    # used to search and measure first, then fail every real run (exit 1)
    ("tfplace.plan", ["--cluster", "clusters/local_cpu.json", "--overheads", "clusters/local_cpu.overheads.json",
                      "--confirm_real", "1", "--confirm_rounds", "1", "--confirm_steps", "2", "--out", "s.json"]),
])
def test_a_placeholder_the_batch_cannot_feed_is_refused_before_any_run(tmp_path, command, args):
    """docs/your_own_model.md: profile and plan --confirm_real feed only the batch, so they refuse a
    step with a placeholder that has no default, naming it: one line, exit 2, nothing started."""
    path = _write(_step_with_a_learning_rate_placeholder(), tmp_path, ".pb")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, TFPLACE_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", command, "--graph", path, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "'lr' must be fed" in lines[0] and "placeholder_with_default" in lines[0]
    assert lines[0].startswith(f"error: {path}: placeholders:")  # the user's file, not its imported copy
    assert "checking" not in run.stdout and "search" not in run.stdout


# ---- the page: a Keras model outside the zoo -------------------------------------------------
def _page_commands():
    text = open(os.path.join(ROOT, "docs", "your_own_model.md"), encoding="utf-8").read()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = " ".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip().startswith("python")]


@pytest.mark.slow
def test_page_commands_run_as_written(tmp_path):
    commands = _page_commands()
    assert [c[1] if c[1] != "-m" else c[2] for c in commands][:3] == [
        "examples/export_densenet.py", "tfplace.compare", "tfplace.simulate"]
    for name in ("examples", "clusters"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    outputs = []
    for cmd in commands:
        run = subprocess.run([sys.executable, *cmd[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, (cmd, run.stderr[-2000:])
        outputs.append(run.stdout)
    assert "densenet121_b32_momentum.json" in outputs[0]
    assert "densenet121" in outputs[1] and "heft" in outputs[1]
    assert "iteration time" in outputs[2]
    # then profiled on a local emulated cluster and planned, the plan checked for real there
    assert [c[2] for c in commands[3:]] == ["tfplace.profile", "tfplace.plan"]
    assert "for real: median of 1 round(s)" in outputs[4] and "strategy written to densenet_strategy.json" in outputs[4]
    assert os.path.exists(tmp_path / "densenet_strategy.json")
    from tfplace.overheads.model import load_overheads  # --overheads measure: measured here, stamped
    assert load_overheads(tmp_path / "densenet_strategy.overheads.json").machine_probe_s > 0
    _, meta = __import__("tfplace.graph_defs", fromlist=["read_bundle"]).read_bundle(
        str(tmp_path / "my_models" / "densenet121_b32_momentum.json"))
    assert [i["name"] for i in meta["inputs"]] == ["input_0", "labels"]  # no feed of Keras's own input


@pytest.mark.slow
def test_efficientnet_with_dropout_and_drop_connect_exports_and_loads(tmp_path):
    from tfplace.graph_defs import export_keras, read_bundle

    path = export_keras(lambda: tf.keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3),
                                                                       classes=10, classifier_activation=None),
                        loss="sparse_categorical_crossentropy", batch_size=8, input_shapes=[(32, 32, 3)],
                        out_dir=str(tmp_path), name="efficientnet_b0")
    graph_def, meta = read_bundle(path)
    assert sorted(n.name for n in graph_def.node if n.op == "Placeholder") == ["input_0", "labels"]
    g = load_op_graph(path)
    assert g.loss_reduction == "mean" and any("AssignMovingAvg" in g.names[u] for v in g.variables for u in v.updaters)


def test_named_train_op_without_loss_gets_the_loss_inferred(tmp_path):
    g = load_op_graph(_write(_step(), tmp_path, ".pb"), sinks=["train"], batch_size=4)
    assert g.names[g.tensor_op[g.loss_tensor]] == "loss0" and g.loss_reduction == "mean"


def _averaged_embedding_step():
    """A bag of embeddings: the mean over a lookup's positions, whose gradient TensorFlow builds with a
    Fill of ones of its own (gradients/Mean_grad/ones), beside the seed of the loss."""
    graph = tf.Graph()
    with graph.as_default():
        ids = v1.placeholder(tf.int32, [None, 6], name="ids")
        y = v1.placeholder(tf.int32, [None], name="y")
        table = v1.get_variable("table", [20, 8], use_resource=True)
        h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
        logits = v1.layers.Dense(4, name="head")(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        v1.train.AdamOptimizer(0.01).minimize(loss, name="train")
        v1.global_variables_initializer()
    assert "gradients/Mean_grad/ones" in [n.name for n in graph.as_graph_def().node]  # what the test is about
    return graph


def test_a_fill_of_ones_inside_a_gradient_is_no_loss_seed(tmp_path):
    """Only the seed of tf.gradients names the loss: the Fill of ones in the Mean gradient of the
    averaged lookup made 'Mean' a second loss candidate (exit 2, "2 tensors seed gradients")."""
    g = load_op_graph(_write(_averaged_embedding_step(), tmp_path, ".pb"), batch_size=8)
    assert g.names[g.tensor_op[g.loss_tensor]] == "loss" and g.loss_reduction == "mean"


# ---- a TF2-style tf.function training step (export_train_step) -----------------------------
OPTIMIZERS = {"legacy_sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
              "legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
              "adam": lambda: tf.keras.optimizers.Adam(0.01)}


def _make_step(optimizer, reduce=tf.reduce_mean):
    """A step factory: Dense-BatchNorm-Dense MLP on x [N, 8], class ids y [N] in [0, 4), seeded."""
    def make_step():
        init = tf.keras.initializers.RandomUniform(-0.3, 0.3, seed=1)
        model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init),
                                     tf.keras.layers.BatchNormalization(),
                                     tf.keras.layers.Dense(4, kernel_initializer=init)])
        opt = OPTIMIZERS[optimizer]()

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = reduce(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return train_step
    return make_step


SPECS = [((8,), "float32"), ((), "int32", 4)]


def _bundle_losses(meta_path, x, y, steps):
    from tfplace.graph_defs import read_bundle

    graph_def, meta = read_bundle(meta_path)
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph) as sess:
            sess.run(meta["init_op"])
            feed = {"input_0:0": x, "input_1:0": y}
            return [sess.run([meta["loss"] + ":0", meta["sink"]], feed)[0] for _ in range(steps)]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_tf_function_step_exports_and_trains_like_eager(tmp_path, optimizer):
    from tfplace.graph_defs import export_train_step

    path = export_train_step(_make_step(optimizer), input_specs=SPECS, batch_size=16, out_dir=str(tmp_path),
                             name="mlp")
    assert os.path.basename(path) == "mlp_b16.json"
    g = load_op_graph(path)
    assert g.names[g.sink] == "train_op" and g.names[g.tensor_op[g.loss_tensor]] == "loss"
    assert g.loss_reduction == "mean" and sorted(g.names[i] for i in g.inputs) == ["input_0", "input_1"]
    assert g.meta["inputs"][1]["max_value"] == 4 and g.reference_batch_size == 16
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 8).astype(np.float32), rng.randint(0, 4, 16).astype(np.int32)
    step = _make_step(optimizer)()
    eager = [float(step(x, y)) for _ in range(3)]  # the reference: the same step run by TensorFlow
    np.testing.assert_allclose(_bundle_losses(path, x, y, 3), eager, rtol=1e-5)


def test_tf_function_step_runs_in_compare_and_simulate(tmp_path, capsys):
    from tfplace.graph_defs import export_train_step

    path = export_train_step(_make_step("legacy_adam"), input_specs=SPECS, batch_size=16, out_dir=str(tmp_path),
                             name="mlp")
    out = tmp_path / "cmp"
    assert common.call(compare, ["--graph", path, "--cluster", CLUSTER, "--out", str(out), "--no-plot",
                                 "--strategies", "dp_even_allreduce,heft"]) == 0
    strategy = str(out / "strategies" / "heft.json")
    assert common.call(simulate, ["--graph", path, "--cluster", CLUSTER, "--strategy", strategy]) == 0
    assert "iteration time" in capsys.readouterr().out


def test_tf_function_step_initialises_a_variable_after_those_its_initial_value_reads(tmp_path):
    """A new Keras optimizer with a learning-rate schedule starts `current_learning_rate` at
    schedule(iterations): its initializer reads `iteration`. Without an order between the two
    initializers the init op raced; a rewritten step that put them on two lanes read `iteration`
    before it existed (FailedPrecondition 'Could not find variable iteration/replica_0')."""
    from tfplace.graph_defs import export_train_step, read_bundle

    def make_step():
        model = tf.keras.Sequential([tf.keras.layers.Dense(4)])
        opt = tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5))

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return train_step

    path = export_train_step(make_step, input_specs=[((8,), "float32"), ((), "int64", 4)], batch_size=6,
                             out_dir=str(tmp_path), name="scheduled")
    graph_def, _ = read_bundle(path)
    read = next(n for n in graph_def.node if n.name == "ExponentialDecay/Cast_2/ReadVariableOp")  # initial value's
    assert read.input[0] == "iteration" and "^iteration/Assign" in read.input, read


def test_tf_function_step_that_returns_a_vector_names_the_fix(tmp_path):
    from tfplace.graph_defs import export_train_step

    with pytest.raises(InputError) as err:
        export_train_step(_make_step("legacy_sgd", reduce=tf.identity), input_specs=SPECS, batch_size=16,
                          out_dir=str(tmp_path), name="bad")
    assert err.value.field == "step" and "shape (None,)" in err.value.problem
    assert "tf.reduce_mean" in err.value.fix and not os.listdir(tmp_path)


@pytest.mark.parametrize("keep", [["train"], ["loss0"], ["train", "init", "loss0"], ["init"]])
def test_the_step_is_pruned_as_tensorflows_extract_sub_graph_prunes_it(keep):
    from tfplace.graph_defs.user_step import _subgraph
    graph_def = _step().as_graph_def()
    ours = _subgraph(graph_def, keep)
    theirs = v1.graph_util.extract_sub_graph(graph_def, keep)
    assert [n.name for n in ours.node] == [n.name for n in theirs.node] and len(ours.node) < len(graph_def.node)
    assert ours == theirs


def _small_keras_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(8,))])


@pytest.mark.parametrize("change, field, says", [
    ({"loss": None}, "loss", "is None"),
    ({"loss": "no_such_loss"}, "loss", "'no_such_loss' is no Keras loss"),
    ({"loss": "categorical_crossentropy"}, "loss", "label_shape=(3,), label_dtype='float32'"),  # ids, not one-hot
    ({"loss": lambda labels, outputs: tf.reduce_mean(outputs)}, "loss", "not one value per example"),
    ({"model_fn": "built"}, "model_fn", "is Sequential, not a function that builds the model"),
    ({"out_dir": "/proc/no_such_folder"}, "out_dir", "cannot be made"),
])
def test_export_keras_names_the_argument_to_change(tmp_path, change, field, says):
    from tfplace.graph_defs import export_keras
    args = {"model_fn": _small_keras_model, "loss": "sparse_categorical_crossentropy", "out_dir": str(tmp_path)}
    args.update(change)
    if args["model_fn"] == "built":
        with tf.Graph().as_default():
            args["model_fn"] = _small_keras_model()
    with pytest.raises(InputError) as info:
        export_keras(args.pop("model_fn"), args.pop("loss"), batch_size=4, input_shapes=[(8,)], name="small", **args)
    assert info.value.field == field and says in str(info.value), str(info.value)
    assert not list(tmp_path.glob("small*"))


def test_export_keras_makes_no_folder_for_a_call_it_refuses(tmp_path):
    from tfplace.graph_defs import export_keras
    with tf.Graph().as_default():
        built = _small_keras_model()
    with pytest.raises(InputError, match="model_fn"):
        export_keras(built, "mse", batch_size=4, input_shapes=[(8,)], out_dir=str(tmp_path / "new"), name="small")
    assert not (tmp_path / "new").exists()


def test_export_keras_takes_one_hot_labels_when_told(tmp_path):
    from tfplace.graph_defs import export_keras, read_bundle
    path = export_keras(_small_keras_model, "categorical_crossentropy", batch_size=4, input_shapes=[(8,)],
                        out_dir=str(tmp_path), name="small", label_shape=(3,), label_dtype="float32")
    assert read_bundle(path)[1]["inputs"][-1]["shape"] == [-1, 3]


def _embedding_model(input_dtype="float32", rows=50):
    """ids [N, 10] -> Embedding(rows, 8) -> mean over the ids -> Dense(4) logits."""
    ids = tf.keras.Input((10,), dtype=input_dtype)
    h = tf.keras.layers.GlobalAveragePooling1D()(tf.keras.layers.Embedding(rows, 8)(ids))
    return tf.keras.Model(ids, tf.keras.layers.Dense(4)(h))


def _run_bundle_once(path, batch=6, seed=0):
    """The loss of one step of the bundle, its inputs fed as the runtime feeds them (ints in
    [0, max_value), else 4; floats ~ N(0, 1))."""
    from tfplace.graph_defs import read_bundle

    graph_def, meta = read_bundle(path)
    rng = np.random.default_rng(seed)
    feed = {}
    for inp in meta["inputs"]:
        shape = [batch if d == -1 else d for d in inp["shape"]]
        value = (rng.integers(0, inp.get("max_value", 4), size=shape) if inp["dtype"].startswith("int")
                 else rng.standard_normal(shape))
        feed[inp["name"] + ":0"] = value.astype(inp["dtype"])
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph) as sess:
            sess.run(meta["init_op"])
            return sess.run([meta["loss"] + ":0", meta["sink"]], feed)[0]


def _regularised_model(kernel_l2=0.0, activity_l1=0.0):
    """x [N, 8] -> Dense(3) with every weight 0.5 and no bias: the kernel's L2 is 24 * 0.25 = 6."""
    x = tf.keras.Input((8,))
    dense = tf.keras.layers.Dense(3, use_bias=False, kernel_initializer=tf.keras.initializers.Constant(0.5),
                                  kernel_regularizer=tf.keras.regularizers.l2(kernel_l2) if kernel_l2 else None,
                                  activity_regularizer=tf.keras.regularizers.l1(activity_l1) if activity_l1 else None)
    return tf.keras.Model(x, dense(x))


@pytest.mark.parametrize("activity_l1", [0.0, 0.01])
def test_export_keras_adds_the_models_regularisation_losses(tmp_path, activity_l1):
    """model.losses (kernel and activity regularisers, add_loss) are part of the loss Keras trains:
    they were dropped, so the bundle trained another model, silently. The activity loss Keras
    records for its own Input would need a feed of that Input: only the call's own is added."""
    from tfplace.graph_defs import export_keras
    plain = export_keras(_regularised_model, "sparse_categorical_crossentropy", batch_size=4,
                         input_shapes=[(8,)], out_dir=str(tmp_path / "plain"), name="reg")
    decayed = export_keras(lambda: _regularised_model(kernel_l2=1.0, activity_l1=activity_l1),
                           "sparse_categorical_crossentropy", batch_size=4, input_shapes=[(8,)],
                           out_dir=str(tmp_path / "decayed"), name="reg")
    added = _run_bundle_once(decayed, batch=4) - _run_bundle_once(plain, batch=4)
    if activity_l1:
        assert added > 6.0
    else:
        assert added == pytest.approx(6.0, rel=1e-5)


@pytest.mark.parametrize("model_dtype, inputs, max_value", [
    ("float32", {"input_specs": [((10,), "int32", 50)]}, 50),  # declared, with its range
    ("float32", {"input_specs": [((10,), "int32", 20)]}, 20),  # a narrower range is kept
    ("float32", {"input_specs": [((10,), "int64")]}, 50),  # declared int, range from the table's rows
    ("int32", {"input_shapes": [(10,)]}, 50),  # the model's own tf.keras.Input says int32
])
def test_export_keras_feeds_embedding_ids_in_range(tmp_path, model_dtype, inputs, max_value):
    from tfplace.graph_defs import export_keras, read_bundle

    path = export_keras(lambda: _embedding_model(model_dtype), "sparse_categorical_crossentropy", batch_size=6,
                        out_dir=str(tmp_path), name="embed", **inputs)
    spec = read_bundle(path)[1]["inputs"][0]
    declared = inputs.get("input_specs", [((), model_dtype)])[0][1]
    assert (spec["name"], spec["dtype"], spec["max_value"]) == ("input_0", declared, max_value)
    assert np.isfinite(_run_bundle_once(path))  # ids out of [0, 50) fail in ResourceGather


@pytest.mark.parametrize("inputs, field, says", [
    ({"input_shapes": [(10,)]}, "input_shapes[0]", "input_specs=[..., ((10,), 'int32', 50), ...]"),  # floats as ids
    ({"input_specs": [((10,), "float32")]}, "input_specs[0]", "((10,), 'int32', 50)"),
    ({"input_specs": [((10,), "int32", 60)]}, "input_specs[0]", "max_value 60, past the 50 rows"),
    ({"input_specs": [((10,), "no_such_dtype")]}, "input_specs[0]", "per input"),
    ({"input_shapes": [(10,)], "input_specs": [((10,), "int32")]}, "input_shapes", "both given"),
    ({}, "input_shapes", "is missing"),
])
def test_export_keras_refuses_ids_it_would_feed_out_of_range(tmp_path, inputs, field, says):
    from tfplace.graph_defs import export_keras

    with pytest.raises(InputError) as info:
        export_keras(_embedding_model, "sparse_categorical_crossentropy", batch_size=6, out_dir=str(tmp_path),
                     name="embed", **inputs)
    assert (info.value.source, info.value.field) == ("export_keras", field) and says in str(info.value), info.value
    assert not list(tmp_path.glob("embed*"))


def _two_input_model():
    """img [N, 7, 5, 3] and vec [N, 11] -> Dense(3) logits."""
    img, vec = tf.keras.Input((7, 5, 3)), tf.keras.Input((11,))
    h = tf.keras.layers.Concatenate()([tf.keras.layers.GlobalAveragePooling2D()(img), vec])
    return tf.keras.Model([img, vec], tf.keras.layers.Dense(3)(h))


def _two_output_model():
    x = tf.keras.Input((5,))
    return tf.keras.Model(x, [tf.keras.layers.Dense(3)(x), tf.keras.layers.Dense(2)(x)])


def _reshape_model():
    """A Sequential without declared inputs: only its call can refuse a shape."""
    return tf.keras.Sequential([tf.keras.layers.Reshape((4, 2)), tf.keras.layers.Dense(3)])


@pytest.mark.parametrize("model_fn, shapes, field, says", [
    (_two_input_model, [(7, 5, 4), (11,)], "input_shapes[0]", "is (7, 5, 4), the model's input 0 is (7, 5, 3)"),
    (_two_input_model, [(7, 5, 3), (11, 1)], "input_shapes[1]", "give (11,)"),
    (_two_input_model, [(7, 5, 3)], "input_shapes", "gives 1 input(s), the model takes 2"),
    (_two_input_model, [(7, 5, 3), (11,), (2,)], "input_shapes", "with the shapes [(7, 5, 3), (11,)]"),
    (_reshape_model, [(7,)], "input_shapes", "which the model refuses (total size of new array"),
    (_two_output_model, [(5,)], "model_fn", "with 2 outputs"),
])
def test_export_keras_names_inputs_and_outputs_that_do_not_fit_the_model(tmp_path, model_fn, shapes, field, says):
    from tfplace.graph_defs import export_keras

    with pytest.raises(InputError) as info:
        export_keras(model_fn, "sparse_categorical_crossentropy", batch_size=4, input_shapes=shapes,
                     out_dir=str(tmp_path), name="small")
    assert (info.value.source, info.value.field) == ("export_keras", field) and says in str(info.value), info.value
    assert not list(tmp_path.glob("small*"))


def _lstm_model(unroll):
    x = tf.keras.Input((9, 6))
    return tf.keras.Model(x, tf.keras.layers.Dense(3)(tf.keras.layers.LSTM(8, unroll=unroll)(x)))


@pytest.mark.parametrize("unroll", [False, True])
def test_export_keras_refuses_a_loop_as_every_command_would(tmp_path, unroll):
    from tfplace.formats.errors import UnsupportedGraphError
    from tfplace.graph_defs import export_keras

    def export():
        return export_keras(lambda: _lstm_model(unroll), "sparse_categorical_crossentropy", batch_size=4,
                            input_shapes=[(9, 6)], out_dir=str(tmp_path), name="lstm")
    if unroll:
        assert load_op_graph(export()).reference_batch_size == 4
        return
    with pytest.raises(UnsupportedGraphError) as info:
        export()
    assert info.value.source == "export_keras" and "contains a loop (" in info.value.problem
    assert "unroll=True for Keras RNNs" in info.value.fix and not list(tmp_path.glob("lstm*"))


@pytest.mark.parametrize("env, expected", [
    ({"TFPLACE_CACHE_DIR": "{tmp}/steps_here", "TFPLACE_CACHE": "{tmp}/all"}, "{tmp}/steps_here"),  # its own wins
    ({"TFPLACE_CACHE": "{tmp}/all"}, "{tmp}/all/steps"),  # under tfplace's whole cache
    ({}, "{home}/.cache/tfplace/steps"),
])
def test_the_imported_steps_cache_follows_tfplace_cache(tmp_path, monkeypatch, env, expected):
    from tfplace.graph_defs.user_step import cache_dir
    for name in ("TFPLACE_CACHE_DIR", "TFPLACE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    assert cache_dir() == expected.format(tmp=tmp_path, home=tmp_path / "home")
