"""Cluster: devices, hosts and the links between them, with the topology the simulator uses.

File format `cluster.json` (every field, with units, in examples/formats/README.md; the bundled
clusters and their datasheet figures in clusters/README.md):

    {"format": "tfplace.cluster", "version": 1, "name": "two_kind_4gpu",
     "hosts": [{"name": "h0", "address": "127.0.0.1",
                "nic_bandwidth_bytes_per_s": 6.25e9, "nic_latency_s": 1e-5,
                "intra_bandwidth_bytes_per_s": 1.2e10, "intra_latency_s": 5e-6,
                "cpu_cores": 2,                                                     # optional
                "emulation": {"bandwidth_bytes_per_s": 2.5e7, "latency_s": 5e-4}}],  # optional
     "devices": [{"name": "v100_0", "kind": "V100", "host": "h0", "memory_bytes": 16000000000,
                  "task": 0, "straggle_probability": 0.0, "straggle_factor": 1.0,
                  "emulation": {"cpus": [1], "cpu_fraction": 0.5}}],                  # optional
     "links": {"bandwidth_bytes_per_s": [[...]], "latency_s": [[...]]}}   # optional matrices

Units: bytes, bytes per second, seconds. Host fields left out take the `Host` defaults. A file
must give memory >= 1 MB and bandwidths >= 1 MB/s (smaller figures are taken for a wrong unit).

Topology (when no explicit matrix is given):
  * two devices on one host talk over a dedicated link per ordered pair (intra bandwidth);
  * devices on different hosts go up the source host's NIC and down the destination host's NIC
    into a non-blocking switch: each host has an "up" and a "down" link (full duplex), shared by
    every transfer that leaves or enters the host. The path is [up(src host), down(dst host)].
With an explicit matrix every ordered device pair gets its own link (the diagonal is ignored);
the matrices are kept on the Cluster so that `to_json` writes them back unchanged.

A transfer of S bytes on a free path takes sum(latencies) + S / min(bandwidths).

Devices map onto TensorFlow tasks: `task` is the index of the TF server process that owns the
device (default: one task per host, in host order), and `tf_device` is the full device name
`/job:worker/replica:0/task:<t>/device:<GPU|CPU>:<k>`. Tasks must be numbered 0..T-1 and a task
lives on one host (it is one process).

Emulation (optional, per device): how the device's TF task is run on this machine to emulate a
slower or faster device. `cpus` pins the task's process to those cores (indices as in
`os.sched_setaffinity`); `cpu_fraction` in (0, 1] limits it to that share of one core by a
cgroup CPU quota (tfplace.emulation.cpu_quota). A device with emulation must be its task's only
device (one process, one set of limits). The file is checked here; whether the cores exist and
quotas can be applied is checked where the cluster is started (tfplace.emulation.tasks), before
any process starts. activate's servers and the Horovod ranks apply these limits; the profiler
takes the same ones as flags (`python -m tfplace.profile --cpus 1 --cpu-fraction 0.5`).

Emulation (optional, per host; all hosts or none): the host is run on this machine as a network
namespace of its own behind an emulated NIC, shaped to `bandwidth_bytes_per_s` each way (tc tbf)
and delayed by `latency_s` each way (tc netem), into a switch that the run's client also sits on
(tfplace.emulation.links). So a multi-host cluster runs on one machine with the links the
simulator models: declare the same figures as the host's nic_bandwidth_bytes_per_s / nic_latency_s
(the path between two hosts is up one NIC and down the other, as in the topology above). Its
address must still be loopback: the tasks run here, at addresses the emulation hands out.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, integral, write_json

FORMAT = "tfplace.cluster"
CPU_KINDS = ("CPU",)


def is_cpu_kind(kind: str) -> bool:
    """CPU devices: kind "CPU", or "CPU_<label>" for CPUs of another speed (e.g. "CPU_half", a
    local-cluster task under a CPU quota, profiled under the same quota)."""
    return kind in CPU_KINDS or kind.startswith("CPU_")


def is_loopback_address(address: str) -> bool:
    """Whether `address` names this machine over loopback ("localhost", 127.0.0.0/8, ::1)."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip()).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Emulation:
    """How a device's task is emulated on one machine.

    cpus: cores the task's process is pinned to (sorted, distinct, >= 0); None: not pinned.
    cpu_fraction: CPU quota as a share of one core, in (0, 1]; None: no quota."""
    cpus: Optional[Tuple[int, ...]] = None
    cpu_fraction: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.cpus is not None:
            out["cpus"] = list(self.cpus)
        if self.cpu_fraction is not None:
            out["cpu_fraction"] = self.cpu_fraction
        return out


