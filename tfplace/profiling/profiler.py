"""Measures per-op run time of a training step on a real device from TensorFlow step stats.

    result = profile_bundle("graph_defs/zoo/tiny_cnn_b16_s16_sgd.json",
                            ProfileOptions(device="CPU", batch_sizes=(4, 8, 16)))
    save_profile(result.profile, "profile.json")

How (one graph import per device, every per-device batch size measured in it):
  1. The step is imported into a `tf.compat.v1.Session`, every node pinned to `device` (soft
     placement lets ops without a kernel there fall back to the host). Grappler and the classic
     graph optimizer are off by default, so every op of the GraphDef runs as itself and is timed
     under its own name (with them on, fused or folded ops vanish from the trace).
  2. `init_op` runs once; every input gets synthetic data of its dtype and shape: floats uniform
     in [0, 1), integers uniform in [0, max_value) (labels, token ids), booleans at random.
  3. `warmup` untraced steps per batch size, then `repeats` steps per batch size with
     `RunOptions(trace_level=FULL_TRACE)`, round-robin over the batch sizes
     (`measurement_order`): a slow phase of the machine then costs each size a few repeats,
     which the statistic drops, rather than every repeat of one size.
  4. From each step's `RunMetadata.step_stats`, an op's time is `all_end_rel` of its record (the
     kernel plus TensorFlow's per-op bookkeeping, which the simulator must also charge), in ns;
     records of one op in one step are summed (several GPU kernels, or an op that runs twice).
     On GPUs the kernel records of `.../stream:all` replace the launch records of the device.
  5. Per op the minimum over repeats is kept by default (`statistic="min"`): interference on a
     shared machine only ever adds time, so the minimum converges to the undisturbed cost with
     few repeats, where the median needs most repeats undisturbed. `median` and `mean` are
     available. A device limited by a CPU quota (tfplace.emulation.cpu_quota) is not timed under it: there
     a 0.5 kind's ops summed to up to 4.1x the unlimited kind's where compute slows 2.0x (most
     likely the profiler's own work between timed steps draws on the quota and stalls the next
     step); `python -m tfplace.profile --cpu-fraction` times its ops unlimited and scales them
     by the slowdown measured under the quota (`scaled_kind`).
  6. TensorFlow's oneDNN rewrite on CPUs (not Grappler; it runs as the runtime runs) fuses e.g.
     Conv2D + BiasAdd into one kernel named after the BiasAdd, so the Conv2D has no record. The
     first traced step also returns the executed partition graphs; an op that vanished there is
     attributed to the fused node that absorbed it (`fused_into`), and that kernel's time is
     shared among its ops in proportion to their roofline work (tfplace.device_model), recorded
     in `conditions["fused"]`. Profiling keeps the kernels the runtime will run.
  7. Tracing costs time of its own, inside each op's record (a NodeExecStats per op, with its
     timestamps and allocation records): on the tiny transformer the traced records sum to ~2x
     the untraced step. So 3 untraced steps follow each traced one, each with an empty step (a
     NoOp with the same feed: the session's fixed cost per run), all interleaved so that a slow
     phase of the machine hits records and walls alike (traced steps first, then the untraced
     ones, gave this machine's CNN τ of 5-214 µs across batch sizes). Where ops run
     one at a time on a CPU (inter_threads 1: the executor is serial), the untraced step minus
     the empty one is the true sum of the op costs. Every record is then reduced by one per-op
     tracing cost τ, keeping at least a tenth of itself (an op's dispatch). τ is the median over
     the batch sizes of the τ that makes that size's records add up to its untraced sum
     (`trace_cost_per_op_by_batch_s`; 0 where the records do not exceed it: nothing is ever
     raised). `trace_calibration=False` keeps the records as traced. The conditions keep τ
     (`trace_cost_per_op_s`), the walls and the traced sums (`traced_sum_of_ops_s`). Elsewhere
     (GPU stream times, parallel executors) the walls are recorded and nothing is corrected.
  8. The order the executor ran the ops in is part of what was timed: the first traced step at
     the largest batch size gives `Profile.run_order` (records by start time, each fused op just
     before the kernel that ran it). The lowering breaks priority ties in that order, so the
     rewrite chains a device's ops as the profiled step ran them. ResNet-50 (b8, 32x32) on one
     core, three rounds in one process: the rewritten single-device step took 147.7-152.4 ms
     chained in graph order, 139.8-145.7 ms chained in this order, the original graph
     142.5-146.4 ms.

The step is the sink and the loss with all their ancestors (as in the OpGraph). Ops of the step
that never appear in any trace are listed in `Profile.missing_ops`, each with a reason in
`conditions["missing_reasons"]` — never silently 0. Fed placeholders are the usual case: a fed
tensor replaces the node, no kernel runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import atomic_write
from tfplace.formats.profile import Profile, graph_name  # graph_name: re-exported, the profile's own rule

STATISTIC_FUNCTIONS = {"min": np.min, "median": np.median, "mean": np.mean}
STATISTICS = tuple(STATISTIC_FUNCTIONS)
UNTRACED_PER_TRACED = 3  # untraced (and empty) steps timed per traced repeat: cheap, and noisier
TRACE_FLOOR_FRACTION = 0.1  # a record keeps at least this share of itself: every op costs its dispatch
_DEVICE_RE = re.compile(r"^(?:/device:)?(CPU|GPU)(?::(\d+))?$", re.IGNORECASE)

FED_REASON = "fed input: the fed tensor replaces the node, no kernel runs"
UNTRACED_REASON = "no record in any traced step (no kernel ran: pruned, folded or host-only)"
FUSED_REASON = "fused into {} by TensorFlow's graph rewrite, which has no usable cost to split"


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """How to measure. Thread counts of 0 mean TensorFlow's default.

    inter_threads defaults to 1: ops then run one at a time, as the simulator schedules them on a
    device, and concurrent ops do not inflate each other's times on a small machine.
    """
    device: str = "CPU"
    kind: str = ""            # profile key; default "CPU" for CPU devices, else required
    batch_sizes: Tuple[int, ...] = (8, 16, 32)
    repeats: int = 5
    warmup: int = 2
    statistic: str = "min"
    intra_threads: int = 0
    inter_threads: int = 1
    grappler: bool = False
    seed: int = 0
    trace_calibration: bool = True

    def validated(self, source: str = "profile options") -> "ProfileOptions":
        device_type, index = parse_device(self.device, source)
        kind = self.kind or ("CPU" if device_type == "CPU" else "")
        if not kind:
            raise InputError(source, "kind", f"no device kind given for {self.device}",
                             "name the GPU model, e.g. --kind V100 (it keys the profile)")
        if not self.batch_sizes:
            raise InputError(source, "batch_sizes", "is empty", "give at least one per-device batch size, e.g. 8,16,32")
        for i, b in enumerate(self.batch_sizes):
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0:
                raise InputError(source, f"batch_sizes[{i}]", f"must be a positive integer, got {b!r}",
                                 "give per-device batch sizes >= 1, e.g. 8,16,32")
        for field, value, low in (("repeats", self.repeats, 1), ("warmup", self.warmup, 0),
                                  ("intra_threads", self.intra_threads, 0),
                                  ("inter_threads", self.inter_threads, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(source, field, f"must be an integer >= {low}, got {value!r}", f"use {low} or more")
        if self.statistic not in STATISTICS:
            raise InputError(source, "statistic", f"is {self.statistic!r}", f"use one of {list(STATISTICS)}")
        return dataclasses.replace(self, device=f"/device:{device_type}:{index}", kind=kind,
                                   batch_sizes=tuple(sorted(set(int(b) for b in self.batch_sizes))))


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """A measured profile plus what the measurement saw.

    step_wall_s: per batch size, the statistic of the traced steps' wall-clock time.
    untraced_step_wall_s: the same for untraced steps (what the step really costs).
    missing_reasons: op name -> why it has no time (also in profile.conditions).
    elapsed_s: total time of the measurement, graph import included.
    """
    profile: Profile
    step_wall_s: Mapping[int, float]
    untraced_step_wall_s: Mapping[int, float]
    missing_reasons: Mapping[str, str]
    elapsed_s: float


def parse_device(device: str, source: str = "argument --device") -> Tuple[str, int]:
    """"CPU", "gpu:1", "/device:GPU:0" -> ("CPU", 0), ("GPU", 1), ("GPU", 0)."""
    m = _DEVICE_RE.match(device.strip()) if isinstance(device, str) else None
    if not m:
        raise InputError(source, "device", f"unknown device {device!r}",
                         "use CPU, GPU, GPU:<index> or /device:GPU:<index>")
    return m.group(1).upper(), int(m.group(2) or 0)


def profile_graph_note(profile: Profile, graph_source: str, profile_path: str,
                       op_names: Sequence[str] = ()) -> Optional[str]:
    """A line to print when `profile` (read from `profile_path`) was measured on another graph than
    the one at `graph_source` (by graph_name: the model with its sizes and optimizer): its per-op
    costs may still cover every op (e.g. another image size), so nothing else would say so. None
    as well when the profile lacks one of `op_names` (the graph's ops) altogether: the lowering
    then refuses it with the reason (tfplace.lowering.costs), and a note that it is applied would
    contradict that."""
    if not profile.graph or not graph_source:
        return None
    if any(n not in profile.ops and n not in profile.missing_ops for n in op_names):
        return None
    applied = graph_name(graph_source)
    if profile.graph == applied:
        return None
    return (f"note: the profile {profile_path} was measured on graph {profile.graph!r}; it is applied to "
            f"{applied!r}, whose op costs may differ (other sizes or optimizer)")


def step_op_names(graph_def, roots: Sequence[str]) -> List[str]:
    """Names of the root ops (sink, loss) and all their ancestors over data and control inputs,
    in GraphDef order."""
    roots = [roots] if isinstance(roots, str) else list(roots)
    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph_def.node}
    for r in roots:
        if r not in inputs:
            raise InputError("graph", "sink", f"no node named {r!r}", "name the train op (and loss) of the graph")
    seen, stack = set(roots), list(roots)
    while stack:
        for src in inputs.get(stack.pop(), ()):
            if src not in seen:
                seen.add(src)
                stack.append(src)
    return [n.name for n in graph_def.node if n.name in seen]


def fused_into(graph_def, executed: Mapping[str, str], candidates: Iterable[str]) -> Dict[str, str]:
    """For ops absent from the executed (partition) graphs, the node whose kernel absorbed them.

    TensorFlow's graph rewrites (oneDNN on CPUs: Conv2D + BiasAdd [+ Relu] -> one
    `_MklNativeConv2DWithBias` node named after the last op) drop ops and keep the name of the
    op at the end of the fused chain. An op X is fused into Y when Y is reached from X through
    data consumers that all vanished, and Y runs with a different op type than it has in the
    GraphDef (its kernel was replaced).

    Args:
      graph_def: the original GraphDef.
      executed: node name -> op type, over the partition graphs the runtime executed.
      candidates: op names that had no record in the trace.
    """
    types = {n.name: n.op for n in graph_def.node}
    consumers: Dict[str, List[str]] = {}
    for n in graph_def.node:
        for i in n.input:
            if not i.startswith("^"):
                consumers.setdefault(i.split(":")[0], []).append(n.name)
    out: Dict[str, str] = {}
    for x in candidates:
        if x in executed:
            continue
        frontier, seen, found = [x], {x}, None
        while frontier and found is None:
            nxt = []
            for op in frontier:
                for c in consumers.get(op, ()):
                    if c in seen:
                        continue
                    seen.add(c)
                    if c in executed:
                        if executed[c] != types.get(c) and found is None:
                            found = c
                    else:
                        nxt.append(c)
            frontier = nxt
        if found is not None:
            out[x] = found
    return out


def synthetic_feed(inputs: Sequence[Mapping[str, Any]], batch_size: int, rng: np.random.Generator,
                   source: str = "graph metadata") -> Dict[str, np.ndarray]:
    """Random data for every input: {"name:0": array} at `batch_size` on each input's batch axis."""
    feed = {}
    for i, spec in enumerate(inputs):
        shape = list(spec["shape"])
        axis = spec.get("batch_axis", 0)
        shape[axis] = batch_size
        if any(d is None or d < 0 for d in shape):
            raise InputError(source, f"inputs[{i}].shape", f"has unknown dimensions {spec['shape']} besides the batch",
                             "export the input with a fully known shape apart from the batch axis")
        dtype = np.dtype(spec["dtype"]) if spec["dtype"] != "bfloat16" else np.float32
        if dtype.kind == "f":
            value = rng.random(shape, dtype=np.float64).astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, int(spec.get("max_value", 2)), size=shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            raise InputError(source, f"inputs[{i}].dtype", f"cannot synthesize {spec['dtype']!r} inputs",
                             "profile graphs whose inputs are numbers or booleans")
        feed[f"{spec['name']}:0"] = value
    return feed


