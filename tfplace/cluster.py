"""Cluster: devices, hosts and the links between them, with the topology the simulator uses.

File format `cluster.json` (documented with examples in clusters/README.md):

    {"format": "tfplace.cluster", "version": 1, "name": "two_kind_4gpu",
     "hosts": [{"name": "h0", "address": "127.0.0.1",
                "nic_bandwidth_bytes_per_s": 6.25e9, "nic_latency_s": 1e-5,
                "intra_bandwidth_bytes_per_s": 1.2e10, "intra_latency_s": 5e-6}],
     "devices": [{"name": "v100_0", "kind": "V100", "host": "h0", "memory_bytes": 16000000000}],
     "links": {"bandwidth_bytes_per_s": [[...]], "latency_s": [[...]]}}   # optional matrix

Topology (when no explicit matrix is given):
  * two devices on one host talk over a dedicated link per ordered pair (intra bandwidth);
  * devices on different hosts go up the source host's NIC and down the destination host's NIC
    into a non-blocking switch: each host has an "up" and a "down" link (full duplex), shared by
    every transfer that leaves or enters the host.
With an explicit matrix every ordered device pair gets its own link.

Devices map onto TensorFlow tasks: `task` is the index of the TF server process that owns the
device (default: one task per host, in host order), and `tf_device` is the full device name
`/job:worker/replica:0/task:<t>/device:<GPU|CPU>:<k>`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tfplace.errors import InputError
from tfplace.jsonio import FieldReader, write_json

FORMAT = "tfplace.cluster"
CPU_KINDS = ("CPU",)


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str = "127.0.0.1"
    nic_bandwidth_bytes_per_s: float = 1.25e9
    nic_latency_s: float = 1e-5
    intra_bandwidth_bytes_per_s: float = 1.0e10
    intra_latency_s: float = 5e-6


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator (or CPU) that runs ops.

    Attributes:
      name: short unique name used in strategies ("v100_0").
      kind: device kind, a key of the device-model table and of profiles ("V100", "CPU").
      host: name of the host it sits in.
      memory_bytes: memory available to tensors and variables.
      task: TF server task index that owns it.
      tf_device: full TF device string.
      straggle_probability: chance per step that the device runs slow (simulator noise).
      straggle_factor: slowdown factor (>= 1) when it does.
    """
    name: str
    kind: str
    host: str
    memory_bytes: int
    task: int = 0
    tf_device: str = ""
    straggle_probability: float = 0.0
    straggle_factor: float = 1.0