@dataclasses.dataclass(frozen=True)
class LinkEmulation:
    """How a host's NIC is emulated on one machine (tfplace.emulation.links).

    bandwidth_bytes_per_s: rate each way (tc tbf); None: not shaped.
    latency_s: delay added each way (tc netem); None: none added."""
    bandwidth_bytes_per_s: Optional[float] = None
    latency_s: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine. Defaults: 10 GbE NIC (1.25e9 B/s), PCIe-class intra-host links.

    cpu_cores: cores the host's CPU devices share (e.g. 2 for three TF tasks on a 2-core
    machine): the simulator runs at most that many of them at once. None (the default): every
    device has its own processor, as GPUs do.
    emulation: the host's NIC when the cluster runs on one machine (a network namespace behind a
    shaped link), or None."""
    name: str
    address: str = "127.0.0.1"
    nic_bandwidth_bytes_per_s: float = 1.25e9
    nic_latency_s: float = 1e-5
    intra_bandwidth_bytes_per_s: float = 1.0e10
    intra_latency_s: float = 5e-6
    cpu_cores: Optional[int] = None
    emulation: Optional[LinkEmulation] = None

    @property
    def is_loopback(self) -> bool:
        """Whether the host is this machine over loopback (its tasks may run locally)."""
        return is_loopback_address(self.address)


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator (or CPU) that runs ops.

    Attributes:
      name: short unique name used in strategies ("v100_0").
      kind: device kind, a key of the device-model table and of profiles ("V100", "CPU").
      host: name of the host it sits in.
      memory_bytes: memory available to tensors and variables (bytes, GB = 1e9).
      task: TF server task index that owns it; None (the default) means the index of its host,
        i.e. one task per host (filled in by `build_cluster`).
      tf_device: full TF device string (filled in by `build_cluster`).
      straggle_probability: chance per step that the device runs slow (simulator noise).
      straggle_factor: slowdown factor (>= 1) when it does.
      emulation: pinned cores and CPU quota of its task on a local cluster, or None.
    """
    name: str
    kind: str
    host: str
    memory_bytes: int
    task: Optional[int] = None
    tf_device: str = ""
    straggle_probability: float = 0.0
    straggle_factor: float = 1.0
    emulation: Optional[Emulation] = None