def op_seconds_from_step_stats(step_stats, known: Optional[Iterable[str]] = None) -> Dict[str, float]:
    """op name -> seconds in one traced step (see the module docstring for the rules).

    Node names are normalised: a ":<suffix>" (GPU kernel records "name:Type", outputs ":0") is
    stripped; names not in `known` (if given; e.g. "_SOURCE", "_arg_x_0_0", RecvTensor) are dropped.
    """
    known = None if known is None else set(known)

    def collect(devices) -> Dict[str, float]:
        acc: Dict[str, float] = {}
        for dev in devices:
            for ns in dev.node_stats:
                op = ns.node_name.split(":")[0]
                if known is None or op in known:
                    secs = ns.all_end_rel_nanos * 1e-9 if ns.all_end_rel_nanos else ns.all_end_rel_micros * 1e-6
                    acc[op] = acc.get(op, 0.0) + secs
        return acc

    streams = [d for d in step_stats.dev_stats if d.device.endswith("/stream:all")]
    gpu_prefixes = tuple(d.device[:-len("/stream:all")] for d in streams)  # e.g. "/device:GPU:0"
    host = [d for d in step_stats.dev_stats if "/stream:" not in d.device and "/memcpy" not in d.device]
    kernels = collect(streams)
    out = dict(kernels)
    for dev in host:
        launch_only = bool(gpu_prefixes) and dev.device.endswith(gpu_prefixes)
        for op, secs in collect([dev]).items():
            if launch_only and op in kernels:
                continue  # a GPU op: its kernel time came from stream:all, this is the launch
            out[op] = out.get(op, 0.0) + secs
    return out


