"""Measured peak live bytes per device of a rewritten step, for comparison with the simulator's.

    with LocalCluster.for_cluster(cluster) as lc, StepRunner(lc, step) as runner:
        runner.initialize()
        measured = measure_peak_live_bytes(runner, step.graph_def, cluster, feed, traced_steps=3)
        measured.peak_bytes          # per cluster device, median over the traced steps

What is measured, per device of the cluster (its `tf_device`), for one FULL_TRACE training step:

  resident    the variables: every VarHandleOp the rewritten GraphDef places there (shape x dtype
              size). They were allocated by the init op, before the step, and stay.
  fed         the fed global batch, on the device of each fed placeholder.
  transient   the running sum over time of the step's allocation records (RunMetadata
              step_stats, `node_stats[].memory[].allocation_records`: +bytes when a kernel
              allocates an output or a temporary, -bytes when that buffer is freed), plus the
              tensors the device received: TensorFlow records no allocation for a _Recv's
              output, so each one counts, with the size of the tensor its _Send sent (the sender's
              recorded output shape x dtype size), from the start of its first reader on this
              device to the end of its last one (a partition graph names the readers).
  peak        resident + fed + the highest point of transient.

The simulator's peak (SimReport.peak_memory_bytes) counts the same three things from the
PlacedGraph: variables as static bytes, every buffer from its producer's start to its last
reader's end.

Limits:
  * Records carry the requested bytes: what the allocator rounds up or keeps in its pools, and
    the process's own memory (TensorFlow runtime, Python, gRPC buffers) are not counted, so this is
    the live tensor bytes, not the resident set size.
  * A received tensor counts from its first reader's start, not from its arrival: a tensor that
    arrives long before it is read is undercounted in between. A received tensor whose sender
    recorded no output shape, or that no traced node on its device reads, is left out and
    counted in `unsized_receives`; the client's feeds are such receives (the fed batch is
    counted as `fed` instead).
  * Events at the same microsecond are ordered frees first, so a free and an allocation in one
    microsecond never both count at the peak.
  * Only nodes whose step stats name the device itself are counted: on a GPU cluster, what the
    host CPU of a task holds is not. Checked on CPU clusters (clusters/local_cpu.json) only.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

_RECV_OPS = ("_Recv", "_HostRecv")
_SEND_OPS = ("_Send", "_HostSend")


@dataclasses.dataclass(frozen=True)
class DeviceLiveBytes:
    """One device's live bytes in one traced step (see the module docstring for each part)."""
    device: str
    peak_bytes: int
    resident_bytes: int
    fed_bytes: int
    transient_peak_bytes: int
    received_bytes: int
    unsized_receives: int


@dataclasses.dataclass(frozen=True)
class LiveBytesMeasurement:
    """Per traced step, one DeviceLiveBytes per cluster device (cluster order); `peak_bytes`: the
    median peak over the steps, per device."""
    steps: Tuple[Tuple[DeviceLiveBytes, ...], ...]

    @property
    def device_names(self) -> Tuple[str, ...]:
        return tuple(d.device for d in self.steps[0])

    @property
    def peak_bytes(self) -> Tuple[float, ...]:
        return tuple(float(statistics.median(step[i].peak_bytes for step in self.steps))
                     for i in range(len(self.steps[0])))


def _canonical(device: str) -> str:
    import tensorflow as tf
    return tf.DeviceSpec.from_string(device).to_string() if device else ""


def _dtype_size(dtype_enum: int) -> int:
    import tensorflow as tf
    return tf.as_dtype(dtype_enum).size


