"""File formats: every bundled and example file loads; save + load gives an equal value;
cluster topology, profile interpolation and batch-splitting rules match hand-computed tables."""

import dataclasses
import errno
import glob
import json
import os

import numpy as np
import pytest

from tfplace.formats.cluster import Device, Host, build_cluster, load_cluster, save_cluster
from tfplace.formats.config import (BASELINES, load_activate_config, load_train_config, save_train_config,
                            train_config_defaults, validate_entries)
from tfplace.formats.errors import InputError
from tfplace.formats.profile import interpolate_seconds, load_profile, save_profile
from tfplace.formats.strategy import (decision, even_strategy, load_strategy, proportional_shares, proportional_strategy,
                              save_strategy, validate_strategy)
from tfplace.overheads.model import load_overheads, save_overheads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_FILES = sorted(glob.glob(os.path.join(REPO, "clusters", "*.json"))
                    + glob.glob(os.path.join(REPO, "examples", "formats", "*.json"))
                    + glob.glob(os.path.join(REPO, "examples", "formats", "*.txt"))
                    + glob.glob(os.path.join(REPO, "configs", "*.json"))
                    + glob.glob(os.path.join(REPO, "configs", "*.txt")))
LOADERS = {"tfplace.cluster": load_cluster, "tfplace.strategy": load_strategy,
           "tfplace.profile": load_profile, "tfplace.train_config": load_train_config,
           "tfplace.activate_config": load_activate_config, "tfplace.runtime_overheads": load_overheads}