def op_start_order(step_stats, known: Optional[Iterable[str]] = None) -> List[str]:
    """Op names of one traced step in the order their records start (`all_start_micros`; ties in
    record order), each once, normalised and filtered like `op_seconds_from_step_stats`."""
    known = None if known is None else set(known)
    first: Dict[str, Tuple[int, int]] = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            op = ns.node_name.split(":")[0]
            if (known is None or op in known) and op not in first:
                first[op] = (int(ns.all_start_micros), len(first))
    return sorted(first, key=first.__getitem__)


def run_order_with_fused(order: Sequence[str], fused: Mapping[str, str]) -> List[str]:
    """`order` with each op that ran inside another op's kernel (`fused`: op -> the op whose
    kernel ran it, `fused_into`) placed just before that op, in `fused`'s order; fused ops whose
    kernel is not in `order` are left out."""
    before: Dict[str, List[str]] = {}
    for op, into in fused.items():
        before.setdefault(into, []).append(op)
    return [x for op in order for x in before.get(op, []) + [op]]


def reduce_samples(samples: Sequence[Mapping[str, float]], statistic: str) -> Dict[str, float]:
    """Per op, `statistic` over the steps in which it appeared."""
    per_op: Dict[str, List[float]] = {}
    for step in samples:
        for op, s in step.items():
            per_op.setdefault(op, []).append(s)
    fn = STATISTIC_FUNCTIONS[statistic]
    return {op: float(fn(v)) for op, v in per_op.items()}


