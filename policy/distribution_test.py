import json
import os

import numpy as np
import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import write_json
from tfplace.policy import distribution as D
from tfplace.profiling.device_model import DEVICES

SHAPES = [
    D.ClusterShape(2, 2, 1, "10GbE", "PCIe3"),
    D.ClusterShape(5, 2, 2, "25GbE", "PCIe4", 6 * 10**9),
    D.ClusterShape(6, 4, 3, "10GbE", "PCIe3"),
    D.ClusterShape(8, 3, 4, "100GbE", "NVLink", 4 * 10**9),
    D.ClusterShape(16, 4, 4, "IB200", "NVLink"),
    D.ClusterShape(4, 4, 4, "IB200", "PCIe3"),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("seed", [0, 7])
def test_generated_cluster_matches_its_shape(shape, seed, tmp_path):
    body = D.generate_cluster(shape, seed)
    assert body == D.generate_cluster(shape, seed)
    assert body != D.generate_cluster(shape, seed + 1)
    write_json(tmp_path / "c.json", body)
    cluster = load_cluster(tmp_path / "c.json")
    assert cluster.num_devices == shape.num_devices
    assert len(cluster.hosts) == shape.num_hosts
    assert {d.host for d in cluster.devices} == {h.name for h in cluster.hosts}  # every host has a device
    assert len(cluster.kinds) == shape.num_kinds and set(cluster.kinds) <= set(D.GPU_KINDS)
    for h in cluster.hosts:
        assert h.nic_bandwidth_bytes_per_s == D.LINKS[shape.nic].bandwidth_bytes_per_s
        assert h.intra_bandwidth_bytes_per_s == D.LINKS[shape.intra].bandwidth_bytes_per_s
    cap = shape.memory_cap_bytes or float("inf")
    for d in cluster.devices:
        assert d.memory_bytes == min(DEVICES[d.kind].memory_bytes, cap)


@pytest.mark.parametrize("shape,name", [
    (D.ClusterShape(8, 3, 2, "25GbE", "PCIe3"), "d8_k3_h2_25GbE_PCIe3"),
    (D.ClusterShape(5, 2, 2, "25GbE", "PCIe4", 6 * 10**9), "d5_k2_h2_25GbE_PCIe4_m6G"),
])
def test_shape_name(shape, name):
    assert shape.name == name


@pytest.mark.parametrize("field,value", [
    ("num_devices", 1), ("num_devices", 17), ("num_kinds", 1), ("num_kinds", 5), ("num_hosts", 0),
    ("num_hosts", 5), ("nic", "40GbE"), ("intra", "SXM"), ("memory_cap_bytes", 0),
])
def test_bad_shape_names_the_field(field, value):
    kw = dict(num_devices=6, num_kinds=2, num_hosts=2, nic="10GbE", intra="PCIe3", memory_cap_bytes=None)
    kw[field] = value
    with pytest.raises(InputError) as e:
        D.ClusterShape(**kw)
    assert e.value.field == field


def test_kinds_and_hosts_never_exceed_devices():
    with pytest.raises(InputError, match="num_kinds"):
        D.ClusterShape(2, 3, 1, "10GbE", "PCIe3")
    with pytest.raises(InputError, match="num_hosts"):
        D.ClusterShape(3, 2, 4, "10GbE", "PCIe3")


def test_sampled_shapes_cover_the_ranges():
    rng = np.random.default_rng(0)
    shapes = [D.sample_shape(rng) for _ in range(200)]
    for s in shapes:
        assert 2 <= s.num_devices <= 16 and 2 <= s.num_kinds <= min(4, s.num_devices)
        assert 1 <= s.num_hosts <= min(4, s.num_devices)
        assert s.nic in D.NIC_CLASSES and s.intra in D.INTRA_CLASSES
        assert s.memory_cap_bytes in (None,) + D.MEMORY_CAPS_BYTES
    capped = sum(s.memory_cap_bytes is not None for s in shapes)
    assert 0 < capped < len(shapes)
    middle = sum(4 <= s.num_devices <= 8 for s in shapes)
    assert middle > len(shapes) / 2  # weighted toward 4..8 (uniform would give 5/15)
    assert {s.nic for s in shapes} == set(D.NIC_CLASSES) and {s.intra for s in shapes} == set(D.INTRA_CLASSES)


def test_gpu_kinds_are_datasheet_gpus():
    assert set(D.GPU_KINDS) <= set(DEVICES) and "CPU" not in D.GPU_KINDS


@pytest.fixture(scope="module")
def split():
    return D.load_split()


def test_split_holds_out_models_and_shapes(split):
    assert not {m["model"] for m in split.heldout_models} & {m["model"] for m in split.train_models}
    for s in split.heldout_shapes:
        assert s not in split.train_shapes
        assert all((s.num_devices, s.num_kinds, s.num_hosts, s.nic) != (t.num_devices, t.num_kinds, t.num_hosts, t.nic)
                   for t in split.train_shapes)


def test_heldout_files_are_reproducible_from_the_split(split):
    assert len(split.heldout_clusters) == len(split.heldout_shapes) > 0
    for rel, shape in zip(split.heldout_clusters, split.heldout_shapes):
        path = os.path.join(D.REPO_ROOT, rel)
        assert os.path.isfile(path), f"{rel} missing: run python -m tfplace.policy.distribution --write_heldout"
        with open(path, encoding="utf-8") as f:
            assert json.load(f) == D.generate_cluster(shape, split.seed), f"{rel} differs from its shape"


def test_training_clusters_are_deterministic_and_distinct(split):
    clusters = D.training_clusters(split)
    assert len(clusters) == len(split.train_shapes) * split.clusters_per_train_shape
    assert clusters == D.training_clusters(split)
    assert len({name for name, _ in clusters}) == len(clusters)
    devices = [body["devices"] for _, body in clusters]
    assert all(devices.count(d) == 1 for d in devices)


def _broken(edit):
    with open(D.DEFAULT_SPLIT_PATH, encoding="utf-8") as f:
        data = json.load(f)
    edit(data)
    return data


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.pop("seed"), "seed"),
    (lambda d: d.pop("train_shapes"), "train_shapes"),
    (lambda d: d.update(clusters_per_train_shape="2"), "clusters_per_train_shape"),
    (lambda d: d["train_models"][1].update(batch_size="64"), "train_models[1].batch_size"),
    (lambda d: d["heldout_models"][0].pop("model"), "heldout_models[0].model"),
    (lambda d: d["train_shapes"][2].update(num_kinds=3.5), "train_shapes[2].num_kinds"),
    (lambda d: d["train_shapes"][0].update(nic="40GbE"), "train_shapes[0].nic"),
    (lambda d: d["heldout_shapes"][1].update(num_hosts=17), "heldout_shapes[1].num_hosts"),
    (lambda d: d["heldout_models"].append({"model": "vgg19", "batch_size": 8}), "heldout_models[3].model"),
    (lambda d: d["heldout_shapes"].append(d["train_shapes"][0]), "heldout_shapes[3]"),
])
def test_broken_split_names_the_field(edit, field, tmp_path):
    path = tmp_path / "split.json"
    write_json(path, _broken(edit))
    with pytest.raises(InputError) as e:
        D.load_split(str(path))
    assert e.value.field == field