def _format_of(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["format"]


def _rel(path):
    return os.path.relpath(path, REPO)


# ---- every file loads -----------------------------------------------------------------------
def test_every_format_has_an_example():
    formats = {_format_of(p) for p in DATA_FILES if "examples" in p}
    assert formats == set(LOADERS)
    assert os.path.exists(os.path.join(REPO, "examples", "formats", "README.md"))
    assert os.path.exists(os.path.join(REPO, "clusters", "README.md"))


def _readme_keys(name):
    """The keys the tables of examples/formats/README.md's section on `name` document (first column)."""
    import re
    with open(os.path.join(REPO, "examples", "formats", "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## `" + re.escape(name) + r"`.*?(?=^## |\Z)", text, re.S | re.M).group(0)
    return {key for line in section.splitlines() if line.startswith("| `")
            for key in re.findall(r"`([^`]+)`", line.split("|")[1])}


def _example_keys(value, documented, prefix=""):
    """The keys of an example file, dotted (`rl.learning_rate`, `hosts[].name`) where the README
    documents the keys inside an object, without format, version and comment."""
    keys = set()
    for key, sub in value.items():
        if key in ("format", "version", "comment"):
            continue
        name = prefix + key
        keys.add(name)
        items = sub if isinstance(sub, list) and all(isinstance(i, dict) for i in sub) else [sub]
        inner = name + "[]." if isinstance(sub, list) else name + "."
        if any(d.startswith(inner) for d in documented):
            for item in items:
                if isinstance(item, dict):
                    keys |= _example_keys(item, documented, inner)
    return keys


@pytest.mark.parametrize("name, every_key", [
    ("cluster.json", False), ("strategy.json", True), ("profile.json", False), ("overheads.json", False),
    ("config.json", True), ("activate_config.txt", False),
])
def test_the_examples_and_the_readme_tables_name_the_same_keys(name, every_key):
    """Every key of an example is in its README table (profile.json's run_order was not), and the
    examples whose comment says they hold every key do (strategy.json lacked bucket_bytes and
    min_batch_per_replica; config.json init_policy, overheads, accept_infeasible and two more)."""
    documented = _readme_keys(name)
    with open(os.path.join(REPO, "examples", "formats", name), encoding="utf-8") as f:
        data = json.load(f)
    example = _example_keys(data, documented)
    if name == "strategy.json":  # a decision's keys have a table of their own
        for decision in [data["default"], *data["groups"].values()]:
            example |= set(decision) - {"comment"}
    parents = {d.split("[]")[0].rsplit(".", 1)[0] for d in documented}  # comm of comm.p2p
    assert example - documented - parents == set()
    if every_key:  # a graph entry's keys for bare steps and sequence models are not in the example
        assert {k for k in documented if "[]" not in k} - example == set()


@pytest.mark.parametrize("path", DATA_FILES, ids=_rel)
def test_bundled_file_loads(path, tmp_path):
    value = LOADERS[_format_of(path)](path) if "config" not in _format_of(path) else \
        LOADERS[_format_of(path)](path, workdir=str(tmp_path))
    assert value is not None


@pytest.mark.parametrize("name, load, save", [("cluster.json", load_cluster, save_cluster),
                                              ("strategy.json", load_strategy, save_strategy),
                                              ("profile.json", load_profile, save_profile),
                                              ("overheads.json", load_overheads, save_overheads)])
def test_a_file_saved_with_a_byte_order_mark_loads_as_without(name, load, save, tmp_path):
    """Editors on Windows start a UTF-8 file with a byte-order mark; the file means the same."""
    with open(os.path.join(REPO, "examples", "formats", name), "rb") as f:
        data = f.read()
    (tmp_path / "plain.json").write_bytes(data)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + data)
    save(load(str(tmp_path / "plain.json")), str(tmp_path / "plain_saved.json"))
    save(load(str(tmp_path / "bom.json")), str(tmp_path / "bom_saved.json"))
    assert (tmp_path / "bom_saved.json").read_text() == (tmp_path / "plain_saved.json").read_text()


def _edited(name, change):
    """The example file `name` (examples/formats, else clusters) changed in place by `change`."""
    folder = "examples/formats" if os.path.exists(os.path.join(REPO, "examples", "formats", name)) else "clusters"
    with open(os.path.join(REPO, folder, name), encoding="utf-8") as f:
        data = json.load(f)
    change(data)
    return data


# An integer written as a float (16e9, 16.0) is that integer wherever a file gives one; a number
# with a fraction there is an error naming the field.
# (file, change, loader, read back -> expected, or the field of the error)
INTEGERS = [
    ("strategy.json", lambda d: d["default"]["shares"].update(v100_0=24.0), load_strategy,
     lambda s: dict(s.default.shares)["v100_0"], (24,)),
    ("strategy.json", lambda d: d["default"]["shares"].update(p100_0=[8.0, 8e0]), load_strategy,
     lambda s: dict(s.default.shares)["p100_0"], (8, 8)),
    ("strategy.json", lambda d: d.update(global_batch_size=64.0), load_strategy,
     lambda s: s.global_batch_size, 64),
    ("strategy.json", lambda d: d["default"]["shares"].update(v100_0=23.5, v100_1=24.5), load_strategy,
     None, "default.shares.v100_0"),
    ("strategy.json", lambda d: d["default"]["shares"].update(p100_0=[8, 7.5]), load_strategy,
     None, "default.shares.p100_0"),
    ("cluster.json", lambda d: d["devices"][0].update(memory_bytes=16.5e9), load_cluster,
     lambda c: c.devices[0].memory_bytes, 16_500_000_000),
    ("cluster.json", lambda d: d["devices"][0].update(memory_bytes=16e9 + 0.5), load_cluster,
     None, "devices[0].memory_bytes"),
    ("local_cpu_hetero.json", lambda d: d["devices"][1]["emulation"].update(cpus=[1.0]), load_cluster,
     lambda c: c.devices[1].emulation.cpus, (1,)),
    ("local_cpu_hetero.json", lambda d: d["devices"][1]["emulation"].update(cpus=[1.5]), load_cluster,
     None, "devices[1].emulation.cpus[0]"),
]


@pytest.mark.parametrize("name, change, load, read, expected", INTEGERS)
def test_an_integer_written_as_a_float_is_that_integer(name, change, load, read, expected, tmp_path):
    path = tmp_path / name
    path.write_text(json.dumps(_edited(name, change)))
    if read is None:
        with pytest.raises(InputError) as err:
            load(str(path))
        assert err.value.field == expected and "integer" in str(err.value), str(err.value)
    else:
        value = read(load(str(path)))
        assert value == expected and all(type(v) is int for v in (value if isinstance(value, tuple) else [value]))


def test_activate_example_entries_are_all_good():
    config = load_activate_config(os.path.join(REPO, "examples", "formats", "activate_config.txt"))
    assert [error for _, error in validate_entries(config)] == [None] * 4
    assert set(config.baselines) <= set(BASELINES)


# ---- round trips ----------------------------------------------------------------------------
CLUSTER_FILES = [p for p in DATA_FILES if _format_of(p) == "tfplace.cluster"]


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=_rel)
def test_cluster_round_trip(path, tmp_path):
    original = load_cluster(path)
    save_cluster(original, tmp_path / "c.json")
    again = load_cluster(tmp_path / "c.json")
    assert again.to_json() == original.to_json()
    assert again.link_names == original.link_names
    np.testing.assert_array_equal(again.link_bandwidth_bytes_per_s, original.link_bandwidth_bytes_per_s)
    np.testing.assert_array_equal(again.link_latency_s, original.link_latency_s)
    assert again.paths == original.paths
    assert [d.tf_device for d in again.devices] == [d.tf_device for d in original.devices]