def measurement_order(batch_sizes: Sequence[int], repeats: int) -> List[Tuple[int, int]]:
    """(repeat, batch size) of each timed repeat, in the order they run: round-robin over the
    batch sizes, one repeat of each per pass.

    A slow phase of a shared machine lasts seconds (ResNet-50's weight-bound conv5 kernels at
    3.4x for all five repeats of one batch size, while the sizes timed before it were not
    hit). Timed size after size, such a phase takes every repeat of one size and the median
    keeps it; timed round-robin, it takes a few repeats of every size, and the median over the
    repeats drops them as long as the phase covers fewer than half of the passes.
    """
    return [(r, b) for r in range(repeats) for b in batch_sizes]


def machine_conditions() -> Dict[str, Any]:
    """Where the measurement ran: CPU model, core count, host, OS, date (UTC)."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu_model": cpu, "cpu_count": os.cpu_count(), "host": platform.node(),
            "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class ProgressBar:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line every few
    seconds otherwise)."""

    def __init__(self, total: float, label: str, stream=None, width: int = 28, min_interval_s: float = 5.0):
        """total: the amount of work (any unit, e.g. samples to process); update() adds to it."""
        self.total, self.label, self.width = max(1e-9, float(total)), label, width
        self.stream = sys.stderr if stream is None else stream
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done, self.start, self.last = 0, time.monotonic(), -1e9
        self.min_interval_s = 0.1 if self.tty else min_interval_s

    def update(self, n: float = 1, note: str = "") -> None:
        """Adds `n` to the work done and redraws (at most every min_interval_s, and at the end)."""
        self.update_to(self.done + n, note)

    def update_to(self, done: float, note: str = "", elapsed_s: Optional[float] = None) -> None:
        """Sets the work done to `done` (clipped to the total) and redraws as update() does.
        `elapsed_s`: how long the work has run, when its clock is not this bar's (work that
        started before the bar was made, e.g. a search that reports its own elapsed seconds)."""
        now = time.monotonic()
        if elapsed_s is not None:
            self.start = now - elapsed_s
        self.done = min(self.total, done)
        if now - self.last < self.min_interval_s and self.done < self.total:
            return
        self.last = now
        frac = self.done / self.total
        elapsed = now - self.start
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        bar = "#" * int(round(frac * self.width))
        line = (f"{self.label} [{bar:<{self.width}}] {100 * frac:3.0f}% {elapsed:5.0f}s elapsed, "
                f"~{eta:.0f}s left  {note}")
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        if self.done >= self.total and self.tty:
            self.stream.write("\n")
        self.stream.flush()


