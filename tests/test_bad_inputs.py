"""Bad input gets one clear InputError naming the file, the field and the fix.

Each case writes a bad file (plus any good files it needs) to tmp_path, loads it the way the
tools do, and checks the error's type and that its message names the file, the field path and
says "Fix". Truncated GraphDefs and graphs without a sink are covered by the graph-IR tests.
"""

import copy
import json
import os

import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.config import load_activate_config, load_train_config
from tfplace.formats.errors import InputError
from tfplace.formats.profile import load_profile
from tfplace.formats.strategy import load_strategy, validate_strategy
from tfplace.graph_defs.export import resolve_options

CLUSTER = {
    "format": "tfplace.cluster", "version": 1, "name": "two_hosts",
    "hosts": [{"name": "h0", "nic_bandwidth_bytes_per_s": 6.25e9},
              {"name": "h1", "nic_bandwidth_bytes_per_s": 6.25e9}],
    "devices": [{"name": "a", "kind": "V100", "host": "h0", "memory_bytes": 16e9},
                {"name": "b", "kind": "P100", "host": "h1", "memory_bytes": 12e9}],
}
STRATEGY = {
    "format": "tfplace.strategy", "version": 1, "global_batch_size": 32, "max_groups": 8,
    "default": {"shares": {"a": 16, "b": 16}, "sync": "allreduce"},
    "groups": {"g1": {"shares": {"a": 32}}},
}
PROFILE = {
    "format": "tfplace.profile", "version": 1,
    "ops": {"conv": {"CPU": {"8": 0.1, "16": 0.2}}},
}
TRAIN = {
    "format": "tfplace.train_config", "version": 1,
    "graphs": [{"model": "tiny_mlp", "batch_size": 16}, {"model": "tiny_cnn", "batch_size": 16}],
    "clusters": ["clusters/two_kind_4gpu.json"],  # resolved against the repository root
}
ACTIVATE = {
    "format": "tfplace.activate_config", "version": 1,
    "cluster": "clusters/local_cpu.json",
    "baselines": ["single"],
    "graphs": [{"model": "tiny_mlp", "batch_size": 12}],
}
BAD_CPU_STRATEGY = {"global_batch_size": 8, "max_groups": 8, "default": {"shares": {"cpu0": 4, "gpu9": 4}}}


def edit(base, change):
    """A deep copy of `base` changed in place by `change`."""
    data = copy.deepcopy(base)
    change(data)
    return data


def _strategy_against_cluster(path):
    validate_strategy(load_strategy(path), group_names=["g1"], device_names=["a", "b"])


def _fake_zoo(name, batch_size, **options):
    if name not in ("tiny_mlp", "tiny_cnn"):
        raise ValueError(f"unknown model {name!r}; choose one of ['tiny_cnn', 'tiny_mlp']")