@dataclasses.dataclass(frozen=True, eq=False)
class Cluster:
    """Devices plus the link table and a path (tuple of link ids) for every ordered device pair.

    Arrays: link_bandwidth_bytes_per_s[L], link_latency_s[L], link_names[L];
    paths[i][j]: tuple of link indices a transfer from device i to device j occupies (empty for
    i == j). Transfer time of S bytes on a free path = sum of latencies + S / min bandwidth.
    """
    name: str
    hosts: Tuple[Host, ...]
    devices: Tuple[Device, ...]
    link_names: Tuple[str, ...]
    link_bandwidth_bytes_per_s: np.ndarray
    link_latency_s: np.ndarray
    paths: Tuple[Tuple[Tuple[int, ...], ...], ...]
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "_index", {d.name: i for i, d in enumerate(self.devices)})

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_names(self) -> Tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def kinds(self) -> Tuple[str, ...]:
        """Distinct device kinds, in order of first appearance."""
        return tuple(dict.fromkeys(d.kind for d in self.devices))

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], dtype=np.int64)

    def device_index(self, name: str, source: str = "", field: str = "device") -> int:
        try:
            return self._index[name]
        except KeyError:
            raise InputError(source or self.source or "cluster", field, f"unknown device {name!r}",
                             f"use one of the cluster's devices {list(self._index)}") from None

    def path_bandwidth_bytes_per_s(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth from device src to dst (inf on the same device)."""
        links = self.paths[src][dst]
        return float(self.link_bandwidth_bytes_per_s[list(links)].min()) if links else float("inf")

    def path_latency_s(self, src: int, dst: int) -> float:
        links = self.paths[src][dst]
        return float(self.link_latency_s[list(links)].sum()) if links else 0.0

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT, "version": 1, "name": self.name,
            "hosts": [dataclasses.asdict(h) for h in self.hosts],
            "devices": [_device_json(d) for d in self.devices],
        }


def _device_json(d: Device) -> Dict[str, Any]:
    out = {"name": d.name, "kind": d.kind, "host": d.host, "memory_bytes": int(d.memory_bytes),
           "task": d.task}
    if d.straggle_probability:
        out.update(straggle_probability=d.straggle_probability, straggle_factor=d.straggle_factor)
    return out


def tf_device_string(task: int, kind: str, ordinal: int) -> str:
    device_type = "CPU" if kind in CPU_KINDS else "GPU"
    return f"/job:worker/replica:0/task:{task}/device:{device_type}:{ordinal}"


def build_cluster(name: str, hosts: Sequence[Host], devices: Sequence[Device],
                  bandwidth_matrix: Optional[np.ndarray] = None,
                  latency_matrix: Optional[np.ndarray] = None, source: str = "") -> Cluster:
    """Builds the link table and paths; fills in each device's `tf_device`.

    Raises InputError for duplicate names, devices on unknown hosts and bad matrices.
    """
    src = source or name
    host_index = {}
    for i, h in enumerate(hosts):
        if h.name in host_index:
            raise InputError(src, f"hosts[{i}].name", f"duplicate host name {h.name!r}", "give every host a unique name")
        host_index[h.name] = i
    seen, ordinals, filled = set(), {}, []
    for i, d in enumerate(devices):
        if d.name in seen:
            raise InputError(src, f"devices[{i}].name", f"duplicate device name {d.name!r}", "give every device a unique name")
        seen.add(d.name)
        if d.host not in host_index:
            raise InputError(src, f"devices[{i}].host", f"unknown host {d.host!r}",
                             f"use one of the hosts {list(host_index)} or add the host")
        key = (d.task, d.kind in CPU_KINDS)
        ordinals[key] = ordinals.get(key, -1) + 1
        filled.append(dataclasses.replace(d, tf_device=tf_device_string(d.task, d.kind, ordinals[key])))
    n = len(filled)
    if n == 0:
        raise InputError(src, "devices", "no devices", "list at least one device")
    names: List[str] = []
    bandwidth: List[float] = []
    latency: List[float] = []
    paths = [[() for _ in range(n)] for _ in range(n)]
    if bandwidth_matrix is not None:
        bw = np.asarray(bandwidth_matrix, dtype=float)
        lat = np.zeros((n, n)) if latency_matrix is None else np.asarray(latency_matrix, dtype=float)
        for field, m in (("links.bandwidth_bytes_per_s", bw), ("links.latency_s", lat)):
            if m.shape != (n, n):
                raise InputError(src, field, f"must be a {n}x{n} matrix (one row per device), got shape {m.shape}",
                                 "give one row and one column per device, in device order")
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                if not bw[i, j] > 0:
                    raise InputError(src, f"links.bandwidth_bytes_per_s[{i}][{j}]", "must be > 0",
                                     "give the bandwidth between the two devices in bytes per second")
                if lat[i, j] < 0:
                    raise InputError(src, f"links.latency_s[{i}][{j}]", "must be >= 0", "give seconds")
                paths[i][j] = (len(names),)
                names.append(f"{filled[i].name}->{filled[j].name}")
                bandwidth.append(bw[i, j])
                latency.append(lat[i, j])
    else:
        up, down = {}, {}
        for h in hosts:
            up[h.name] = len(names); names.append(f"{h.name}/nic_up")
            bandwidth.append(h.nic_bandwidth_bytes_per_s); latency.append(h.nic_latency_s)
            down[h.name] = len(names); names.append(f"{h.name}/nic_down")
            bandwidth.append(h.nic_bandwidth_bytes_per_s); latency.append(h.nic_latency_s)
        for i, a in enumerate(filled):
            for j, b in enumerate(filled):
                if i == j:
                    continue
                if a.host == b.host:
                    h = hosts[host_index[a.host]]
                    paths[i][j] = (len(names),)
                    names.append(f"{a.name}->{b.name}")
                    bandwidth.append(h.intra_bandwidth_bytes_per_s)
                    latency.append(h.intra_latency_s)
                else:
                    paths[i][j] = (up[a.host], down[b.host])
    return Cluster(name=name, hosts=tuple(hosts), devices=tuple(filled), link_names=tuple(names),
                   link_bandwidth_bytes_per_s=np.array(bandwidth, dtype=float),
                   link_latency_s=np.array(latency, dtype=float),
                   paths=tuple(tuple(row) for row in paths), source=source)


def load_cluster(path: Union[str, os.PathLike]) -> Cluster:
    """Reads and validates a cluster.json file."""
    return cluster_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


def cluster_from_reader(r: FieldReader) -> Cluster:
    positive = dict(check=lambda v: v > 0, must="be > 0")
    non_negative = dict(check=lambda v: v >= 0, must="be >= 0")
    name = r.get("name", str)
    hosts = []
    for h in r.items("hosts", min_len=1):
        hosts.append(Host(
            name=h.get("name", str),
            address=h.get("address", str, default="127.0.0.1"),
            nic_bandwidth_bytes_per_s=h.get("nic_bandwidth_bytes_per_s", float, default=1.25e9, **positive),
            nic_latency_s=h.get("nic_latency_s", float, default=1e-5, **non_negative),
            intra_bandwidth_bytes_per_s=h.get("intra_bandwidth_bytes_per_s", float, default=1.0e10, **positive),
            intra_latency_s=h.get("intra_latency_s", float, default=5e-6, **non_negative),
        ))
        h.reject_unknown(also_allowed=("comment",))
    host_task = {h.name: i for i, h in enumerate(hosts)}
    devices = []
    for d in r.items("devices", min_len=1):
        host = d.get("host", str)
        devices.append(Device(
            name=d.get("name", str, check=lambda v: bool(v.strip()), must="be non-empty"),
            kind=d.get("kind", str, check=lambda v: bool(v.strip()), must="be non-empty"),
            host=host,
            memory_bytes=d.get("memory_bytes", int, check=lambda v: v > 0, must="be > 0",
                               fix="give the device memory in bytes, e.g. 16000000000 for 16 GB"),
            task=d.get("task", int, default=host_task.get(host, 0), **non_negative),
            straggle_probability=d.get("straggle_probability", float, default=0.0,
                                       check=lambda v: 0 <= v <= 1, must="be in [0, 1]"),
            straggle_factor=d.get("straggle_factor", float, default=1.0,
                                  check=lambda v: v >= 1, must="be >= 1"),
        ))
        d.reject_unknown(also_allowed=("comment",))
    bw = lat = None
    if r.has("links"):
        links = r.child("links")
        bw = links.get("bandwidth_bytes_per_s", list)
        lat = links.get("latency_s", list, default=None)
        links.reject_unknown()
        try:
            bw = np.array(bw, dtype=float)
            lat = None if lat is None else np.array(lat, dtype=float)
        except (TypeError, ValueError):
            raise r.error("links", "matrices must be lists of lists of numbers", "fix the matrix rows") from None
    r.reject_unknown()
    return build_cluster(name, hosts, devices, bw, lat, source=r.source)


def save_cluster(cluster: Cluster, path: Union[str, os.PathLike]) -> None:
    write_json(path, cluster.to_json())