def _session_config(tf, options: ProfileOptions):
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=options.intra_threads,
                                      inter_op_parallelism_threads=options.inter_threads,
                                      allow_soft_placement=True)
    if not options.grappler:
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        config.graph_options.optimizer_options.do_constant_folding = False
        config.graph_options.optimizer_options.do_common_subexpression_elimination = False
    return config


def _unbatched(graph_def, inputs: Sequence[Mapping[str, Any]]):
    """A copy with unknown batch dims on the inputs and no stale `_output_shapes`, so one
    imported graph runs at every batch size."""
    gd = type(graph_def)()
    gd.CopyFrom(graph_def)
    by_name = {i["name"]: i for i in inputs}
    for node in gd.node:
        node.device = ""
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
        if node.name in by_name and "shape" in node.attr:
            dims = node.attr["shape"].shape.dim
            axis = by_name[node.name].get("batch_axis", 0)
            if axis < len(dims):
                dims[axis].size = -1
    return gd


def step_fetches(meta: Mapping[str, Any]) -> List[str]:
    """What one training step runs: the bundle's sink (the updates), and its loss if it has one."""
    return [meta["sink"]] + ([meta["loss"]] if meta.get("loss") else [])


def check_feedable(graph_def, meta: Mapping[str, Any], source: str = "graph") -> List[str]:
    """Raises InputError unless the step of `graph_def` (bundle metadata `meta`) runs on the batch
    alone: metadata without "sink", "init_op" or "inputs", or a placeholder of the step that is
    not a batch input and has no default (a learning rate, keep_prob: a run without the script's
    feeds cannot know it). Returns the step's op names (step_op_names of the sink and the loss)."""
    for field in ("sink", "init_op", "inputs"):
        if field not in meta:
            raise InputError(source, field, "missing from the graph metadata",
                             "use a bundle from tfplace.graph_defs.export")
    step_ops = step_op_names(graph_def, step_fetches(meta))
    op_types = {n.name: n.op for n in graph_def.node}
    fed = {i["name"] for i in meta["inputs"]}
    unfed = [n for n in step_ops if op_types.get(n) == "Placeholder" and n not in fed]
    if unfed:  # the profiler and the real runs feed the batch only
        from tfplace.ir.step_roles import unfed_placeholders_error
        raise unfed_placeholders_error(source, unfed)
    return step_ops


def check_bundle_feedable(meta_path: str, source: Optional[str] = None) -> None:
    """check_feedable on the bundle `meta_path` (<stem>.json beside <stem>.pb): what a command
    that runs the step on the batch alone (profile --cluster, plan --confirm_real) checks before
    it starts any process, so that such a step is one error line, not a failed child. `source`:
    the file the error names (the user's own step, which the bundle was imported from), default
    meta_path."""
    from tfplace.ir.loader import read_graph_source
    graph_def, meta, _ = read_graph_source(os.fspath(meta_path), None)
    check_feedable(graph_def, meta, source or os.fspath(meta_path))