@dataclasses.dataclass(frozen=True, eq=False)
class Cluster:
    """Devices plus the link table and a path (tuple of link ids) for every ordered device pair.

    Arrays: link_bandwidth_bytes_per_s[L], link_latency_s[L], link_names[L];
    paths[i][j]: tuple of link indices a transfer from device i to device j occupies (empty for
    i == j). bandwidth_matrix_bytes_per_s / latency_matrix_s: the [D, D] matrices the cluster
    was built from, or None for the host topology. Compare clusters with `to_json()`.
    """
    name: str
    hosts: Tuple[Host, ...]
    devices: Tuple[Device, ...]
    link_names: Tuple[str, ...]
    link_bandwidth_bytes_per_s: np.ndarray
    link_latency_s: np.ndarray
    paths: Tuple[Tuple[Tuple[int, ...], ...], ...]
    source: str = ""
    bandwidth_matrix_bytes_per_s: Optional[np.ndarray] = None
    latency_matrix_s: Optional[np.ndarray] = None

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
    def num_tasks(self) -> int:
        return max(d.task for d in self.devices) + 1

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], dtype=np.int64)

    @property
    def task_emulations(self) -> Tuple[Optional[Emulation], ...]:
        """The emulation of every task, in task order (None where its device declares none)."""
        out: List[Optional[Emulation]] = [None] * self.num_tasks
        for d in self.devices:
            if d.emulation is not None:
                out[d.task] = d.emulation
        return tuple(out)

    @property
    def has_emulation(self) -> bool:
        return any(d.emulation is not None for d in self.devices)

    def interchangeable_devices(self) -> Tuple[Tuple[int, ...], ...]:
        """The devices in classes that swapping two members of maps the cluster onto itself, each
        class in device order, singletons included: same kind, host, task, memory, straggling and
        CPU quota, and the same path bandwidth and latency to and from every other device (so a
        strategy and its image under the swap simulate alike). Planners try one device per class
        where the strategy treats its members alike."""
        classes: Dict[tuple, List[List[int]]] = {}
        for i, d in enumerate(self.devices):
            quota = d.emulation.cpu_fraction if d.emulation is not None else None
            key = (d.kind, d.host, d.task, d.memory_bytes, d.straggle_probability, d.straggle_factor, quota)
            for members in classes.setdefault(key, []):
                if self._swappable(members[0], i):
                    members.append(i)
                    break
            else:
                classes[key].append([i])
        return tuple(sorted(tuple(m) for ms in classes.values() for m in ms))

    def _swappable(self, i: int, j: int) -> bool:
        """Whether devices i and j have the same links: to each other both ways, and to and from
        every third device."""
        def figures(a: int, b: int) -> Tuple[float, float]:
            return self.path_bandwidth_bytes_per_s(a, b), self.path_latency_s(a, b)
        if figures(i, j) != figures(j, i):
            return False
        return all(figures(i, k) == figures(j, k) and figures(k, i) == figures(k, j)
                   for k in range(self.num_devices) if k not in (i, j))

    def device_index(self, name: str, source: str = "", field: str = "device") -> int:
        try:
            return self._index[name]
        except KeyError:
            raise InputError(source or self.source or "cluster", field, f"unknown device {name!r}",
                             f"use one of the cluster's devices {list(self._index)}") from None

    def host_of(self, device: int) -> Host:
        name = self.devices[device].host
        return next(h for h in self.hosts if h.name == name)

    def path_bandwidth_bytes_per_s(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth from device src to dst (inf on the same device)."""
        links = self.paths[src][dst]
        return float(self.link_bandwidth_bytes_per_s[list(links)].min()) if links else float("inf")

    def path_latency_s(self, src: int, dst: int) -> float:
        """Sum of the latencies of the links on the path (0 on the same device)."""
        links = self.paths[src][dst]
        return float(self.link_latency_s[list(links)].sum()) if links else 0.0

    def transfer_seconds(self, src: int, dst: int, num_bytes: float) -> float:
        """Time to move num_bytes from src to dst on otherwise idle links."""
        if src == dst:
            return 0.0
        return self.path_latency_s(src, dst) + num_bytes / self.path_bandwidth_bytes_per_s(src, dst)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "format": FORMAT, "version": 1, "name": self.name,
            "hosts": [_host_json(h) for h in self.hosts],
            "devices": [_device_json(d) for d in self.devices],
        }
        if self.bandwidth_matrix_bytes_per_s is not None:
            links = {"bandwidth_bytes_per_s": self.bandwidth_matrix_bytes_per_s.tolist()}
            if self.latency_matrix_s is not None:
                links["latency_s"] = self.latency_matrix_s.tolist()
            out["links"] = links
        return out


def _host_json(h: Host) -> Dict[str, Any]:
    out = {f.name: getattr(h, f.name) for f in dataclasses.fields(h)
           if f.name != "emulation" and not (f.name == "cpu_cores" and h.cpu_cores is None)}
    if h.emulation is not None:
        out["emulation"] = h.emulation.to_json()
    return out


def _device_json(d: Device) -> Dict[str, Any]:
    out = {"name": d.name, "kind": d.kind, "host": d.host, "memory_bytes": int(d.memory_bytes),
           "task": d.task}
    if d.straggle_probability or d.straggle_factor != 1.0:
        out.update(straggle_probability=d.straggle_probability, straggle_factor=d.straggle_factor)
    if d.emulation is not None:
        out["emulation"] = d.emulation.to_json()
    return out


def tf_device_string(task: int, kind: str, ordinal: int) -> str:
    device_type = "CPU" if is_cpu_kind(kind) else "GPU"
    return f"/job:worker/replica:0/task:{task}/device:{device_type}:{ordinal}"


# ---- validation (one place for files and for code that builds clusters directly) -------------
def _check_hosts(src: str, hosts: Sequence[Host]) -> Dict[str, int]:
    index: Dict[str, int] = {}
    for i, h in enumerate(hosts):
        f = f"hosts[{i}]"
        if not h.name.strip():
            raise InputError(src, f"{f}.name", "is empty", "give the host a name")
        if h.name in index:
            raise InputError(src, f"{f}.name", f"duplicate host name {h.name!r}", "give every host a unique name")
        if not h.address.strip() or any(c.isspace() for c in h.address):
            raise InputError(src, f"{f}.address", f"must be a host name or IP address, got {h.address!r}",
                             'give e.g. "127.0.0.1" or "gpu-node-3.example.org"')
        for key in ("nic_bandwidth_bytes_per_s", "intra_bandwidth_bytes_per_s"):
            value = getattr(h, key)
            if not (np.isfinite(value) and value > 0):
                raise InputError(src, f"{f}.{key}", f"must be > 0, got {value}",
                                 "give the bandwidth in bytes per second, e.g. 6.25e9 for 50 GbE")
        for key in ("nic_latency_s", "intra_latency_s"):
            value = getattr(h, key)
            if not (np.isfinite(value) and value >= 0):
                raise InputError(src, f"{f}.{key}", f"must be >= 0, got {value}", "give the latency in seconds, e.g. 5e-6")
        if h.cpu_cores is not None and not (isinstance(h.cpu_cores, int) and h.cpu_cores >= 1):
            raise InputError(src, f"{f}.cpu_cores", f"must be an integer >= 1, got {h.cpu_cores!r}",
                             "give the number of cores the host's CPU devices share, or leave it out")
        if h.emulation is not None:
            _check_link_emulation(src, f, h)
        index[h.name] = i
    emulated = [h.emulation is not None for h in hosts]
    if any(emulated) and not all(emulated):
        i = emulated.index(False)
        raise InputError(src, f"hosts[{i}].emulation", "is missing while other hosts declare one",
                         "emulate every host's link (one machine runs them all) or none")
    return index


def _check_link_emulation(src: str, host_field: str, h: Host) -> None:
    e, f = h.emulation, f"{host_field}.emulation"
    if not isinstance(e, LinkEmulation):
        raise InputError(src, f, f"must be a LinkEmulation, got {e!r}", 'give e.g. {"bandwidth_bytes_per_s": 2.5e7}')
    if e.bandwidth_bytes_per_s is None and e.latency_s is None:
        raise InputError(src, f, "gives neither bandwidth_bytes_per_s nor latency_s",
                         'give "bandwidth_bytes_per_s" and/or "latency_s", or remove it')

    def number(x) -> bool:
        return not isinstance(x, bool) and isinstance(x, (int, float)) and bool(np.isfinite(x))

    bw, lat = e.bandwidth_bytes_per_s, e.latency_s
    if bw is not None and not (number(bw) and bw > 0):
        raise InputError(src, f"{f}.bandwidth_bytes_per_s", f"must be > 0, got {bw!r}",
                         "give the NIC's rate in bytes per second, e.g. 1.25e8 for 1 GbE")
    if lat is not None and not (number(lat) and 0 <= lat <= 10):
        raise InputError(src, f"{f}.latency_s", f"must be in [0, 10] seconds, got {lat!r}",
                         "give the delay each way in seconds, e.g. 5e-4")
    if not h.is_loopback:
        raise InputError(src, f"{host_field}.address", f"host {h.name!r} is emulated on this machine but its address "
                         f"{h.address!r} is not loopback", 'give "127.0.0.1", or remove the emulation to run on that host')


def _check_device(src: str, i: int, d: Device, host_index: Dict[str, int], seen: set) -> None:
    f = f"devices[{i}]"
    if not d.name.strip():
        raise InputError(src, f"{f}.name", "is empty", "give the device a name")
    if d.name in seen:
        raise InputError(src, f"{f}.name", f"duplicate device name {d.name!r}", "give every device a unique name")
    if not d.kind.strip():
        raise InputError(src, f"{f}.kind", "is empty", 'give the device kind, e.g. "V100" or "CPU"')
    if d.host not in host_index:
        raise InputError(src, f"{f}.host", f"unknown host {d.host!r}",
                         f"use one of the hosts {list(host_index)} or add the host")
    if not d.memory_bytes > 0:
        raise InputError(src, f"{f}.memory_bytes", f"must be > 0, got {d.memory_bytes}",
                         "give the device memory in bytes, e.g. 16000000000 for 16 GB")
    if d.task is not None and d.task < 0:
        raise InputError(src, f"{f}.task", f"must be >= 0, got {d.task}", "number the TF tasks from 0")
    if not 0 <= d.straggle_probability <= 1:
        raise InputError(src, f"{f}.straggle_probability", f"must be in [0, 1], got {d.straggle_probability}",
                         "give a probability per step")
    if not d.straggle_factor >= 1:
        raise InputError(src, f"{f}.straggle_factor", f"must be >= 1, got {d.straggle_factor}",
                         "give the slowdown factor (2.0 = twice as slow)")
    if d.emulation is not None:
        _check_emulation(src, f"{f}.emulation", d.emulation)


def _check_emulation(src: str, f: str, e: Emulation) -> None:
    if not isinstance(e, Emulation):
        raise InputError(src, f, f"must be an Emulation, got {e!r}", 'give e.g. {"cpus": [1], "cpu_fraction": 0.5}')
    if e.cpus is None and e.cpu_fraction is None:
        raise InputError(src, f, "gives neither cpus nor cpu_fraction",
                         'give "cpus" (pinned cores) and/or "cpu_fraction" (share of one core), or remove it')
    if e.cpus is not None:
        if not isinstance(e.cpus, tuple) or not e.cpus:
            raise InputError(src, f"{f}.cpus", f"must be a non-empty list of core indices, got {e.cpus!r}",
                             "list the cores the task is pinned to, e.g. [1]")
        for k, cpu in enumerate(e.cpus):
            if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
                raise InputError(src, f"{f}.cpus[{k}]", f"must be an integer >= 0, got {cpu!r}",
                                 "give core indices as os.sched_setaffinity numbers them (0, 1, ...)")
        if len(set(e.cpus)) != len(e.cpus):
            raise InputError(src, f"{f}.cpus", f"lists a core twice: {list(e.cpus)}", "list each core once")
    problem = None if e.cpu_fraction is None else cpu_fraction_problem(e.cpu_fraction)
    if problem:
        raise InputError(src, f"{f}.cpu_fraction", *problem)


def cpu_fraction_problem(value: Any) -> Optional[Tuple[str, str]]:
    """(problem, fix) of `value` as a task's CPU quota, a share of one core in (0, 1] (the
    emulation's cpu_fraction here, and the command lines' --cpu-fraction flags), or None when
    it is one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        return (f"must be a number in (0, 1], got {value!r}",
                "give the share of one core the task may use, e.g. 0.5 for half a core")
    return None


