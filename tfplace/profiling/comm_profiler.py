"""Measures point-to-point and all-reduce costs on a local cluster and fits latency + bandwidth.

    comm = measure_comm()                      # starts a 3-task LocalCluster, ~30-60 s
    print_fits(comm); comm.model               # tfplace.formats.profile.CommModel

Point-to-point: task 1 holds a float32 variable of S bytes; an op on task 0 reads it, so every
step moves S bytes from task 1 to task 0 through TensorFlow's own transport (gRPC here). Its
time is the `RecvTensor` record of the step's trace on task 0 (the receiving side times the whole
transfer, request to last byte).

All-reduce: every task of a group holds a float32 variable of S bytes, reads it (an Identity
named `allreduce...`) and all-reduces it with the nodes the rewrite emits
(tfplace.ir.node_defs.import_all_reduce, the rewrite's CPU implementation), and a tiny slice op consumes each result. A collective is
asynchronous (its own trace record ends when the kernel is launched) and an exchange is many
ops, so the time is taken from the trace's absolute start times (one host, one clock): from the
last participant's read (before that the group cannot progress) to the last participant's
consumer start (the result is there).

Sizes sweep 4 KiB ... `max_bytes` by factors of 4; per size the minimum over `repeats` traced
steps is kept (interference only adds time). The fit `t = latency + bytes / bandwidth` is a
least-squares fit on relative residuals (each point counts by its relative error, so the
microsecond latencies of small messages are not drowned by the large ones) with a soft-L1 loss
(robust to an outlier step); latency is clamped at >= 0.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.profile import CommModel, LinearCost
from tfplace.ir.node_defs import CPU_ALL_REDUCE, import_all_reduce

DEFAULT_MIN_BYTES = 4 << 10
DEFAULT_MAX_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class CommMeasurement:
    """Raw points and fits.

    p2p: (bytes, seconds) per size; allreduce: group size -> (bytes, seconds) per size.
    model: the fitted CommModel; conditions: how it was measured (JSON-able).
    """
    p2p: Tuple[Tuple[int, float], ...]
    allreduce: Mapping[int, Tuple[Tuple[int, float], ...]]
    model: CommModel
    conditions: Mapping[str, object]


def message_sizes(min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES, factor: int = 4) -> List[int]:
    """min_bytes, min_bytes*factor, ... up to max_bytes (inclusive), multiples of 4 bytes."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise InputError("comm sweep", "max_bytes", f"range [{min_bytes}, {max_bytes}] is empty",
                         "give 4 <= min_bytes <= max_bytes")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(int(s) // 4 * 4)
        s *= factor
    return out


def fit_linear(points: Sequence[Tuple[float, float]]) -> LinearCost:
    """Robust fit of seconds = latency_s + bytes / bandwidth (see the module docstring)."""
    from scipy.optimize import least_squares

    pts = np.array([(b, s) for b, s in points if s > 0], dtype=float)
    if len(pts) < 2:
        raise InputError("comm fit", "points", f"needs >= 2 positive timings, got {len(pts)}",
                         "measure at least two message sizes")
    x, y = pts[:, 0], pts[:, 1]
    # Start from an ordinary least-squares line; parameters scaled to O(1) for the solver.
    slope0, lat0 = np.polyfit(x, y, 1)
    slope0 = max(slope0, 1e-15)
    lat0 = max(lat0, 0.0)
    lat_scale, slope_scale = max(y.min(), 1e-9), slope0

    def residual(p):
        return (p[0] * lat_scale + p[1] * slope_scale * x) / y - 1.0

    res = least_squares(residual, x0=[lat0 / lat_scale, 1.0], bounds=([0.0, 1e-9], [np.inf, np.inf]),
                        loss="soft_l1", f_scale=0.1)
    latency, slope = res.x[0] * lat_scale, res.x[1] * slope_scale
    return LinearCost(latency_s=float(latency), bandwidth_bytes_per_s=float(1.0 / slope))


def _records(step_stats, prefix: str) -> List[Tuple[str, float]]:
    out = []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name.startswith(prefix):
                secs = ns.all_end_rel_nanos * 1e-9 if ns.all_end_rel_nanos else ns.all_end_rel_micros * 1e-6
                out.append((dev.device, secs))
    return out


def measure_comm(sizes: Optional[Sequence[int]] = None, group_sizes: Sequence[int] = (2, 3), repeats: int = 5,
                 warmup: int = 1, max_bytes: int = DEFAULT_MAX_BYTES, threads_per_task: Optional[int] = None,
                 cluster=None, progress: Optional[Callable[[float], object]] = None) -> CommMeasurement:
    """Measures p2p (task 1 -> task 0) and all-reduce over the first g tasks for g in group_sizes.

    Args:
      sizes: message sizes in bytes (default 4 KiB ... max_bytes by x4).
      group_sizes: all-reduce group sizes to measure (each <= the number of tasks).
      cluster: a running LocalCluster to use (default: start one with max(group_sizes, 2) tasks).
      progress: factory `total -> ProgressBar` (see tfplace.profiling.profiler), or None.
    """
    sizes = list(sizes) if sizes is not None else message_sizes(max_bytes=max_bytes)
    for i, s in enumerate(sizes):
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 4:
            raise InputError("comm sweep", f"sizes[{i}]", f"must be an integer >= 4 bytes, got {s!r}", "give bytes")
    group_sizes = sorted(set(int(g) for g in group_sizes))
    if any(g < 2 for g in group_sizes):
        raise InputError("comm sweep", "group_sizes", f"{group_sizes} has a group smaller than 2",
                         "all-reduce needs at least 2 participants")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.runtime.local_cluster import LocalCluster

    num_tasks = max(group_sizes + [2])
    started = time.monotonic()
    if cluster is None:
        threads = None if threads_per_task is None else [threads_per_task] * num_tasks
        with LocalCluster(num_tasks=num_tasks, threads_per_task=threads) as lc:
            return _measure(lc, sizes, group_sizes, repeats, warmup, progress, started)
    if cluster.num_tasks < num_tasks:
        raise InputError("comm sweep", "cluster", f"has {cluster.num_tasks} tasks, the sweep needs {num_tasks}",
                         "start a LocalCluster with more tasks or measure smaller groups")
    return _measure(cluster, sizes, group_sizes, repeats, warmup, progress, started)


def _measure(lc, sizes, group_sizes, repeats, warmup, progress, started) -> CommMeasurement:
    import tensorflow as tf

    total = len(sizes) * (1 + len(group_sizes)) * (repeats + warmup)
    bar = progress(total) if progress else None
    graph = tf.Graph()
    p2p_fetch: Dict[int, tf.Tensor] = {}
    ar_fetch: Dict[Tuple[int, int], List[tf.Operation]] = {}
    with graph.as_default():
        instance = 0
        for s in sizes:
            n = s // 4
            with tf.device(lc.task_device(1)):
                v = tf.Variable(tf.zeros([n]), name=f"p2p_src_{s}")
            with tf.device(lc.task_device(0)):
                # Identity on task 0 forces the whole tensor across; the slice keeps the fetch tiny.
                p2p_fetch[s] = tf.identity(v.read_value(), name=f"p2p_dst_{s}")[:1]
            for g in group_sizes:
                instance += 1
                values, devices = [], [lc.task_device(t) for t in range(g)]
                for t, dev in enumerate(devices):
                    with tf.device(dev):
                        x = tf.Variable(tf.ones([n]), name=f"ar{g}_{s}_t{t}")
                        values.append(tf.identity(x.read_value(), name=f"allreduce{g}_{s}_t{t}"))
                sums = import_all_reduce(values, devices, "float32", CPU_ALL_REDUCE[0], g, instance, f"ar{g}_{s}")
                outs = []
                for t, (dev, y) in enumerate(zip(devices, sums)):
                    with tf.device(dev):
                        outs.append(tf.slice(y, [0], [1], name=f"ardone{g}_{s}_t{t}"))
                ar_fetch[(g, s)] = outs
        init = tf.compat.v1.global_variables_initializer()
    trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    p2p_points: List[Tuple[int, float]] = []
    ar_points: Dict[int, List[Tuple[int, float]]] = {g: [] for g in group_sizes}
    from tfplace.runtime.step_runner import step_session_config
    # as the runtime runs a step: Grappler off (with it on, a slice of the exchange's concatenated
    # sums would let it skip shards)
    with lc.session(graph=graph, config=step_session_config(None, lc)) as sess:
        lc.run(sess, init)
        for s in sizes:
            p2p_points.append((s, _time(lc, sess, p2p_fetch[s], trace, "RecvTensor", repeats, warmup, bar,
                                        f"p2p {s} B", min_over="sum")))
            for g in group_sizes:
                secs = _time(lc, sess, ar_fetch[(g, s)], trace, f"{g}_{s}_t", repeats, warmup, bar,
                             f"all-reduce x{g} {s} B", min_over="collective")
                ar_points[g].append((s, secs))
    model = CommModel(p2p=fit_linear(p2p_points), allreduce={g: fit_linear(ar_points[g]) for g in group_sizes})
    conditions = {"cluster": f"LocalCluster({lc.num_tasks} tasks on {lc.host})", "transport": "grpc",
                  "all_reduce": CPU_ALL_REDUCE[0], "sizes_bytes": list(sizes), "repeats": repeats, "warmup": warmup,
                  "statistic": "min",
                  "p2p_points": [[b, float(f"{t:.4g}")] for b, t in p2p_points],
                  "allreduce_points": {str(g): [[b, float(f"{t:.4g}")] for b, t in pts] for g, pts in ar_points.items()},
                  "fit": "relative-residual soft-L1 least squares, t = latency + bytes / bandwidth",
                  "elapsed_s": round(time.monotonic() - started, 1)}
    return CommMeasurement(tuple(p2p_points), {g: tuple(p) for g, p in ar_points.items()}, model, conditions)


def _collective_seconds(step_stats, key: str) -> Optional[float]:
    """Last collective start -> last consumer start, over the participants (names *{key}<t>)."""
    starts, dones = [], []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            t = ns.all_start_nanos * 1e-9 if ns.all_start_nanos else ns.all_start_micros * 1e-6
            if ns.node_name.startswith("allreduce" + key) and "/" not in ns.node_name:
                starts.append(t)
            elif ns.node_name.startswith("ardone" + key) and "/" not in ns.node_name:
                dones.append(t)
    if not starts or not dones:
        return None
    return max(dones) - max(starts)


def _time(lc, sess, fetch, trace, prefix, repeats, warmup, bar, note, min_over) -> float:
    """Min over traced steps of one step's time: "sum" of the records named `prefix*` (one p2p
    transfer may show as several RecvTensor records) or "collective" (see _collective_seconds).
    Wall clock if the trace has none."""
    import tensorflow as tf
    for _ in range(warmup):
        lc.run(sess, fetch)
        if bar:
            bar.update(1, note)
    best = np.inf
    for _ in range(repeats):
        md = tf.compat.v1.RunMetadata()
        t0 = time.perf_counter()
        lc.run(sess, fetch, options=trace, run_metadata=md)
        wall = time.perf_counter() - t0
        if min_over == "collective":
            value = _collective_seconds(md.step_stats, prefix)
        else:
            recs = [s for _, s in _records(md.step_stats, prefix)]
            value = sum(recs) if recs else None
        value = wall if value is None or value <= 0 else value
        best = min(best, value)
        if bar:
            bar.update(1, note)
    return float(best)


def format_fits(comm: CommMeasurement) -> str:
    """Human-readable fits and points (one line per fit, then the points)."""
    lines = []
    m = comm.model

    def line(label, fit, pts):
        worst = max(abs(fit.seconds(b) - t) / t for b, t in pts)
        lines.append(f"{label:<16} latency {fit.latency_s * 1e6:8.1f} us, bandwidth "
                     f"{fit.bandwidth_bytes_per_s / 1e9:7.3f} GB/s  (worst point off by {100 * worst:.0f}%)")

    line("p2p", m.p2p, comm.p2p)
    for g, fit in sorted(m.allreduce.items()):
        line(f"all-reduce x{g}", fit, comm.allreduce[g])
    head = "    bytes " + "".join(f"{lab:>14}" for lab in ["p2p"] + [f"allreduce x{g}" for g in sorted(comm.allreduce)])
    lines.append(head)
    for i, (b, t) in enumerate(comm.p2p):
        row = [t] + [comm.allreduce[g][i][1] for g in sorted(comm.allreduce)]
        lines.append(f"{b:>9} " + "".join(f"{x * 1e3:11.3f} ms" for x in row))
    return "\n".join(lines)


def print_fits(comm: CommMeasurement) -> None:
    print(format_fits(comm))
