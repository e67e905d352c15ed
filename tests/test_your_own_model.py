"""Your own training step in, with one command (docs/your_own_model.md).

A hand-built tf.compat.v1 step written as .pb, .pbtxt and .meta works in groups, compare and
simulate with no flags (train op, loss, reduction, inputs and init op inferred); ambiguous steps
give exit 2 naming the flag; the page's commands (a Keras model outside the zoo exported with
`export_keras`, then compare and simulate) run as written."""

import os
import re
import shlex
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf

from tfplace.cli import common, compare, groups, simulate
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


@pytest.mark.parametrize("kind,flag,fix_args", [
    ("two_train_ops", "--train_op", ["--train_op", "step0", "--batch-size", "8"]),  # a named op: no default batch
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