def test_link_matrix_is_written_back():
    cluster = load_cluster(os.path.join(REPO, "examples", "formats", "cluster_links.json"))
    links = cluster.to_json()["links"]
    assert links["bandwidth_bytes_per_s"][0][2] == 1.25e9
    assert links["latency_s"][2][1] == 2e-5


def test_strategy_round_trip(tmp_path):
    for name in ("strategy.json", "strategy_local_cpu.json"):
        original = load_strategy(os.path.join(REPO, "examples", "formats", name))
        save_strategy(original, tmp_path / name)
        again = load_strategy(tmp_path / name)
        assert again.to_json() == original.to_json()
        assert again.groups == original.groups and again.default == original.default


def test_profile_round_trip(tmp_path):
    original = load_profile(os.path.join(REPO, "examples", "formats", "profile.json"))
    save_profile(original, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again.to_json() == original.to_json()
    assert again.ops == original.ops and again.comm == original.comm
    assert again.run_order == original.run_order and len(original.run_order) == 3


def test_overheads_round_trip(tmp_path):
    original = load_overheads(os.path.join(REPO, "examples", "formats", "overheads.json"))
    save_overheads(original, tmp_path / "o.json")
    again = load_overheads(tmp_path / "o.json")
    assert again.to_json() == original.to_json()
    assert original.transfer_s["CPU|CPU"] < 0 and original.collective_cpu_s["3"]["bytes"][0] == 16


def test_train_config_round_trip(tmp_path):
    original = load_train_config(os.path.join(REPO, "examples", "formats", "config.json"), workdir=str(tmp_path))
    save_train_config(original, tmp_path / "resolved.json")
    again = load_train_config(tmp_path / "resolved.json")
    assert again == original


# ---- config semantics -----------------------------------------------------------------------
def test_train_config_defaults_and_paths(tmp_path):
    path = tmp_path / "my_config.json"
    path.write_text(json.dumps({"graphs": [{"model": "tiny_mlp", "batch_size": 8}],
                                "clusters": ["clusters/local_cpu.json"]}))
    config = load_train_config(path, workdir=str(tmp_path / "work"))
    assert config.clusters == (os.path.join(REPO, "clusters", "local_cpu.json"),)  # repo fallback
    assert config.output_dir == str(tmp_path / "work" / "runs" / "my_config")
    assert config.profiles == (None,)
    defaults = train_config_defaults()
    assert config.max_groups == defaults["max_groups"] == 64
    assert config.rl.learning_rate == defaults["rl"]["learning_rate"]
    assert config.budget.steps == defaults["budget"]["steps"]


def test_config_paths_prefer_the_config_folder(tmp_path):
    (tmp_path / "clusters").mkdir()
    local = tmp_path / "clusters" / "local_cpu.json"
    local.write_text(open(os.path.join(REPO, "clusters", "two_kind_4gpu.json")).read())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"graphs": [{"model": "tiny_mlp", "batch_size": 8}],
                                "clusters": ["clusters/local_cpu.json"]}))
    assert load_train_config(path).clusters == (str(local),)