def _check_tasks(src: str, devices: Sequence[Device]) -> None:
    """A task is one TF server process: it lives on one host, and tasks are numbered 0..T-1."""
    task_host: Dict[int, str] = {}
    for i, d in enumerate(devices):
        if task_host.setdefault(d.task, d.host) != d.host:
            raise InputError(src, f"devices[{i}].task", f"task {d.task} is on host {task_host[d.task]!r} "
                             f"and on host {d.host!r}", "give devices of different hosts different tasks")
    # The first gap, found among the tasks given: a range up to the largest number (a typo of
    # 2**40) would not fit in memory.
    missing = next((want for want, task in enumerate(sorted(task_host)) if task != want), None)
    if missing is not None:
        raise InputError(src, "devices", f"tasks must be numbered 0..T-1 without gaps; no device has task {missing}",
                         "renumber the devices' tasks")
    for i, d in enumerate(devices):  # emulation limits a process: its task must hold only this device
        if d.emulation is not None and sum(e.task == d.task for e in devices) > 1:
            raise InputError(src, f"devices[{i}].emulation", f"task {d.task} holds several devices; emulation "
                             "applies to a task's whole process", "give the emulated device a task of its own")


def _check_matrix(src: str, field: str, m: np.ndarray, n: int, positive: bool) -> None:
    if m.shape != (n, n):
        raise InputError(src, field, f"must be a {n}x{n} matrix (one row per device), got shape {m.shape}",
                         "give one row and one column per device, in device order")
    for i in range(n):
        for j in range(n):
            if i != j and not (np.isfinite(m[i, j]) and (m[i, j] > 0 if positive else m[i, j] >= 0)):
                raise InputError(src, f"{field}[{i}][{j}]", f"must be {'> 0' if positive else '>= 0'}, got {m[i, j]}",
                                 "give bytes per second" if positive else "give seconds")