# id: (file name, content (object or raw text), loader, field path in the message,
#      extra files {name: content}, file named in the message (default: the file itself))
CASES = {
    # ---- any JSON file ----
    "truncated_json": ("cluster.json", '{"format": "tfplace.cluster", "name": "x", "hosts": [', load_cluster,
                       "line 1 column", {}, None),
    "top_level_not_object": ("cluster.json", "[1, 2, 3]", load_cluster, "(top level)", {}, None),
    "wrong_format": ("cluster.json", edit(CLUSTER, lambda d: d.update(format="tfplace.strategy")),
                     load_cluster, "format", {}, None),
    "unsupported_version": ("cluster.json", edit(CLUSTER, lambda d: d.update(version=7)),
                            load_cluster, "version", {}, None),
    "duplicate_json_key": ("strategy.json", '{"global_batch_size": 8, "global_batch_size": 16}',
                           load_strategy, "global_batch_size", {}, None),
    "file_is_folder": ("sub", None, load_cluster, "(top level)", {}, None),
    # ---- cluster ----
    "unknown_top_level_key": ("cluster.json", edit(CLUSTER, lambda d: d.update(devicez=[])),
                              load_cluster, "devicez", {}, None),
    "unknown_nested_key": ("cluster.json", edit(CLUSTER, lambda d: d["devices"][0].update(colour="red")),
                           load_cluster, "devices[0].colour", {}, None),
    "negative_memory_bytes": ("cluster.json", edit(CLUSTER, lambda d: d["devices"][1].update(memory_bytes=-16e9)),
                              load_cluster, "devices[1].memory_bytes", {}, None),
    "zero_bandwidth": ("cluster.json", edit(CLUSTER, lambda d: d["hosts"][0].update(nic_bandwidth_bytes_per_s=0)),
                       load_cluster, "hosts[0].nic_bandwidth_bytes_per_s", {}, None),
    "zero_cpu_cores": ("cluster.json", edit(CLUSTER, lambda d: d["hosts"][0].update(cpu_cores=0)),
                       load_cluster, "hosts[0].cpu_cores", {}, None),
    "fractional_cpu_cores": ("cluster.json", edit(CLUSTER, lambda d: d["hosts"][0].update(cpu_cores=1.5)),
                             load_cluster, "hosts[0].cpu_cores", {}, None),
    "device_on_unknown_host": ("cluster.json", edit(CLUSTER, lambda d: d["devices"][1].update(host="h9")),
                               load_cluster, "devices[1].host", {}, None),
    "duplicate_device_name": ("cluster.json", edit(CLUSTER, lambda d: d["devices"][1].update(name="a")),
                              load_cluster, "devices[1].name", {}, None),
    "bad_link_matrix_shape": ("cluster.json",
                              edit(CLUSTER, lambda d: d.update(links={"bandwidth_bytes_per_s": [[0, 1, 1], [1, 0, 1]]})),
                              load_cluster, "links.bandwidth_bytes_per_s", {}, None),
    # figures in the wrong unit (GB written as 16, Gbit/s as 10): under the file's 1 MB and 1 MB/s bounds
    "memory_bytes_in_gb": ("cluster.json", edit(CLUSTER, lambda d: d["devices"][0].update(memory_bytes=16)),
                           load_cluster, "devices[0].memory_bytes", {}, None),
    "nic_bandwidth_in_gbit": ("cluster.json",
                              edit(CLUSTER, lambda d: d["hosts"][0].update(nic_bandwidth_bytes_per_s=10)),
                              load_cluster, "hosts[0].nic_bandwidth_bytes_per_s", {}, None),
    "intra_bandwidth_in_gbyte": ("cluster.json",
                                 edit(CLUSTER, lambda d: d["hosts"][1].update(intra_bandwidth_bytes_per_s=12)),
                                 load_cluster, "hosts[1].intra_bandwidth_bytes_per_s", {}, None),
    "link_matrix_in_gbit": ("cluster.json",
                            edit(CLUSTER, lambda d: d.update(links={"bandwidth_bytes_per_s": [[0, 1e9], [25, 0]]})),
                            load_cluster, "links.bandwidth_bytes_per_s[1][0]", {}, None),
    "task_on_two_hosts": ("cluster.json", edit(CLUSTER, lambda d: [x.update(task=0) for x in d["devices"]]),
                          load_cluster, "devices[1].task", {}, None),
    # a task number far past the others (a typo): the gap is named without listing every number below it
    "task_number_with_a_gap": ("cluster.json", edit(CLUSTER, lambda d: [x.update(task=t) for x, t in
                                                                         zip(d["devices"], (0, 2 ** 40))]),
                               load_cluster, "devices", {}, None),
    # ---- strategy ----
    "shares_not_summing_to_batch": ("strategy.json", edit(STRATEGY, lambda d: d["default"].update(shares={"a": 10, "b": 10})),
                                    load_strategy, "default.shares", {}, None),
    "non_positive_share": ("strategy.json", edit(STRATEGY, lambda d: d["default"].update(shares={"a": 0, "b": 32})),
                           load_strategy, "default.shares.a", {}, None),
    "unknown_sync_method": ("strategy.json", edit(STRATEGY, lambda d: d["groups"]["g1"].update(sync="nccl")),
                            load_strategy, "groups.g1.sync", {}, None),
    "ps_without_ps_device": ("strategy.json", edit(STRATEGY, lambda d: d["default"].update(sync="ps")),
                             load_strategy, "default.ps_device", {}, None),
    "zero_global_batch": ("strategy.json", edit(STRATEGY, lambda d: d.update(global_batch_size=0)),
                          load_strategy, "global_batch_size", {}, None),
    "unknown_device_in_strategy": ("strategy.json", edit(STRATEGY, lambda d: d["default"].update(shares={"a": 16, "zz": 16})),
                                   _strategy_against_cluster, "default.shares.zz", {}, None),
    "group_not_in_grouping": ("strategy.json", edit(STRATEGY, lambda d: d["groups"].update(nope={"shares": {"b": 32}})),
                              _strategy_against_cluster, "groups.nope", {}, None),
    # ---- profile ----
    "non_integer_batch_key": ("profile.json", edit(PROFILE, lambda d: d["ops"]["conv"]["CPU"].update({"8.5": 0.1})),
                              load_profile, "ops.conv.CPU.8.5", {}, None),
    "negative_seconds": ("profile.json", edit(PROFILE, lambda d: d["ops"]["conv"]["CPU"].update({"8": -0.1})),
                         load_profile, "ops.conv.CPU.8", {}, None),
    "nan_seconds": ("profile.json", '{"ops": {"conv": {"CPU": {"8": NaN}}}}', load_profile, "ops.conv.CPU.8", {}, None),
    "run_order_twice": ("profile.json", edit(PROFILE, lambda d: d.update(run_order=["conv", "relu", "conv"])),
                        load_profile, "run_order", {}, None),
    "run_order_not_a_name": ("profile.json", edit(PROFILE, lambda d: d.update(run_order=["conv", 3])),
                             load_profile, "run_order[1]", {}, None),
    # ---- train config ----
    "config_missing_graph_file": ("config.json", edit(TRAIN, lambda d: d.update(graphs=[{"graph": "nope.json", "batch_size": 8}])),
                                  load_train_config, "graphs[0].graph", {}, None),
    "config_missing_cluster_file": ("config.json", edit(TRAIN, lambda d: d.update(clusters=["nope/cluster.json"])),
                                    load_train_config, "clusters[0]", {}, None),
    "config_learning_rate_not_positive": ("config.json", edit(TRAIN, lambda d: d.update(rl={"learning_rate": 0})),
                                          load_train_config, "rl.learning_rate", {}, None),
    "config_unknown_nested_key": ("config.json", edit(TRAIN, lambda d: d.update(rl={"learning_rat": 0.1})),
                                  load_train_config, "rl.learning_rat", {}, None),
    "config_profiles_count": ("config.json", edit(TRAIN, lambda d: d.update(profiles=["derive"])),
                              load_train_config, "profiles", {}, None),
    "config_model_and_graph": ("config.json", edit(TRAIN, lambda d: d["graphs"][0].update(graph="x.json")),
                               load_train_config, "graphs[0]", {}, None),
    "config_empty_budget": ("config.json", edit(TRAIN, lambda d: d.update(budget={})),
                            load_train_config, "budget", {}, None),
    "config_unknown_zoo_model": ("config.json", edit(TRAIN, lambda d: d["graphs"][1].update(model="tiny_rnn")),
                                 lambda p: load_train_config(p, check_model=_fake_zoo), "graphs[1].model", {}, None),
    # an image under the model's smallest (tiny_cnn: 4 px): refused with the config, before any export
    "config_image_too_small": ("config.json", edit(TRAIN, lambda d: d["graphs"][1].update(image_size=1)),
                               lambda p: load_train_config(p, check_model=resolve_options), "graphs[1].image_size",
                               {}, None),
    "config_sequence_too_long": ("config.json", edit(TRAIN, lambda d: d["graphs"].append(
                                     {"model": "bert_base", "batch_size": 2, "seq_len": 513})),
                                 lambda p: load_train_config(p, check_model=resolve_options), "graphs[2].seq_len",
                                 {}, None),
    "config_bad_cluster_inside": ("config.json", edit(TRAIN, lambda d: d.update(clusters=["bad_cluster.json"])),
                                  load_train_config, "devices[1].memory_bytes",
                                  {"bad_cluster.json": edit(CLUSTER, lambda d: d["devices"][1].update(memory_bytes=0))},
                                  "bad_cluster.json"),
    # ---- activate config ----
    "activate_unknown_baseline": ("activate_config.txt", edit(ACTIVATE, lambda d: d.update(baselines=["single", "dp_magic"])),
                                  load_activate_config, "baselines[1]", {}, None),
    "activate_missing_strategy_file": ("activate_config.txt",
                                       edit(ACTIVATE, lambda d: d.update(strategies=[{"name": "s", "strategy": "nope.json", "model": "tiny_mlp"}])),
                                       load_activate_config, "strategies[0].strategy", {}, None),
    "activate_bad_entry_name": ("activate_config.txt",
                                edit(ACTIVATE, lambda d: d.update(strategies=[{"name": "my run", "strategy": "s.json", "model": "tiny_mlp"}])),
                                load_activate_config, "strategies[0].name", {"s.json": BAD_CPU_STRATEGY}, None),
    "activate_image_too_small": ("activate_config.txt",
                                 edit(ACTIVATE, lambda d: d.update(graphs=[{"model": "tiny_cnn", "batch_size": 12,
                                                                            "image_size": 2}])),
                                 lambda p: load_activate_config(p, check_model=resolve_options), "graphs[0].image_size",
                                 {}, None),
    "activate_strategy_unknown_device": ("activate_config.txt",
                                         edit(ACTIVATE, lambda d: d.update(strategies=[{"name": "s", "strategy": "s.json", "model": "tiny_mlp"}])),
                                         load_activate_config, "default.shares.gpu9", {"s.json": BAD_CPU_STRATEGY}, "s.json"),
}


