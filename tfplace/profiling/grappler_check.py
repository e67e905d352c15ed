"""Cross-check of the roofline device model against TensorFlow Grappler's analytical cost model.

    python -m tfplace.cli.grappler_check --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --kind V100
    python -m tfplace.cli.grappler_check --all --kind V100 --kind P100 [--batch-size 32] [--by-type]

(the command line lives in tfplace/cli/grappler_check.py; this module is the library)

For each graph and kind, the whole training step is placed on one virtual device whose
properties (peak FLOP/s, memory bandwidth) are the device table's (tfplace.device_model), and
Grappler's `Cluster.MeasureCosts` predicts every op (OpLevelCostEstimator: compute time at 100%
of peak plus memory time at 100% of bandwidth, no launch cost). Our total for the same step is
the sum of `roofline_seconds` over the OpGraph's ops at the same per-device batch. Both ignore
communication (one device). The ratio ours / Grappler is printed per model, as is the ratio
for our model with efficiencies 1 and no launch cost ("ideal"), which isolates the FLOP and byte
counts from the efficiency factors. On A100/H100 our conv/matmul rate is TF32; Grappler only
knows the FP32 peak, so the ratio there is expected to be well below 1.

Grappler's per-op costs of the tiny test models at their own batch come out as 0 (below its
resolution; "n/a"); give them a large --batch-size (e.g. 4096) to compare.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence, Tuple

from tfplace.formats.errors import InputError

VIRTUAL_DEVICE = "/job:localhost/replica:0/task:0/device:{}:0"
# Grappler's GPU peak = num_cores (SMs) * frequency (MHz) * cores per SM (64 from arch 6.0 on)
# * 2 FLOPs per FMA; we fix 80 SMs at arch 7.0 and solve for the frequency.
_GPU_SMS, _GPU_CORES_PER_SM = 80, 64


@dataclasses.dataclass(frozen=True)
class CheckRow:
    """One graph on one kind: predicted compute seconds of one step on one device."""
    graph: str
    kind: str
    batch_size: int
    grappler_s: float
    ours_s: float
    ours_ideal_s: float
    grappler_by_type: Mapping[str, float]
    ours_by_type: Mapping[str, float]

    @property
    def ratio(self) -> float:
        return self.ours_s / self.grappler_s if self.grappler_s > 0 else float("inf")

    @property
    def ideal_ratio(self) -> float:
        return self.ours_ideal_s / self.grappler_s if self.grappler_s > 0 else float("inf")


# Compute time is compared, not memory: the virtual device gets 1 TiB so that a step bigger than
# the real card (ResNet-200 at batch 64 on a 12 GB P100) is still estimated instead of refused.
_VIRTUAL_MEMORY_BYTES = 1 << 40


def grappler_device(spec):
    """A Grappler NamedDevice with the peak FLOP/s and bandwidth of a DeviceSpec."""
    from tensorflow.core.protobuf import device_properties_pb2 as dp

    bandwidth_kb_s = int(spec.memory_bandwidth_bytes_per_s / 1e3)  # DeviceProperties.bandwidth is KB/s
    if spec.kind == "CPU":
        # Grappler's CPU peak = num_cores * frequency(MHz) * 1e-3 GFLOP/s (one FLOP per cycle).
        props = dp.DeviceProperties(type="CPU", num_cores=1, frequency=int(round(spec.peak_flops_per_s / 1e6)),
                                    memory_size=_VIRTUAL_MEMORY_BYTES, bandwidth=bandwidth_kb_s)
        return dp.NamedDevice(name=VIRTUAL_DEVICE.format("CPU"), properties=props)
    mhz = int(round(spec.peak_flops_per_s / (_GPU_SMS * _GPU_CORES_PER_SM * 2 * 1e6)))
    props = dp.DeviceProperties(type="GPU", num_cores=_GPU_SMS, frequency=mhz, environment={"architecture": "7.0"},
                                memory_size=_VIRTUAL_MEMORY_BYTES, bandwidth=bandwidth_kb_s)
    return dp.NamedDevice(name=VIRTUAL_DEVICE.format("GPU"), properties=props)


def grappler_seconds(graph_def, sink: str, spec) -> Tuple[float, Dict[str, float]]:
    """Grappler's predicted compute time of the step (sum over ops) and its split by op type.

    graph_def: the training step with its inputs' shapes at the batch size to predict (the
    caller sets them); sink: its train op."""
    import tensorflow as tf
    from tensorflow.python.grappler import cluster as gcluster, item as gitem

    gd = type(graph_def)()
    gd.CopyFrom(graph_def)  # the device fields are cleared below
    device = grappler_device(spec)
    pin = "/device:CPU:0" if spec.kind == "CPU" else "/device:GPU:0"
    for node in gd.node:
        node.device = ""
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(pin):
            tf.compat.v1.import_graph_def(gd, name="")
        graph.add_to_collection("train_op", graph.get_operation_by_name(sink))
        metagraph = tf.compat.v1.train.export_meta_graph(graph=graph)
    cluster = gcluster.Cluster(devices=[device], disable_timeline=False)
    op_perfs, _, _ = cluster.MeasureCosts(gitem.Item(metagraph, ignore_colocation=False))
    by_type: Dict[str, float] = {}
    for perf in op_perfs:
        by_type[perf.op.op] = by_type.get(perf.op.op, 0.0) + perf.compute_cost * 1e-9  # ns
    return sum(by_type.values()), by_type


def model_seconds(graph, spec, batch_size: int, ideal: bool = False) -> Tuple[float, Dict[str, float]]:
    """Our roofline time of the step on `spec` and its split by op type. ideal: efficiencies 1
    and no launch or host costs."""
    from tfplace.profiling import device_model

    if ideal:
        spec = dataclasses.replace(spec, compute_efficiency=1.0, memory_efficiency=1.0, launch_overhead_s=0.0,
                                   host_op_overhead_s=0.0, matmul_flops_per_s=None)
    secs = device_model.roofline_seconds(spec, device_model.op_costs(graph, batch_size))
    by_type: Dict[str, float] = {}
    for t, s in zip(graph.op_types, secs):
        by_type[t] = by_type.get(t, 0.0) + float(s)
    return float(secs.sum()), by_type


def check_graph(name: str, graph, graph_def, sink: str, kinds: Sequence[str], batch_size: int) -> List[CheckRow]:
    """Grappler vs our model for one step on each kind.

    graph: the step's OpGraph at `batch_size` (per device); graph_def: the same step with its
    inputs at that batch (Grappler reads the shapes from it); sink: its train op; name: the
    graph's label in the rows."""
    from tfplace.profiling import device_model

    if batch_size <= 0:
        raise InputError("argument --batch-size", "batch_size", f"must be > 0, got {batch_size}",
                         "give a per-device batch size")
    specs = [device_model.device_spec(k, "argument --kind", f"kind[{i}]") for i, k in enumerate(kinds)]
    rows = []
    for spec in specs:
        g_s, g_by = grappler_seconds(graph_def, sink, spec)
        o_s, o_by = model_seconds(graph, spec, batch_size)
        i_s, _ = model_seconds(graph, spec, batch_size, ideal=True)
        rows.append(CheckRow(name, spec.kind, batch_size, g_s, o_s, i_s, g_by, o_by))
    return rows


HEADER = (f"{'graph':<34} {'kind':<9} {'batch':>5} {'grappler ms':>12} {'ours ms':>10} {'ours/grappler':>14} "
          f"{'ideal/grappler':>15}")


def format_rows(rows: Sequence[CheckRow], by_type: bool = False, header: bool = True) -> str:
    lines = [HEADER] if header else []
    for r in rows:
        if r.grappler_s > 0:
            ratios = f"{r.ratio:14.2f} {r.ideal_ratio:15.2f}"
        else:  # every op below Grappler's resolution
            ratios = f"{'n/a':>14} {'n/a':>15}"
        lines.append(f"{r.graph:<34} {r.kind:<9} {r.batch_size:>5} {r.grappler_s * 1e3:12.2f} {r.ours_s * 1e3:10.2f} "
                     f"{ratios}")
        if by_type:
            top = sorted(r.grappler_by_type.items(), key=lambda kv: -kv[1])[:8]
            for t, s in top:
                o = r.ours_by_type.get(t, 0.0)
                lines.append(f"    {t:<36} grappler {s * 1e3:9.2f} ms   ours {o * 1e3:9.2f} ms")
    return "\n".join(lines)
