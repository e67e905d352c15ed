"""The policy's training distribution: random heterogeneous clusters and a fixed held-out split.

A cluster is drawn in two steps. `sample_shape(rng)` draws a `ClusterShape` (how many devices,
kinds and hosts, which NIC and intra-host link, an optional memory cap). Then
`generate_cluster(shape, seed)` turns it into a cluster file body (format "tfplace.cluster",
tfplace.formats.cluster); the body is a function of (shape, seed) only.

The split (`policy/split.json`, read by `load_split`) fixes which models and cluster shapes the
policy trains on and which it is evaluated on, never trained on:

    {"format": "tfplace.policy_split", "version": 1, "comment": "...", "seed": 0,
     "train_models":   [{"model": "vgg19", "batch_size": 32}, ...],     # zoo names
     "heldout_models": [{"model": "bert_base", "batch_size": 16}, ...],
     "train_shapes":   [{"num_devices": 4, "num_kinds": 2, "num_hosts": 2, "nic": "25GbE",
                         "intra": "PCIe3", "memory_cap_bytes": null}, ...],
     "clusters_per_train_shape": 2,
     "heldout_shapes": [...]}                                            # like train_shapes

Held-out shape s is committed as clusters/heldout/<s.name>.json, generated with the split's
seed; `python -m tfplace.policy.distribution --write_heldout` rewrites those files.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.cluster import FORMAT as CLUSTER_FORMAT
from tfplace.formats.cluster import cluster_from_reader
from tfplace.formats.config import REPO_ROOT
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, write_json
from tfplace.profiling.device_model import DEVICES

SPLIT_FORMAT = "tfplace.policy_split"
DEFAULT_SPLIT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "split.json")
HELDOUT_DIR = "clusters/heldout"  # repo-relative


@dataclasses.dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float
    latency_s: float


# Link classes. NICs: line rate / 8 (10 GbE = 10e9 bit/s = 1.25e9 B/s; 25 GbE, 100 GbE likewise;
# InfiniBand HDR 200 Gb/s = 25e9 B/s), ~10 us latency through the kernel stack, ~5 us for RDMA.
# Intra-host: PCIe 3.0 x16 is 15.75 GB/s raw, ~12e9 B/s effective; PCIe 4.0 x16 twice that;
# NVLink 2 (V100 generation) 6 links x 25 GB/s per direction = 150e9 B/s per GPU (NVIDIA V100
# datasheet: 300 GB/s bidirectional). Latencies ~5 us (PCIe DMA) and ~2 us (NVLink).
LINKS: Dict[str, Link] = {
    "10GbE": Link(1.25e9, 1e-5),
    "25GbE": Link(3.125e9, 1e-5),
    "100GbE": Link(12.5e9, 1e-5),
    "IB200": Link(25e9, 5e-6),
    "PCIe3": Link(12e9, 5e-6),
    "PCIe4": Link(24e9, 5e-6),
    "NVLink": Link(150e9, 2e-6),
}
NIC_CLASSES = ("10GbE", "25GbE", "100GbE", "IB200")
INTRA_CLASSES = ("PCIe3", "PCIe4", "NVLink")
# Pinned (not derived from DEVICES) so that a new device kind does not change the clusters that
# existing seeds generate.
GPU_KINDS = ("V100", "P100", "GTX1080Ti", "T4", "A100", "H100", "H200")

DEVICE_RANGE = (2, 16)
KIND_RANGE = (2, 4)
HOST_RANGE = (1, 4)
# sample_shape: relative weight of each device count 2..16; most real jobs use 4-8 GPUs.
DEVICE_WEIGHTS = {n: 3.0 if 4 <= n <= 8 else 1.0 for n in range(DEVICE_RANGE[0], DEVICE_RANGE[1] + 1)}
MEMORY_CAPS_BYTES = (4 * 10**9, 6 * 10**9, 8 * 10**9)
MEMORY_CAP_PROBABILITY = 0.2  # often enough that some models must be split across devices


def _in(lo: int, hi: int):
    return lambda v: lo <= v <= hi


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """What `generate_cluster` keeps fixed: counts, link classes (keys of LINKS) and the memory
    cap (bytes; every device gets min(datasheet, cap): a shared GPU), None for no cap."""
    num_devices: int
    num_kinds: int
    num_hosts: int
    nic: str
    intra: str
    memory_cap_bytes: Optional[int] = None

    def __post_init__(self):
        def count(lo, hi):  # evaluated in order, so num_devices is checked before it bounds the others
            return lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool) and lo <= v <= hi
        checks = (
            ("num_devices", count(*DEVICE_RANGE), f"be an integer in {list(DEVICE_RANGE)}"),
            ("num_kinds", lambda v: count(KIND_RANGE[0], min(KIND_RANGE[1], self.num_devices))(v),
             f"be an integer in {list(KIND_RANGE)} and <= num_devices"),
            ("num_hosts", lambda v: count(HOST_RANGE[0], min(HOST_RANGE[1], self.num_devices))(v),
             f"be an integer in {list(HOST_RANGE)} and <= num_devices"),
            ("nic", lambda v: v in NIC_CLASSES, f"be one of {list(NIC_CLASSES)}"),
            ("intra", lambda v: v in INTRA_CLASSES, f"be one of {list(INTRA_CLASSES)}"),
            ("memory_cap_bytes", lambda v: v is None or count(1, float("inf"))(v), "be an integer > 0 or null"),
        )
        for field, ok, must in checks:
            if not ok(getattr(self, field)):
                raise InputError("cluster shape", field, f"must {must}, got {getattr(self, field)!r}",
                                 f"give a value that is {must[3:]}")

    @property
    def name(self) -> str:
        """Stable readable name, e.g. "d8_k3_h2_25GbE_PCIe3" or "d5_k2_h2_25GbE_PCIe4_m6G"."""
        cap = "" if self.memory_cap_bytes is None else f"_m{self.memory_cap_bytes / 1e9:g}G"
        return f"d{self.num_devices}_k{self.num_kinds}_h{self.num_hosts}_{self.nic}_{self.intra}{cap}"

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _host_sizes(rng: np.random.Generator, num_devices: int, num_hosts: int) -> List[int]:
    """Random contiguous blocks: every host gets 1 device, the rest are spread at random."""
    extra = rng.multinomial(num_devices - num_hosts, np.full(num_hosts, 1.0 / num_hosts))
    return [1 + int(e) for e in extra]


def generate_cluster(shape: ClusterShape, seed: int) -> Dict[str, Any]:
    """A cluster file body drawn for `shape`; equal (shape, seed) give equal bodies.

    Kinds: `num_kinds` distinct GPU kinds; each occurs at least once, the other devices draw
    among them. Devices are sorted by kind and cut into contiguous host blocks, so hosts are of
    one kind where the counts allow it. Validated with tfplace.formats.cluster before returning.
    """
    rng = np.random.default_rng(seed)
    kinds = [GPU_KINDS[i] for i in rng.choice(len(GPU_KINDS), size=shape.num_kinds, replace=False)]
    picks = list(range(shape.num_kinds)) + list(rng.integers(0, shape.num_kinds, shape.num_devices - shape.num_kinds))
    device_kinds = [kinds[i] for i in sorted(picks)]
    hosts, devices, counts = [], [], {}
    nic, intra = LINKS[shape.nic], LINKS[shape.intra]
    start = 0
    for h, size in enumerate(_host_sizes(rng, shape.num_devices, shape.num_hosts)):
        hosts.append({"name": f"h{h}", "address": f"h{h}.invalid",
                      "nic_bandwidth_bytes_per_s": nic.bandwidth_bytes_per_s, "nic_latency_s": nic.latency_s,
                      "intra_bandwidth_bytes_per_s": intra.bandwidth_bytes_per_s, "intra_latency_s": intra.latency_s,
                      "comment": f"{shape.nic} NIC; {shape.intra} between the GPUs"})
        for kind in device_kinds[start:start + size]:
            memory_bytes = int(DEVICES[kind].memory_bytes)
            if shape.memory_cap_bytes is not None:
                memory_bytes = min(memory_bytes, int(shape.memory_cap_bytes))
            devices.append({"name": f"{kind.lower()}_{counts.get(kind, 0)}", "kind": kind, "host": f"h{h}",
                            "memory_bytes": memory_bytes})
            counts[kind] = counts.get(kind, 0) + 1
        start += size
    body = {"format": CLUSTER_FORMAT, "version": 1, "name": f"{shape.name}_s{seed}",
            "comment": f"Generated by tfplace.policy.distribution from shape {shape.name} with seed {seed}. "
                       "Memory: datasheet figures (tfplace.profiling.device_model), capped by the shape.",
            "hosts": hosts, "devices": devices}
    as_cluster(body)  # the generated body must read back as a cluster file would
    return body


def as_cluster(body: Dict[str, Any]):
    """The tfplace.formats.cluster.Cluster of a cluster file body (checked as a file would be)."""
    return cluster_from_reader(FieldReader.from_data(body, body["name"], expected_format=CLUSTER_FORMAT))


def sample_shape(rng: np.random.Generator) -> ClusterShape:
    """A shape from the training distribution (ranges and weights: the constants above)."""
    counts = np.array(list(DEVICE_WEIGHTS))
    weights = np.array(list(DEVICE_WEIGHTS.values()))
    num_devices = int(rng.choice(counts, p=weights / weights.sum()))
    num_kinds = int(rng.integers(KIND_RANGE[0], min(KIND_RANGE[1], num_devices) + 1))
    num_hosts = int(rng.integers(HOST_RANGE[0], min(HOST_RANGE[1], num_devices) + 1))
    nic = NIC_CLASSES[int(rng.integers(len(NIC_CLASSES)))]
    intra = INTRA_CLASSES[int(rng.integers(len(INTRA_CLASSES)))]
    cap = None
    if rng.random() < MEMORY_CAP_PROBABILITY:
        cap = MEMORY_CAPS_BYTES[int(rng.integers(len(MEMORY_CAPS_BYTES)))]
    return ClusterShape(num_devices, num_kinds, num_hosts, nic, intra, cap)


@dataclasses.dataclass(frozen=True)
class Split:
    """The fixed train / held-out split. Models: ({"model": zoo name, "batch_size": int}, ...);
    held-out cluster i is the committed file heldout_clusters[i], drawn from heldout_shapes[i]
    with `seed`."""
    train_models: Tuple[Dict[str, Any], ...]
    heldout_models: Tuple[Dict[str, Any], ...]
    train_shapes: Tuple[ClusterShape, ...]
    clusters_per_train_shape: int
    heldout_shapes: Tuple[ClusterShape, ...]
    seed: int

    @property
    def heldout_clusters(self) -> Tuple[str, ...]:
        """Repo-relative paths of the held-out cluster files."""
        return tuple(f"{HELDOUT_DIR}/{s.name}.json" for s in self.heldout_shapes)


def _models(r: FieldReader, key: str) -> Tuple[Dict[str, Any], ...]:
    out = []
    for m in r.items(key, min_len=1):
        m.expect_keys(("model", "batch_size"))
        out.append({"model": m.get("model", str, check=bool, must="be a zoo model name"),
                    "batch_size": m.get("batch_size", int, check=lambda v: v > 0, must="be > 0")})
    return tuple(out)


def _shapes(r: FieldReader, key: str) -> Tuple[ClusterShape, ...]:
    out = []
    for s in r.items(key, min_len=1):
        s.expect_keys(tuple(f.name for f in dataclasses.fields(ClusterShape)))
        values = dict(num_devices=s.get("num_devices", int), num_kinds=s.get("num_kinds", int),
                      num_hosts=s.get("num_hosts", int), nic=s.get("nic", str), intra=s.get("intra", str),
                      memory_cap_bytes=s.get("memory_cap_bytes", (int, type(None)), default=None))
        try:
            out.append(ClusterShape(**values))
        except InputError as e:
            raise s.error(e.field, e.problem, e.fix) from None
    return tuple(out)


def load_split(path: Optional[str] = None) -> Split:
    """Reads the split file (default: policy/split.json). Raises InputError naming the field
    for a missing or mistyped field, and for a held-out model or shape that is also trained on."""
    r = FieldReader.from_file(path or DEFAULT_SPLIT_PATH, expected_format=SPLIT_FORMAT)
    r.expect_keys(("seed", "train_models", "heldout_models", "train_shapes", "clusters_per_train_shape",
                   "heldout_shapes"))
    split = Split(train_models=_models(r, "train_models"), heldout_models=_models(r, "heldout_models"),
                  train_shapes=_shapes(r, "train_shapes"),
                  clusters_per_train_shape=r.get("clusters_per_train_shape", int, check=lambda v: v > 0, must="be > 0"),
                  heldout_shapes=_shapes(r, "heldout_shapes"),
                  seed=r.get("seed", int, check=lambda v: v >= 0, must="be >= 0"))
    trained = {m["model"] for m in split.train_models}
    for i, m in enumerate(split.heldout_models):
        if m["model"] in trained:
            raise r.error(f"heldout_models[{i}].model", f"{m['model']!r} is also in train_models",
                          "hold out models the policy never trains on")
    for i, s in enumerate(split.heldout_shapes):
        if s in split.train_shapes:
            raise r.error(f"heldout_shapes[{i}]", f"{s.name} is also in train_shapes",
                          "hold out shapes the policy never trains on")
    return split


def training_clusters(split: Split) -> List[Tuple[str, Dict[str, Any]]]:
    """(name, cluster body) for every train shape, `clusters_per_train_shape` each; seeds come
    from SeedSequence((split.seed, shape index)), so adding a shape leaves the others alone."""
    out = []
    for i, shape in enumerate(split.train_shapes):
        seeds = np.random.SeedSequence((split.seed, i)).generate_state(split.clusters_per_train_shape)
        for seed in seeds:
            body = generate_cluster(shape, int(seed))
            out.append((body["name"], body))
    return out


def write_heldout(split: Split, repo_root: str = REPO_ROOT) -> List[str]:
    """(Re)writes the held-out cluster files under repo_root; returns their paths."""
    os.makedirs(os.path.join(repo_root, HELDOUT_DIR), exist_ok=True)
    paths = []
    for shape, rel in zip(split.heldout_shapes, split.heldout_clusters):
        paths.append(os.path.join(repo_root, rel))
        write_json(paths[-1], generate_cluster(shape, split.seed))
    return paths


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default=DEFAULT_SPLIT_PATH, help="split file")
    parser.add_argument("--write_heldout", action="store_true", help=f"rewrite {HELDOUT_DIR}/*.json from the split")
    args = parser.parse_args(argv)
    if not args.write_heldout:
        parser.error("nothing to do: pass --write_heldout")
    for path in write_heldout(load_split(args.split)):
        print(path)


if __name__ == "__main__":
    main()