def profile_graph(graph_def, meta: Mapping[str, Any], options: ProfileOptions, name: str = "",
                  source: str = "graph", progress: Optional[Callable[[int], ProgressBar]] = None) -> ProfileResult:
    """Measures every op of the step of `graph_def` (bundle metadata `meta`). See the module doc.

    Args:
      graph_def: the step's GraphDef.
      meta: bundle metadata with "sink", "init_op", "inputs" (name, dtype, shape, batch_axis,
        max_value for integer inputs).
      options: how to measure (validated here).
      name: profile graph name.
      progress: factory `total -> ProgressBar`, or None for no progress output.
    """
    options = options.validated()
    started = time.monotonic()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    step_ops = check_feedable(graph_def, meta, source)
    fetches = step_fetches(meta)
    op_types = {n.name: n.op for n in graph_def.node}
    fed = {i["name"] for i in meta["inputs"]}
    gd = _unbatched(graph_def, meta["inputs"])
    graph = tf.Graph()
    with graph.as_default(), tf.device(options.device):
        tf.compat.v1.import_graph_def(gd, name="")
        empty_step = tf.no_op(name="tfplace_profiler_empty_step")  # the session's fixed cost per run
    rng = np.random.default_rng(options.seed)
    weights = [b * (options.warmup + (1 + UNTRACED_PER_TRACED) * options.repeats) for b in options.batch_sizes]
    bar = progress(sum(weights)) if progress else None
    trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    first_trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                          output_partition_graphs=True)
    per_batch: Dict[int, Dict[str, float]] = {}
    wall: Dict[int, float] = {}
    untraced_wall: Dict[int, float] = {}
    empty_wall: Dict[int, float] = {}
    executed: Dict[str, str] = {}
    order_batch = max(options.batch_sizes)  # Profile.run_order: the first traced step at this batch
    started_order: List[str] = []
    pick = STATISTIC_FUNCTIONS[options.statistic]
    with tf.compat.v1.Session(graph=graph, config=_session_config(tf, options)) as sess:
        sess.run(meta["init_op"])
        feeds = {b: synthetic_feed(meta["inputs"], b, rng, source) for b in options.batch_sizes}
        for b in options.batch_sizes:
            for _ in range(options.warmup):
                sess.run(fetches, feed_dict=feeds[b])
                if bar:
                    bar.update(b, f"batch {b} warm-up")
        samples: Dict[int, List[Dict[str, float]]] = {b: [] for b in options.batch_sizes}
        walls: Dict[int, List[float]] = {b: [] for b in options.batch_sizes}
        plain: Dict[int, List[float]] = {b: [] for b in options.batch_sizes}
        empty: Dict[int, List[float]] = {b: [] for b in options.batch_sizes}
        for r, b in measurement_order(options.batch_sizes, options.repeats):
            feed = feeds[b]
            md = tf.compat.v1.RunMetadata()
            t0 = time.perf_counter()
            sess.run(fetches, feed_dict=feed, options=trace if executed else first_trace, run_metadata=md)
            walls[b].append(time.perf_counter() - t0)
            if not executed:
                executed = {n.name: n.op for pg in md.partition_graphs for n in pg.node}
            samples[b].append(op_seconds_from_step_stats(md.step_stats, known=step_ops))
            if b == order_batch and not started_order:
                started_order = op_start_order(md.step_stats, known=step_ops)
            # each traced step is followed by its untraced and empty steps: a slow phase of the
            # machine hits the records and the walls they are calibrated against alike (rule 7)
            for _ in range(UNTRACED_PER_TRACED):
                for fetch, out in ((fetches, plain[b]), (empty_step, empty[b])):
                    t0 = time.perf_counter()
                    sess.run(fetch, feed_dict=feed)
                    out.append(time.perf_counter() - t0)
            if bar:
                bar.update(b * (1 + UNTRACED_PER_TRACED), f"batch {b} repeat {r + 1}/{options.repeats}")
        for b in options.batch_sizes:
            per_batch[b] = reduce_samples(samples[b], options.statistic)
            wall[b] = float(pick(walls[b]))
            untraced_wall[b], empty_wall[b] = float(pick(plain[b])), float(pick(empty[b]))
    traced_sums = {b: sum(v.values()) for b, v in per_batch.items()}
    trace_cost: Dict[int, float] = {}
    serial_cpu = options.device.startswith("/device:CPU") and options.inter_threads == 1
    tau = 0.0
    if options.trace_calibration and serial_cpu:
        for b in options.batch_sizes:
            trace_cost[b] = trace_cost_per_op(per_batch[b].values(), untraced_wall[b] - empty_wall[b])
        # the tracer's cost per record does not depend on the batch; one median over the batch
        # sizes is steadier than each size's own estimate on a noisy machine
        tau = float(np.median(list(trace_cost.values())))
        for b in options.batch_sizes:
            per_batch[b] = {op: max(s - tau, TRACE_FLOOR_FRACTION * s) for op, s in per_batch[b].items()}
    sums = {b: sum(v.values()) for b, v in per_batch.items()}
    traced = set().union(*per_batch.values())
    fused = fused_into(graph_def, executed, [op for op in step_ops if op not in traced and op not in fed])
    for b in options.batch_sizes:
        _split_fused(per_batch[b], fused, graph, b, options.kind)
    ops: Dict[str, Dict[str, Tuple[Tuple[int, ...], Tuple[float, ...]]]] = {}
    missing: Dict[str, str] = {}
    for op in step_ops:
        points = [(b, per_batch[b][op]) for b in options.batch_sizes if op in per_batch[b]]
        if points:
            ops[op] = {options.kind: (tuple(b for b, _ in points), tuple(s for _, s in points))}
        elif op in fed and op_types.get(op) == "Placeholder":
            missing[op] = FED_REASON
        else:
            missing[op] = FUSED_REASON.format(fused[op]) if op in fused else UNTRACED_REASON
    elapsed = time.monotonic() - started
    conditions = {
        "tf_version": tf.__version__, "device": options.device, "kind": options.kind,
        "batch_sizes": list(options.batch_sizes), "repeats": options.repeats, "warmup": options.warmup,
        "statistic": options.statistic, "time_field": "all_end_rel (kernel + per-op bookkeeping)",
        "intra_op_threads": options.intra_threads, "inter_op_threads": options.inter_threads,
        "grappler": "on" if options.grappler else "off", "seed": options.seed,
        **machine_conditions(), "elapsed_s": round(elapsed, 2),
        "step_wall_s": {str(b): _round(w) for b, w in wall.items()},
        "sum_of_ops_s": {str(b): _round(sums[b]) for b in options.batch_sizes},
        "untraced_step_wall_s": {str(b): _round(w) for b, w in untraced_wall.items()},
        "empty_step_wall_s": {str(b): _round(w) for b, w in empty_wall.items()},
        "traced_sum_of_ops_s": {str(b): _round(traced_sums[b]) for b in options.batch_sizes},
        "trace_calibration": ("per-op tracing cost removed (module doc, rule 7)" if trace_cost else
                              "off" if not options.trace_calibration else
                              "none: ops do not run one at a time on a CPU, the wall is not their sum"),
        "trace_cost_per_op_s": _round(tau),
        "trace_cost_per_op_by_batch_s": {str(b): _round(c) for b, c in trace_cost.items()},
        "fused": {x: y for x, y in fused.items() if x in ops},
        "run_order": f"op start order of the first traced step at batch {order_batch}",
        "missing_reasons": missing,
    }
    profile = Profile(ops=ops, graph=name, conditions=conditions, missing_ops=tuple(missing),
                      run_order=tuple(run_order_with_fused(started_order, fused)))
    return ProfileResult(profile=profile, step_wall_s=wall, untraced_step_wall_s=untraced_wall,
                         missing_reasons=missing, elapsed_s=elapsed)


