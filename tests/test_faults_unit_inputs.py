"""Every bad input is one clear error: exit status 2, one line naming the file or flag, a fix, and
never a traceback, before any work starts (tfplace.cli.common's contract).

One table, by category:
  * "format": a file whose content is wrong as a whole (empty, not JSON, not an object, a wrong
    type, a name used twice, an unknown zoo model name);
  * "path": a path that is not what the command needs: an input that is a FIFO, a folder or a
    device (refused without opening it: a FIFO must not hang the command), an output that is a
    folder, a FIFO or in a missing folder, a file where an output folder goes;
  * "value": a number out of range or an unknown name in a flag or a config file.

Each case runs the command in-process (`tfplace.cli.common.call`), or a loader under the same
guard (`tfplace.cli.common.guarded`), under an alarm, so a case that would block fails instead.
None starts a server, exports a graph or imports TensorFlow except the train command (its
library imports it before the config is read).
"""

import json
import os
import signal
import types

import pytest

from tfplace.cli import (activate, common, compare, export, grappler_check, groups, kernel_replay, overheads,
                         plan, profile, simulate, train)

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
CLUSTER = os.path.join(REPO, "clusters", "local_cpu.json")
TINY = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
STRATEGY = os.path.join(REPO, "examples", "formats", "strategy_local_cpu.json")
RUN_DIR = "run"  # a fake training output_dir made by the cases that need one
ALARM_S = 60

GOOD_STRATEGY = {"global_batch_size": 6, "max_groups": 4, "default": {"shares": {"cpu0": 2, "cpu1": 2, "cpu2": 2}}}
ACTIVATE = {"format": "tfplace.activate_config", "cluster": CLUSTER, "baselines": ["single"],
            "graphs": [{"model": "tiny_mlp", "batch_size": 12}]}

# the files `kernel_replay export` and `kernel_replay replay` write (tfplace.profiling.kernel_replay)
OP_TABLE = {"format": "tfplace.profiling.kernel_replay_ops", "version": 1, "graph": "g", "reference_batch_size": 16,
            "ops": []}
REPLAY_RESULT = {"format": "tfplace.profiling.kernel_replay", "version": 1, "graph": "g", "device": "NVIDIA H100",
                 "seconds": {"conv": {"8": 1e-6}}, "skipped": {}}


def _local_cpu(change):
    """local_cpu.json changed in place by `change`."""
    with open(CLUSTER) as f:
        cluster = json.load(f)
    change(cluster)
    return cluster


