"""Tests of the model zoo exporter and the bundle format (graph_defs/).

Fast tests use the tiny models and whatever bundles are already in graph_defs/zoo/ (the
committed ones, plus any generated earlier). Exporting the large generated models is
@pytest.mark.slow (each takes seconds to ~15 s; they are then cached in zoo/).
"""

import dataclasses
import glob
import json
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfplace.graph_defs import bundle, export, models  # noqa: E402

v1 = tf.compat.v1
ZOO_BUNDLES = sorted(glob.glob(os.path.join(export.ZOO_DIR, "*.json")))
ZOO_IDS = [os.path.basename(p)[:-5] for p in ZOO_BUNDLES]
TINY = models.model_names(tiny_only=True)
APPLY_OPS = {"sgd": "ResourceApplyGradientDescent", "momentum": "ResourceApplyMomentum",
             "adam": "ResourceApplyAdam"}


def _committed_entries():
    with open(export.MANIFEST_PATH) as f:
        return [e for e in json.load(f)["models"] if e["committed"]]


def _default_meta_path(name):
    spec, _, opts = export.resolve_options(name)
    return bundle.bundle_paths(export.ZOO_DIR, export.bundle_stem(spec, opts))[1]


def _random_feed(meta, batch, seed=0):
    """Valid random values for every input: ids below max_value, floats ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for inp in meta["inputs"]:
        shape = [batch if d == -1 else d for d in inp["shape"]]
        if "max_value" in inp:
            value = rng.integers(0, inp["max_value"], size=shape)
        else:
            value = rng.standard_normal(shape)
        feed[inp["name"] + ":0"] = value.astype(inp["dtype"])
    return feed


# ---------------------------------------------------------------- every bundle in the zoo
@pytest.mark.parametrize("meta_path", ZOO_BUNDLES, ids=ZOO_IDS)
def test_zoo_bundle_is_well_formed(meta_path):
    graph_def, meta = bundle.read_bundle(meta_path)
    nodes = {n.name: n for n in graph_def.node}
    assert nodes[meta["sink"]].op == "NoOp" and meta["sink"] == "train_op"
    assert nodes[meta["init_op"]].op == "NoOp" and meta["init_op"] == "init"
    assert meta["loss"] == "loss" and meta["loss_reduction"] == "mean"
    op_types = {n.op for n in graph_def.node}
    assert not op_types & {"VariableV2", "Variable"}, "ref variables found"
    assert "VarHandleOp" in op_types and APPLY_OPS[meta["optimizer"]] in op_types
    assert not op_types & {"Switch", "Merge", "Enter", "While", "StatelessWhile", "Assert"}
    assert meta["op_count"] == len(graph_def.node)
    handles = sum(1 for n in graph_def.node if n.op == "VarHandleOp")
    if meta["optimizer"] == "sgd":  # no optimizer slots: every variable is a model variable
        assert handles == meta["variable_count"]
    assert handles >= meta["variable_count"] > 0
    missing = [n.name for n in graph_def.node if "_output_shapes" not in n.attr]
    assert not missing, f"nodes without _output_shapes: {missing[:5]}"
    batch = meta["global_batch_size"]
    for inp in meta["inputs"]:
        dims = [d.size for d in nodes[inp["name"]].attr["shape"].shape.dim]
        assert dims == [batch if d == -1 else d for d in inp["shape"]], inp["name"]
        if inp["dtype"].startswith("int"):
            assert inp["max_value"] > 0
    assert 0 < meta["param_bytes"] == 4 * meta["param_count"]  # all float32
    assert meta["tf_version"] == tf.__version__ and meta["seed"] == 0


@pytest.mark.parametrize("meta_path", ZOO_BUNDLES, ids=ZOO_IDS)
def test_zoo_bundle_imports_at_two_batch_sizes(meta_path):
    graph_def, meta = bundle.read_bundle(meta_path)
    with tf.Graph().as_default():  # as stored, with its _output_shapes
        v1.import_graph_def(graph_def, name="")
    b = meta["global_batch_size"]
    shapes = []
    for batch in (b, 2 * b):
        gd = bundle.with_batch_size(graph_def, meta["inputs"], batch)
        with tf.Graph().as_default() as g:
            v1.import_graph_def(gd, name="")
            shapes.append([op.outputs[0].shape for op in g.get_operations()
                           if op.type in ("MatMul", "Conv2D", "Einsum")])
    # Activations are [N, ...] or flattened [N*L, ...]: their first dimension doubles.
    doubled = [s1 for s1, s2 in zip(*shapes) if s1.rank and s2[0] == 2 * s1[0]]
    assert doubled, "no tensor's first dimension scales with the batch"


def test_committed_bundles_match_manifest_and_gitignore():
    entries = _committed_entries()
    assert {e["model"] for e in entries} >= set(TINY)
    total = 0
    for e in entries:
        meta = bundle.read_meta(os.path.join(export.ZOO_DIR, e["stem"] + ".json"))
        assert meta["graph_bytes"] == e["graph_bytes"] <= export.COMMIT_LIMIT_BYTES
        total += e["graph_bytes"]
    assert total < 25_000_000
    with open(os.path.join(export.ZOO_DIR, ".gitignore")) as f:
        ignore = f.read().split("\n")
    for e in entries:
        assert f"!{e['stem']}.pb" in ignore and f"!{e['stem']}.json" in ignore


@pytest.mark.parametrize("name", TINY)
def test_committed_tiny_bundles_are_current(name):
    assert export.bundle_is_current(_default_meta_path(name), models.get_spec(name)), (
        f"{name}: committed bundle is stale; run python -m tfplace.cli.export --tiny "
        "--force --manifest")


# ---------------------------------------------------------------- tiny models, really run
@pytest.mark.parametrize("name", TINY)
def test_tiny_model_trains(name):
    graph_def, meta = bundle.read_bundle(_default_meta_path(name))
    feed = _random_feed(meta, meta["global_batch_size"])
    with tf.Graph().as_default() as g:
        v1.import_graph_def(graph_def, name="")
        handles = [op for op in g.get_operations() if op.type == "VarHandleOp"]
        assert len(handles) == meta["variable_count"]  # sgd: no optimizer slots
        reads = [tf.raw_ops.ReadVariableOp(resource=h.outputs[0], dtype=h.get_attr("dtype"))
                 for h in handles]
        with v1.Session(graph=g) as sess:
            sess.run(meta["init_op"])
            before = sess.run(reads)
            losses = [sess.run([meta["loss"] + ":0", meta["sink"]], feed)[0] for _ in range(3)]
            after = sess.run(reads)
    assert all(np.isfinite(losses)) and losses[2] < losses[0], losses
    changed = [not np.array_equal(a, b) for a, b in zip(before, after)]
    # Every variable moves: trainables through the optimizer, BN statistics through the
    # update ops hung on train_op.
    assert all(changed), f"{changed.count(False)} variables did not change"


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_optimizer_ops(tmp_path, optimizer):
    path = export.export_model("tiny_mlp", 8, optimizer=optimizer, learning_rate=0.05,
                               out_dir=str(tmp_path))
    assert os.path.basename(path) == f"tiny_mlp_b8_{optimizer}_lr0.05.json"
    graph_def, meta = bundle.read_bundle(path)
    ops = [n.op for n in graph_def.node]
    assert ops.count(APPLY_OPS[optimizer]) == 6  # 3 dense layers x (kernel, bias)
    assert "VariableV2" not in ops and not any(o.startswith("Apply") for o in ops)
    assert meta["optimizer"] == optimizer and meta["learning_rate"] == 0.05
    slots = {"sgd": 0, "momentum": 6, "adam": 14}[optimizer]  # adam: m, v + 2 beta powers
    assert ops.count("VarHandleOp") == meta["variable_count"] + slots


def test_export_is_deterministic(tmp_path):
    a = export.export_model("tiny_cnn", 4, out_dir=str(tmp_path / "a"))
    b = export.export_model("tiny_cnn", 4, out_dir=str(tmp_path / "b"))
    with open(a[:-5] + ".pb", "rb") as fa, open(b[:-5] + ".pb", "rb") as fb:
        assert fa.read() == fb.read()


def test_ensure_bundle_caches(tmp_path):
    out = str(tmp_path)
    path = export.ensure_bundle("tiny_mlp", out_dir=out, batch_size=4)
    stamp = os.path.getmtime(path)
    assert export.ensure_bundle("tiny_mlp", out_dir=out, batch_size=4) == path
    assert os.path.getmtime(path) == stamp                      # cached, not re-exported
    with open(path) as f:
        meta = json.load(f)
    meta["source_hash"] = "stale"
    with open(path, "w") as f:
        json.dump(meta, f)
    assert export.ensure_bundle("tiny_mlp", out_dir=out, batch_size=4) == path
    assert bundle.read_meta(path)["source_hash"] != "stale"     # re-exported


# ---------------------------------------------------------------- names and bad input
@pytest.mark.parametrize("name,opts,stem", [
    ("vgg19", {}, "vgg19_b64_s224_sgd"),
    ("resnet50", {"batch_size": 32, "optimizer": "momentum"}, "resnet50_b32_s224_momentum"),
    ("inception_v3", {}, "inception_v3_b64_s299_sgd"),
    ("nasnet", {"variant": "large"}, "nasnet_large_b64_s331_sgd"),
    ("bert_large", {}, "bert_large_b16_t128_n24_sgd"),
    ("transformer", {"num_layers": 2, "seq_len": 64}, "transformer_b32_t64_n2_sgd"),
    ("tiny_mlp", {"num_classes": 3, "seed": 2}, "tiny_mlp_b16_c3_sgd_seed2"),
])
def test_bundle_stem(name, opts, stem):
    spec, _, resolved = export.resolve_options(name, **opts)
    assert export.bundle_stem(spec, resolved) == stem


@pytest.mark.parametrize("name,opts,message", [
    ("alexnet", {}, "unknown model 'alexnet'"),
    ("vgg19", {"batch_size": 0}, r"batch_size must be an integer >= 1 and below 2\*\*31, got 0"),
    ("vgg19", {"batch_size": 2 ** 31}, r"batch_size must be an integer >= 1 and below 2\*\*31, got 2147483648"),
    ("vgg19", {"batch_size": 2.5}, "batch_size must be an integer"),
    ("resnet50", {"image_size": -3}, r"image_size must be an integer >= 1 and below 2\*\*31, got -3"),
    ("bert_large", {"image_size": 224}, "option image_size does not apply"),
    ("vgg19", {"seq_len": 128}, "option seq_len does not apply"),
    ("vgg19", {"optimizer": "rmsprop"}, "unknown optimizer 'rmsprop'"),
    ("vgg19", {"learning_rate": 0}, "learning_rate must be a positive number"),
    ("nasnet", {"variant": "huge"}, "unknown variant 'huge'"),
    ("tiny_mlp", {"num_classes": 1}, "num_classes must be an integer >= 2"),
])
def test_bad_options_raise(name, opts, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        export.export_model(name, out_dir="/nonexistent", **opts)


# (model, option, the registry's bound, a value past it): refused by resolve_options, before any export
SIZE_BOUNDS = [
    ("tiny_cnn", "image_size", models.MODELS["tiny_cnn"].min_image_size, 1),
    ("vgg19", "image_size", models.MODELS["vgg19"].min_image_size, 4),
    ("resnet50", "image_size", models.MODELS["resnet50"].min_image_size, 8),
    ("resnet200", "image_size", models.MODELS["resnet200"].min_image_size, 16),
    ("inception_v3", "image_size", models.MODELS["inception_v3"].min_image_size, 50),
    ("bert_base", "seq_len", models.MODELS["bert_base"].max_seq_len, 600),
]


@pytest.mark.parametrize("name,option,bound,value", SIZE_BOUNDS)
def test_sizes_past_the_model_bound_refused_before_export(name, option, bound, value):
    with pytest.raises(export.OptionError, match=rf"{option} must be [<>]= {bound} .*got {value}") as err:
        export.resolve_options(name, **{option: value})
    assert str(bound) in err.value.fix
    export.resolve_options(name, **{option: bound})  # the bound itself is taken


@pytest.mark.parametrize("name,option,bound,value", SIZE_BOUNDS)
def test_registry_bounds_match_the_family_builds(name, option, bound, value):
    """The family module's build refuses a size just past the registry's bound (before it touches
    `inputs`): the two never disagree."""
    spec = models.MODELS[name]
    _, cfg, _ = export.resolve_options(name, **{option: bound})
    past = bound - 1 if option == "image_size" else bound + 1
    with pytest.raises(ValueError, match=rf"{option} must be [<>]= {bound}, got {past}"):
        models.family_module(spec).build(dataclasses.replace(cfg, **{option: past}), None)


@pytest.mark.parametrize("field,edit,message", [
    ("sink", lambda m: m.pop("sink"), "field 'sink': missing; add the name of the train op"),
    ("format", lambda m: m.update(format="onnx"), "field 'format': is 'onnx'"),
    ("version", lambda m: m.update(version=2), "field 'version': is 2"),
    ("global_batch_size", lambda m: m.update(global_batch_size="16"), "has type str"),
    ("inputs", lambda m: m["inputs"][0].update(batch_axis=1), r"inputs\[0\].batch_axis"),
    ("init_op", lambda m: m.update(init_op="nope"), "node 'nope' is not in"),
    ("graph_bytes", lambda m: m.update(graph_bytes=1), "the .pb and .json are out of step"),
    ("graph_file", lambda m: m.update(graph_file="gone.pb"), "gone.pb does not exist"),
])
def test_read_bundle_errors_name_file_field_and_fix(tmp_path, field, edit, message):
    src = _default_meta_path("tiny_mlp")
    shutil.copy(src[:-5] + ".pb", tmp_path)
    with open(src) as f:
        meta = json.load(f)
    edit(meta)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="broken.json: .*" + message.replace("(", r"\(")):
        bundle.read_bundle(str(path))


def test_cli(tmp_path, capsys):
    from tfplace.cli import export as export_cli
    from tfplace.cli.common import call
    assert call(export_cli, ["--model", "tiny_mlp", "--batch-size", "0", "--out", str(tmp_path)]) == 2
    assert "--batch-size=0: 0 is not an integer in the range [1, 2147483647]" in capsys.readouterr().err
    assert call(export_cli, ["--all", "--batch-size", "8"]) == 2
    assert "--all/--tiny export the default sizes" in capsys.readouterr().err
    assert call(export_cli, ["--model", "tiny_mlp", "--batch-size", "4", "--out", str(tmp_path)]) == 0
    assert "tiny_mlp_b4_sgd.json" in capsys.readouterr().out
    assert call(export_cli, ["--model", "alexnet"]) == 2
    assert "alexnet" in capsys.readouterr().err
    assert call(export_cli, ["--model", "tiny_mlp", "--tiny"]) == 2
    assert "exactly one of --model, --all, --tiny" in capsys.readouterr().err


@pytest.mark.parametrize("name,option,bound,value", SIZE_BOUNDS)
def test_cli_refuses_a_size_past_the_bound_naming_the_flag(tmp_path, capsys, name, option, bound, value):
    from tfplace.cli import export as export_cli
    from tfplace.cli.common import call
    flag = "--" + option.replace("_", "-")
    assert call(export_cli, ["--model", name, flag, str(value), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {name}: {option} must be" in err
    assert f" {bound} " in err.split("Fix:")[1]
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- parameter counts
PUBLISHED = [s.name for s in models.MODELS.values() if s.published_params]


@pytest.mark.parametrize("name", PUBLISHED)
def test_param_count_matches_published(name):
    path = _default_meta_path(name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not exported here (the slow test exports it)")
    _check_params(name, bundle.read_meta(path))


def _check_params(name, meta):
    count, tolerance = models.get_spec(name).published_params
    assert abs(meta["param_count"] - count) <= tolerance * count, (meta["param_count"], count)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in models.model_names() if n not in TINY])
def test_export_zoo_model(name):
    meta_path = export.ensure_bundle(name)  # exports into the zoo cache if missing or stale
    graph_def, meta = bundle.read_bundle(meta_path)
    assert meta["op_count"] > 500 and meta["variable_count"] > 10
    if models.get_spec(name).published_params:
        _check_params(name, meta)