def trace_cost_per_op(times: Iterable[float], untraced_s: float, tol_s: float = 1e-10) -> float:
    """The per-record tracing cost τ >= 0 that makes the corrected records
    `max(t - τ, TRACE_FLOOR_FRACTION * t)` sum to `untraced_s` (the untraced step's op time,
    seconds), by bisection (the sum falls monotonically in τ). 0 when the records already sum to
    no more than `untraced_s` (the trace did not inflate them: nothing to remove) or
    `untraced_s` <= 0 (the untraced step measured no faster than the empty one: no
    information); the largest useful τ (max record) when even that cannot reach it."""
    t = np.asarray(list(times), dtype=np.float64)
    if t.size == 0 or untraced_s <= 0 or t.sum() <= untraced_s:
        return 0.0
    floor = TRACE_FLOOR_FRACTION * t

    def total(tau: float) -> float:
        return float(np.maximum(t - tau, floor).sum())

    lo, hi = 0.0, float(t.max())
    while hi - lo > tol_s:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) > untraced_s else (lo, mid)
    return hi


def _split_fused(times: Dict[str, float], fused: Mapping[str, str], graph, batch_size: int, kind: str) -> None:
    """Shares the measured time of each fused kernel among the ops it replaced, in proportion to
    their roofline work on `kind` (the table's CPU entry for kinds not in the table). In place."""
    from tfplace.profiling import device_model
    try:
        spec = device_model.device_spec(kind)
    except InputError:
        spec = device_model.DEVICES["CPU"]
    groups: Dict[str, List[str]] = {}
    for x, y in fused.items():
        groups.setdefault(y, []).append(x)
    for y, members in groups.items():
        if y not in times:
            continue
        names = [y] + members
        w = np.array([_work_seconds(graph, n, batch_size, spec, device_model) for n in names])
        share = w / w.sum() if w.sum() > 0 else np.full(len(names), 1.0 / len(names))
        total = times[y]
        for n, f in zip(names, share):
            times[n] = float(total * f)