def test_activate_non_strict_reports_each_bad_entry(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"global_batch_size": 6, "max_groups": 4,
                                "default": {"shares": {"cpu0": 2, "cpu1": 2, "cpu2": 2}}}))
    path = tmp_path / "activate_config.txt"
    path.write_text(json.dumps({
        "strategies": [{"name": "ok", "strategy": "good.json", "model": "tiny_mlp"},
                       {"name": "missing", "strategy": "nope.json", "model": "tiny_mlp"},
                       {"name": "ok2", "strategy": "good.json", "model": "tiny_mlp"}],
        "baselines": ["single", "dp_magic", "dp_even_ps"]}))
    with pytest.raises(InputError, match=r"strategies\[1\].strategy"):
        load_activate_config(path)
    config = load_activate_config(path, strict=False)
    assert config.cluster == os.path.join(REPO, "clusters", "local_cpu.json")  # the default
    report = validate_entries(config)
    assert [name for name, _ in report] == ["ok", "missing", "ok2", "single", "dp_magic", "dp_even_ps"]
    assert [error is None for _, error in report] == [True, False, True, True, False, True]
    assert "strategies[1].strategy" in str(report[1][1]) and "baselines[1]" in str(report[4][1])


@pytest.mark.parametrize("strategies,baselines,field,first", [
    (["ok", "ok"], [], "strategies[1].name", "strategies[0].name"),
    (["single"], ["single"], "baselines[0]", "strategies[0].name"),
    ([], ["single", "dp_even_ps", "single"], "baselines[2]", "baselines[0]"),
])
def test_an_activate_entry_name_used_twice_stops_the_whole_file(strategies, baselines, field, first, tmp_path):
    """Results are keyed by entry name: a shared name would fail the valid entry too (or drop a
    baseline), so it is an error of the file, strict or not, naming both entries' fields."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"global_batch_size": 6, "max_groups": 4,
                                "default": {"shares": {"cpu0": 2, "cpu1": 2, "cpu2": 2}}}))
    path = tmp_path / "activate_config.txt"
    path.write_text(json.dumps({"strategies": [{"name": n, "strategy": "good.json", "model": "tiny_mlp"}
                                               for n in strategies],
                                "baselines": baselines, "graphs": [{"model": "tiny_mlp", "batch_size": 6}]}))
    for strict in (True, False):
        with pytest.raises(InputError) as info:
            load_activate_config(path, strict=strict)
        message = str(info.value)
        assert message.startswith(str(path)) and field in message and first in message and "Fix:" in message


# ---- cluster topology -----------------------------------------------------------------------
TESTBED = os.path.join(REPO, "clusters", "heterog_testbed.json")
# (src, dst, link names on the path, bottleneck B/s, latency s)
TOPOLOGY = [
    ("v100_0", "v100_1", ["v100_0->v100_1"], 12e9, 5e-6),
    ("v100_1", "v100_0", ["v100_1->v100_0"], 12e9, 5e-6),
    ("v100_0", "gtx1080ti_0", ["host_a/nic_up", "host_b/nic_down"], 6.25e9, 10e-6),  # host B's 50 GbE
    ("gtx1080ti_0", "v100_0", ["host_b/nic_up", "host_a/nic_down"], 6.25e9, 10e-6),
    ("gtx1080ti_1", "gtx1080ti_2", ["host_b/nic_up", "host_c/nic_down"], 6.25e9, 10e-6),
    ("p100_1", "v100_1", ["host_d/nic_up", "host_a/nic_down"], 6.25e9, 10e-6),
    ("gtx1080ti_2", "gtx1080ti_3", ["gtx1080ti_2->gtx1080ti_3"], 12e9, 5e-6),
]


@pytest.mark.parametrize("src,dst,links,bandwidth,latency", TOPOLOGY)
def test_testbed_paths(src, dst, links, bandwidth, latency):
    c = load_cluster(TESTBED)
    i, j = c.device_index(src), c.device_index(dst)
    assert [c.link_names[k] for k in c.paths[i][j]] == links
    assert c.path_bandwidth_bytes_per_s(i, j) == bandwidth
    assert c.path_latency_s(i, j) == pytest.approx(latency, rel=1e-12)
    assert c.transfer_seconds(i, j, bandwidth) == pytest.approx(1.0 + latency, rel=1e-12)


def test_testbed_facts():
    c = load_cluster(TESTBED)
    assert c.num_devices == 8 and c.kinds == ("V100", "GTX1080Ti", "P100") and c.num_tasks == 4
    assert list(c.memory_bytes) == [16e9] * 2 + [11e9] * 4 + [12e9] * 2
    assert c.paths[0][0] == () and c.path_bandwidth_bytes_per_s(0, 0) == float("inf")
    # Both V100s leave host A through the same NIC link (shared, so the simulator sees contention).
    p0 = c.device_index("p100_0")
    assert c.paths[0][p0][0] == c.paths[1][p0][0]
    assert c.devices[3].tf_device == "/job:worker/replica:0/task:1/device:GPU:1"


def test_matrix_cluster_paths():
    hosts = [Host("h0"), Host("h1")]
    devices = [Device("a", "V100", "h0", 16 * 10**9), Device("b", "T4", "h1", 15 * 10**9)]
    bw = np.array([[0, 2e9], [3e9, 0]])
    c = build_cluster("m", hosts, devices, bandwidth_matrix=bw)
    assert c.paths[0][1] != c.paths[1][0] and len(c.paths[0][1]) == 1
    assert c.path_bandwidth_bytes_per_s(0, 1) == 2e9 and c.path_bandwidth_bytes_per_s(1, 0) == 3e9
    assert c.path_latency_s(0, 1) == 0.0
    assert "latency_s" not in c.to_json()["links"]


def _three_v100s(**change):
    """Three V100s on one host; `change` = {device index: Device field overrides}."""
    devices = [Device(f"v{i}", "V100", "h0", 16 * 10**9) for i in range(3)]
    for i, fields in change.pop("devices", {}).items():
        devices[i] = dataclasses.replace(devices[i], **fields)
    return build_cluster("three", [Host("h0")], devices, **change)


SKEWED_LINK = np.full((3, 3), 1e10)
SKEWED_LINK[0, 2] = SKEWED_LINK[2, 0] = 5e9  # device 0 reaches device 2 at half the rate


@pytest.mark.parametrize("cluster, classes", [
    ("heterog_testbed.json", ((0, 1), (2, 3), (4, 5), (6, 7))),  # same kind, but another host: apart
    ("heldout/d16_k3_h4_IB200_NVLink.json", ((0, 1, 2, 3, 4), (5,), (6, 7, 8, 9), (10,), (11, 12, 13, 14, 15))),
    ("local_cpu.json", ((0,), (1,), (2,))),  # a task each
    (dict(), ((0, 1, 2),)),
    (dict(devices={1: dict(memory_bytes=8 * 10**9)}), ((0, 2), (1,))),
    (dict(devices={2: dict(straggle_probability=0.1, straggle_factor=2.0)}), ((0, 1), (2,))),
    (dict(bandwidth_matrix=SKEWED_LINK), ((0, 2), (1,))),  # 1 sees 0 and 2 alike; 0 and 2 swap too
])
def test_interchangeable_devices_share_kind_host_memory_straggling_and_links(cluster, classes):
    c = load_cluster(os.path.join(REPO, "clusters", cluster)) if isinstance(cluster, str) else _three_v100s(**cluster)
    assert c.interchangeable_devices() == classes


def test_local_cpu_cluster_has_one_task_per_device():
    c = load_cluster(os.path.join(REPO, "clusters", "local_cpu.json"))
    assert [d.tf_device for d in c.devices] == [
        f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(3)]
    assert {h.address for h in c.hosts} == {"127.0.0.1"}


# ---- profile interpolation ------------------------------------------------------------------
# (batches, seconds, query batch, expected seconds), hand-computed.
INTERPOLATION = [
    ((8, 16, 32), (1.0, 2.0, 3.6), 8, 1.0),      # exact at measured points
    ((8, 16, 32), (1.0, 2.0, 3.6), 16, 2.0),
    ((8, 16, 32), (1.0, 2.0, 3.6), 32, 3.6),
    ((8, 16, 32), (1.0, 2.0, 3.6), 12, 1.5),     # linear between
    ((8, 16, 32), (1.0, 2.0, 3.6), 24, 2.8),
    ((8, 16, 32), (1.0, 2.0, 3.6), 4, 0.5),      # below: line through 8 and 16
    ((8, 16, 32), (1.0, 2.0, 3.6), 64, 6.8),     # above: line through 16 and 32
    ((8, 16), (1.0, 3.0), 2, 0.0),               # extrapolation clipped at zero
    ((16,), (2.0,), 8, 1.0),                     # one point: proportional to batch
    ((16,), (2.0,), 48, 6.0),
]


@pytest.mark.parametrize("batches,seconds,batch,expected", INTERPOLATION)
def test_interpolation(batches, seconds, batch, expected):
    got = interpolate_seconds(batches, seconds, batch)
    if batch in batches:
        assert got == expected
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_profile_seconds_uses_interpolation():
    p = load_profile(os.path.join(REPO, "examples", "formats", "profile.json"))
    assert p.seconds("dense/MatMul", "CPU", 16) == 0.0002
    assert p.seconds("dense/MatMul", "CPU", 24) == pytest.approx(0.00029)
    with pytest.raises(InputError, match="Fix"):
        p.seconds("dense/MatMul", "T4", 16)


# ---- batch splitting ------------------------------------------------------------------------
# (weights, batch, shares) — largest remainder, ties to the earlier device, >= 1 each.
SHARES = [
    ([1.8, 1], 64, [41, 23]),
    ([1, 1], 64, [32, 32]),
    ([1, 1, 1], 64, [22, 21, 21]),
    ([1, 1], 3, [2, 1]),
    ([1, 1], 1, [1, 0]),            # batch < devices: some get nothing
    ([3, 1], 4, [3, 1]),
    ([1, 2, 1], 7, [2, 3, 2]),      # shortfalls .75, .5, .75: tie goes to device 0, then device 2
    ([100, 1, 1], 10, [8, 1, 1]),   # every device keeps >= 1 sample
    ([1, 0], 5, [5, 0]),            # weight 0: no samples
    ([15.7, 9.3, 11.3], 48, [21, 12, 15]),
]


@pytest.mark.parametrize("weights,batch,expected", SHARES)
def test_proportional_shares(weights, batch, expected):
    assert proportional_shares(weights, batch) == expected


def test_proportional_shares_invariants():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        weights = list(rng.uniform(0.1, 10.0, n))
        batch = int(rng.integers(n, 300))
        shares = proportional_shares(weights, batch)
        assert sum(shares) == batch and min(shares) >= 1
        targets = np.array(weights) / sum(weights) * batch
        if min(targets) >= 1:  # no minimum-share correction needed: within one sample of the target
            assert np.all(np.abs(np.array(shares) - targets) < 1)


def _shares_one_at_a_time(weights, batch):
    """The rule of proportional_shares as its docstring states it, a sample at a time (slow):
    the reference the one-sort implementation is checked against."""
    from fractions import Fraction
    ws = [Fraction(float(w)) for w in weights]
    targets = [batch * w / sum(ws) for w in ws]
    shares = [int(t) for t in targets]
    for _ in range(batch - sum(shares)):
        k = max(range(len(shares)), key=lambda i: (targets[i] - shares[i], -i))
        shares[k] += 1
    if all(w > 0 for w in ws) and batch >= len(ws):
        for i in range(len(shares)):
            if shares[i] == 0:
                k = max((j for j in range(len(shares)) if shares[j] >= 2), key=lambda j: (shares[j] - targets[j], -j))
                shares[k], shares[i] = shares[k] - 1, shares[i] + 1
    return shares


@pytest.mark.parametrize("draw", ["uniform", "ties", "zeros"])
def test_proportional_shares_equals_the_rule_a_sample_at_a_time(draw):
    # uniform weights; small integer weights (many exact ties); speed classes with some left out
    rng = np.random.default_rng({"uniform": 0, "ties": 1, "zeros": 2}[draw])
    for _ in range(300):
        n = int(rng.integers(1, 17))
        if draw == "uniform":
            weights = list(rng.uniform(0.01, 10.0, n))
        elif draw == "ties":
            weights = [float(w) for w in rng.integers(1, 4, n)]
        else:
            weights = [float(w) for w in rng.choice([0.0, 0.5, 1.0, 2.0], n) * rng.choice([0.38, 3.18, 9.93], n)]
            if not any(weights):
                weights[0] = 1.0
        batch = int(rng.integers(0, 130))
        assert proportional_shares(weights, batch) == _shares_one_at_a_time(weights, batch), (weights, batch)


def test_proportional_shares_rejects_bad_weights():
    for weights in ([], [0, 0], [-1, 2], [float("nan"), 1]):
        with pytest.raises(InputError, match="Fix"):
            proportional_shares(weights, 8)


def test_even_and_proportional_strategies():
    s = even_strategy(["a", "b", "c"], 64, max_groups=16)
    assert s.default.shares == (("a", (22,)), ("b", (21,)), ("c", (21,)))
    assert s.default.sync == "allreduce" and s.groups == {}
    ps = even_strategy(["a", "b"], 8, 16, sync="ps", ps_device="a")
    assert (ps.default.sync, ps.default.ps_device) == ("ps", "a")
    validate_strategy(ps, None, ["a", "b"], global_batch_size=8)
    prop = proportional_strategy(["v100", "p100", "idle"], [1.8, 1, 0], 64, 16)
    assert prop.default.shares == (("v100", (41,)), ("p100", (23,)))
    with pytest.raises(InputError, match="Fix"):
        even_strategy(["a", "b", "c"], 2, 16)
    with pytest.raises(InputError, match="ps_device"):
        even_strategy(["a", "b"], 8, 16, sync="ps")


@pytest.mark.parametrize("made_for, graph, says", [
    ("resnet50", "vgg19", "note: the strategy (s.json) was made for graph 'resnet50'; it is applied to 'vgg19'"),
    ("resnet50", "resnet50", None),
    ("", "vgg19", None),        # a strategy that names no graph
    ("resnet50", "", None),     # a graph without a model name
])
def test_a_strategy_applied_to_another_graph_is_named(made_for, graph, says):
    import dataclasses

    from tfplace.formats.strategy import graph_mismatch_note, validate_strategy
    s = dataclasses.replace(even_strategy(["a", "b"], 8, 4), graph=made_for, source="s.json")
    assert graph_mismatch_note(s, graph) == says
    with_group = dataclasses.replace(s, groups={"conv1_pad/Pad": s.default})
    with pytest.raises(InputError) as info:
        validate_strategy(with_group, ["dense/MatMul"], ["a", "b"])
    assert "groups.conv1_pad/Pad" in str(info.value)
    assert (f"made for graph {made_for!r}" in str(info.value)) == bool(made_for)


def test_a_train_config_asking_for_ppo_is_refused_when_loaded(tmp_path):
    """Only REINFORCE is implemented: the loader says so before any graph is exported."""
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "examples", "formats", "config.json")) as f:
        data = json.load(f)
    assert data["rl"]["algorithm"] == "reinforce"  # the documented example runs as it is
    data["rl"]["algorithm"] = "ppo"
    data["clusters"] = [os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, "clusters",
                                                     "two_kind_4gpu.json"))]
    data.pop("overheads", None)  # one entry per cluster of the example
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"rl\.algorithm.*reinforce"):
        load_train_config(str(path))


def _full_disk(monkeypatch):
    """Every file the atomic writer opens takes a few characters, then fails as a full disk does."""
    import builtins
    import errno

    from tfplace.formats import jsonio
    real_open = builtins.open

    def full_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        real_write = f.write

        def write(text):
            real_write(text[:3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        f.write = write
        return f
    monkeypatch.setattr(jsonio, "open", full_open, raising=False)


def _simulate_cli(tmp_path, flag, fill_disk):
    from tfplace import testing
    from tfplace.cli import common, simulate
    from tfplace.ir.loader import load_op_graph
    meta = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
    save_profile(testing.uniform_profile(load_op_graph(meta), ["V100", "P100"]), tmp_path / "profile.json")
    save_strategy(even_strategy(load_cluster(os.path.join(REPO, "clusters", "two_kind_4gpu.json")).device_names, 16, 8),
                  tmp_path / "strategy.json")
    fill_disk()
    return common.call(simulate, ["--graph", meta, "--cluster", os.path.join(REPO, "clusters", "two_kind_4gpu.json"),
                                  "--strategy", str(tmp_path / "strategy.json"), "--profile",
                                  str(tmp_path / "profile.json"), flag, str(tmp_path / "out" / "t.json")])


def _groups_cli(tmp_path, flag, fill_disk):
    from tfplace.cli import common, groups
    fill_disk()
    return common.call(groups, ["--graph", os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json"),
                                "--max-groups", "4", flag, str(tmp_path / "out" / "t.json")])


def _write_json(path):
    from tfplace.formats.jsonio import write_json
    write_json(path, {"a": [1, 2, 3]})


def _write_trace(path):
    from tfplace.simulator import write_trace
    write_trace({"traceEvents": [{"ph": "X"}]}, path)


def _save_compact(path):
    from tfplace import testing
    from tfplace.profiling.profiler import save_compact
    save_compact(testing.uniform_profile(testing.tiny_graph("mlp", 8), ["V100"]), path)


@pytest.mark.parametrize("writer", [_write_json, _write_trace, _save_compact, lambda p: save_strategy(
    even_strategy(load_cluster(os.path.join(REPO, "clusters", "two_kind_4gpu.json")).device_names, 16, 8), p)])
def test_a_full_disk_is_one_error_naming_the_file_and_leaves_no_temporary_file(tmp_path, monkeypatch, writer):
    (tmp_path / "out").mkdir()
    path = str(tmp_path / "out" / "t.json")
    _full_disk(monkeypatch)
    with pytest.raises(InputError) as info:
        writer(path)
    assert info.value.source == path and "No space left on device" in info.value.problem
    assert "free space" in info.value.fix
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("command, flag", [(_simulate_cli, "--trace"), (_simulate_cli, "--json"),
                                           (_groups_cli, "--json")])
def test_a_command_writing_to_a_full_disk_says_which_file_in_one_line(tmp_path, monkeypatch, capsys, command, flag):
    (tmp_path / "out").mkdir()
    capsys.readouterr()
    assert command(tmp_path, flag, lambda: _full_disk(monkeypatch)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'out' / 't.json'}: cannot be written"), err
    assert os.listdir(tmp_path / "out") == []


def _failing_write(f):
    f.write(b"half" if "b" in f.mode else "half")
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("binary, write, expected", [
    (False, lambda f: f.write("text é\n"), b"text \xc3\xa9\n"),      # UTF-8 text
    (True, lambda f: f.write(b"\x89PNG\x00\xff"), b"\x89PNG\x00\xff"),  # bytes (a plot, a GraphDef)
    (False, _failing_write, None),                                   # a full disk: one InputError, no file
    (True, _failing_write, None),
])
def test_an_atomic_write_leaves_the_whole_file_or_none(tmp_path, binary, write, expected):
    from tfplace.formats.jsonio import atomic_write
    path = tmp_path / "out.bin"
    if expected is None:
        with pytest.raises(InputError, match="out.bin: cannot be written .*Fix: free space"):
            atomic_write(path, write, binary=binary)
        assert os.listdir(tmp_path) == []  # neither the file nor its temporary
    else:
        atomic_write(path, write, binary=binary)
        assert path.read_bytes() == expected and os.listdir(tmp_path) == ["out.bin"]


def test_two_atomic_writes_of_one_file_at_once_each_leave_a_whole_file(tmp_path):
    """Two writers of one path with the same pid (two threads here; across pid namespaces, two
    containers sharing a cache folder) must not share a temporary file: with <path>.tmp<pid> the
    second truncated the first's, renamed it into place, the first went on writing into the renamed
    file (path half of each) and then failed its own rename."""
    import threading
    from tfplace.formats.jsonio import atomic_write
    path = tmp_path / "out.json"
    first_half_written, second_done = threading.Event(), threading.Event()
    errors = []

    def slow(f):
        f.write("A" * 100)
        f.flush()  # on disk, as a file larger than the buffer is while it is written
        first_half_written.set()
        second_done.wait(10)
        f.write("A" * 100)

    def first():
        try:
            atomic_write(path, slow)
        except Exception as err:  # noqa: BLE001  (reported by the assert below)
            errors.append(err)
    thread = threading.Thread(target=first)
    thread.start()
    assert first_half_written.wait(10)
    atomic_write(path, lambda f: f.write("B" * 150))
    assert path.read_text() == "B" * 150
    second_done.set()
    thread.join(10)
    assert path.read_text() == "A" * 200  # the last rename wins, whole (was "B" * 100 + "A" * 100)
    assert errors == []
    assert os.listdir(tmp_path) == ["out.json"]


@pytest.mark.parametrize("shares, whole", [
    ({"a": 12}, {"a": 12}),                     # one replica already: unchanged
    ({"a": [6, 6]}, {"a": 12}),                 # micro-batches joined
    ({"a": 4, "b": 8}, {"b": 12}),              # onto the device with most samples
    ({"a": 6, "b": [3, 3]}, {"a": 12}),         # a tie: the first listed
])
def test_whole_on_one_device(shares, whole):
    from tfplace.formats.strategy import splits, whole_on_one_device
    d = decision(shares, "ps", "b", priority=2)
    out = whole_on_one_device(d)
    assert out == decision(whole, "ps", "b", priority=2)
    assert not splits(out) and splits(d) == (d != out)