def build_cluster(name: str, hosts: Sequence[Host], devices: Sequence[Device],
                  bandwidth_matrix: Optional[np.ndarray] = None,
                  latency_matrix: Optional[np.ndarray] = None, source: str = "") -> Cluster:
    """Validates, builds the link table and paths, and fills in each device's `tf_device`.

    Raises InputError (field paths as in the file: `devices[2].host`) for duplicate names,
    devices on unknown hosts, non-positive memory or bandwidth, bad task numbering and bad
    matrices.
    """
    src = source or name
    host_index = _check_hosts(src, hosts)
    if not devices:
        raise InputError(src, "devices", "no devices", "list at least one device")
    seen: set = set()
    ordinals: Dict[Tuple[int, bool], int] = {}
    filled = []
    for i, d in enumerate(devices):
        _check_device(src, i, d, host_index, seen)
        seen.add(d.name)
        task = host_index[d.host] if d.task is None else d.task
        key = (task, is_cpu_kind(d.kind))
        ordinals[key] = ordinals.get(key, -1) + 1
        filled.append(dataclasses.replace(d, task=task, tf_device=tf_device_string(task, d.kind, ordinals[key])))
    _check_tasks(src, filled)
    n = len(filled)
    names: List[str] = []
    bandwidth: List[float] = []
    latency: List[float] = []
    paths: List[List[Tuple[int, ...]]] = [[() for _ in range(n)] for _ in range(n)]

    def add_link(link_name: str, bw: float, lat: float) -> int:
        names.append(link_name); bandwidth.append(float(bw)); latency.append(float(lat))
        return len(names) - 1

    bw_m = lat_m = None
    if bandwidth_matrix is not None:
        bw_m = np.array(bandwidth_matrix, dtype=float)
        _check_matrix(src, "links.bandwidth_bytes_per_s", bw_m, n, positive=True)
        if latency_matrix is not None:
            lat_m = np.array(latency_matrix, dtype=float)
            _check_matrix(src, "links.latency_s", lat_m, n, positive=False)
        for i in range(n):
            for j in range(n):
                if i != j:
                    paths[i][j] = (add_link(f"{filled[i].name}->{filled[j].name}", bw_m[i, j],
                                            0.0 if lat_m is None else lat_m[i, j]),)
        for m in (bw_m, lat_m):
            if m is not None:
                m.setflags(write=False)  # shared with every copy of the Cluster
    elif latency_matrix is not None:
        raise InputError(src, "links.latency_s", "given without links.bandwidth_bytes_per_s",
                         "give both matrices or neither")
    else:
        up, down = {}, {}
        for h in hosts:  # link order: h0 up, h0 down, h1 up, ... (stable ids for traces)
            up[h.name] = add_link(f"{h.name}/nic_up", h.nic_bandwidth_bytes_per_s, h.nic_latency_s)
            down[h.name] = add_link(f"{h.name}/nic_down", h.nic_bandwidth_bytes_per_s, h.nic_latency_s)
        for i, a in enumerate(filled):
            for j, b in enumerate(filled):
                if i == j:
                    continue
                if a.host == b.host:
                    h = hosts[host_index[a.host]]
                    paths[i][j] = (add_link(f"{a.name}->{b.name}", h.intra_bandwidth_bytes_per_s, h.intra_latency_s),)
                else:
                    paths[i][j] = (up[a.host], down[b.host])
    return Cluster(name=name, hosts=tuple(hosts), devices=tuple(filled), link_names=tuple(names),
                   link_bandwidth_bytes_per_s=np.array(bandwidth, dtype=float),
                   link_latency_s=np.array(latency, dtype=float),
                   paths=tuple(tuple(row) for row in paths), source=source,
                   bandwidth_matrix_bytes_per_s=bw_m, latency_matrix_s=lat_m)