TWO_CPUS_ONE_TASK = _local_cpu(lambda c: c["devices"][2].update(task=1))  # cpu2 moved into cpu1's task
TRAIN = {"format": "tfplace.train_config", "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "clusters": [CLUSTER]}


def _bundle_meta():
    with open(TINY, encoding="utf-8") as f:
        return json.load(f)


def _with(base, **changes):
    return dict(base, **changes)


def _entries(*names):
    return [{"name": n, "strategy": "s.json", "model": "tiny_mlp"} for n in names]


def _loader(load):
    """A command-like stand-in (for common.call) that runs `load(PATH)` under the CLI guard."""
    def main(argv):
        load(argv[1])
        return 0
    return types.SimpleNamespace(__name__=f"loader{load.__name__}", __doc__=load.__doc__, POSITIONAL=("PATH",),
                                 define_flags=lambda: None, main=main)


def _load_cluster(path):
    from tfplace.formats.cluster import load_cluster
    return load_cluster(path)


def _load_strategy(path):
    from tfplace.formats.strategy import load_strategy
    return load_strategy(path)


def _load_profile(path):
    from tfplace.formats.profile import load_profile
    return load_profile(path)


def _load_overheads(path):
    from tfplace.overheads.model import load_overheads
    return load_overheads(path)


def _load_train_config(path):
    from tfplace.formats.config import load_train_config
    return load_train_config(path)


def _load_activate_config(path):
    from tfplace.formats.config import load_activate_config
    return load_activate_config(path, strict=False)


def _load_activate_config_strict(path):
    """As activate.py reads a config: a bad strategy entry raises before any work."""
    from tfplace.formats.config import load_activate_config
    return load_activate_config(path)


def _load_graph(path):
    from tfplace.ir.loader import read_graph_source
    return read_graph_source(path, None)  # reads the bundle or GraphDef file; no shape inference


# A file is (name, content): str is written as is, a dict as JSON, FIFO makes a named pipe, DIR a
# folder. {tmp} in argv is the case's scratch folder.
FIFO, DIR = object(), object()
# id -> (category, command, argv, files, strings stderr must hold)
CASES = {
    # ---- format: the content of a file, as a whole -----------------------------------------
    "activate_config_empty": ("format", activate, ["{tmp}/a.txt"], {"a.txt": ""}, ["a.txt", "empty"]),
    "activate_config_not_json": ("format", activate, ["{tmp}/a.txt"], {"a.txt": "baselines: single"},
                                 ["a.txt", "not valid JSON"]),
    "activate_config_top_level_list": ("format", activate, ["{tmp}/a.txt"], {"a.txt": "[1, 2]"},
                                       ["a.txt", "(top level)", "JSON object"]),
    "activate_config_wrong_type": ("format", activate, ["{tmp}/a.txt"], {"a.txt": _with(ACTIVATE, steps="ten")},
                                   ["a.txt", "steps", "integer"]),
    "activate_config_entries_not_objects": ("format", activate, ["{tmp}/a.txt"],
                                            {"a.txt": _with(ACTIVATE, strategies=["s.json"])}, ["a.txt", "strategies[0]"]),
    "activate_duplicate_entry_name": ("format", activate, ["{tmp}/a.txt"],
                                      {"a.txt": _with(ACTIVATE, strategies=_entries("s1", "s1")), "s.json": GOOD_STRATEGY},
                                      ["a.txt", "strategies[1].name", "strategies[0].name", "twice"]),
    "activate_entry_named_like_a_baseline": ("format", activate, ["{tmp}/a.txt"],
                                             {"a.txt": _with(ACTIVATE, strategies=_entries("single")),
                                              "s.json": GOOD_STRATEGY},
                                             ["a.txt", "baselines[0]", "strategies[0].name"]),
    "activate_baseline_listed_twice": ("format", activate, ["{tmp}/a.txt"],
                                       {"a.txt": _with(ACTIVATE, baselines=["single", "single"])},
                                       ["a.txt", "baselines[1]", "baselines[0]"]),
    "activate_unknown_zoo_model": ("format", activate, ["{tmp}/a.txt"],
                                   {"a.txt": _with(ACTIVATE, graphs=[{"model": "tiny_mpl", "batch_size": 12}])},
                                   ["a.txt", "graphs[0].model", "did you mean 'tiny_mlp'", "tiny_cnn"]),
    "train_config_empty": ("format", train, ["--config", "{tmp}/c.json"], {"c.json": "  \n"}, ["c.json", "empty"]),
    "train_config_graphs_not_a_list": ("format", _loader(_load_train_config), ["{tmp}/c.json"],
                                       {"c.json": _with(TRAIN, graphs="tiny_mlp")}, ["c.json", "graphs", "a list"]),
    "cluster_not_json": ("format", simulate, ["--graph", TINY, "--cluster", "{tmp}/c.json", "--strategy", STRATEGY],
                         {"c.json": '{"devices": ['}, ["c.json", "not valid JSON"]),
    "strategy_not_an_object": ("format", simulate, ["--graph", TINY, "--cluster", CLUSTER, "--strategy", "{tmp}/s.json"],
                               {"s.json": '"shares"'}, ["s.json", "(top level)"]),
    "profile_empty": ("format", _loader(_load_profile), ["{tmp}/p.json"], {"p.json": ""}, ["p.json", "empty"]),
    "overheads_wrong_format": ("format", _loader(_load_overheads), ["{tmp}/o.json"],
                               {"o.json": {"format": "tfplace.cluster"}}, ["o.json", "format"]),
    "bundle_not_json": ("format", groups, ["--graph", "{tmp}/b.json", "--max-groups", "3"], {"b.json": "{"},
                        ["b.json", "not valid JSON"]),
    "replay_result_not_json": ("format", kernel_replay,
                               ["to-profile", "--replay", "{tmp}/r.json", "--kind", "H100", "--out", "{tmp}/p.json"],
                               {"r.json": "not json"}, ["r.json", "JSON"]),
    # a file of another kind where a replay result or op table goes: the file is named, not a KeyError
    "replay_result_is_an_op_table": ("format", kernel_replay, ["to-profile", "--replay", "{tmp}/ops.json", "--kind",
                                                               "H100", "--out", "{tmp}/p.json"], {"ops.json": OP_TABLE},
                                     ["ops.json: format", "not a replay result", "kernel_replay replay"]),
    "replay_result_is_a_strategy": ("format", kernel_replay, ["to-profile", "--replay", STRATEGY, "--kind", "H100",
                                                              "--out", "{tmp}/p.json"], {},
                                    ["strategy_local_cpu.json: format", "'tfplace.strategy'", "not a replay result"]),
    "replay_result_without_seconds": ("format", kernel_replay, ["to-profile", "--replay", "{tmp}/r.json", "--kind",
                                                                "H100", "--out", "{tmp}/p.json"],
                                      {"r.json": {"ops": {}}},
                                      ["r.json: seconds: missing", "kernel_replay replay"]),
    "replay_result_negative_seconds": ("format", kernel_replay, ["to-profile", "--replay", "{tmp}/r.json", "--kind",
                                                                 "H100", "--out", "{tmp}/p.json"],
                                       {"r.json": _with(REPLAY_RESULT, seconds={"conv": {"8": -1e-6}})},
                                       ["r.json: seconds.conv.8", ">= 0"]),
    "replay_result_batch_not_a_size": ("format", kernel_replay, ["to-profile", "--replay", "{tmp}/r.json", "--kind",
                                                                 "H100", "--out", "{tmp}/p.json"],
                                       {"r.json": _with(REPLAY_RESULT, seconds={"conv": {"eight": 1e-6}})},
                                       ["r.json: seconds.conv.eight", "batch size"]),
    "replay_result_newer_version": ("format", kernel_replay, ["to-profile", "--replay", "{tmp}/r.json", "--kind",
                                                              "H100", "--out", "{tmp}/p.json"],
                                    {"r.json": _with(REPLAY_RESULT, version=2)}, ["r.json: version", "must be 1"]),
    "replay_op_table_is_a_result": ("format", kernel_replay, ["replay", "--ops", "{tmp}/r.json", "--batch-sizes", "8",
                                                              "--out", "{tmp}/o.json"], {"r.json": REPLAY_RESULT},
                                    ["r.json: format", "not an op table", "kernel_replay export"]),
    "replay_op_table_is_a_bundle": ("format", kernel_replay, ["replay", "--ops", TINY, "--batch-sizes", "8",
                                                              "--out", "{tmp}/o.json"], {},
                                    ["tiny_mlp_b16_sgd.json: format", "not an op table"]),
    # ---- path: inputs that are not regular files, outputs that cannot be written -------------
    "fifo_activate_config": ("path", activate, ["{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_train_config": ("path", train, ["--config", "{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_cluster_flag": ("path", simulate, ["--graph", TINY, "--cluster", "{tmp}/fifo", "--strategy", STRATEGY],
                          {"fifo": FIFO}, ["--cluster", "fifo", "named pipe"]),
    "fifo_graph_flag": ("path", groups, ["--graph", "{tmp}/fifo", "--max-groups", "3"], {"fifo": FIFO},
                        ["--graph", "named pipe"]),
    "fifo_overheads_flag": ("path", compare, ["--graph", TINY, "--cluster", CLUSTER, "--overheads", "{tmp}/fifo",
                                              "--out", "{tmp}/cmp"], {"fifo": FIFO}, ["--overheads", "named pipe"]),
    "fifo_replay_ops": ("path", kernel_replay, ["replay", "--ops", "{tmp}/fifo", "--batch-sizes", "8",
                                                "--out", "{tmp}/r.json"], {"fifo": FIFO}, ["--ops", "named pipe"]),
    # a list of paths: the one that is not a file is named (the flag's value in the message is the whole list)
    "compare_strategy_files_one_missing": ("path", compare, ["--graph", TINY, "--cluster", CLUSTER, "--strategy-files",
                                                             STRATEGY + ",{tmp}/nonexist.json", "--out", "{tmp}/cmp"],
                                           {}, ["--strategy-files", "nonexist.json: file not found"]),
    "grappler_graphs_one_a_folder": ("path", grappler_check, ["--graph", TINY, "--graph", "{tmp}/sub"], {"sub": DIR},
                                     ["--graph", "sub: is a folder"]),
    "fifo_cluster_file": ("path", _loader(_load_cluster), ["{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_strategy_file": ("path", _loader(_load_strategy), ["{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_profile_file": ("path", _loader(_load_profile), ["{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_overheads_file": ("path", _loader(_load_overheads), ["{tmp}/fifo"], {"fifo": FIFO}, ["fifo", "named pipe"]),
    "fifo_graph_def": ("path", _loader(_load_graph), ["{tmp}/fifo.pb"], {"fifo.pb": FIFO}, ["fifo.pb", "named pipe"]),
    "fifo_bundle_meta": ("path", _loader(_load_graph), ["{tmp}/fifo.json"], {"fifo.json": FIFO},
                         ["fifo.json", "named pipe"]),
    "fifo_bundle_graph_file": ("path", _loader(_load_graph), ["{tmp}/b.json"],
                               {"b.json": {"format": "tfplace.graph", "graph_file": "b.pb", "global_batch_size": 4,
                                           "sink": "train", "inputs": [{"name": "x"}]}, "b.pb": FIFO},
                               ["b.json", "graph_file", "named pipe"]),
    "fifo_graph_file_of_a_bundle_to_check": ("path", grappler_check, ["--graph", "{tmp}/b.json"],
                                             {"b.json": _bundle_meta(),
                                              "tiny_mlp_b16_sgd.pb": FIFO}, ["b.json", "graph_file", "named pipe"]),
    "fifo_cluster_in_activate_config": ("path", _loader(_load_activate_config), ["{tmp}/a.txt"],
                                         {"a.txt": _with(ACTIVATE, cluster="fifo"), "fifo": FIFO},
                                         ["a.txt", "cluster", "fifo", "named pipe"]),
    "folder_as_strategy_in_activate_config": ("path", _loader(_load_activate_config_strict), ["{tmp}/a.txt"],
                                              {"a.txt": _with(ACTIVATE, strategies=_entries("s1")), "s.json": DIR},
                                              ["a.txt", "strategies[0].strategy", "folder"]),
    # one bad entry stops the whole run before any entry runs (examples/formats/README.md says so)
    "activate_missing_strategy_file": ("path", activate, ["{tmp}/a.txt"],
                                       {"a.txt": _with(ACTIVATE, strategies=_entries("s1"))},
                                       ["a.txt", "strategies[0].strategy", "s.json"]),
    "folder_as_cluster": ("path", plan, ["--checkpoint", "{tmp}/" + RUN_DIR, "--model", "tiny_mlp", "--cluster", "{tmp}",
                                         "--out", "{tmp}/s.json"], {}, ["--cluster", "folder"]),
    "folder_as_graph": ("path", grappler_check, ["--graph", "{tmp}/sub"], {"sub": DIR}, ["--graph", "folder"]),
    "device_as_strategy": ("path", simulate, ["--graph", TINY, "--cluster", CLUSTER, "--strategy", "/dev/null"], {},
                           ["--strategy", "/dev/null", "device"]),
    "device_as_profile_file": ("path", _loader(_load_profile), ["/dev/zero"], {}, ["/dev/zero", "device"]),
    "output_file_is_a_folder": ("path", simulate, ["--graph", TINY, "--cluster", CLUSTER, "--strategy", STRATEGY,
                                                   "--json", "{tmp}"], {}, ["--json", "folder"]),
    "output_file_is_a_fifo": ("path", groups, ["--graph", TINY, "--max-groups", "3", "--json", "{tmp}/fifo"],
                              {"fifo": FIFO}, ["--json", "named pipe"]),
    "output_in_a_missing_folder": ("path", profile, ["--graph", TINY, "--out", "{tmp}/nope/p.json"], {},
                                   ["--out", "nope", "does not exist"]),
    "output_folder_is_a_file": ("path", export, ["--model", "tiny_mlp", "--out", "{tmp}/f"], {"f": "x"},
                                ["--out", "not a folder"]),
    "compare_output_inside_is_a_folder": ("path", compare, ["--graph", TINY, "--cluster", CLUSTER, "--out", "{tmp}/cmp",
                                                            "--strategies", "single"],
                                          {"cmp": DIR, "cmp/table.txt": DIR}, ["--out", "table.txt", "folder"]),
    "compare_strategy_output_is_a_folder": ("path", compare, ["--graph", TINY, "--cluster", CLUSTER, "--out", "{tmp}/cmp",
                                                              "--strategies", "single"],
                                            {"cmp": DIR, "cmp/strategies": DIR, "cmp/strategies/single.json": DIR},
                                            ["--out", "strategies/single.json"]),
    "activate_output_dir_is_a_file": ("path", activate, ["{tmp}/a.txt"],
                                      {"a.txt": _with(ACTIVATE, output_dir="{tmp}/f"), "f": "x"},
                                      ["a.txt", "output_dir", "not a folder"]),
    "train_output_dir_is_a_file": ("path", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/f"],
                                   {"c.json": TRAIN, "f": "x"}, ["--output_dir", "not a folder"]),
    "kernel_replay_out_is_a_folder": ("path", kernel_replay, ["export", "--graph", TINY, "--out", "{tmp}"], {},
                                      ["--out", "folder"]),
    "overheads_out_in_a_missing_folder": ("path", overheads, ["--cluster", CLUSTER, "--out", "{tmp}/nope/o.json"], {},
                                          ["--out", "does not exist"]),
    "plan_checkpoint_not_a_run": ("path", plan, ["--checkpoint", "{tmp}", "--model", "tiny_mlp", "--cluster", CLUSTER,
                                                 "--out", "{tmp}/s.json"], {}, ["--checkpoint", "config.json"]),
    # ---- value: numbers out of range, unknown names ---------------------------------------
    "plan_batch_size_0": ("value", plan, ["--checkpoint", "{tmp}/" + RUN_DIR, "--model", "tiny_mlp", "--cluster", CLUSTER,
                                          "--batch_size", "0", "--out", "{tmp}/s.json"], {}, ["--batch_size"]),
    "plan_negative_seed": ("value", plan, ["--checkpoint", "{tmp}/" + RUN_DIR, "--model", "tiny_mlp", "--cluster", CLUSTER,
                                           "--seed", "-1", "--out", "{tmp}/s.json"], {}, ["--seed"]),
    "plan_unknown_model": ("value", plan, ["--checkpoint", "{tmp}/" + RUN_DIR, "--model", "tiny_mpl", "--cluster", CLUSTER,
                                           "--out", "{tmp}/s.json"], {}, ["--model", "did you mean 'tiny_mlp'", "vgg19"]),
    "plan_zoo_name_as_graph": ("value", plan, ["--checkpoint", "{tmp}/" + RUN_DIR, "--graph", "tiny_mlp", "--cluster",
                                               CLUSTER, "--out", "{tmp}/s.json"], {}, ["--graph", "--model tiny_mlp"]),
    "compare_keras_h5": ("format", compare, ["--graph", "{tmp}/model.h5", "--cluster", CLUSTER], {"model.h5": "x"},
                         ["--graph", "saved Keras model", "export_keras"]),
    "plan_saved_model_folder": ("format", plan, ["--graph", "{tmp}/sm", "--cluster", CLUSTER, "--out", "{tmp}/s.json"],
                                {"sm": DIR, "sm/saved_model.pb": "x"}, ["--graph", "is a SavedModel", "export_keras"]),
    "train_config_saved_model_pb": ("format", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/out"],
                                    {"c.json": _with(TRAIN, graphs=[{"graph": "{tmp}/saved_model.pb", "batch_size": 8}]),
                                     "saved_model.pb": "x"}, ["c.json", "graphs[0].graph", "is a SavedModel"]),
    "compare_unknown_graph_name": ("value", compare, ["--graph", "tiny_mpl", "--cluster", CLUSTER, "--out", "{tmp}/c"], {},
                                   ["--graph", "did you mean 'tiny_mlp'"]),
    "compare_unknown_strategy": ("value", compare, ["--graph", TINY, "--cluster", CLUSTER, "--strategies", "singel",
                                                    "--out", "{tmp}/c"], {}, ["--strategies", "did you mean 'single'"]),
    "compare_max_groups_0": ("value", compare, ["--graph", TINY, "--cluster", CLUSTER, "--max-groups", "0"], {},
                             ["--max-groups"]),
    "simulate_unknown_graph_name": ("value", simulate, ["--graph", "resnet_50", "--cluster", CLUSTER, "--strategy",
                                                        STRATEGY], {}, ["--graph", "did you mean 'resnet50'"]),
    "simulate_negative_seed": ("value", simulate, ["--graph", TINY, "--cluster", CLUSTER, "--strategy", STRATEGY,
                                                   "--seed", "-2"], {}, ["--seed"]),
    "groups_unknown_graph_name": ("value", groups, ["--graph", "tiny_mpl", "--max-groups", "3"], {}, ["--graph", "tiny_mlp"]),
    "groups_batch_size_0": ("value", groups, ["--graph", TINY, "--max-groups", "3", "--batch-size", "0"], {},
                            ["--batch-size"]),
    "profile_batch_size_0": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--batch-sizes", "8,0"], {},
                             ["--batch-sizes"]),
    "export_manifest_of_another_folder": ("value", export, ["--tiny", "--manifest", "--out", "{tmp}/zoo"], {},
                                          ["--manifest", "--out is", "drop --manifest"]),
    "profile_derive_the_measured_kind": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--batch-sizes",
                                                            "8", "--derive", "CPU,V100"], {},
                                         ["derive=CPU,V100", "the kind that is measured", "leave that kind out"]),
    "profile_unknown_graph_name": ("value", profile, ["--graph", "tiny_mpl", "--out", "{tmp}/p.json"], {},
                                   ["--graph", "tiny_mlp"]),
    "profile_unknown_derived_kind": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--derive", "V100,X9"],
                                     {}, ["--derive", "X9", "V100"]),
    "profile_unknown_device": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--device", "TPU"], {},
                               ["--device", "TPU"]),
    "profile_repeats_0": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--repeats", "0"], {},
                          ["--repeats"]),
    "profile_comm_only_with_graph": ("value", profile, ["--comm-only", "--graph", TINY, "--out", "{tmp}/p.json"], {},
                                     ["--comm-only", "--graph", "would be ignored", "--comm"]),
    "profile_comm_only_with_derive": ("value", profile, ["--comm-only", "--derive", "V100", "--out", "{tmp}/p.json"],
                                      {}, ["--comm-only", "--derive", "would be ignored"]),
    "profile_roofline_with_derive": ("value", profile, ["--graph", TINY, "--out", "{tmp}/p.json", "--roofline", "V100",
                                                        "--derive", "T4"], {}, ["roofline", "derive"]),
    "export_unknown_model": ("value", export, ["--model", "bert_bas", "--out", "{tmp}/zoo"], {},
                             ["--model", "did you mean 'bert_base'"]),
    "export_learning_rate_0": ("value", export, ["--model", "tiny_mlp", "--learning-rate", "0", "--out", "{tmp}/zoo"], {},
                               ["--learning-rate"]),
    "export_option_the_model_lacks": ("value", export, ["--model", "tiny_mlp", "--image-size", "32", "--out",
                                                        "{tmp}/zoo"], {}, ["--image-size", "image_size"]),
    "export_negative_seed": ("value", export, ["--model", "tiny_mlp", "--seed", "-1", "--out", "{tmp}/zoo"], {},
                             ["--seed"]),
    "grappler_unknown_kind": ("value", grappler_check, ["--graph", TINY, "--kind", "V1OO"], {}, ["--kind", "V1OO"]),
    "grappler_negative_batch": ("value", grappler_check, ["--graph", TINY, "--batch-size", "-1"], {}, ["--batch-size"]),
    "kernel_replay_reps_0": ("value", kernel_replay, ["replay", "--ops", TINY, "--batch-sizes", "8", "--reps", "0",
                                                      "--out", "{tmp}/r.json"], {}, ["--reps"]),
    "kernel_replay_empty_kind": ("value", kernel_replay, ["to-profile", "--replay", TINY, "--kind", "",
                                                          "--out", "{tmp}/p.json"], {}, ["--kind"]),
    "overheads_passes_0": ("value", overheads, ["--cluster", CLUSTER, "--out", "{tmp}/o.json", "--passes", "0"], {},
                           ["--passes"]),
    "overheads_negative_cpu": ("value", overheads, ["--cluster", CLUSTER, "--out", "{tmp}/o.json",
                                                    "--cpus-per-task", "0;-1"], {}, ["--cpus-per-task"]),
    # a CPU quota is a share of one core in (0, 1], on the command line as in the cluster file's emulation
    "profile_cpu_fraction_over_1": ("value", profile, ["--graph", TINY, "--cpu-fraction", "2", "--out", "{tmp}/p.json"],
                                    {}, ["--cpu-fraction", "(0, 1]", "share of one core"]),
    "profile_cpu_fraction_nan": ("value", profile, ["--graph", TINY, "--cpu-fraction", "nan", "--out", "{tmp}/p.json"],
                                 {}, ["--cpu-fraction", "(0, 1]"]),
    "overheads_cpu_fraction_over_1": ("value", overheads, ["--cluster", CLUSTER, "--out", "{tmp}/o.json",
                                                           "--cpu-fraction-per-task", ",2,0.5"], {},
                                      ["--cpu-fraction-per-task", "'2'", "(0, 1]"]),
    "overheads_cpu_fraction_inf": ("value", overheads, ["--cluster", CLUSTER, "--out", "{tmp}/o.json",
                                                        "--cpu-fraction-per-task", "inf,0.5,0.5"], {},
                                   ["--cpu-fraction-per-task", "'inf'", "(0, 1]"]),
    "simulate_memory_in_gb": ("value", simulate, ["--graph", TINY, "--cluster", "{tmp}/c.json", "--strategy", STRATEGY],
                              {"c.json": _local_cpu(lambda c: c["devices"][0].update(memory_bytes=16))},
                              ["c.json: devices[0].memory_bytes", "in bytes", "16000000000 for 16 GB"]),
    "simulate_nic_in_gbit": ("value", simulate, ["--graph", TINY, "--cluster", "{tmp}/c.json", "--strategy", STRATEGY],
                             {"c.json": _local_cpu(lambda c: c["hosts"][0].update(nic_bandwidth_bytes_per_s=10))},
                             ["c.json: hosts[0].nic_bandwidth_bytes_per_s", "10 Gbit/s is 1250000000"]),
    "activate_steps_0": ("value", activate, ["{tmp}/a.txt"], {"a.txt": _with(ACTIVATE, steps=0)}, ["a.txt", "steps"]),
    "activate_negative_warmup": ("value", activate, ["{tmp}/a.txt"], {"a.txt": _with(ACTIVATE, warmup_steps=-1)},
                                 ["a.txt", "warmup_steps"]),
    "activate_batch_size_0": ("value", activate, ["{tmp}/a.txt"],
                              {"a.txt": _with(ACTIVATE, graphs=[{"model": "tiny_mlp", "batch_size": 0}])},
                              ["a.txt", "graphs[0].batch_size"]),
    "activate_strategy_for_another_batch": ("value", activate, ["{tmp}/a.txt"],
                                            {"s.json": GOOD_STRATEGY, "a.txt": _with(ACTIVATE, strategies=[
                                                {"name": "mine", "strategy": "{tmp}/s.json", "graph": TINY}])},
                                            ["s.json: global_batch_size: is 6", "built for a global batch of 16"]),
    "activate_bundle_at_another_batch": ("value", activate, ["{tmp}/a.txt"],
                                         {"a.txt": _with(ACTIVATE, graphs=[{"graph": TINY, "batch_size": 8}])},
                                         ["a.txt: graphs[0].batch_size: is 8", "built for a global batch of 16"]),
    "activate_gpu_kind_on_this_machine": ("value", activate, ["{tmp}/a.txt"],
                                          {"a.txt": _with(ACTIVATE, cluster=os.path.join(
                                              REPO, "examples", "formats", "cluster_links.json"))},
                                          ["cluster_links.json: devices[0].kind", "GPU kind", "0 GPUs"]),
    "profile_cluster_on_another_host": ("value", profile, ["--graph", TINY, "--cluster", "{tmp}/c.json", "--out",
                                                           "{tmp}/p.json"],
                                        {"c.json": _local_cpu(lambda c: c["hosts"][0].update(address="10.1.2.3"))},
                                        ["c.json: hosts[0].address", "'10.1.2.3' is not this machine's loopback"]),
    "activate_cluster_on_another_host": ("value", activate, ["{tmp}/a.txt"],
                                         {"c.json": _local_cpu(lambda c: c["hosts"][0].update(address="10.1.2.3")),
                                          "a.txt": _with(ACTIVATE, cluster="{tmp}/c.json")},
                                         ["c.json: hosts[0].address", "not this machine's loopback"]),
    "activate_two_cpus_in_one_task": ("value", activate, ["{tmp}/a.txt"],
                                      {"c.json": TWO_CPUS_ONE_TASK, "a.txt": _with(ACTIVATE, cluster="{tmp}/c.json")},
                                      ["c.json: devices[2].task", "second CPU device of task 1"]),
    # below 2**31, but batch x features overflows a size the step computes (TensorFlow's int32 shape values)
    "plan_batch_size_overflows_the_step": ("value", plan, ["--model", "tiny_mlp", "--batch_size", str(2 ** 31 - 1),
                                                           "--cluster", CLUSTER, "--out", "{tmp}/s.json"], {},
                                           ["batch_size: is 2147483647", "int32", "smaller batch size"]),
    "train_config_batch_size_overflows_the_step": ("value", train, ["--config", "{tmp}/c.json", "--output_dir",
                                                                    "{tmp}/out"],
                                                   {"c.json": _with(TRAIN, graphs=[{"model": "tiny_mlp",
                                                                                    "batch_size": 2 ** 31 - 1}])},
                                                   ["c.json: graphs[0].batch_size: is 2147483647", "int32"]),
    "activate_batch_size_overflows_the_step": ("value", activate, ["{tmp}/a.txt"],
                                               {"a.txt": _with(ACTIVATE, graphs=[{"model": "tiny_mlp",
                                                                                  "batch_size": 2 ** 31 - 1}])},
                                               ["a.txt: graphs[0].batch_size: is 2147483647", "int32"]),
    "train_config_batch_size_over_int32": ("value", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/out"],
                                           {"c.json": _with(TRAIN, graphs=[{"model": "tiny_mlp", "batch_size": 10 ** 12}])},
                                           ["c.json", "graphs[0].batch_size"]),
    "train_config_unknown_model": ("value", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/out"],
                                   {"c.json": _with(TRAIN, graphs=[{"model": "resnet51", "batch_size": 16}])},
                                   ["c.json", "graphs[0].model", "did you mean 'resnet50'"]),
    "export_image_size_over_int32": ("value", export, ["--model", "tiny_cnn", "--image-size", str(2 ** 31),
                                                       "--out", "{tmp}/zoo"], {}, ["--image-size"]),
    "train_config_init_policy_typo": ("value", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/out"],
                                      {"c.json": _with(TRAIN, init_policy="pretrianed")},
                                      ["c.json", "init_policy", "did you mean 'pretrained'"]),
    "train_config_learning_rate_0": ("value", train, ["--config", "{tmp}/c.json", "--output_dir", "{tmp}/out"],
                                     {"c.json": _with(TRAIN, rl={"learning_rate": 0})}, ["c.json", "rl.learning_rate"]),
}


def _fill(value, tmp):
    """`value` with every "{tmp}" replaced by the scratch folder, in strings, lists and dicts."""
    if isinstance(value, str):
        return value.replace("{tmp}", tmp)
    if isinstance(value, list):
        return [_fill(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, tmp) for k, v in value.items()}
    return value


def _make(tmp, files):
    os.makedirs(os.path.join(tmp, RUN_DIR), exist_ok=True)
    for rel in ("config.json", "state.json"):  # a run folder that passes plan's parse-time check
        with open(os.path.join(tmp, RUN_DIR, rel), "w") as f:
            f.write("{}")
    for name, content in files.items():
        path = os.path.join(tmp, name)
        if content is FIFO:
            os.mkfifo(path)
        elif content is DIR:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(content if isinstance(content, str) else json.dumps(_fill(content, tmp)))


def _timeout(signum, frame):
    raise TimeoutError(f"the command did not return within {ALARM_S} s (a FIFO opened?)")


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{CASES[c][0]}-{c}")
def test_bad_input_exits_2_with_one_line_naming_it_and_the_fix(case, tmp_path, capsys, monkeypatch):
    category, command, argv, files, expected = CASES[case]
    tmp = str(tmp_path)
    _make(tmp, files)
    monkeypatch.chdir(tmp_path)  # default outputs (plan's strategy.json) land in the scratch folder
    import tensorflow as tf  # the GPU-kind case reads as on a machine without GPUs, wherever it runs
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    before = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(ALARM_S)
    try:
        status = common.call(command, _fill(argv, tmp))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2, err[-3000:]
    assert "Traceback" not in err
    assert len(errors) == 1, err[-3000:]
    assert "Fix:" in errors[0], errors[0]
    for text in expected:
        assert text in errors[0], (text, errors[0])
    for folder in ("runs", "out"):  # the default output folders (activate, train) and the cases' own
        assert not os.path.exists(os.path.join(tmp, folder)), f"{folder}/ was made for input refused"


@pytest.mark.parametrize("command,argv,first,later", [
    (simulate, ["--graph", TINY, "--cluster", "{tmp}/nope1.json", "--strategy", "{tmp}/nope2.json"],
     "--cluster=", "nope2.json"),
    (profile, ["--graph", TINY, "--cpu-fraction", "2", "--batch-sizes", "0", "--out", "{tmp}/p.json"],
     "--batch-sizes=", "--cpu-fraction"),
    (overheads, ["--cluster", "{tmp}/nope1.json", "--comm", "{tmp}/nope2.json", "--out", "{tmp}/o.json"],
     "--cluster=", "nope2.json"),
])
def test_two_refused_flags_are_one_error_the_first(command, argv, first, later, tmp_path, capsys):
    """absl refuses every bad flag at once; the user sees one line, the first flag and its fix
    (not every message run together on one line)."""
    assert common.call(command, _fill(argv, str(tmp_path))) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and first in errors[0] and errors[0].count("Fix:") == 1, err
    assert later not in errors[0], errors[0]


def test_every_category_has_cases():
    categories = [c[0] for c in CASES.values()]
    assert all(categories.count(c) >= 10 for c in ("format", "path", "value")), categories


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    """The check looks at the path with stat only: opening a FIFO without a writer would block."""
    from tfplace.formats.errors import InputError
    from tfplace.formats.files import require_regular_file
    fifo, bundle_meta = str(tmp_path / "fifo"), str(tmp_path / "fifo.json")
    os.mkfifo(fifo)
    os.mkfifo(bundle_meta)
    before = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(ALARM_S)
    try:
        with pytest.raises(InputError, match="config.json: cluster: .*fifo: is a named pipe"):
            require_regular_file(fifo, "config.json", "cluster")
        with pytest.raises(InputError, match="fifo.json: .*named pipe"):  # every command's bundle reader
            _load_graph(bundle_meta)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert require_regular_file(TINY) == TINY