def resident_bytes(graph_def, cluster) -> Dict[str, int]:
    """Cluster device name -> bytes of the resource variables (VarHandleOp) placed on it; a variable
    of unknown shape (a -1 dimension) adds nothing."""
    by_tf_device = {_canonical(d.tf_device): d.name for d in cluster.devices}
    out = dict.fromkeys(cluster.device_names, 0)
    for node in graph_def.node:
        name = by_tf_device.get(_canonical(node.device))
        dims = [d.size for d in node.attr["shape"].shape.dim]
        if node.op == "VarHandleOp" and name is not None and all(d >= 0 for d in dims):  # unknown: not sized
            out[name] += int(np.prod(dims, dtype=np.int64)) * _dtype_size(node.attr["dtype"].type)
    return out


def fed_bytes(graph_def, cluster, feed: Mapping[str, np.ndarray]) -> Dict[str, int]:
    """Cluster device name -> bytes of the fed values (tensor name -> array) whose placeholder is
    placed on it."""
    by_tf_device = {_canonical(d.tf_device): d.name for d in cluster.devices}
    node_device = {n.name: _canonical(n.device) for n in graph_def.node}
    out = dict.fromkeys(cluster.device_names, 0)
    for tensor, value in feed.items():
        name = by_tf_device.get(node_device.get(tensor.split(":")[0], ""))
        if name is not None:
            out[name] += int(value.nbytes)
    return out


def _output_ref(ref: str) -> Tuple[str, int]:
    name, _, slot = ref.partition(":")
    return name, int(slot) if slot else 0


class _Partitions:
    """The partition graphs of one step: per device, each node's op and its data readers, and the
    _Send feeding each _Recv (rendezvous key: send device, recv device, tensor name)."""

    def __init__(self, partition_graphs):
        self.op: Dict[Tuple[str, str], str] = {}
        self.readers: Dict[Tuple[str, str], List[str]] = collections.defaultdict(list)
        self.recvs: Dict[str, List[Tuple[str, Tuple[str, str, str]]]] = collections.defaultdict(list)
        self.sent: Dict[Tuple[str, str, str], Tuple[str, str]] = {}
        for graph in partition_graphs:
            for node in graph.node:
                device = _canonical(node.device)
                self.op[(device, node.name)] = node.op
                for ref in node.input:
                    if not ref.startswith("^"):
                        self.readers[(device, _output_ref(ref)[0])].append(node.name)
                if node.op in _RECV_OPS or node.op in _SEND_OPS:
                    key = (_canonical(node.attr["send_device"].s.decode()),
                           _canonical(node.attr["recv_device"].s.decode()), node.attr["tensor_name"].s.decode())
                    if node.op in _RECV_OPS:
                        self.recvs[device].append((node.name, key))
                    else:
                        self.sent[key] = (device, node.input[0])


def _node_stats_by_device(step_stats) -> Dict[str, list]:
    out: Dict[str, list] = collections.defaultdict(list)
    for dev in step_stats.dev_stats:
        out[_canonical(dev.device)].extend(dev.node_stats)
    return out


def _output_bytes(stats_by_device) -> Dict[Tuple[str, str, int], int]:
    """(device, node, output slot) -> bytes of the output (shape x dtype size when the shape is
    known, else the allocation's requested bytes)."""
    out = {}
    for device, stats in stats_by_device.items():
        for ns in stats:
            for output in ns.output:
                desc = output.tensor_description
                dims = [d.size for d in desc.shape.dim]
                if desc.dtype and all(d >= 0 for d in dims):
                    size = int(np.prod(dims, dtype=np.int64)) * _dtype_size(desc.dtype)
                else:
                    size = int(desc.allocation_description.requested_bytes)
                out[(device, ns.node_name, output.slot)] = size
    return out


def _received_size(parts: _Partitions, output_bytes, key, depth: int = 0):
    """Bytes of the tensor a _Recv of rendezvous `key` receives, or None when unknown. A _Send
    that forwards a received tensor (no stats of its own) is followed back to its source."""
    if key not in parts.sent or depth > 8:
        return None
    device, ref = parts.sent[key]
    node, slot = _output_ref(ref)
    if (device, node, slot) in output_bytes:
        return output_bytes[(device, node, slot)]
    if parts.op.get((device, node)) in _RECV_OPS:
        upstream = [k for name, k in parts.recvs[device] if name == node]
        return _received_size(parts, output_bytes, upstream[0], depth + 1) if upstream else None
    return None