# ---- file format --------------------------------------------------------------------------
def load_cluster(path: Union[str, os.PathLike]) -> Cluster:
    """Reads and validates a cluster.json file."""
    return cluster_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


_HOST_KEYS = ("name", "address", "nic_bandwidth_bytes_per_s", "nic_latency_s",
              "intra_bandwidth_bytes_per_s", "intra_latency_s", "cpu_cores")
_DEVICE_KEYS = ("name", "kind", "host", "memory_bytes", "task", "straggle_probability", "straggle_factor",
                "emulation")
_EMULATION_KEYS = ("cpus", "cpu_fraction")
_LINK_EMULATION_KEYS = ("bandwidth_bytes_per_s", "latency_s")


def _link_emulation(h: FieldReader) -> Optional[LinkEmulation]:
    """The host's "emulation" object, or None without one (values checked in build_cluster)."""
    if not h.has("emulation"):
        return None
    e = h.child("emulation")
    e.expect_keys(_LINK_EMULATION_KEYS, also_allowed=("comment",))
    return LinkEmulation(bandwidth_bytes_per_s=e.get("bandwidth_bytes_per_s", float, default=None),
                         latency_s=e.get("latency_s", float, default=None))


def _emulation(d: FieldReader) -> Optional[Emulation]:
    """The device's "emulation" object, or None without one (values checked in build_cluster)."""
    if not d.has("emulation"):
        return None
    e = d.child("emulation")
    e.expect_keys(_EMULATION_KEYS, also_allowed=("comment",))
    cpus = e.get("cpus", list, default=None)
    # a core written 1.0 is core 1; any other non-integer is kept for build_cluster to refuse, naming it
    cores = None if cpus is None else tuple(cpu if integral(cpu) is None else integral(cpu) for cpu in cpus)
    return Emulation(cpus=cores,
                     cpu_fraction=e.get("cpu_fraction", float, default=None))