def _work_seconds(graph, op_name: str, batch_size: int, spec, device_model) -> float:
    """Roofline time of an op of the imported tf.Graph without the launch cost (unknown dims,
    the batch among them, taken as `batch_size`)."""
    op = graph.get_operation_by_name(op_name)

    def dims(t):
        if t.shape.rank is None:
            return (float(batch_size),)
        return tuple(float(batch_size if d is None else d) for d in t.shape.as_list())

    work = device_model.op_work(op.type, [dims(t) for t in op.inputs], [t.dtype.base_dtype.name for t in op.inputs],
                                [dims(t) for t in op.outputs], [t.dtype.base_dtype.name for t in op.outputs])
    if work.klass == device_model.HOST:
        return 0.0
    return max(work.flops / spec.rate(work.klass == device_model.MATMUL),
               work.bytes / (spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency))


def profile_bundle(meta_path: str, options: ProfileOptions,
                   progress: Optional[Callable[[int], ProgressBar]] = None) -> ProfileResult:
    """`profile_graph` on an exported bundle (`<stem>.json` next to `<stem>.pb`)."""
    from tfplace.ir.loader import read_graph_source  # the one bundle reader (strict metadata checks)
    graph_def, meta, _ = read_graph_source(os.fspath(meta_path), None)
    if not str(meta_path).endswith(".json") or "init_op" not in meta:
        raise InputError(str(meta_path), "init_op", "no bundle metadata with an init op",
                         "profile an exported bundle (<stem>.json); export with python -m tfplace.cli.export")
    return profile_graph(graph_def, meta, options, name=graph_name(meta_path), source=meta_path, progress=progress)


def _round(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def rounded(profile: Profile, digits: int = 4) -> Profile:
    """The same profile with every time rounded to `digits` significant digits (small files)."""
    ops = {op: {k: (b, tuple(_round(s, digits) for s in secs)) for k, (b, secs) in per.items()}
           for op, per in profile.ops.items()}
    return dataclasses.replace(profile, ops=ops)


def save_compact(profile: Profile, path: str) -> None:
    """Writes profile.json with one op per line (same format as `save_profile`, a third of the
    size of the indented file, and still diffs line by line). Atomic like `save_profile`."""
    import json
    data = profile.to_json()
    ops = data.pop("ops")
    head = json.dumps(data, separators=(",", ":"), allow_nan=False)
    lines = [json.dumps(op, allow_nan=False) + ":" + json.dumps(v, separators=(",", ":"), allow_nan=False)
             for op, v in ops.items()]
    text = head[:-1] + ',"ops":{\n' + ",\n".join(lines) + "\n}}\n"
    atomic_write(path, lambda f: f.write(text))


def scaled_kind(profile: Profile, kind: str, factor: float) -> Profile:
    """`profile` with every op time of `kind` multiplied by `factor` (> 0); other kinds as they
    are. A CPU quota's slowdown applied to op times measured without it (profiler_cli)."""
    if not factor > 0:
        raise InputError("profile", "factor", f"must be > 0, got {factor!r}", "give the measured slowdown")
    ops = {op: {k: ((pts[0], tuple(t * factor for t in pts[1])) if k == kind else pts) for k, pts in per.items()}
           for op, per in profile.ops.items()}
    return dataclasses.replace(profile, ops=ops)


def merge_profiles(base: Profile, extra: Profile) -> Profile:
    """Kinds of `extra` added to (or replacing those of) `base`, op by op; conditions are kept
    per kind under conditions["by_kind"]."""
    ops = {op: dict(per) for op, per in base.ops.items()}
    for op, per in extra.ops.items():
        ops.setdefault(op, {}).update(per)
    by_kind = dict(base.conditions.get("by_kind", {}))
    for p in (base, extra):
        own = {k: v for k, v in p.conditions.items() if k != "by_kind"}
        if own:
            for kind in ([p.conditions["kind"]] if "kind" in p.conditions else list(p.kinds)):
                by_kind[kind] = own
    conditions = dict(base.conditions)
    if by_kind:
        conditions["by_kind"] = by_kind
    missing = tuple(dict.fromkeys(m for m in base.missing_ops + extra.missing_ops if m not in ops))
    derived = {k: v for k, v in base.derived.items() if k not in extra.kinds}
    derived.update(extra.derived)
    return Profile(ops=ops, graph=base.graph or extra.graph, conditions=conditions, missing_ops=missing,
                   derived=derived, comm=extra.comm or base.comm, run_order=base.run_order or extra.run_order)