def _write(path, content):
    with open(path, "w", encoding="utf-8") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_names_file_field_and_fix(case, tmp_path):
    name, content, load, field, extra, named_file = CASES[case]
    for extra_name, extra_content in extra.items():
        _write(tmp_path / extra_name, extra_content)
    path = tmp_path / name
    if content is None:
        os.mkdir(path)
    else:
        _write(path, content)
    with pytest.raises(InputError) as info:
        load(str(path))
    message = str(info.value)
    assert type(info.value) is InputError
    assert (named_file or name) in message
    assert field in message
    assert "Fix" in message


def test_there_are_at_least_fifteen_kinds():
    assert len(CASES) >= 15


def test_unknown_key_suggests_the_closest_known_key(tmp_path):
    path = tmp_path / "config.json"
    _write(path, edit(TRAIN, lambda d: d.update(rl={"learning_rat": 0.1})))
    with pytest.raises(InputError, match="did you mean 'learning_rate'"):
        load_train_config(str(path))


def test_the_unit_bounds_are_the_cluster_files_only(tmp_path):
    """A file's 16 (GB meant) is refused; code may build a cluster of tiny figures on purpose."""
    from tfplace.formats.cluster import Device, Host, build_cluster
    tiny = build_cluster("tiny", [Host("h0", nic_bandwidth_bytes_per_s=10, intra_bandwidth_bytes_per_s=10)],
                         [Device("a", "CPU", "h0", memory_bytes=16)])
    assert tiny.memory_bytes.tolist() == [16]
    path = tmp_path / "cluster.json"
    _write(path, tiny.to_json())
    with pytest.raises(InputError, match=r"cluster.json: devices\[0\].memory_bytes: is 16 bytes, under 1 MB"):
        load_cluster(str(path))