def _matrix(links: FieldReader, key: str, default: Any) -> Optional[np.ndarray]:
    rows = links.get(key, list, default=default)
    if rows is None:
        return None
    if not all(isinstance(row, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in row)
               for row in rows) or len({len(row) for row in rows}) > 1:
        raise links.error(key, "must be a list of equally long rows of numbers",
                          "give one row per device with one number per device")
    return np.array(rows, dtype=float)


# Least plausible figures in a cluster FILE. Below them a value is almost surely in the wrong unit
# (16 meant as 16 GB, 10 as 10 Gbit/s) and would simulate as nonsense (an OOM at 0 GB, a step of
# days) instead of failing. Only the file reader checks them: code and tests build tiny clusters
# on purpose with `build_cluster`.
MIN_FILE_MEMORY_BYTES = 10 ** 6  # 1 MB: no device that trains a model has less
MIN_FILE_BANDWIDTH_BYTES_PER_S = 10 ** 6  # 1 MB/s (8 Mbit/s): slower than any link a cluster trains over
_MEMORY_FIX = "memory_bytes is in bytes: e.g. 16000000000 for 16 GB"
_BANDWIDTH_FIX = "bandwidths are in bytes per second: 10 Gbit/s is 1250000000"


def _check_file_units(src: str, cluster: Cluster) -> None:
    """Refuses memory under 1 MB and bandwidths under 1 MB/s (see MIN_FILE_MEMORY_BYTES)."""
    for i, d in enumerate(cluster.devices):
        if d.memory_bytes < MIN_FILE_MEMORY_BYTES:
            raise InputError(src, f"devices[{i}].memory_bytes", f"is {d.memory_bytes} bytes, under 1 MB: "
                             "too little for a device, so probably not in bytes", _MEMORY_FIX)
    rates = [(f"hosts[{i}].{key}", getattr(h, key)) for i, h in enumerate(cluster.hosts)
             for key in ("nic_bandwidth_bytes_per_s", "intra_bandwidth_bytes_per_s")]
    rates += [(f"hosts[{i}].emulation.bandwidth_bytes_per_s", h.emulation.bandwidth_bytes_per_s)
              for i, h in enumerate(cluster.hosts)
              if h.emulation is not None and h.emulation.bandwidth_bytes_per_s is not None]
    m = cluster.bandwidth_matrix_bytes_per_s
    if m is not None:
        rates += [(f"links.bandwidth_bytes_per_s[{i}][{j}]", m[i, j])
                  for i in range(len(m)) for j in range(len(m)) if i != j]
    for field, rate in rates:
        if rate < MIN_FILE_BANDWIDTH_BYTES_PER_S:
            raise InputError(src, field, f"is {rate:g} bytes per second, under 1 MB/s: too slow for a link, "
                             "so probably not in bytes per second", _BANDWIDTH_FIX)