def _device_events(device: str, stats: list, parts: _Partitions, output_bytes) -> Tuple[list, int, int]:
    """(events as (microseconds, +/- bytes), received bytes, unsized receives) of one device."""
    events, start_us, end_us = [], {}, {}
    for ns in stats:
        start_us[ns.node_name] = min(start_us.get(ns.node_name, ns.all_start_micros), ns.all_start_micros)
        end = ns.all_start_micros + ns.all_end_rel_micros
        end_us[ns.node_name] = max(end_us.get(ns.node_name, end), end)
        for memory in ns.memory:
            events.extend((r.alloc_micros, int(r.alloc_bytes)) for r in memory.allocation_records)
    received, unsized = 0, 0
    for recv, key in parts.recvs.get(device, ()):
        readers = [r for r in parts.readers.get((device, recv), ()) if r in start_us]
        size = _received_size(parts, output_bytes, key)
        if size is None or not readers:
            unsized += 1
            continue
        events.append((min(start_us[r] for r in readers), size))
        events.append((max(end_us[r] for r in readers) + 1, -size))
        received += size
    return events, received, unsized


def step_live_bytes(run_metadata, cluster, resident: Mapping[str, int],
                    fed: Mapping[str, int]) -> Tuple[DeviceLiveBytes, ...]:
    """One DeviceLiveBytes per cluster device from one FULL_TRACE step's RunMetadata (run with
    output_partition_graphs), given each device's resident and fed bytes."""
    parts = _Partitions(run_metadata.partition_graphs)
    stats = _node_stats_by_device(run_metadata.step_stats)
    output_bytes = _output_bytes(stats)
    out = []
    for d in cluster.devices:
        device = _canonical(d.tf_device)
        events, received, unsized = _device_events(device, stats.get(device, []), parts, output_bytes)
        events.sort()  # by time; at one microsecond, frees (negative) first
        transient = int(max(0, np.cumsum([b for _, b in events]).max())) if events else 0
        base = int(resident.get(d.name, 0)) + int(fed.get(d.name, 0))
        out.append(DeviceLiveBytes(d.name, base + transient, int(resident.get(d.name, 0)), int(fed.get(d.name, 0)),
                                   transient, received, unsized))
    return tuple(out)


def measure_peak_live_bytes(runner, graph_def, cluster, feed: Mapping[str, np.ndarray], *, traced_steps: int = 3,
                            warmup_steps: int = 2) -> LiveBytesMeasurement:
    """Runs `warmup_steps` untraced steps, then `traced_steps` FULL_TRACE steps of an initialised
    tfplace.runtime.step_runner.StepRunner, and reconstructs each traced step's live bytes per
    device of `cluster` (the cluster the step was rewritten for; `graph_def` its rewritten GraphDef)."""
    if traced_steps < 1 or warmup_steps < 0:
        raise ValueError(f"traced_steps must be >= 1 and warmup_steps >= 0, got {traced_steps}, {warmup_steps}")
    resident = resident_bytes(graph_def, cluster)
    fed = fed_bytes(graph_def, cluster, feed)
    runner.run_steps(warmup_steps, feed)
    steps: List[Tuple[DeviceLiveBytes, ...]] = []
    for _ in range(traced_steps):
        steps.append(step_live_bytes(runner.traced_metadata(feed, partition_graphs=True), cluster, resident, fed))
    return LiveBytesMeasurement(tuple(steps))


def ratios(simulated_bytes: Sequence[float], measured: LiveBytesMeasurement) -> Tuple[float, ...]:
    """simulated / measured peak per device (nan where nothing was measured)."""
    return tuple(float(s) / m if m > 0 else float("nan") for s, m in zip(simulated_bytes, measured.peak_bytes))