def cluster_from_reader(r: FieldReader) -> Cluster:
    """Builds a Cluster from a parsed cluster.json; value checks live in `build_cluster`, and the
    file's plausibility bounds (memory >= 1 MB, bandwidths >= 1 MB/s) in `_check_file_units`."""
    r.expect_keys(("name", "hosts", "devices", "links"))
    name = r.get("name", str)
    hosts = []
    for h in r.items("hosts", min_len=1):
        h.expect_keys(_HOST_KEYS + ("emulation",), also_allowed=("comment",))
        defaults = Host(name="")
        hosts.append(Host(name=h.get("name", str), cpu_cores=h.get("cpu_cores", int, default=None),
                          emulation=_link_emulation(h), **{
            key: h.get(key, type(getattr(defaults, key)), default=getattr(defaults, key))
            for key in _HOST_KEYS[1:-1]}))
    devices = []
    for d in r.items("devices", min_len=1):
        d.expect_keys(_DEVICE_KEYS, also_allowed=("comment",))
        host = d.get("host", str)
        devices.append(Device(
            name=d.get("name", str), kind=d.get("kind", str), host=host,
            memory_bytes=d.get("memory_bytes", int, fix="give the device memory in bytes, e.g. 16000000000 for 16 GB"),
            task=d.get("task", int, default=None),
            straggle_probability=d.get("straggle_probability", float, default=0.0),
            straggle_factor=d.get("straggle_factor", float, default=1.0), emulation=_emulation(d)))
    bw = lat = None
    if r.has("links"):
        links = r.child("links")
        links.expect_keys(("bandwidth_bytes_per_s", "latency_s"), also_allowed=("comment",))
        bw = _matrix(links, "bandwidth_bytes_per_s", default=None)
        if bw is None:
            raise links.error("bandwidth_bytes_per_s", "missing", "give the [device x device] bandwidth matrix")
        lat = _matrix(links, "latency_s", default=None)
    cluster = build_cluster(name, hosts, devices, bw, lat, source=r.source)
    _check_file_units(r.source, cluster)
    return cluster


def save_cluster(cluster: Cluster, path: Union[str, os.PathLike]) -> None:
    write_json(path, cluster.to_json())
